"""What the gateway keeps per episode: the exact ids it sampled, matched to the client's messages.

An agent program sends its whole conversation with every request. The gateway never re-tokenizes what the policy
wrote: each session (one episode) keeps *segments*; a segment holds the messages of the conversation so far (the
client's, and the assistant replies exactly as the gateway returned them) and the ids of its last turn (prompt +
sampled response). A new request *extends* the segment when its messages start with the segment's messages (the
assistant ones equal to what was sampled: content and tool calls by name and arguments; tool-call ids, ``null``
versus ``""`` contents and fields such as ``refusal`` are not compared) and its tools are the same; its prompt is
then the recorded ids, the sampled response as sampled, and only the new messages encoded on the orchestrator's path
(:func:`agent_rl.rollout.prompts.encoding.continuation_ids`, spliced by
:func:`agent_rl.rollout.replies.splice_followup`). Any other request (history edited, truncated, re-ordered,
tools changed) starts a new segment, rendered whole (:func:`agent_rl.rollout.prompts.render`), and is counted as a
prefix break: never silently merged.

Every call is one :class:`~agent_rl.types.Turn` (prompt ids as the engine saw them, response ids and log-probs as
sampled), so the rows of an episode are built by :func:`agent_rl.rollout.build_rollout_batch` exactly as for
orchestrated episodes (per-turn rows, or in full-trajectory mode one row per segment; only sampled tokens carry
``response_mask`` 1).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from agent_rl.rollout.replies import splice_followup
from agent_rl.rollout.prompts import render
from agent_rl.rollout.prompts.encoding import continuation_ids, encode_data
from agent_rl.rollout.tool_calls import TemplateTools, ToolCallFormat, tool_messages
from agent_rl.types import Turn
from envs.hosting.jsonable import lone_surrogate, scrub_text
from envs.jsondepth import JSONTooDeep, loads_bounded

Message = dict[str, Any]


class RequestError(ValueError):
    """A request the gateway refuses (HTTP 400 with ``code``, and ``param``: the field at fault, when one is);
    nothing of the episode changes."""

    def __init__(self, message: str, code: str = "invalid_request", status: int = 400,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.param = code, status, param


def _arguments(value: Any) -> dict[str, Any]:
    """A tool call's arguments as a dict (OpenAI sends them as a JSON string), parsed under the bounds of a body:
    nested at most ``MAX_JSON_DEPTH`` deep (counted before parsing), valid Unicode (no escaped lone surrogate).

    Raises:
        RequestError: 400 ``invalid_tool_arguments`` (not a JSON object, too deep) or ``invalid_text``."""
    if isinstance(value, dict):
        parsed: Any = value
    elif value is None or (isinstance(value, str) and not value.strip()):
        return {}
    else:
        try:
            parsed = loads_bounded(str(value), where="a tool call's arguments")
        except JSONTooDeep as exc:
            raise RequestError(str(exc), "invalid_tool_arguments") from None
        except ValueError:
            raise RequestError(f"a tool call's arguments are not a JSON object: {scrub_text(str(value)[:80])!r}",
                               "invalid_tool_arguments") from None
    if not isinstance(parsed, dict):
        raise RequestError(f"a tool call's arguments must be a JSON object, got {type(parsed).__name__}",
                           "invalid_tool_arguments")
    found = lone_surrogate(parsed, "a tool call's arguments")
    if found:
        raise RequestError(found, "invalid_text")
    return parsed


def normalize_message(m: dict[str, Any]) -> Message:
    """One client message in the form the chat template and the prefix match use: ``role`` (``developer`` is
    ``system``), ``content`` a str (text parts joined, ``None`` -> ``""``), ``tool_calls`` as ``[{"type":
    "function", "function": {"name", "arguments": dict}}]`` (ids dropped), ``tool_call_id`` and ``name`` kept.

    Raises:
        RequestError: a content part that is not text (images, audio), a tool call without a function name.
    """
    role = m.get("role")
    role = "system" if role == "developer" else role
    content = m.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError("only text content parts are supported (type=text)", "unsupported_content")
            texts.append(part["text"])
        content = "".join(texts)
    out: Message = {"role": role, "content": "" if content is None else str(content)}
    calls = m.get("tool_calls") or []
    if calls:
        out["tool_calls"] = []
        for c in calls:
            fn = (c or {}).get("function") or {}
            if not isinstance(fn.get("name"), str) or not fn["name"]:
                raise RequestError("a tool call has no function name")
            out["tool_calls"].append({"type": "function", "function": {"name": fn["name"],
                                                                       "arguments": _arguments(fn.get("arguments"))}})
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            out[key] = str(m[key])
    return out


BREAK_CAUSES = ("tools_changed", "history_truncated", "reply_rewritten", "history_edited", "text_edited")
"""Why a request did not extend its segment (``gateway/prefix_breaks/<cause>``): its tools differ, it has no more
messages than the segment, the last reply differs beyond a known normalisation (:meth:`PromptBuilder.prompt`), an
earlier message differs, a ``/v1/completions`` prompt does not start with the segment's text."""


