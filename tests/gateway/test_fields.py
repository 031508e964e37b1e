"""The gateway's request fields and the Responses API with the real ``openai`` client, the real HF engine (every
output kept, :class:`RecordingEngine`) and the tiny model: each field honoured (checked on what the engine did) or
refused with a 400 naming it; ``/v1/responses`` recorded like chat completions; history normalisations; an end
token the client's text lacks never left in the next prompt; OpenAI-shaped errors everywhere."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from agent_rl.engines import get_engine
from agent_rl.gateway.app import call_opening
from agent_rl.gateway.fields import cut_at_stop
from agent_rl.rollout.prompts.encoding import chat_ids
from envs.examples.calculator import CALCULATOR_TOOLS
from tests.gateway.test_gateway import Live, RecordingEngine, policy  # noqa: F401 (the module's policy fixture)

MESSAGES = [{"role": "user", "content": "Count to ten."}]


@pytest.fixture(scope="module")
def gw(policy):  # noqa: F811
    engine = RecordingEngine(get_engine("hf", policy[0], policy[1], seed=0))
    live = Live(policy, max_new_tokens=12, engine=engine)
    live.engine = engine
    yield live
    live.close()


def _chat(gw, session, **kw):
    return gw.client(session).chat.completions.create(model="x", **{"messages": MESSAGES, **kw})


def _refused(gw, session, param: str, path: str = "/v1/chat/completions", **body):
    r = httpx.post(f"{gw.url}{path}", json={"model": "x", "messages": MESSAGES, **body},
                   headers={"Authorization": f"Bearer {session.api_key}"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err
    return err


# ------------------------------------------------------------------------------------------------ request fields
def test_n_logprobs_top_logprobs(gw):
    s = gw.session(temperature=0.0)
    _refused(gw, s, "n", n=2)
    _refused(gw, s, "top_logprobs", logprobs=True, top_logprobs=2)
    _refused(gw, s, "best_of", path="/v1/completions", prompt="x", best_of=2)
    _refused(gw, s, "logprobs", path="/v1/completions", prompt="x", logprobs=3)
    assert s.turns == []  # nothing refused was recorded
    r = _chat(gw, s, logprobs=True, n=1)
    content = r.choices[0].logprobs.content
    turn = s.turns[0]
    assert [c.logprob for c in content] == pytest.approx(turn.response_logprobs)  # the engine's, as sampled
    assert len(content) == r.usage.completion_tokens == len(turn.response_ids)
    assert "".join(c.token for c in content) == gw.orch.runner.tokenizer.decode(turn.response_ids)
    c = gw.client(s).completions.create(model="x", prompt="Once upon a time", max_tokens=4, logprobs=0)
    assert c.choices[0].logprobs.token_logprobs == pytest.approx(s.turns[1].response_logprobs)
    # streamed: the same log-probs, all in the finish chunk
    t = gw.session(temperature=0.0)
    chunks = list(_chat(gw, t, logprobs=True, stream=True))
    streamed = [lp for ch in chunks if ch.choices and ch.choices[0].logprobs for lp in ch.choices[0].logprobs.content]
    assert [x.logprob for x in streamed] == pytest.approx([x.logprob for x in content])


def test_max_tokens_is_the_engines_cap(gw):
    s = gw.session(temperature=1.0)
    before = len(gw.engine.outputs)
    r = _chat(gw, s, max_completion_tokens=3)
    (prompt, out, _), = gw.engine.outputs[before:]
    assert len(out) <= 3 and r.usage.completion_tokens == len(out)  # generation stopped at 3: nothing cut later
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 0},
                   headers={"Authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_stop_ends_the_reply_and_its_ids_before_the_stop_string(gw, policy):  # noqa: F811
    tok = policy[1]
    free = gw.session(temperature=0.0)
    full = _chat(gw, free, max_tokens=12).choices[0].message.content
    free_ids = free.turns[0].response_ids
    # a stop string from the middle of the greedy reply: a token's text, so the reply is cut at a token boundary
    k = next(i for i in range(2, len(free_ids)) if tok.decode(free_ids[i:i + 1]).strip()
             and tok.decode(free_ids[i:i + 1]) not in tok.decode(free_ids[:i]))
    stop = tok.decode(free_ids[k:k + 1])
    s = gw.session(temperature=0.0)
    before = len(gw.engine.outputs)
    r = _chat(gw, s, max_tokens=12, stop=[stop])
    text = r.choices[0].message.content
    assert stop not in text and text == tok.decode(free_ids[:k]) and full.startswith(text)
    assert r.choices[0].finish_reason == "stop"
    assert s.turns[0].response_ids == free_ids[:k]  # the recorded ids end where the text ends
    (_, out, _), = gw.engine.outputs[before:]
    assert len(out) == k + 1 < 12  # the engine stopped at the token that completed the stop string
    assert tok.decode(s.turns[0].response_ids) == text
    _refused(gw, s, "stop", stop=["a", "b", "c", "d", "e"])


def test_cut_at_stop_drops_the_token_holding_the_stop_strings_start():
    pieces = {1: "ab", 2: "cX", 3: "Yd"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    assert cut_at_stop([1, 2, 3], "abcXYd", ["XY"], decode) == (1, "ab")  # "c" went with the token "cX"
    assert cut_at_stop([1, 2, 3], "abcXYd", ["Yd"], decode) == (2, "abcX")
    assert cut_at_stop([1, 2, 3], "abcXYd", ["Q"], decode) is None
    assert cut_at_stop([1, 2, 3], "abcXYd", ["a"], decode) == (0, "")


def test_seed_is_part_of_the_row_seed(gw):
    def ids(seed):
        s = gw.session(temperature=1.0)
        _chat(gw, s, seed=seed) if seed is not None else _chat(gw, s)
        return s.turns[0].response_ids

    a, b, c = ids(7), ids(7), ids(8)
    assert a == b and a != c and ids(None) != a
    _refused(gw, gw.session(), "seed", seed="x")


def test_tool_choice_each_value(gw, policy):  # noqa: F811
    tok = policy[1]
    s = gw.session(temperature=0.0)
    _refused(gw, s, "tool_choice", tool_choice="required")  # no tools
    _refused(gw, s, "tool_choice", tools=CALCULATOR_TOOLS, tool_choice={"type": "function",
                                                                        "function": {"name": "nope"}})
    _refused(gw, s, "tool_choice", tools=CALCULATOR_TOOLS, tool_choice="sometimes")
    _refused(gw, s, "response_format", response_format={"type": "json_object"})
    _refused(gw, s, "frobnicate", frobnicate=1)
    fmt = gw.orch.runner.builder.tool_format
    assert call_opening(fmt, None) == '<tool_call>\n{"name": "'
    assert call_opening(fmt, "calc") == '<tool_call>\n{"name": "calc", "arguments": '
    for choice, opening in (("required", call_opening(fmt, None)),
                            ({"type": "function", "function": {"name": "calc"}}, call_opening(fmt, "calc"))):
        t = gw.session(temperature=0.0)
        _chat(gw, t, tools=CALCULATOR_TOOLS, tool_choice=choice, parallel_tool_calls=False)
        opened = tok.encode(opening, add_special_tokens=False)
        prompt = t.turns[0].prompt_ids
        # the reply starts as a call: the format's opening is written after the rendered prompt (and recorded)
        assert prompt[-len(opened):] == opened
        assert prompt[:-len(opened)] == gw.orch.runner.builder.full(MESSAGES, CALCULATOR_TOOLS)
    # none: the reply is text, never parsed as a call
    n = gw.session(temperature=0.0)
    r = _chat(gw, n, tools=CALCULATOR_TOOLS, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"


# ------------------------------------------------------------------------------------------------ Responses API
def test_responses_recorded_like_chat_and_previous_response_id(gw, policy):  # noqa: F811
    tok = policy[1]
    s, c = gw.session(temperature=0.0), gw.session(temperature=0.0)
    client = gw.client(s)
    first = client.responses.create(model="x", input="What is 3 + 4?", instructions="Be brief.",
                                    max_output_tokens=8)
    chat = _chat(gw, c, messages=[{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "What is 3 + 4?"}], max_tokens=8)
    assert first.output_text == chat.choices[0].message.content  # the same call, the same greedy reply
    assert s.turns[0].prompt_ids == c.turns[0].prompt_ids and s.turns[0].response_ids == c.turns[0].response_ids
    assert first.usage.output_tokens == len(s.turns[0].response_ids) and first.status in ("completed", "incomplete")
    second = client.responses.create(model="x", previous_response_id=first.id, instructions="Be brief.",
                                     input=[{"role": "user", "content": "And 5 + 6?"}], max_output_tokens=8)
    a, b = s.turns
    assert s.prefix_breaks == 0 and b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)] == \
        a.prompt_ids + a.response_ids  # the stored conversation, extended: the recorded ids spliced
    assert "And 5 + 6?" in tok.decode(b.prompt_ids) and second.id != first.id
    r = httpx.post(f"{gw.url}/v1/responses", json={"input": "x", "previous_response_id": "resp_nope"},
                   headers={"Authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    # another session's response id is not this session's
    r = httpx.post(f"{gw.url}/v1/responses", json={"input": "x", "previous_response_id": first.id},
                   headers={"Authorization": f"Bearer {c.api_key}"})
    assert r.status_code == 400 and len(c.turns) == 1


def test_responses_streaming_same_reply_and_ids(gw):
    plain, streamed = gw.session(temperature=0.0), gw.session(temperature=0.0)
    r = gw.client(plain).responses.create(model="x", input="Say hi.", max_output_tokens=8)
    events = list(gw.client(streamed).responses.create(model="x", input="Say hi.", max_output_tokens=8, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text and events[-1].response.output_text == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [(t.prompt_ids, t.response_ids) for t in plain.turns] == [(t.prompt_ids, t.response_ids)
                                                                     for t in streamed.turns]


def test_responses_function_call_items_extend_the_segment(gw):
    """A reply with a call comes back as a ``function_call`` item and its ``function_call_output``: the same
    conversation as the chat form (the assistant message with ``tool_calls``, then a ``tool`` message)."""
    s = gw.session(temperature=0.0)
    client = gw.client(s)
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in CALCULATOR_TOOLS]
    client.responses.create(model="x", input="What is 2+2?", tools=tools, max_output_tokens=4)
    call = {"type": "function", "function": {"name": "calc", "arguments": {"expression": "2+2"}}}
    s.segments[-1].messages[-1] = {"role": "assistant", "content": "", "tool_calls": [call]}  # as if sampled
    client.responses.create(model="x", tools=tools, max_output_tokens=4, input=[
        {"role": "user", "content": "What is 2+2?"},
        {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": '{"expression": "2+2"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "4"}])
    assert s.prefix_breaks == 0 and len(s.turns) == 2
    r = httpx.post(f"{gw.url}/v1/responses", json={"input": [{"type": "reasoning", "summary": []}]},
                   headers={"Authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_content"
    r = httpx.post(f"{gw.url}/v1/responses", json={"input": "x", "tools": [{"type": "web_search"}]},
                   headers={"Authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_responses_function_tool_renders_as_its_chat_tool(gw, policy):  # noqa: F811
    """A Responses function tool (``strict`` included, as the OpenAI Agents SDK sends it) is the chat tool with the
    same ``function`` fields: the same prompt ids, ``"strict": true`` rendered with the tool; a ``strict`` that is
    not a boolean is 400 naming ``tools`` and records nothing."""
    fn = {"name": "calc", "description": "Evaluate an arithmetic expression.", "strict": True,
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                         "required": ["expression"], "additionalProperties": False}}
    s, c = gw.session(temperature=0.0), gw.session(temperature=0.0)
    gw.client(s).responses.create(model="x", input="What is 2+2?", tools=[{"type": "function", **fn}],
                                  max_output_tokens=2)
    gw.client(c).chat.completions.create(model="x", messages=[{"role": "user", "content": "What is 2+2?"}],
                                         tools=[{"type": "function", "function": fn}], max_tokens=2)
    assert s.turns[0].prompt_ids == c.turns[0].prompt_ids
    assert '"strict": true}}' in policy[1].decode(s.turns[0].prompt_ids)
    r = httpx.post(f"{gw.url}/v1/responses", json={"input": "x", "tools": [{"type": "function", **fn,
                                                                            "strict": "yes"}]},
                   headers={"Authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools" and len(s.turns) == 1


# ------------------------------------------------------------------------------------------------ history rewrites
def test_history_normalisations_extend_and_breaks_are_counted_by_cause(gw, policy, caplog):  # noqa: F811
    tok = policy[1]
    s = gw.session(temperature=0.0)
    c = gw.client(s)
    reply = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=6,
                                      stop=["Observation:"]).choices[0].message.content
    a = s.turns[0]
    # a library that strips the reply and appends the stop string it asked for (smolagents): the same segment
    history = MESSAGES + [{"role": "assistant", "content": "  " + reply.strip() + "Observation:\n"},
                          {"role": "user", "content": "go on"}]
    c.chat.completions.create(model="x", messages=history, max_tokens=4)
    b = s.turns[1]
    spliced = a.prompt_ids + a.response_ids + tok.encode("Observation:", add_special_tokens=False)
    assert s.prefix_breaks == 0 and s.rewrites == 1 and b.info["history_rewrite"] == "stop"
    assert b.prompt_ids[:len(spliced)] == spliced  # the sampled ids as sampled, the appended text as context
    # a reply edited beyond that: a break counted by cause, the first differing message in the log
    edited = history + [{"role": "assistant", "content": "something else"}, {"role": "user", "content": "?"}]
    with caplog.at_level(logging.INFO, logger="agent_rl.gateway.app"):
        c.chat.completions.create(model="x", messages=edited, max_tokens=4)
    assert s.breaks == {"reply_rewritten": 1} and s.prefix_breaks == 1
    assert any("reply_rewritten" in r.message and "something else" in r.message for r in caplog.records)
    c.chat.completions.create(model="x", messages=[{"role": "user", "content": "new"}], max_tokens=2)
    c.chat.completions.create(model="x", messages=[{"role": "user", "content": "new"}], max_tokens=2,
                              tools=CALCULATOR_TOOLS, tool_choice="none")
    assert s.breaks == {"reply_rewritten": 1, "history_edited": 1, "tools_changed": 1}


# ------------------------------------------------------------------------------------------------ end tokens
def test_an_end_token_the_clients_text_lacks_is_not_in_the_next_prompt(gw, policy):  # noqa: F811
    """A completion that ended on EOS: the client's next prompt (its text + more) holds no EOS, so neither do the
    recorded ids: they are what the client's text encodes to, and the next call starts a new segment (no break)."""
    tok = policy[1]
    eos = sorted(gw.orch.runner.builder.eos_ids)[0]
    s = gw.session(temperature=0.0)
    c = gw.client(s)
    first = c.completions.create(model="x", prompt="Once upon a time", max_tokens=4)
    seg = s.segments[-1]
    seg.response_ids = seg.response_ids + [eos]  # as if the reply had ended on EOS (its text is the same)
    s.turns[0].response_ids = list(seg.response_ids)
    text = "Once upon a time" + first.choices[0].text + " and then"
    c.completions.create(model="x", prompt=text, max_tokens=4)
    b = s.turns[1]
    assert eos not in b.prompt_ids and tok.decode(b.prompt_ids) == text  # the client's text, round trip
    assert b.prompt_ids[:len(seg.prompt_ids) + len(seg.response_ids) - 1] == seg.prompt_ids + seg.response_ids[:-1]
    assert s.prefix_breaks == 0 and [t.segment for t in s.turns] == [0, 1]


