"""The shaping of one sampled generation into a reply: cut at the call's cap and at the client's stop strings
(ids and text together, so the recorded ids are exactly the reply's), the recorded turn, the tool-call opening a
forced call starts with, and the log-probs in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any, Callable

from agent_rl.gateway.fields import cut_at_stop
from agent_rl.gateway.recorder import GatewaySession
from agent_rl.types import Generation, Turn


def call_opening(fmt: Any, name: str | None) -> str:
    """The text a tool-call format writes before a call's name (``name`` None) or, for a named function, before its
    arguments: hermes ``<tool_call>\\n{"name": "`` / ``<tool_call>\\n{"name": "f", "arguments": ``. Read from
    the format's own :meth:`render_call`, so every registered format has one."""
    probe_name, probe_key = "zzAgentRlNamezz", "zzAgentRlArgzz"
    rendered = fmt.render_call(probe_name if name is None else name, {probe_key: 0})
    if name is None:
        return rendered[:rendered.index(probe_name)]
    return rendered[:rendered.index("{" + json.dumps(probe_key))]


def cut_at_cap(gen: Generation, cap: int, decode: Callable[[list[int]], str]) -> Generation:
    """A generation cut at ``cap`` tokens (a prefix of a sample is a sample: ``finish_reason="length"``);
    ``decode``: the text of the kept ids."""
    if len(gen.token_ids) <= cap:
        return gen
    ids = list(gen.token_ids[:cap])
    text = decode(ids)
    return Generation(token_ids=ids, logprobs=list(gen.logprobs[:cap]), text=text, finish_reason="length",
                      cached_tokens=gen.cached_tokens, policy_version=gen.policy_version)


def cut_at_stops(gen: Generation, stops: list[str], decode: Callable[[list[int]], str]) -> Generation:
    """The generation ended before its first client stop string (ids and text: :func:`cut_at_stop`); ``decode``:
    the text of ids as the reply reads them."""
    if not stops:
        return gen
    cut = cut_at_stop(list(gen.token_ids), gen.text, stops, decode)
    if cut is None:
        return gen
    k, text = cut
    return Generation(token_ids=list(gen.token_ids[:k]), logprobs=list(gen.logprobs[:k]), text=text,
                      finish_reason="stop", cached_tokens=gen.cached_tokens, policy_version=gen.policy_version)


def recorded_turn(session: GatewaySession, prompt_ids: list[int], gen: Generation, action: str,
                  invalid: bool) -> Turn:
    """The turn a call records: its prompt and sampled ids and log-probs, at the generation's policy version (the
    session's when the engine gives none)."""
    version = gen.policy_version if gen.policy_version is not None else session.policy_version
    return Turn(prompt_ids=list(prompt_ids), response_ids=list(gen.token_ids),
                response_logprobs=list(gen.logprobs), action=action, invalid=invalid,
                response_truncated=gen.finish_reason == "length", policy_version=int(version))


def token_logprobs(tokenizer: Any, gen: Generation) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content``: each sampled token's text, log-prob at the call's temperature and bytes;
    no alternatives (``top_logprobs`` empty)."""
    out = []
    for token_id, lp in zip(gen.token_ids, gen.logprobs):
        text = tokenizer.decode([int(token_id)])
        out.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8", "replace")),
                    "top_logprobs": []})
    return out


def completion_logprobs(content: list[dict[str, Any]], prompt: str) -> dict[str, Any]:
    """The completions API's ``logprobs`` of :func:`token_logprobs`' ``content``: tokens, their log-probs and each
    token's offset in the prompt + reply text."""
    offsets, at = [], len(prompt)
    for item in content:
        offsets.append(at)
        at += len(item["token"])
    return {"tokens": [c["token"] for c in content], "token_logprobs": [c["logprob"] for c in content],
            "top_logprobs": None, "text_offset": offsets}