@dataclass
class Segment:
    """A run of calls that extend each other: ``messages`` (normalized, the assistant replies as returned),
    ``tools`` and ``ids`` (the last turn's prompt + response ids); ``stops``: the stop strings of the last reply
    (a client that appends one to the reply still extends the segment)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    ids: list[int]
    response_ids: list[int]
    prompt_ids: list[int]
    stops: tuple[str, ...] = ()


@dataclass
class Match:
    """How a request relates to its session's current segment (:meth:`PromptBuilder.prompt`).

    Attributes:
        extends: the request continues the segment (its prompt starts with the recorded ids).
        cause: why it does not (one of :data:`BREAK_CAUSES`; None for the first segment or a restart).
        detail: the first differing message, sent and recorded (for the run's log).
        rewrite: the normalisation under which the last reply matched (``strip``, ``stop``), else None.
        suffix: text the client appended to the last reply (a stop string), encoded after the sampled ids.
        restart: the request extends the conversation, but the last reply ended on an end token the client's text
            does not render (an EOS the template does not write, or any EOS on ``/v1/completions``): the prompt is
            the recorded ids without it, and a new segment starts (its turns cannot extend the reply's row).
    """

    extends: bool
    cause: str | None = None
    detail: str = ""
    rewrite: str | None = None
    suffix: str = ""
    restart: bool = False


@dataclass
class GatewaySession:
    """One episode seen through the gateway.

    Attributes:
        session_id: the key of the episode (``X-Session-ID`` or ``/sessions/<id>/v1``).
        api_key: the session's own bearer token (a program holds its own episode's key only).
        temperature, is_high, repetition_penalty: sampling of every call, set by the trainer (the group's slot).
        key: ``(group id, slot)`` of the row seeds (``row_seed(rollout seed, group, slot, call)``).
        episode_id: the engine's cache key of the episode (``engine.kv_reuse``).
        env_session: the env session the program may step through the gateway (``/env/sessions/<id>/step``).
        turns: one :class:`~agent_rl.types.Turn` per call, in order (``info["segment"]``: its segment).
        prefix_breaks: requests that did not extend the current segment (each started a new one); ``breaks``: their
            count by cause (:data:`BREAK_CAUSES`), ``rewrites``: requests that extended it under a normalisation.
        ignored: the client's sampling fields the trainer's rule replaced, one dict per call: name -> size of the
            value as JSON (bytes; never the value).
        responses: ``/v1/responses`` ids of the session -> the conversation after them (``previous_response_id``).
        reward_closed: the reward is posted and later calls are refused (training; the standalone gateway closes
            the session instead).
        reward, reward_info: posted by the program (``POST /sessions/<id>/reward``), None until then.
        env_reward, env_won, env_done: what the env said to the program's steps through the gateway.
    """

    session_id: str
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    temperature: float = 1.0
    is_high: bool = False
    repetition_penalty: float = 1.0
    key: tuple[int, ...] = (0, 0)
    episode_id: str = ""
    env_session: str | None = None
    policy_version: int = 0
    max_requests: int = 64
    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    prefix_breaks: int = 0
    breaks: dict[str, int] = field(default_factory=dict)
    rewrites: int = 0
    requests: int = 0
    ignored: list[dict[str, int]] = field(default_factory=list)
    responses: dict[str, tuple[list[Message], list[dict[str, Any]] | None]] = field(default_factory=dict)
    reward_closed: bool = False
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    env_reward: float = 0.0
    env_steps: int = 0
    env_won: bool | None = None
    env_done: bool = False
    closed: bool = False
    created: float = field(default_factory=time.time)
    busy: bool = False


def _same(a: Message, b: Message) -> bool:
    """Prefix equality of two normalized messages (contents exactly; tool calls by name and arguments, compared as
    JSON: ``1``, ``1.0`` and ``true`` are equal in Python, not in what the policy wrote)."""
    return a == b and json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _max_token_bytes(tokenizer: Any) -> int:
    """The most UTF-8 bytes a single token decodes to (0 when the tokenizer has no vocabulary to read). A vocabulary
    entry spells at least the bytes it decodes to (byte-level BPE: one character per byte; sentencepiece: ``▁`` for a
    space; byte fallback: ``<0xE9>``), so entries are decoded longest first until no longer one can win."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    best = 0
    for piece, token_id in sorted(vocab.items(), key=lambda kv: -len(str(kv[0]).encode("utf-8", "replace"))):
        if len(str(piece).encode("utf-8", "replace")) <= best:
            break
        best = max(best, len(tokenizer.decode([token_id]).encode("utf-8", "replace")))
    return best


class PromptBuilder:
    """Prompt ids of a request in its session (module docstring), with the model's tokenizer and tool-call format.

    Args:
        tokenizer: the engine's tokenizer.
        tool_format: ``model.tool_call_format`` (renders past calls and tools for templates that cannot).
        eos_ids: ids that end a response (a sampled one closes the assistant turn: not written twice).
    """

    def __init__(self, tokenizer: Any, tool_format: ToolCallFormat, eos_ids: set[int]) -> None:
        self.tokenizer, self.tool_format, self.eos_ids = tokenizer, tool_format, set(eos_ids)
        self.caps = TemplateTools.of(tokenizer)
        self.max_token_bytes = _max_token_bytes(tokenizer)
        """The most UTF-8 bytes one token decodes to (0: unknown, no bound)."""

    def fewest_tokens(self, texts: Sequence[str]) -> int:
        """A lower bound on the tokens ``texts`` encode to, without encoding them (bytes / :attr:`max_token_bytes`):
        a request far over the prompt budget is refused before the tokenizer spends seconds on it."""
        if not self.max_token_bytes:
            return 0
        return sum(len(t.encode("utf-8")) for t in texts) // self.max_token_bytes

    def full(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
        """Ids of a whole conversation (a new segment), as the orchestrator's first turn renders one."""
        msgs, render_tools = tool_messages(messages, tools or [], self.tokenizer, self.tool_format)
        return render(self.tokenizer, msgs, tools=render_tools)

    def continuation(self, seg: Segment, new: list[Message], match: Match) -> list[int]:
        """Ids of ``new`` messages after the segment's recorded ids (the sampled response spliced as sampled, then
        ``match.suffix`` as context); with ``match.restart`` set here when the response's last id is an EOS the
        template does not write after it (the prompt then takes the response without it)."""
        msgs, _ = tool_messages(new, [], self.tokenizer, self.tool_format)
        tail = continuation_ids(self.tokenizer, msgs, tools=seg.tools if (seg.tools and self.caps.tools) else None)
        response = list(seg.response_ids)
        if response and response[-1] in self.eos_ids and tail[:1] != response[-1:]:
            match.restart, match.extends = True, False
            response = response[:-1]
        if match.suffix:
            response += encode_data(self.tokenizer, match.suffix)
        return splice_followup(seg.prompt_ids, response, tail, self.eos_ids)

    def match(self, seg: Segment | None, messages: list[Message], tools: list[dict[str, Any]] | None) -> Match:
        """How ``messages`` relate to ``seg`` (:class:`Match`). They extend it when they hold more messages, the
        same tools, every earlier message the same (:func:`_same`) and the segment's last reply either the same or
        the same under one normalisation a client library applies: its content stripped of surrounding whitespace
        (``strip``), or with one of the reply's stop strings appended (``stop``: the suffix is then context after
        the sampled ids). A tool call re-serialised (arguments' whitespace, key order, a string or an object) is the
        same call already (:func:`normalize_message`)."""
        if seg is None:
            return Match(False)
        if (tools or None) != seg.tools:
            return Match(False, "tools_changed", "the request's tools differ from the segment's")
        n = len(seg.messages)
        for i, (sent, rec) in enumerate(zip(messages, seg.messages)):
            if _same(sent, rec):
                continue
            if i == n - 1 and rec.get("role") == "assistant" and sent.get("role") == "assistant":
                rewrite = self._rewrite(sent, rec, seg)
                if rewrite is not None and len(messages) > n:
                    return Match(True, rewrite=rewrite[0], suffix=rewrite[1])
                return Match(False, "reply_rewritten", _diff(i, sent, rec))
            return Match(False, "history_edited", _diff(i, sent, rec))
        if len(messages) <= n:
            return Match(False, "history_truncated", f"{len(messages)} messages sent, the segment has {n}")
        return Match(True)

    def _rewrite(self, sent: Message, rec: Message, seg: Segment) -> tuple[str, str] | None:
        """``(normalisation, appended suffix)`` under which ``sent`` is the recorded reply ``rec``, or None."""
        rest = {k: v for k, v in sent.items() if k != "content"}
        if not _same(rest, {k: v for k, v in rec.items() if k != "content"}):
            return None
        a, b = sent["content"], rec["content"]
        if a.strip() == b.strip():
            return "strip", ""
        ended_on_eos = bool(seg.response_ids) and seg.response_ids[-1] in self.eos_ids
        for stop in seg.stops:
            if not ended_on_eos and a.rstrip().endswith(stop) and a.rstrip()[:-len(stop)].strip() == b.strip():
                return "stop", stop
        return None

    def prompt(self, session: GatewaySession, messages: list[Message],
               tools: list[dict[str, Any]] | None) -> tuple[list[int], Match]:
        """``(prompt ids, match)`` of a request (:meth:`match`): the recorded ids spliced when it extends the
        segment, else the whole conversation rendered (a new segment: the first, a restart or a prefix break)."""
        if not messages:
            raise RequestError("messages is empty")
        seg = session.segments[-1] if session.segments else None
        match = self.match(seg, messages, tools)
        if match.extends:
            assert seg is not None
            return self.continuation(seg, messages[len(seg.messages):], match), match
        return self.full(messages, tools), match

    @staticmethod
    def record(session: GatewaySession, messages: list[Message], tools: list[dict[str, Any]] | None,
               match: Match, prompt_ids: list[int], reply: Message, turn: Turn,
               stops: Sequence[str] = ()) -> None:
        """Keep a served call: its turn, and the segment it extends or starts (the reply as the next prefix;
        ``stops``: the call's stop strings)."""
        if not match.extends:
            if session.segments and not match.restart:
                session.prefix_breaks += 1
                cause = match.cause or "history_edited"
                session.breaks[cause] = session.breaks.get(cause, 0) + 1
            session.segments.append(Segment([], tools or None, [], [], []))
        elif match.rewrite is not None:
            session.rewrites += 1
        seg = session.segments[-1]
        if session.turns and (match.extends or match.restart):  # the previous turn's observation: what followed it
            done = len(seg.messages) if match.extends else len(session.segments[-2].messages)
            session.turns[-1].observation = "\n".join(m["content"] for m in messages[done:])
        seg.messages = list(messages) + [reply]
        seg.prompt_ids, seg.response_ids = list(prompt_ids), list(turn.response_ids)
        seg.ids = list(prompt_ids) + list(turn.response_ids)
        seg.stops = tuple(stops)
        turn.segment = turn.info["segment"] = len(session.segments) - 1
        if match.rewrite is not None:
            turn.info["history_rewrite"] = match.rewrite
        session.turns.append(turn)


def _short(m: Message) -> str:
    return json.dumps(m, ensure_ascii=False, default=str)[:300]


def _diff(i: int, sent: Message, rec: Message) -> str:
    return f"message {i} differs: sent {_short(sent)}, recorded {_short(rec)}"


def reply_message(content: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> Message:
    """The normalized assistant message of a reply (what the next request must repeat to extend the segment)."""
    msg: Message = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return msg
