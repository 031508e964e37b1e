"""What the gateway does with each request field: honoured, refused with a 400 naming it, or (the sampling
distribution) replaced by the trainer's and said so in the reply. No field is dropped without a word.

- ``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens``: the engine's generation cap of the call (at
  most ``engine.max_new_tokens``: generation stops there, ``finish_reason="length"``).
- ``stop``: up to 4 strings, the engine's stop strings of the call; the reply and its recorded ids end before the
  first one (:func:`cut_at_stop`).
- ``seed``: mixed into the call's row seed (same session key, call index and seed: the same sample).
- ``logprobs`` / ``top_logprobs``: the sampled tokens' log-probs from the engine (at the call's temperature);
  ``top_logprobs`` > 0 is refused (the engines return the sampled token's only).
- ``n``, ``best_of``: 1 only (a call is one turn of one episode).
- ``tool_choice``: ``auto``: calls parsed; ``none``: the reply is text, not parsed; ``required`` / a named function:
  the format's call opening (and the name) is written after the prompt, so the reply is a call (the opening is part
  of the recorded prompt ids); refused without ``tools``.
- ``parallel_tool_calls=false``: honoured by formats whose stop string ends a reply at its first call (hermes);
  refused by the others.
- ``response_format`` / ``text.format``: ``text`` only (``json_object``/``json_schema`` refused: no constrained
  decoding).
- :data:`SAMPLING` (``temperature``, ``top_p``, ...): the trainer's sampling wins: the call samples at its episode's
  temperature and the run's top_p/top_k; the reply says so (``agent_rl_sampling``) and the call keeps the names and
  sizes, never the values.
- :data:`INERT` (``user``, ``metadata``, ``store``, ...): no effect on generation.
- anything else: 400 ``unsupported_parameter`` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from agent_rl.gateway.recorder import RequestError

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
            "logit_bias", "reasoning_effort", "reasoning")
"""Fields of the sampling distribution: the trainer's rule replaces them (stated in each reply)."""
INERT = ("model", "stream", "stream_options", "user", "metadata", "store", "service_tier", "prompt_cache_key",
         "safety_identifier", "include", "truncation", "background", "modalities", "echo", "suffix")
"""Fields with no effect on what is generated or recorded (some with a value check in :func:`call_options`)."""
MAX_STOP = 4
MAX_STOP_CHARS = 256


def _refuse(param: str, why: str) -> RequestError:
    return RequestError(f"{param}: {why}", "unsupported_parameter", param=param)


@dataclass
class CallOptions:
    """What one call asks of generation, checked (:func:`call_options`)."""

    max_new_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    tool_choice: str = "auto"
    """``auto``, ``none``, ``required`` or ``function`` (then :attr:`tool_name`)."""
    tool_name: str | None = None
    overridden: dict[str, int] = field(default_factory=dict)
    """The client's sampling fields the trainer's rule replaced: name -> size of the value as JSON (bytes)."""


def _size(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False, default=str).encode())
    except (TypeError, ValueError, RecursionError):
        return len(str(value))


def _stop_list(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _refuse("stop", "a string or a list of strings")
    if len(stops) > MAX_STOP or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise _refuse("stop", f"at most {MAX_STOP} non-empty strings of at most {MAX_STOP_CHARS} characters")
    return list(dict.fromkeys(stops))


def _tool_choice(value: Any, tool_names: Sequence[str] | None) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if tool_names else "none"), None
    name = None
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise _refuse("tool_choice", f"{value!r} is not one of 'auto', 'none', 'required' or a named function")
        choice = value
    elif isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function") if isinstance(value.get("function"), dict) else value  # chat / Responses shape
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _refuse("tool_choice", "a named function needs its name")
        choice = "function"
    else:
        raise _refuse("tool_choice", "'auto', 'none', 'required' or {'type': 'function', 'function': {'name'}}")
    if choice in ("required", "function") and not tool_names:
        raise _refuse("tool_choice", f"{choice!r} needs tools")
    if name is not None and name not in (tool_names or []):
        raise _refuse("tool_choice", f"names {name[:64]!r}, which is not among the request's tools")
    return choice, name


