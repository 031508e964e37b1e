"""The run's key on every route of a ``vllm serve`` the run starts: a pure ASGI middleware, loaded by vLLM's own
``--middleware agent_rl_vllm_guard.BearerGuard`` option (vLLM 0.32, ``vllm/entrypoints/serve/middleware/register.py``:
a class is added with ``app.add_middleware``, outside vLLM's own middlewares).

vLLM's ``--api-key`` (``AuthenticationMiddleware``) checks only paths under ``/v1``, ``/v2``, ``/inference`` and
``/cohere``; the dev routes the engine needs (``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/collective_rpc``,
``/update_weights``, ``/update_weight_version``...), ``/metrics`` and ``/health`` answer anyone. This middleware sits
in front of the whole ASGI app instead, so it sees every HTTP request and WebSocket handshake whatever its path or
method (OPTIONS included), routes added after it included: a request passes only with ``Authorization: Bearer KEY``
(one such header; KEY compared in constant time), else HTTP 401 (a WebSocket handshake: closed, which the server
answers 403). The key is the server's ``VLLM_API_KEY`` (its environment, never its argv); without one the app fails
to start rather than serve unguarded.

Stdlib only: it is imported by the Python that runs vLLM (the servers' ``PYTHONPATH`` is this module's folder alone).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any, Awaitable, Callable

KEY_ENV = "VLLM_API_KEY"
_BODY = json.dumps({"error": {"message": "this server answers only the run that started it: send its key as "
                                         "'Authorization: Bearer KEY'", "type": "unauthorized", "code": 401}}).encode()


class BearerGuard:
    """ASGI middleware: ``scope`` of type ``http`` or ``websocket`` passes to ``app`` only with the key (module
    docstring); other scopes (``lifespan``) pass unchanged.

    Raises:
        RuntimeError: ``VLLM_API_KEY`` is unset or empty (at construction: the server does not start).
    """

    def __init__(self, app: Callable[..., Awaitable[None]], key: str | None = None) -> None:
        key = os.environ.get(KEY_ENV, "") if key is None else key
        if not key:
            raise RuntimeError(f"agent_rl_vllm_guard: {KEY_ENV} is unset: refusing to serve without a key")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether ``headers`` (ASGI: lower-case names) hold exactly one ``Authorization: Bearer KEY``."""
        values = [v for k, v in headers if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(hashlib.sha256(token.strip()).digest(), self._digest)

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(list(scope.get("headers") or [])):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _BODY})
