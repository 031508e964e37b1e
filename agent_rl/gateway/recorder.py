"""What the gateway keeps per episode: the exact ids it sampled, matched to the client's messages.

An agent program sends its whole conversation with every request. The gateway never re-tokenizes what the policy
wrote: each session (one episode) keeps *segments*; a segment holds the messages of the conversation so far (the
client's, and the assistant replies exactly as the gateway returned them) and the ids of its last turn (prompt +
sampled response). A new request *extends* the segment when its messages start with the segment's messages (the
assistant ones equal to what was sampled: content and tool calls by name and arguments; tool-call ids, ``null``
versus ``""`` contents and fields such as ``refusal`` are not compared) and its tools are the same; its prompt is
then the recorded ids, the sampled response as sampled, and only the new messages encoded on the orchestrator's path
(:func:`agent_rl.rollout.prompts.encoding.continuation_ids`, spliced by
:func:`agent_rl.rollout.orchestrator.splice_followup`). Any other request (history edited, truncated, re-ordered,
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

from agent_rl.rollout.orchestrator import splice_followup
from agent_rl.rollout.prompts import render
from agent_rl.rollout.prompts.encoding import continuation_ids
from agent_rl.rollout.tools import TemplateTools, ToolCallFormat, tool_messages
from agent_rl.types import Turn

Message = dict[str, Any]


class RequestError(ValueError):
    """A request the gateway refuses (HTTP 400 with ``code``); nothing of the episode changes."""

    def __init__(self, message: str, code: str = "invalid_request", status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status


def _arguments(value: Any) -> dict[str, Any]:
    """A tool call's arguments as a dict (OpenAI sends them as a JSON string)."""
    if isinstance(value, dict):
        return value
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        raise RequestError(f"a tool call's arguments are not a JSON object: {str(value)[:80]!r}") from None
    if not isinstance(parsed, dict):
        raise RequestError(f"a tool call's arguments must be a JSON object, got {type(parsed).__name__}")
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


@dataclass
class Segment:
    """A run of calls that extend each other: ``messages`` (normalized, the assistant replies as returned),
    ``tools`` and ``ids`` (the last turn's prompt + response ids)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    ids: list[int]
    response_ids: list[int]
    prompt_ids: list[int]


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
        prefix_breaks: requests that did not extend the current segment (each started a new one).
        ignored: the client's sampling fields that were recorded and not applied, one dict per call.
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
    requests: int = 0
    ignored: list[dict[str, Any]] = field(default_factory=list)
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

    def continuation(self, seg: Segment, new: list[Message]) -> list[int]:
        """Ids of ``new`` messages after the segment's recorded ids (the sampled response spliced as sampled)."""
        msgs, _ = tool_messages(new, [], self.tokenizer, self.tool_format)
        tail = continuation_ids(self.tokenizer, msgs, tools=seg.tools if (seg.tools and self.caps.tools) else None)
        return splice_followup(seg.prompt_ids, seg.response_ids, tail, self.eos_ids)

    def prompt(self, session: GatewaySession, messages: list[Message],
               tools: list[dict[str, Any]] | None) -> tuple[list[int], bool]:
        """``(prompt ids, extends)`` of a request: ``extends`` False = a new segment (the first, or a prefix
        break)."""
        if not messages:
            raise RequestError("messages is empty")
        seg = session.segments[-1] if session.segments else None
        if seg is not None and (tools or None) == seg.tools and len(messages) > len(seg.messages) and all(
                _same(a, b) for a, b in zip(messages, seg.messages)):
            new = messages[len(seg.messages):]
            return self.continuation(seg, new), True
        return self.full(messages, tools), False

    @staticmethod
    def record(session: GatewaySession, messages: list[Message], tools: list[dict[str, Any]] | None,
               extends: bool, prompt_ids: list[int], reply: Message, turn: Turn) -> None:
        """Keep a served call: its turn, and the segment it extends or starts (the reply as the next prefix)."""
        if not extends:
            if session.segments:
                session.prefix_breaks += 1
            session.segments.append(Segment([], tools or None, [], [], []))
        seg = session.segments[-1]
        if session.turns and extends:  # the previous turn's observation: what the client sent after it
            session.turns[-1].observation = "\n".join(m["content"] for m in messages[len(seg.messages):])
        seg.messages = list(messages) + [reply]
        seg.prompt_ids, seg.response_ids = list(prompt_ids), list(turn.response_ids)
        seg.ids = list(prompt_ids) + list(turn.response_ids)
        turn.segment = turn.info["segment"] = len(session.segments) - 1
        session.turns.append(turn)


def reply_message(content: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> Message:
    """The normalized assistant message of a reply (what the next request must repeat to extend the segment)."""
    msg: Message = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return msg
