"""Who may call the env server, and what each caller reaches: one gate in front of every surface (our routes, the
docs and schema pages, OpenEnv's HTTP and WebSocket routes, MCP) and one view of the sessions per caller.

- **Clients.** A server started with tokens (``--token``: one client, named ``default``; ``--token-file``: one
  ``name: token`` a line) tells its clients apart by the token each request carries: ``Authorization: Bearer
  <token>``, or HTTP Basic with the token as password (any user name; what openenv-core's client sends for a URL
  ``http://user:<token>@host/...``). An empty credential never authenticates, and an empty token is refused at
  start (``servers.tokens.check_tokens``). A server without tokens has one client, ``servers.tokens.LOCAL_CLIENT``,
  and then serves only
  loopback: ``servers.serve`` refuses a non-loopback ``--host``, and :class:`AccessGate` answers 421
  ``host_not_allowed`` to a ``Host`` header that is not a loopback name or address (a DNS-rebinding page reaches
  the server under its own host name).
- **Browsers.** A request with an ``Origin`` header (every browser's WebSocket, and its cross-site POSTs) is
  refused with 403 ``origin_not_allowed`` unless the origin is the server's own (``http(s)://`` + its ``Host``)
  or allowed by ``--allow-origin``, with or without tokens (a browser may hold Basic credentials for the docs).
  MCP's own DNS-rebinding protection (the ``mcp`` SDK's ``TransportSecuritySettings``) is on when there is no token.
- **Ownership.** A session belongs to the client that opened it, on every surface; another client's step, reset,
  state, info or close of it is 404 ``session_not_found`` (the same answer as for an id that does not exist, so a
  client learns nothing of others' sessions), and ``GET /sessions`` lists the caller's own. Session ids are each
  client's own namespace (:func:`scoped`): a client-chosen id another client holds is free for this one (no 409
  ``session_exists`` tells it the other's id is live, and no client can take an id before another). A surface of one env
  (``/envs/<env id>/...``: OpenEnv, MCP) reaches only that env's sessions (:class:`ClientSessions`).

Only ``GET /health`` and the OpenEnv ``GET {path}/health`` answer without a credential (container health checks).
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from envs.hosting import Session, SessionExists, SessionManager, SessionNotFound, SnapshotNotFound
from envs.hosting.errors import UnknownEnv
from envs.hosting.pool import StepReply
from servers.tokens import LOCAL_CLIENT, client_of, is_loopback_host

__all__ = ["CLIENT_KEY", "AccessGate", "ClientSessions", "mcp_loopback_security", "scoped", "unscoped"]

#: The ASGI scope key where :class:`AccessGate` puts the caller's client name.
CLIENT_KEY = "agent_rl.client"

_DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


def mcp_loopback_security() -> Any:
    """The ``mcp`` SDK's DNS-rebinding protection for a server without tokens: loopback ``Host`` values only (any
    port), and loopback origins (the gate before it allows only the server's own origin and ``--allow-origin``)."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = ["127.0.0.1", "localhost", "[::1]"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=[h for n in names for h in (n, f"{n}:*")],
        allowed_origins=[o for n in names for s in ("http", "https") for o in (f"{s}://{n}", f"{s}://{n}:*")])


# ------------------------------------------------------------------------------------------------ the gate
#: headers the gate decides on: sent twice, a request is refused (400 ``duplicate_header``), never read first-wins
_SINGLE_HEADERS = ("host", "origin", "authorization")