def call_options(data: dict[str, Any], *, handled: Sequence[str], tool_names: Sequence[str] | None,
                 single_call_stop: bool, max_tokens_fields: Sequence[str] = ("max_completion_tokens", "max_tokens"),
                 chat_logprobs: bool = True) -> CallOptions:
    """The checked :class:`CallOptions` of a request's fields ``data`` (as sent: unset fields absent).

    Args:
        handled: fields the route itself reads (messages, tools, input, ...): not checked here.
        tool_names: the request's tool names (None: no tools).
        single_call_stop: the tool-call format ends a reply at its first call (``parallel_tool_calls=false`` holds).
        max_tokens_fields: the route's cap fields, first present wins.
        chat_logprobs: ``logprobs`` is a bool (chat), else an int (completions: 0, the sampled tokens' only).

    Raises:
        RequestError: 400 ``unsupported_parameter`` naming the field (module docstring's table).
    """
    opts = CallOptions()
    for key in max_tokens_fields:
        if data.get(key) is not None:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _refuse(key, "a positive integer")
            opts.max_new_tokens = value
            break
    for key in ("n", "best_of"):
        if data.get(key) not in (None, 1):
            raise _refuse(key, f"{data[key]!r}: one sample per call (a call is one turn of this session's episode, "
                               "which is one episode of the group); call again for another sample")
    if data.get("stop") is not None:
        opts.stop = _stop_list(data["stop"])
    if data.get("seed") is not None:
        if isinstance(data["seed"], bool) or not isinstance(data["seed"], int):
            raise _refuse("seed", "an integer")
        opts.seed = int(data["seed"]) % 2**63
    lp = data.get("logprobs")
    if chat_logprobs and lp is not None and not isinstance(lp, bool):
        raise _refuse("logprobs", "true or false")
    if lp is True or (lp == 0 and not isinstance(lp, bool) and not chat_logprobs):
        opts.logprobs = True
    elif lp not in (None, False):
        raise _refuse("logprobs", "0 only: the engines return the sampled token's log-prob, not the most likely "
                                  "alternatives")
    if data.get("top_logprobs") not in (None, 0):
        raise _refuse("top_logprobs", "0 only: the engines return the sampled token's log-prob, not the most likely "
                                      "alternatives")
    opts.tool_choice, opts.tool_name = _tool_choice(data.get("tool_choice"), tool_names)
    if data.get("parallel_tool_calls") is False and tool_names and not single_call_stop:
        raise _refuse("parallel_tool_calls", "false needs a tool-call format whose stop string ends a reply at its "
                                             "first call (model.tool_call_format=hermes)")
    fmt = data.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _refuse("response_format", "only {'type': 'text'}: the engines do not constrain decoding to JSON")
    text = data.get("text")  # the Responses API's response_format
    if text is not None and not (isinstance(text, dict) and set(text) <= {"format", "verbosity"} and
                                 (text.get("format") is None or text.get("format", {}).get("type") == "text")):
        raise _refuse("text", "only {'format': {'type': 'text'}}: the engines do not constrain decoding to JSON")
    if data.get("modalities") not in (None, ["text"]):
        raise _refuse("modalities", "text only")
    if data.get("echo") or data.get("suffix") or data.get("include") or data.get("background"):
        key = next(k for k in ("echo", "suffix", "include", "background") if data.get(k))
        raise _refuse(key, "not supported")
    if data.get("truncation") not in (None, "disabled"):
        raise _refuse("truncation", "'disabled' only (a prompt over the budget is 400 context_length_exceeded)")
    known = set(handled) | set(SAMPLING) | set(INERT) | set(max_tokens_fields) | {
        "n", "best_of", "stop", "seed", "logprobs", "top_logprobs", "tool_choice", "parallel_tool_calls",
        "response_format", "text", "max_tokens", "max_completion_tokens"}
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise _refuse(unknown[0], f"not a field the gateway serves (unknown: {', '.join(u[:64] for u in unknown[:8])})")
    opts.overridden = {k: _size(data[k]) for k in SAMPLING if data.get(k) is not None}
    return opts


def cut_at_stop(ids: list[int], text: str, stops: Sequence[str], decode: Any) -> tuple[int, str] | None:
    """Where a reply ends for the client's stop strings: ``(k, text of ids[:k])`` with ``k`` the most ids whose text
    is a prefix of ``text`` before its first stop string (the token that holds the start of the stop string is
    dropped with the text it carried before it), or None when no stop string occurs. ``decode(ids) -> str`` is the
    reply's decoding."""
    found = [text.find(s) for s in stops if s and s in text]
    if not found:
        return None
    target = text[:min(found)]
    lo, hi = 0, len(ids)  # the most ids whose text fits: bisected (texts grow with ids), then checked downwards
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if target.startswith(decode(ids[:mid])):
            lo = mid
        else:
            hi = mid - 1
    k = lo
    piece = decode(ids[:k]) if k else ""
    while k > 0 and not target.startswith(piece):
        k -= 1
        piece = decode(ids[:k]) if k else ""
    return k, piece
