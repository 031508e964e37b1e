"""How replies are generated and read for one tokenizer and tool-call format: the text of sampled ids with the
format's markup and the reasoning markers kept, a tools-mode reply resumed past a stop string that fired inside a
reasoning block, and the reading of its calls. Shared by the env episodes (:class:`agent_rl.rollout.episode.EnvEpisode`)
and the gateway's (``agent_rl.gateway.external``)."""

from __future__ import annotations

from typing import Any, Sequence

from agent_rl.engines.base import EngineBase
from agent_rl.rollout.generation import GenerationBatcher
from agent_rl.rollout.tool_calls import decode_for_parsing, prompt_opens_reasoning, reasoning_markers, reasoning_open, \
    strip_reasoning
from agent_rl.types import Generation

MAX_REASONING_RESUMES = 8
"""How many times one tools-mode reply resumes after a stop string fired inside a reasoning block."""
_PROMPT_TAIL_TOKENS = 64  # the prompt tokens read to see whether the generation prompt opened a reasoning block


def eos_ids_of(engine: Any) -> set[int]:
    """The ids that end a response: an :class:`~agent_rl.engines.base.EngineBase`'s declared ``eos_token_ids``; for
    one that declares none, or a duck-typed engine (not an ``EngineBase``, e.g. a test's fake), the tokenizer's EOS
    id. Read from the declaration, never probed on the object."""
    declared = engine.eos_token_ids if isinstance(engine, EngineBase) else None
    return set(declared or [engine.tokenizer.eos_token_id])


def splice_followup(prompt_ids: Sequence[int], response_ids: Sequence[int], followup: Sequence[int],
                    eos_ids: set[int] | frozenset[int]) -> list[int]:
    """The next prompt of a spliced conversation: the previous prompt, the sampled response as sampled, then what
    the template writes for the new messages (:func:`~agent_rl.rollout.prompts.encoding.followup_ids`), minus its
    first id when that is the EOS the response already ended with (the sampled EOS closes the assistant turn). The
    one splice rule of full-trajectory rows and the gateway's episodes (``agent_rl.gateway``)."""
    response, obs_ids = list(response_ids), list(followup)
    if response and response[-1] in eos_ids and obs_ids[:1] == response[-1:]:
        obs_ids = obs_ids[1:]
    return list(prompt_ids) + response + obs_ids



class ReplyReader:
    """Reads and generates replies for ``tokenizer`` and ``tool_format`` (None: text actions, no markup).

    Attributes:
        reasoning: the tokenizer's reasoning block markers (:func:`agent_rl.rollout.tool_calls.reasoning_markers`).
        call_markup: the format's (open, close) call block markers, whose text is data (None: none).
        keep: the markup decoding keeps (call and reasoning markers).
        eos_ids: the ids that end a response (:func:`eos_ids_of`).
    """

    def __init__(self, tokenizer: Any, tool_format: Any, eos_ids: set[int]) -> None:
        self.tokenizer, self.tool_format, self.eos_ids = tokenizer, tool_format, eos_ids
        self.reasoning = reasoning_markers(tokenizer)
        markup = tuple(tool_format.markup) if tool_format is not None else ()
        self.call_markup = (markup[0], markup[1]) if len(markup) == 2 else None  # a call block: its text is data
        self.keep = markup + tuple(m for pair in self.reasoning for m in pair)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of sampled ids with the markup kept (:func:`agent_rl.rollout.tool_calls.decode_for_parsing`)."""
        return decode_for_parsing(self.tokenizer, list(ids), self.keep)

    def parse_calls(self, text: str, opened: bool) -> Any:
        """The tool-call format's reading (``ToolCallParse``) of a reply without its reasoning blocks (``opened``:
        the prompt opened one)."""
        assert self.tool_format is not None
        return self.tool_format.parse(strip_reasoning(text, self.reasoning, opened, self.call_markup))

    async def generate_tool_turn(self, batcher: GenerationBatcher, prompt_ids: list[int], temperature: float,
                                 penalty: float, key: tuple[int, ...], episode_id: str | None,
                                 max_new_tokens: int | None = None,
                                 stop: Sequence[str] = ()) -> tuple[Generation, bool]:
        """One tools-mode reply: ``(generation, whether the prompt opened a reasoning block)``.

        The text is decoded from the sampled ids with the format's markup and the reasoning markers kept
        (:meth:`decode`: a tokenizer may hold ``<tool_call>`` as a special token, which the engine's text drops). A
        stop string that fired inside an open reasoning block (a call drafted while thinking) does not end the reply:
        generation resumes from the prompt plus the ids so far (key ``key + (resume,)``, same episode, so kept caches
        serve it), at most :data:`MAX_REASONING_RESUMES` times, and the pieces are one generation of at most
        ``max_new_tokens`` ids (cut there: ``"length"``). The check is on the ids, so it is the same for every engine.
        ``max_new_tokens`` and ``stop``: the call's own cap (at most the batcher's) and extra stop strings
        (:meth:`GenerationBatcher.generate`).
        """
        max_new = int(batcher.kwargs["max_new_tokens"])
        if max_new_tokens is not None:
            max_new = min(max_new, int(max_new_tokens))
        row: dict[str, Any] = dict(max_new_tokens=max_new_tokens, stop=tuple(stop))
        stops = [s for s in self.tool_format.stop] if self.tool_format is not None else []
        opened = prompt_opens_reasoning(self.decode(prompt_ids[-_PROMPT_TAIL_TOKENS:]), self.reasoning)
        first = gen = await batcher.generate(prompt_ids, temperature, penalty, key=key, episode_id=episode_id, **row)
        ids, logprobs = list(gen.token_ids), list(gen.logprobs)
        text = self.decode(ids)
        for resume in range(1, MAX_REASONING_RESUMES + 1):
            stopped_by_string = gen.finish_reason == "stop" and not (ids and ids[-1] in self.eos_ids) and any(
                s in text[-(len(s) + 16):] for s in stops)
            thinking = reasoning_open(text, self.reasoning, opened, self.call_markup)
            if not stopped_by_string or len(ids) >= max_new or not thinking:
                break
            gen = await batcher.generate(prompt_ids + ids, temperature, penalty, key=key + (resume,),
                                         episode_id=episode_id, **row)
            ids += gen.token_ids
            logprobs += gen.logprobs
            text = self.decode(ids)
        finish = gen.finish_reason
        if len(ids) > max_new:  # a prefix of a sample is a sample: cut at the turn's budget
            ids, logprobs, finish = ids[:max_new], logprobs[:max_new], "length"
            text = self.decode(ids)
        return Generation(token_ids=ids, logprobs=logprobs, text=text, finish_reason=finish,
                          cached_tokens=first.cached_tokens, policy_version=first.policy_version), opened