# ------------------------------------------------------------------------------------------------ shapes
def test_errors_are_openai_shaped_and_hostile_arguments_are_400(gw):
    s = gw.session(temperature=0.0)
    auth = {"Authorization": f"Bearer {s.api_key}"}
    url = f"{gw.url}/v1/chat/completions"

    def call(arguments: str) -> httpx.Response:
        history = MESSAGES + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "calc", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "a", "content": "1"}]
        return httpx.post(url, json={"messages": history, "max_tokens": 2}, headers=auth, timeout=60)

    deep = call("[" * 100_000 + "]" * 100_000)
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "invalid_tool_arguments"
    lone = call('{"x": "\\ud800"}')
    assert lone.status_code == 400 and lone.json()["error"]["code"] == "invalid_text"
    # the gate's and the body guard's refusals, and an unknown route, in OpenAI's shape
    for r, status in ((httpx.post(url, json={}), 401),
                      (httpx.post(url, content=b"x" * (5 << 20), headers=auth), 413),
                      (httpx.post(url, content="[" * 5000, headers={**auth, "Content-Type": "application/json"}),
                       400),
                      (httpx.post(f"{gw.url}/v1/embeddings", json={"input": "x"}, headers=auth), 404)):
        assert r.status_code == status and set(r.json()["error"]) >= {"message", "type", "code"}, r.text
    with pytest.raises(openai.NotFoundError, match="/v1/responses"):
        gw.client(s).embeddings.create(model="x", input="x")
    r = httpx.post(url, json={"messages": MESSAGES}, headers=[*auth.items(), ("X-Session-ID", s.session_id),
                                                              ("X-Session-ID", s.session_id)])
    assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_header"
    assert s.turns == []


