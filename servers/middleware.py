"""Pure-ASGI request-body guard, in front of every HTTP route (our session API, OpenEnv, MCP): 413 for bodies over
the limit (before reading them whole), 422 for bodies that are not valid UTF-8 (FastAPI would answer those 400),
400 ``json_too_deep`` for JSON nested deeper than the limit (counted before parsing: deep JSON raised RecursionError
in the parser, in pickling to the worker or in the 422 handler, a plain-text 500), 400 ``invalid_json`` for a body
that is not JSON. The body is read once, bounded, and replayed to the app."""

from __future__ import annotations

import json
from typing import Any, Callable

from envs.jsondepth import MAX_JSON_DEPTH, json_depth

__all__ = ["BodyGuardMiddleware"]


async def _send_json(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyGuardMiddleware:
    """Reject request bodies larger than ``max_body_bytes`` (413), not valid UTF-8 (422), nested deeper than
    ``max_json_depth`` (400 ``json_too_deep``) or not JSON (400 ``invalid_json``); an empty body passes (routes
    whose body is optional). ``render(status, code, message)``: the JSON body of a refusal in the server's own error
    shape (the gateway's OpenAI shape); default ``{"detail", "code"}``."""

    def __init__(self, app: Any, max_body_bytes: int, max_json_depth: int = MAX_JSON_DEPTH,
                 render: Callable[[int, str, str], Any] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.render = render

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_large = self._body(413, "body_too_large", f"request body larger than {self.max_body_bytes} bytes")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _send_json(send, 413, too_large)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _send_json(send, 413, too_large)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            message = f"request body is not valid UTF-8: {exc.reason}"
            await _send_json(send, 422, self.render(422, "invalid_utf8", message) if self.render is not None else
                             {"detail": [{"type": "json_invalid", "loc": ["body", exc.start], "msg": message,
                                          "input": None}]})
            return
        if body.strip():
            depth = json_depth(body, self.max_json_depth)
            if depth > self.max_json_depth:
                await _send_json(send, 400, self._body(400, "json_too_deep", f"request body nested deeper than "
                                                       f"{self.max_json_depth} levels (refused before parsing)"))
                return
            try:
                json.loads(body)
            except ValueError as exc:
                await _send_json(send, 400, self._body(400, "invalid_json", f"request body is not JSON: {exc}"))
                return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _body(self, status: int, code: str, message: str) -> Any:
        if self.render is not None:
            return self.render(status, code, message)
        return {"detail": message, "code": code}
