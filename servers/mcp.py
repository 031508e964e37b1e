"""MCP for each served env: ``POST {openenv path}/mcp``, the ``mcp`` SDK's streamable HTTP server (JSON answers,
stateful sessions with the legacy handshake, and the 2026 stateless protocol), with the env's episode as tools:

- ``reset(split?, index?, seed?, options?, env_kwargs?, session_id?)`` starts an episode and answers its
  ``session_id`` and first observation (the same task as the named or bound episode's: that session reset in place;
  another task: a new session, the old one closed);
- the env's own tools (an env made with ``action_format="tools"`` declares them as ``tools``, OpenAI-style function
  schemas: ALFWorld and TextWorld ``act(command)``, WebShop ``search(query)`` and ``click(target)``, the calculator
  ``calc``/``answer``); an env without tools gets one, ``act(command)``, that plays the command text. A call plays
  ``{"name", "arguments"}`` (``envs.tools.encode_call``'s encoding) or the command as the env's next action;
- ``close(session_id?)`` ends the episode's session.

Every ``tools/call`` answers ``structuredContent`` ``{"session_id", "observation", "reward", "done",
"terminated", "truncated", "info"}`` and the observation as text content; an error (episode over, expired session,
an env failure, at capacity) is a tool result with ``isError`` and ``{"error_code", "status", "detail"}`` as our API
would answer (``servers.errors.describe_error``). An unknown tool or malformed arguments are JSON-RPC errors.

Which episode a call plays: its ``session_id`` argument, else the episode that ``reset`` opened on the same MCP
session (the ``Mcp-Session-Id`` of a client that did the initialize handshake); a client of the stateless protocol
(no MCP session; the SDK's default ``mode="auto"`` against this server) passes the ``session_id`` that reset
answered. An MCP session that ends (the client's ``DELETE``) closes its episode's session; an unclosed one expires
with the server's TTL, like any session. Token: as every route (``Authorization: Bearer <token>``), else 401
(``servers.access.AccessGate``). Every episode belongs to the caller's client and to this env
(``servers.access.ClientSessions``): a ``session_id`` of another client or another env is ``session_not_found``
(404) for a play or close, and a reset with it opens a new session, the other untouched; an MCP session itself
answers only the client that opened it (the SDK's session ownership, from ``scope["user"]``). Without a token the
SDK's DNS-rebinding protection is on (loopback ``Host`` only).

Each client has a transport session manager of its own, whose ``max_sessions`` is the client's share of
``max_mcp_sessions`` (at least 1): one client holding all of its MCP sessions leaves every other client its share,
with the SDK's own admission lock deciding the race of two opening requests; the SDK's refusal is answered as 503
``quota_exceeded`` naming the quota.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.responses import JSONResponse

from envs.hosting import SessionManager, SessionNotFound
from envs.hosting.errors import EnvFailed, EnvRejected, http_error
from envs.hosting.jsonable import lone_surrogate
from servers.access import CLIENT_KEY, ClientSessions, mcp_loopback_security, unscoped
from servers.errors import describe_error
from servers.openenv import EnvFacts, close_quietly
from servers.tokens import LOCAL_CLIENT

__all__ = ["EnvMCP"]

log = logging.getLogger(__name__)

SESSION_HEADER = "mcp-session-id"

#: The tool of an env that declares none: its action text (what ``envs.tools.command_tool`` declares).
COMMAND_TOOL = {"type": "function", "function": {
    "name": "act", "description": "Play one command (the env's action text) and get the next observation.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                   "required": ["command"], "additionalProperties": False}}}

_SESSION_ARG = {"type": "string", "description": "the episode (the session_id reset answered); default: the episode "
                                                 "reset opened on this MCP session"}

RESET_TOOL = types.Tool(
    name="reset",
    description="Start an episode and get its first observation and session_id. split/index select the task "
                "(e.g. split='valid_unseen', index=3); options are further reset options, env_kwargs the env's "
                "construction arguments. With session_id (or on an MCP session that has one) that session is reset "
                "in place.",
    input_schema={"type": "object", "additionalProperties": False, "properties": {
        "split": {"type": "string", "description": "the task's split (GET .../tasks lists them)"},
        "index": {"type": "integer", "minimum": 0, "description": "the task's index in the split"},
        "seed": {"type": "integer", "minimum": 0},
        "options": {"type": "object", "description": "more reset options, e.g. {\"goal_idx\": 12}"},
        "env_kwargs": {"type": "object", "description": "keyword arguments of gymnasium.make, e.g. {\"expert\": true}"},
        "session_id": _SESSION_ARG}})

CLOSE_TOOL = types.Tool(
    name="close", description="End the episode and free its session.",
    input_schema={"type": "object", "additionalProperties": False, "properties": {"session_id": _SESSION_ARG}})


def _invalid(message: str) -> MCPError:
    return MCPError(code=types.INVALID_PARAMS, message=message)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class EnvMCP:
    """The MCP server of one env: an ASGI endpoint (mount at ``{openenv path}/mcp``) and the session manager to
    run in the app's lifespan (:meth:`run`)."""

    def __init__(self, env_id: str, facts: EnvFacts, settings: Any) -> None:
        self.env_id = env_id
        self.facts = facts
        self.settings = settings
        self.server: Server[Any] = Server(
            f"agent_rl {env_id}", version="0.1.0",
            instructions=f"An episode of {env_id}: call reset, then the env's tools; each call answers the "
                         "observation, reward and done.",
            on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        self.manager: SessionManager | None = None
        self.transports: dict[str, StreamableHTTPSessionManager] = {}  # client -> its transport session manager
        # MCP session id -> its env session's manager key (servers.access.scoped: the client's id, in its namespace)
        self.bound: dict[str, str] = {}
        self._made_with: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # manager key -> (kwargs, options)
        self._action_kwargs: dict[str, Any] | None = None
        self._tools: list[dict[str, Any]] | None = None

    def client_quota(self) -> int:
        """MCP sessions one client may hold open on this env: its share of ``max_mcp_sessions`` (at least 1)."""
        return self.settings.mcp_sessions_cap() // self.settings.client_count() or 1

    @contextlib.asynccontextmanager
    async def run(self, manager: SessionManager) -> AsyncIterator[None]:
        """Serve while the context is open (fresh transport session managers each time, one per client)."""
        self.manager = manager
        # no token: loopback Host and Origin only (the SDK's DNS-rebinding protection, behind servers.access's
        # gate); with tokens the token guards it (a container's port has a Host header no allow-list can know)
        security = (TransportSecuritySettings(enable_dns_rebinding_protection=False)
                    if self.settings.clients() else mcp_loopback_security())
        async with contextlib.AsyncExitStack() as stack:
            for client in list(self.settings.clients()) or [LOCAL_CLIENT]:
                transport = StreamableHTTPSessionManager(
                    app=self.server, json_response=True, security_settings=security,
                    session_idle_timeout=self.settings.session_ttl_s, max_sessions=self.client_quota(),
                    max_request_body_size=self.settings.max_body_bytes)
                await stack.enter_async_context(transport.run())
                self.transports[client] = transport
            try:
                yield
            finally:
                self.transports = {}
                for sid in list(self.bound.values()):
                    await close_quietly(manager, sid)
                self.bound.clear()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        client = scope.get(CLIENT_KEY)
        if client is None:  # servers.access.AccessGate authenticates every request before it gets here
            await JSONResponse({"detail": "missing or wrong token", "code": "unauthorized"}, status_code=401,
                               headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        transport = self.transports.get(client)
        if transport is None:
            await JSONResponse({"detail": "MCP is not running", "code": "not_ready"}, status_code=503)(
                scope, receive, send)
            return
        # the SDK's own session ownership: an MCP session answers only the client that opened it (another
        # client's request with its Mcp-Session-Id is a 404, as for an unknown one: it is in another manager)
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=client, scopes=[]))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        opening = scope.get("method") == "POST" and SESSION_HEADER not in headers
        refused = False

        async def send_or_refuse(message: dict[str, Any]) -> None:
            """Pass the SDK's answer on, but its 503 to a request that opens a session (the client's manager is
            at its ``max_sessions``) is replaced by the quota's own answer."""
            nonlocal refused
            if opening and message["type"] == "http.response.start" and message["status"] == 503:
                refused = True
            if not refused:
                await send(message)

        await transport.handle_request(scope, receive, send_or_refuse)
        if refused:
            quota = self.client_quota()
            await JSONResponse({"detail": f"client quota: client {client!r} holds {quota} MCP sessions of "
                                          f"{self.env_id} (client_max_mcp_sessions={quota}); end one (DELETE) or "
                                          "retry later", "code": "quota_exceeded"}, status_code=503,
                               headers={"Retry-After": str(self.settings.retry_after_s)})(scope, receive, send)
            return
        if scope.get("method") == "DELETE" and headers.get(SESSION_HEADER) in self.bound:  # the MCP session ended
            assert self.manager is not None
            sessions = ClientSessions(self.manager, client, self.env_id)
            sid = unscoped(self.bound[headers[SESSION_HEADER]])
            if sessions.key(sid) == self.bound[headers[SESSION_HEADER]] and sessions.owns(sid):
                del self.bound[headers[SESSION_HEADER]]
                await close_quietly(sessions, sid)

    def sessions(self, ctx: Any) -> ClientSessions:
        """The calling client's sessions of this env (``servers.access.ClientSessions``)."""
        assert self.manager is not None
        request = getattr(ctx, "request", None)
        client = request.scope.get(CLIENT_KEY) if request is not None else None
        if client is None:
            raise MCPError(code=types.INVALID_REQUEST, message="no authenticated client")
        return ClientSessions(self.manager, client, self.env_id)

    # ---- tools ---------------------------------------------------------------------------------------------
    async def env_tools(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The env's tools and the env kwargs that make it take them: ``action_format="tools"`` if the env accepts
        it, else its defaults (and :data:`COMMAND_TOOL` if it then declares no tools)."""
        if self._tools is None:
            assert self.manager is not None
            try:
                tools, kwargs = await self.facts.tools(self.manager, {"action_format": "tools"}), {
                    "action_format": "tools"}
            except EnvRejected:  # the env takes no action_format (a user's env): its text actions
                tools, kwargs = await self.facts.tools(self.manager), {}
            self._tools, self._action_kwargs = tools or [COMMAND_TOOL], kwargs
        assert self._action_kwargs is not None
        return self._tools, self._action_kwargs

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        try:
            tools, _ = await self.env_tools()
        except Exception as exc:  # noqa: BLE001  (at capacity, env failure: a JSON-RPC error naming it)
            _, code, detail = describe_error(exc, opening=True)
            raise MCPError(code=types.INTERNAL_ERROR, message=f"{code}: {detail}") from None
        listed = [RESET_TOOL]
        for tool in tools:
            fn = tool.get("function") or tool
            schema = dict(fn.get("parameters") or {"type": "object"})
            schema["properties"] = {**(schema.get("properties") or {}), "session_id": _SESSION_ARG}
            listed.append(types.Tool(name=fn["name"], description=fn.get("description"), input_schema=schema))
        listed.append(CLOSE_TOOL)
        return types.ListToolsResult(tools=listed)

    def _episode(self, ctx: Any, arguments: dict[str, Any]) -> tuple[str | None, str | None]:
        """``(env session id or None, MCP session id or None)`` a call refers to."""
        request = getattr(ctx, "request", None)
        mcp_sid = request.headers.get(SESSION_HEADER) if request is not None else None
        sid = arguments.get("session_id")
        if sid is not None and not isinstance(sid, str):
            raise _invalid("session_id must be a string")
        bound = self.bound.get(mcp_sid) if mcp_sid else None  # an MCP session answers only its own client
        return sid or (unscoped(bound) if bound else None), mcp_sid

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        found = lone_surrogate(arguments, "arguments")
        if found:
            raise _invalid(found)
        try:
            if params.name == "reset":
                return await self._reset(ctx, arguments)
            if params.name == "close":
                sid, mcp_sid = self._episode(ctx, arguments)
                if sid is None:
                    raise _invalid("no episode to close: pass session_id")
                sessions = self.sessions(ctx)
                await sessions.close(sid)
                if mcp_sid and self.bound.get(mcp_sid) == sessions.key(sid):
                    del self.bound[mcp_sid]
                return types.CallToolResult(content=[types.TextContent(type="text", text="closed")],
                                            structured_content={"session_id": sid, "closed": True})
            return await self._act(ctx, params.name, arguments)
        except MCPError:
            raise
        except Exception as exc:  # noqa: BLE001  (every env-side failure is a tool error the caller can read)
            if http_error(exc) is None:
                log.exception("MCP %s on %s failed", params.name, self.env_id)
            status, code, detail = describe_error(exc, opening=params.name == "reset")
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"{code}: {detail}")],
                                        structured_content={"error_code": code, "status": status, "detail": detail},
                                        is_error=True)

    async def _reset(self, ctx: Any, arguments: dict[str, Any]) -> types.CallToolResult:
        assert self.manager is not None
        unknown = sorted(set(arguments) - {"split", "index", "seed", "options", "env_kwargs", "session_id"})
        if unknown:
            raise _invalid(f"unknown arguments of reset: {', '.join(unknown)}")
        for name, kind in (("split", str), ("index", int), ("seed", int), ("options", dict), ("env_kwargs", dict)):
            value = arguments.get(name)
            if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise _invalid(f"{name} must be {'an integer' if kind is int else 'a ' + kind.__name__}")
        _, action_kwargs = await self.env_tools()
        env_kwargs = {**action_kwargs, **(arguments.get("env_kwargs") or {})}
        options = dict(arguments.get("options") or {})
        options.update({k: arguments[k] for k in ("split", "index") if arguments.get(k) is not None})
        sid, mcp_sid = self._episode(ctx, arguments)
        sessions = self.sessions(ctx)
        if sid is not None and not sessions.owns(sid):  # unknown, expired, another client's or env's: a new one
            sid = None
        if sid is not None and sessions.key(sid) not in self._made_with:
            raise _invalid(f"session {sid!r} was not opened by this MCP server's reset (a reset here would replace "
                           "it); call reset without session_id")
        seed, reply = arguments.get("seed"), None
        if sid is not None and self._made_with.get(sessions.key(sid)) == (env_kwargs, options):
            # the same task again: in place (another task: a new session, placed where that task is loaded)
            with contextlib.suppress(SessionNotFound):
                reply = await sessions.reset(sid, seed=seed, options=options or None)
        if reply is None:
            if sid is not None:
                await close_quietly(sessions, sid)
                self._made_with.pop(sessions.key(sid), None)
            sid, obs, info = await sessions.create(self.env_id, seed=seed, options=options or None,
                                                   env_kwargs=env_kwargs)
        else:
            obs, info = reply
        self._made_with[sessions.key(sid)] = (env_kwargs, options)
        if mcp_sid:
            self.bound[mcp_sid] = sessions.key(sid)
        self._prune()
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_text(obs))],
            structured_content={"session_id": sid, "observation": obs, "reward": None, "done": False,
                                "terminated": False, "truncated": False, "info": info})

    async def _act(self, ctx: Any, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        assert self.manager is not None
        tools, action_kwargs = await self.env_tools()
        names = [str((t.get("function") or t).get("name")) for t in tools]
        if name not in names:
            raise _invalid(f"unknown tool {name!r}; tools: reset, {', '.join(names)}, close")
        sid, _ = self._episode(ctx, arguments)
        if sid is None:
            raise _invalid("no episode: call reset first (and pass the session_id it answered when the client "
                           "has no MCP session)")
        call_args = {k: v for k, v in arguments.items() if k != "session_id"}
        if self._tools == [COMMAND_TOOL]:  # an env without tools: the command is the action text
            command = call_args.get("command")
            if not isinstance(command, str) or set(call_args) != {"command"}:
                raise _invalid("act takes one string argument, command")
            action = command
        else:  # envs.tools.encode_call: the env checks the arguments against its schema
            action = json.dumps({"name": name, "arguments": call_args}, ensure_ascii=True)
        if len(action.encode("utf-8")) > self.settings.max_action_bytes:
            raise _invalid(f"action longer than max_action_bytes={self.settings.max_action_bytes}")
        sessions = self.sessions(ctx)
        try:
            reply = await sessions.step(sid, action)
        except EnvFailed:
            self._made_with.pop(sessions.key(sid), None)
            raise
        done = reply.terminated or reply.truncated
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_text(reply.observation))],
            structured_content={"session_id": sid, "observation": reply.observation, "reward": reply.reward,
                                "done": done, "terminated": reply.terminated, "truncated": reply.truncated,
                                "info": reply.info})

    def _prune(self) -> None:
        """Forget bindings and kwargs of sessions that are gone (expired, closed by an env failure)."""
        assert self.manager is not None
        live = self.manager.sessions
        for mcp_sid in [m for m, s in self.bound.items() if s not in live]:
            del self.bound[mcp_sid]
        for sid in [s for s in self._made_with if s not in live]:
            del self._made_with[sid]