def test_calls_after_the_reward_are_refused(gw):
    s = gw.session(temperature=0.0)
    _chat(gw, s, max_tokens=2)
    auth = {"Authorization": f"Bearer {s.api_key}"}
    assert httpx.post(f"{gw.url}/sessions/{s.session_id}/reward", json={"reward": 0.1}, headers=auth).status_code \
        == 200
    with pytest.raises(openai.ConflictError, match="episode_over|over"):
        _chat(gw, s, max_tokens=2)
    assert len(s.turns) == 1 and json.loads(json.dumps(s.ignored)) == [{}]


def test_chat_end_token_the_template_does_not_write_is_dropped(gw, policy):  # noqa: F811
    """A chat reply that ended on an end token the template does not write after an assistant message (here
    ``<|endoftext|>``, made an end token of the run): the next prompt is the client's conversation as rendered, the
    sampled reply without that token, and a new segment starts (no prefix break)."""
    tok = policy[1]
    extra = tok.convert_tokens_to_ids("<|endoftext|>")
    builder = gw.orch.runner.builder
    assert extra not in builder.eos_ids
    builder.eos_ids.add(extra)
    try:
        s = gw.session(temperature=0.0)
        c = gw.client(s)
        reply = _chat(gw, s, max_tokens=4).choices[0].message.content
        seg = s.segments[-1]
        seg.response_ids = seg.response_ids + [extra]  # as if sampled (the client's text is the same)
        history = MESSAGES + [{"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
        c.chat.completions.create(model="x", messages=history, max_tokens=2)
        b = s.turns[1]
        assert extra not in b.prompt_ids and tok.decode(b.prompt_ids) == tok.decode(builder.full(history, None))
        assert s.prefix_breaks == 0 and [t.segment for t in s.turns] == [0, 1]
    finally:
        builder.eos_ids.discard(extra)


def test_batcher_gives_each_row_its_own_cap_and_stop_strings():
    """Rows asking another cap or other stop strings are generated in their own engine call, with them; a cap at
    or above the batcher's is none (those rows batch with the others)."""
    import asyncio

    from agent_rl.rollout.orchestrator import GenerationBatcher
    from agent_rl.types import Generation

    calls = []

    class Engine:
        def generate(self, prompts, temperatures, **kwargs):
            calls.append((len(prompts), kwargs["max_new_tokens"], kwargs["stop"]))
            return [Generation(token_ids=[1], logprobs=[0.0], text="x", finish_reason="stop") for _ in prompts]

    async def go():
        b = GenerationBatcher(Engine(), max_new_tokens=16, stop=["</tool_call>"], wait_s=0.05)
        server = asyncio.create_task(b.run())
        rows = [b.generate([1], 1.0), b.generate([2], 1.0, max_new_tokens=100), b.generate([3], 1.0, max_new_tokens=4),
                b.generate([4], 1.0, stop=["X"]), b.generate([5], 1.0, max_new_tokens=4)]
        await asyncio.gather(*rows)
        b.close()
        await server

    asyncio.run(go())
    assert sorted(calls) == sorted([(2, 16, ["</tool_call>"]), (2, 4, ["</tool_call>"]),
                                    (1, 16, ["</tool_call>", "X"])])


def test_task_file_rows_with_different_keys(tmp_path, policy):  # noqa: F811
    """A task file whose rows have different keys is read; each row's task dict holds the keys it has."""
    from agent_rl.gateway import ExternalConfig, ExternalRollout
    from agent_rl.rollout import RolloutConfig

    path = tmp_path / "tasks.jsonl"
    rows = [{"question": "What is 1 + 1?", "answer": 2}, {"question": "Name a tool.", "tools": ["calc"]},
            {"prompt": "x", "meta": {"level": 3}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    orch = ExternalRollout(None, get_engine("hf", policy[0], policy[1], seed=0), RolloutConfig(),
                           ExternalConfig(program="tests.gateway.programs:file_task", tasks=str(path)),
                           max_new_tokens=4)
    assert list(orch.runner.rows) == rows


def test_an_unexpected_failure_is_an_openai_shaped_500(gw, monkeypatch):
    s = gw.session(temperature=0.0)

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(gw.orch.runner.builder, "prompt", broken)
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": MESSAGES},
                   headers={"Authorization": f"Bearer {s.api_key}"}, timeout=60)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error" and "boom" not in r.text
    assert not s.busy and s.turns == []  # the session is usable again, nothing recorded


def test_progress_line_counts_calls_and_tokens(gw):
    before = gw.orch.runner.gateway.requests, gw.orch.runner.gateway.generated_tokens
    s = gw.session(temperature=0.0)
    _chat(gw, s, max_tokens=3)
    assert gw.orch.runner.gateway.requests == before[0] + 1
    assert gw.orch.runner.gateway.generated_tokens == before[1] + len(s.turns[0].response_ids)
    line = gw.orch.runner.progress_line()
    gateway = gw.orch.runner.gateway
    assert f"{gateway.requests} model calls" in line and f"{gateway.generated_tokens} tokens" in line
