"""The OpenAI Responses API (``POST /v1/responses``) as the gateway's chat calls: the request's ``input`` items and
``instructions`` become chat messages, its function tools chat tools, and the reply comes back as ``output`` items,
so a call is served and recorded exactly as a chat completion (:meth:`agent_rl.gateway.app.Gateway.serve_call`).

- ``input``: a string (one user message) or items: messages (``role`` user/system/developer/assistant, ``content`` a
  string or ``input_text``/``output_text`` parts), ``function_call`` items (an assistant message's tool calls;
  consecutive ones and the assistant text before them are one message, as the reply that made them) and
  ``function_call_output`` items (``tool`` messages). Other items (reasoning, images, files, built-in tools) are
  400 ``unsupported_content``.
- ``previous_response_id``: a response of the same session; its conversation (input and output) comes first.
  ``instructions`` are not carried over (as OpenAI's): each request's own instructions are its system message.
- ``tools``: ``{"type": "function", "name", "description", "parameters", "strict"}`` only.
- Streaming (``stream=true``): the reply is generated whole, then sent as the Responses events (``response.created``,
  ``response.output_item.added``, ``response.output_text.delta``, ..., ``response.completed``).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, AsyncIterator

from agent_rl.gateway.recorder import Message, RequestError

MAX_STORED_RESPONSES = 256
"""Responses kept per session for ``previous_response_id`` (the oldest dropped first)."""


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of text parts", "unsupported_content")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") or \
                not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RequestError(f"{where}: only text parts are supported (input_text, output_text), got {kind!r}",
                               "unsupported_content")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Chat messages (wire form, for :func:`agent_rl.gateway.recorder.normalize_message`) of a Responses ``input``.

    Raises:
        RequestError: an item the gateway does not serve (400 ``unsupported_content``) or a malformed one.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError("input: a string or a list of items", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where}: an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{where}: role {role!r} is not user, system, developer or assistant",
                                   param="input")
            out.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments", "")
            if not isinstance(name, str) or not name or not isinstance(arguments, str):
                raise RequestError(f"{where}: a function_call needs a name and arguments (a JSON string)",
                                   param="input")
            call = {"id": str(item.get("call_id") or ""), "type": "function",
                    "function": {"name": name, "arguments": arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the reply's text and its calls: one message
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                        "content": _text_of(output, where) if not isinstance(output, str) else output})
        else:
            raise RequestError(f"{where}: items of type {str(kind)[:64]!r} are not served (message, function_call "
                               "and function_call_output are)", "unsupported_content", param="input")
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Chat tools of the Responses ``tools`` (function tools only; 400 ``unsupported_parameter`` otherwise): a
    tool's ``description``, ``parameters`` and ``strict`` become its chat ``function``'s, so the same tools render
    the same prompt over either API (``strict`` is rendered with the tool, not enforced: no constrained decoding)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools: a list", "unsupported_parameter", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(f"tools[{i}]: only function tools are served, got {str(kind)[:64]!r}",
                               "unsupported_parameter", param="tools")
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            raise RequestError(f"tools[{i}].strict: true or false", param="tools")
        fn = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):  # chat's function fields, in chat's order
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def conversation(session: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's whole conversation: its instructions (a system message), the conversation of
    ``previous_response_id`` (the same session's), then its ``input``.

    Raises:
        RequestError: 400 ``previous_response_not_found`` for an id that is not one of the session's responses.
    """
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        if not isinstance(body["instructions"], str):
            raise RequestError("instructions: a string", param="instructions")
        messages.append({"role": "system", "content": body["instructions"]})
    prev = body.get("previous_response_id")
    if prev is not None:
        stored = session.responses.get(prev) if isinstance(prev, str) else None
        if stored is None:
            raise RequestError(f"previous_response_id: no response {str(prev)[:64]!r} in this session",
                               "previous_response_not_found", param="previous_response_id")
        messages += [dict(m) for m in stored]
    return messages + input_messages(body.get("input", []))


def remember(session: Any, response_id: str, messages: list[Message], reply: dict[str, Any]) -> None:
    """Keep the conversation after ``response_id`` (``messages``: without the request's ``instructions``, which a
    later request does not inherit) for a later ``previous_response_id``."""
    kept = list(messages) + [reply]
    session.responses[response_id] = kept
    while len(session.responses) > MAX_STORED_RESPONSES:
        session.responses.pop(next(iter(session.responses)))


def response_object(body: dict[str, Any], served: Any, sampling: dict[str, Any]) -> dict[str, Any]:
    """The Responses API ``response`` object of a served call (``served``: :class:`agent_rl.gateway.app.Served`)."""
    output: list[dict[str, Any]] = []
    if served.content or not served.calls:
        part: dict[str, Any] = {"type": "output_text", "text": served.content, "annotations": []}
        if served.logprobs is not None:
            part["logprobs"] = served.logprobs
        output.append({"type": "message", "id": f"msg_{secrets.token_hex(12)}", "status": "completed",
                       "role": "assistant", "content": [part]})
    for call in served.calls:
        output.append({"type": "function_call", "id": f"fc_{secrets.token_hex(12)}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    incomplete = served.finish_reason == "length"
    return {"id": served.response_id, "object": "response", "created_at": int(time.time()),
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
            "model": body.get("model") or "policy", "output": output, "instructions": body.get("instructions"),
            "previous_response_id": body.get("previous_response_id"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "temperature": sampling["temperature"], "top_p": sampling["top_p"],
            "max_output_tokens": body.get("max_output_tokens"), "text": {"format": {"type": "text"}},
            "truncation": "disabled", "metadata": body.get("metadata") or {}, "store": True,
            "usage": {"input_tokens": served.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": served.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": served.prompt_tokens + served.completion_tokens},
            "agent_rl_sampling": sampling}


def _event(kind: str, seq: int, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **data}, ensure_ascii=False)}" \
        "\n\n".encode()


async def response_events(response: dict[str, Any], pieces: int = 16) -> AsyncIterator[bytes]:
    """``response`` as the Responses stream events, the text in pieces of ``pieces`` characters."""
    seq = 0

    def ev(kind: str, **data: Any) -> bytes:
        nonlocal seq
        seq += 1
        return _event(kind, seq - 1, **data)

    shell = {**response, "status": "in_progress", "output": [], "usage": None}
    yield ev("response.created", response=shell)
    yield ev("response.in_progress", response=shell)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            yield ev("response.output_item.added", output_index=index,
                     item={**item, "status": "in_progress", "content": []})
            yield ev("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                     part={"type": "output_text", "text": "", "annotations": []})
            text = part["text"]
            for start in range(0, len(text), pieces):
                yield ev("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                         delta=text[start:start + pieces], logprobs=[])
            yield ev("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                     logprobs=part.get("logprobs") or [])
            yield ev("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                     part=part)
        else:
            yield ev("response.output_item.added", output_index=index,
                     item={**item, "status": "in_progress", "arguments": ""})
            yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                     delta=item["arguments"])
            yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                     arguments=item["arguments"], name=item["name"])
        yield ev("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield ev(final, response=response)