class AccessGate:
    """Pure-ASGI gate of every HTTP request and WebSocket handshake (see the module docstring): ``Host`` (no
    tokens), ``Origin``, then the credential; the caller's client name goes to ``scope[CLIENT_KEY]``. A refusal is
    ``{"detail", "code"}`` JSON, or ``render(status, code, message)`` (the server's own error shape: the gateway's
    OpenAI one); a WebSocket handshake gets it as its denial response."""

    def __init__(self, app: Any, settings: Any, render: Callable[[int, str, str], Any] | None = None) -> None:
        self.app = app
        self.settings = settings
        self.render = render

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        tokens = self.settings.clients()
        host, origin = headers.get("host"), headers.get("origin")
        refusal: tuple[int, str, str, dict[str, str] | None] | None = None
        repeated = [name for name in _SINGLE_HEADERS if len(headers.getlist(name)) > 1]
        if repeated:  # ambiguous: a proxy may read the last, we would read the first (RFC 9110 allows one)
            refusal = (400, "duplicate_header", f"the {', '.join(repeated)} header is sent more than once (one "
                                                "is allowed)", None)
        elif not tokens and not is_loopback_host(host):
            refusal = (421, "host_not_allowed", f"Host {host!r} is not a loopback name or address: a server "
                                                "without a token serves only this machine's loopback", None)
        elif origin is not None and not self._origin_ok(origin, host):
            refusal = (403, "origin_not_allowed", f"Origin {origin!r} is not allowed (start the server with "
                                                  "--allow-origin to allow a browser page's origin)", None)
        else:
            path = scope.get("path", "")
            client = client_of(headers.get("authorization"), tokens)
            if client is None and not self._public(scope, path):
                scheme = 'Basic realm="agent_rl env server"' if path in _DOCS_PATHS else "Bearer"
                refusal = (401, "unauthorized", "missing or wrong token (Authorization: Bearer <token>, or Basic "
                                                "with the token as password)", {"WWW-Authenticate": scheme})
            scope[CLIENT_KEY] = client
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, detail, extra = refusal
        payload = self.render(status, code, detail) if self.render is not None else {"detail": detail, "code": code}
        response = JSONResponse(payload, status_code=status, headers=extra)
        if scope["type"] == "http":
            await response(scope, receive, send)
            return
        websocket = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            await websocket.send_denial_response(response)
        else:  # a server without the denial-response extension: close the handshake (HTTP 403)
            await websocket.close(code=1008, reason=code)

    def _origin_ok(self, origin: str, host: str | None) -> bool:
        allowed = self.settings.allowed_origins or []
        return origin in allowed or "*" in allowed or (
            bool(host) and origin in (f"http://{host}", f"https://{host}"))

    @staticmethod
    def _public(scope: dict[str, Any], path: str) -> bool:
        """The health checks: ``GET /health`` and each OpenEnv ``GET {path}/health``."""
        return scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and (
            path == "/health" or (path.startswith("/envs/") and path.endswith("/health")))


# ------------------------------------------------------------------------------------------------ sessions
def scoped(client: str, session_id: str) -> str:
    """The session manager's key of ``client``'s session ``session_id`` (client names hold no ``:``,
    ``servers.tokens.check_tokens``, so two clients' keys never meet)."""
    return f"{client}:{session_id}"


def unscoped(key: str) -> str:
    """The id a client knows its session by, from the manager's key (:func:`scoped`)."""
    return key.split(":", 1)[1]


