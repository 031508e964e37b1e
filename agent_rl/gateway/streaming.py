"""Server-sent events of a reply the gateway generated whole: chat completion chunks and completion chunks (the
Responses API's events are :func:`agent_rl.gateway.responses.response_events`)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator


def sse(obj: Any) -> bytes:
    """One ``data:`` event of ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def pieces(text: str, size: int = 16) -> list[str]:
    """``text`` in chunks of ``size`` characters."""
    return [text[i:i + size] for i in range(0, len(text), size)]


async def chat_chunks(result: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """The chat completion ``result`` as OpenAI stream chunks: the role, the content in pieces, the tool calls
    (one chunk each, arguments whole), the finish reason, the usage when asked, ``[DONE]``."""
    base = {k: result[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = result["choices"][0]
    msg = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                         "logprobs": logprobs}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in pieces(msg.get("content") or ""):
        yield chunk({"content": piece})
    for i, call in enumerate(msg.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, choice["finish_reason"], choice.get("logprobs"))  # the sampled tokens' log-probs, all at once
    if include_usage:
        yield sse({**base, "choices": [], "usage": result["usage"]})
    yield b"data: [DONE]\n\n"


async def completion_chunks(result: dict[str, Any]) -> AsyncIterator[bytes]:
    """The text completion ``result`` as stream chunks: the text in pieces, the finish reason, ``[DONE]``."""
    choice = result["choices"][0]
    base = {k: result[k] for k in ("id", "object", "created", "model")}
    for piece in pieces(choice["text"]):
        yield sse({**base, "choices": [{"index": 0, "text": piece, "finish_reason": None, "logprobs": None}]})
    yield sse({**base, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"],
                                    "logprobs": None}]})
    yield b"data: [DONE]\n\n"