class ClientSessions:
    """The sessions of one client (and, for a surface of one env, of that env only), over the server's
    :class:`SessionManager`: the only way a surface reaches sessions on a client's behalf.

    Each operation on a session id that is not the client's (or not of ``env_id``) raises ``SessionNotFound``,
    the same as for an id that does not exist (HTTP 404 ``session_not_found``), and leaves the session untouched.
    Ids are the client's own (the manager keys them :func:`scoped` by the client): another client's id is free.

    Args:
        manager: the server's session manager.
        client: the caller (``scope[CLIENT_KEY]``; :data:`servers.tokens.LOCAL_CLIENT` without tokens).
        env_id: the env of the surface (``/envs/<env id>/...``); ``None``: any served env (``/sessions``).
    """

    def __init__(self, manager: SessionManager, client: str, env_id: str | None = None) -> None:
        self.manager = manager
        self.client = client
        self.env_id = env_id

    def key(self, session_id: str) -> str:
        """The manager's key of the client's session ``session_id`` (:func:`scoped`)."""
        return scoped(self.client, session_id)

    def owns(self, session_id: str | None) -> bool:
        session = self.manager.sessions.get(self.key(session_id)) if session_id is not None else None
        return session is not None and session.owner == self.client and self.env_id in (None, session.env_id)

    def get(self, session_id: str) -> Session:
        """The client's live session, or ``SessionNotFound``."""
        if not self.owns(session_id):
            raise SessionNotFound(session_id)
        return self.manager.sessions[self.key(session_id)]

    def list(self) -> list[tuple[str, Session]]:
        """``(session id, session)`` of the client's live sessions (of ``env_id``, when set)."""
        mine = [unscoped(k) for k, s in self.manager.sessions.items() if s.owner == self.client and ":" in k]
        return [(sid, self.get(sid)) for sid in mine if self.owns(sid)]

    async def _opened(self, session_id: str | None, opening: Any) -> tuple[str, Any, dict[str, Any]]:
        sid = session_id or uuid.uuid4().hex
        try:
            _, observation, info = await opening(self.key(sid))
        except SessionExists:
            raise SessionExists(f"a live session has the id {sid!r}") from None
        return sid, observation, info

    async def create(self, env_id: str, *, session_id: str | None = None, **kwargs: Any
                     ) -> tuple[str, Any, dict[str, Any]]:
        """:meth:`SessionManager.create`, owned by the client (``session_id``: the client's choice, in its own
        namespace; default a new uuid4 hex); ``UnknownEnv`` for another env than ``env_id``."""
        if self.env_id is not None and env_id != self.env_id:
            raise UnknownEnv(f"env id {env_id!r} is not served at this path (it serves {self.env_id!r})")
        return await self._opened(session_id, lambda key: self.manager.create(
            env_id, owner=self.client, session_id=key, **kwargs))

    async def _on(self, session_id: str, call: Any) -> Any:
        """``call(key)`` on the client's session; ``SessionNotFound`` names the client's id."""
        self.get(session_id)
        try:
            return await call(self.key(session_id))
        except SessionNotFound:
            raise SessionNotFound(session_id) from None

    async def reset(self, session_id: str, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return await self._on(session_id, lambda key: self.manager.reset(key, **kwargs))

    async def step(self, session_id: str, action: Any) -> StepReply:
        return await self._on(session_id, lambda key: self.manager.step(key, action))

    async def info(self, session_id: str, what: str, params: Any = None) -> Any:
        return await self._on(session_id, lambda key: self.manager.info(key, what, params))

    async def close(self, session_id: str) -> None:
        await self._on(session_id, self.manager.close)

    # snapshots: another client's snapshot (or one of another env than ``env_id``) is ``SnapshotNotFound``, as one
    # that does not exist
    def owns_snapshot(self, snapshot_id: str) -> bool:
        snap = self.manager.snapshots.get(snapshot_id)
        return snap is not None and snap.owner == self.client and self.env_id in (None, snap.env_id)

    async def snapshot(self, session_id: str) -> str:
        """:meth:`SessionManager.snapshot` of the client's session (the snapshot is the client's)."""
        return await self._on(session_id, self.manager.snapshot)

    async def restore(self, snapshot_id: str, *, session_id: str | None = None) -> tuple[str, Any, dict[str, Any]]:
        """:meth:`SessionManager.restore` of the client's snapshot, the new session owned by the client."""
        if not self.owns_snapshot(snapshot_id):
            raise SnapshotNotFound(snapshot_id)
        return await self._opened(session_id, lambda key: self.manager.restore(
            snapshot_id, owner=self.client, session_id=key))

    async def drop_snapshot(self, snapshot_id: str) -> None:
        if not self.owns_snapshot(snapshot_id):
            raise SnapshotNotFound(snapshot_id)
        await self.manager.drop_snapshot(snapshot_id)

