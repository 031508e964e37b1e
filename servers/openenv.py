"""The OpenEnv protocol (openenv-core's ``EnvClient``/``GenericEnvClient`` wire format) for each served env, under
its own base path :func:`openenv_path` (``/envs/<env id>``; ``GET /envs`` lists them), beside our session API:

==========================  ==============================================================================
``POST {path}/reset``       stateless, as OpenEnv's: a fresh env (a session opened, reset, closed) -> first obs
``POST {path}/step``        stateless, as OpenEnv's: a fresh env, reset with the request's selection, one step
``GET {path}/state``        a fresh env's state (``{"episode_id": null, "step_count": 0}``)
``GET {path}/schema``       JSON schemas of the action, the observation and the state
``GET {path}/metadata``     name, description, version, and ``tools`` (what the env declares; ``[]`` if none)
``GET {path}/health``       ``{"status": "healthy"}`` (no token; the server's own ``/health`` stays ours)
``WS {path}/ws``            the multi-step session channel: ``reset`` / ``step`` / ``state`` / ``close`` messages
Task API (OpenEnv's)        ``GET /splits``, ``POST /tasks``, ``POST /num_tasks``, ``POST /task``,
                            ``POST /task_range``; and ``GET /tasks`` (every split with its size)
``POST {path}/mcp``         MCP (``servers.mcp``)
==========================  ==============================================================================

A server that serves one env also answers these at its root (``/reset``, ``/ws``, ``/mcp``, ...; not ``/health``),
so an OpenEnv client can take the server's URL itself as ``base_url``.

The action is ``{"action": "<text>"}`` (the env's action text: ``"go to desk 1"``, ``"search[red shoes]"``, or a
tool call ``{"name", "arguments"}`` as JSON text for an env made with ``action_format="tools"``); the observation
is ``{"text", "info", "terminated", "truncated", "session_id"}`` (+ ``"tools"`` on reset), with ``reward`` and
``done`` (= terminated or truncated) beside it, as OpenEnv's ``serialize_observation`` lays them out. A reset's
``data`` (WS) or body (HTTP) takes ``seed``, ``episode_id``, ``options``, ``env_kwargs``; any other key is a reset
option, so ``reset(split="valid_unseen", index=3, env_kwargs={"expert": True})`` plays ALFWorld game 3 of
``valid_unseen`` with the expert.

Every surface shares the server's sessions (``GET /sessions`` lists a WS session too), limits (``max_sessions``,
action size), TTL, errors and worker processes: a WS connection holds one session of
:class:`envs.hosting.SessionManager` (opened by its first reset, reset in place by the next ones, closed with the
connection; a connection silent for the TTL is closed; a reset of another task moves it to a new session, which the
manager places on a worker that has that task loaded). Errors on HTTP are our ``{"detail", "code"}`` 4xx/5xx
answers; on WS an ``{"type": "error", "data": {"message", "code", "status", "error_code"}}`` message whose
``code`` is OpenEnv's (``CAPACITY_REACHED``, ``VALIDATION_ERROR``, ``SESSION_ERROR``, ``EXECUTION_ERROR``,
``INVALID_JSON``, ``UNKNOWN_TYPE``) and ``status``/``error_code`` are what our API answers for the same situation
(``servers.errors.describe_error``). Capacity is counted in sessions, not connections: a reset when the server holds
``max_sessions`` answers ``CAPACITY_REACHED`` (status 503) and the connection stays open for a retry. A token
(``--token``, ``--token-file``) is checked on every route but ``health``, by ``servers.access.AccessGate`` before
any route: ``Authorization: Bearer <token>``, or Basic with the token as password, which is what openenv-core's
client sends for a base URL ``http://user:<token>@host:port/envs/<env id>`` (it takes no headers). Every session a
surface opens belongs to the caller's client and to this env (``servers.access.ClientSessions``).

Implemented here rather than with openenv-core's ``HTTPEnvServer``: that server makes each env in the server
process (a thread per session), keeps its own session table, capacity and reaper, and answers every env failure
as ``EXECUTION_ERROR``/500; here envs live in our worker processes under one session manager. The wire format is
openenv-core's (checked against its models and its client in ``tests/servers/test_server_openenv.py``); the server
does not import openenv-core (it imports gradio and fastmcp: seconds and ~200 MB at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any
from urllib.parse import quote

import gymnasium
from fastapi import APIRouter, Body, Depends, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.websockets import WebSocketDisconnect, WebSocketState

from envs.hosting import SessionManager, SessionNotFound
from envs.hosting.errors import EnvFailed, http_error
from envs.hosting.jsonable import lone_surrogate, to_jsonable
from envs.jsondepth import MAX_JSON_DEPTH, json_depth
from servers.access import CLIENT_KEY, ClientSessions
from servers.dependencies import get_client, get_manager
from servers.errors import describe_error
from servers.schemas import ErrorResponse, UnprocessableResponse

__all__ = ["OPENENV_PREFIX", "build_router", "openenv_path"]

log = logging.getLogger(__name__)

OPENENV_PREFIX = "/envs"

#: OpenEnv's ``WSErrorCode`` for each of our error codes (``envs.hosting.errors.HTTP_ERRORS``).
WS_CODES = {
    "at_capacity": "CAPACITY_REACHED",
    "invalid_request": "VALIDATION_ERROR",
    "action_too_large": "VALIDATION_ERROR",
    "body_too_large": "VALIDATION_ERROR",
    "unknown_env": "FACTORY_ERROR",
    "session_not_found": "SESSION_ERROR",
    "episode_over": "SESSION_ERROR",
    "session_busy": "SESSION_ERROR",
    "session_exists": "SESSION_ERROR",
}


def openenv_path(env_id: str) -> str:
    """The base path of ``env_id``'s OpenEnv surface: ``/envs/agent_rl/ALFWorld-v0`` (an OpenEnv client's
    ``base_url`` is the server's URL plus this)."""
    return f"{OPENENV_PREFIX}/{quote(env_id, safe='/:')}"


# ------------------------------------------------------------------------------------------------ wire models
class _NoSurrogates(BaseModel):
    """Refuses a lone UTF-16 surrogate anywhere in the body, extra keys included (the server's text rule)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        found = lone_surrogate(value, "body")
        if found:
            raise ValueError(found)
        return value


class TextAction(_NoSurrogates):
    """The action (OpenEnv ``Action``): the env's action text."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: str = Field(description="the action text (at most max_action_bytes UTF-8 bytes, else 413), e.g. "
                                    "\"go to desk 1\", \"search[red shoes]\", or a tool call "
                                    "{\"name\": ..., \"arguments\": {...}} as JSON text")
    metadata: dict[str, Any] = Field(default_factory=dict, description="OpenEnv's action metadata (not used)")


class TextObservation(BaseModel):
    """The ``observation`` object of a reset or step answer (OpenEnv ``Observation`` fields but ``done``, ``reward``
    and ``metadata``, which OpenEnv's serialisation moves out of it)."""

    text: Any = Field(description="the env's observation (text for agent_rl envs)")
    info: dict[str, Any] = Field(description="the env's info: admissible_actions, won, expert_action, ...")
    terminated: bool = Field(description="the task ended (won or lost)")
    truncated: bool = Field(description="the turn or time budget ran out")
    session_id: str | None = Field(description="the server session behind it (GET /sessions lists it)")
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="on reset: the env's declared tools (OpenAI-style function schemas), [] if none")


class ResetBody(_NoSurrogates):
    """A reset (OpenEnv ``ResetRequest``): ``seed``, ``episode_id``, ``options``, ``env_kwargs``; every other key
    is a reset option (``split``, ``index``, ``goal_idx``, ...), added to ``options``."""

    model_config = ConfigDict(extra="allow", strict=True,
                              json_schema_extra={"examples": [{"split": "valid_unseen", "index": 3}, {"seed": 0}, {}]})

    seed: int | None = Field(default=None, ge=0, description="seed of the reset")
    episode_id: str | None = Field(default=None, max_length=255, description="the client's name for the episode")
    options: dict[str, Any] | None = Field(default=None, description="reset options (the extra keys are added)")
    env_kwargs: dict[str, Any] | None = Field(default=None, description="keyword arguments of gymnasium.make")

    def reset_options(self) -> dict[str, Any] | None:
        """``options`` with the extra keys added (``None`` when neither is given)."""
        extra = dict(self.model_extra or {})
        if self.options is None and not extra:
            return None
        return {**extra, **(self.options or {})}


class ResetAnswer(BaseModel):
    """OpenEnv ``ResetResponse``."""

    observation: TextObservation
    reward: float | None = None
    done: bool = False


class StepBody(ResetBody):
    """A stateless step (OpenEnv ``StepRequest``): ``action`` played on a fresh env that the other keys reset
    (as :class:`ResetBody`). ``timeout_s`` and ``request_id`` are accepted as OpenEnv defines them; the server's
    ``--env-timeout`` is the time limit."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={
        "examples": [{"action": {"action": "look"}, "split": "valid_unseen", "index": 0}]})

    action: TextAction
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


class StepAnswer(BaseModel):
    """OpenEnv ``StepResponse``."""

    observation: TextObservation
    reward: float | None
    done: bool = Field(description="terminated or truncated")


class EnvState(BaseModel):
    """OpenEnv ``State``."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = 0


class Schemas(BaseModel):
    """OpenEnv ``SchemaResponse``."""

    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]


class EnvMetadata(BaseModel):
    """OpenEnv ``EnvironmentMetadata``, plus the env's declared ``tools``."""

    name: str
    description: str
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None
    tools: list[dict[str, Any]] = Field(description="tools the env declares with its default kwargs (OpenAI-style "
                                                    "function schemas; [] if none): what MCP's tools/list maps from")


class OpenEnvHealth(BaseModel):
    """OpenEnv ``HealthResponse``."""

    status: str = "healthy"


class SplitBody(_NoSurrogates):
    """OpenEnv ``ListTasksRequest`` / ``NumTasksRequest``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    split: str


class TaskBody(SplitBody):
    """OpenEnv ``GetTaskRequest``."""

    index: int


class TaskRangeBody(SplitBody):
    """OpenEnv ``GetTaskRangeRequest`` (Python slice semantics: ``start`` inclusive, ``stop`` exclusive, either may
    be omitted or negative)."""

    start: int | None = None
    stop: int | None = None


class SplitInfo(BaseModel):
    name: str
    type: str = Field(description="train, validation or test (OpenEnv's split types)")


class SplitSize(SplitInfo):
    num_tasks: int


class TaskSummary(BaseModel):
    """Every split of the env with its size (``GET {path}/tasks``)."""

    env_id: str
    splits: list[SplitSize]


class TaskSpec(BaseModel):
    """One task: ``reset`` holds the reset options that play it (pass them as the reset's keys)."""

    model_config = ConfigDict(extra="allow")

    id: str
    split: str
    index: int
    reset: dict[str, Any]


class TaskList(BaseModel):
    tasks: list[TaskSpec]
    env_name: str | None = None


class TaskCount(BaseModel):
    num_tasks: int


class OneTask(BaseModel):
    task: TaskSpec


# -------------------------------------------------------------------------------------------- shared helpers
def observation(obs: Any, info: dict[str, Any], *, session_id: str | None, terminated: bool = False,
                truncated: bool = False, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``observation`` object (:class:`TextObservation`) as a dict."""
    out = {"text": obs, "info": info, "terminated": terminated, "truncated": truncated, "session_id": session_id}
    if tools is not None:
        out["tools"] = tools
    return out


async def close_quietly(manager: SessionManager | ClientSessions, session_id: str | None) -> None:
    """Close a session that may already be gone (expired, or closed by an env failure)."""
    if session_id is not None:
        with contextlib.suppress(SessionNotFound):
            await manager.close(session_id)


class EnvFacts:
    """What the server learns once per env and keeps: its declared tools and its task listing (from a temporary
    session with the env's defaults: the env's own answers, computed where it lives)."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self._cache: dict[Any, Any] = {}
        self._locks: dict[Any, asyncio.Lock] = {}

    async def _probe(self, manager: SessionManager, key: Any, what: str, params: Any = None,
                     env_kwargs: dict[str, Any] | None = None) -> Any:
        if key in self._cache:
            return self._cache[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self._cache:
                sid, _, _ = await manager.create(self.env_id, env_kwargs=env_kwargs)
                try:
                    self._cache[key] = await manager.info(sid, what, params)
                finally:
                    await close_quietly(manager, sid)
        return self._cache[key]

    async def tools(self, manager: SessionManager, env_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The tools the env declares when made with ``env_kwargs`` (``[]`` if none)."""
        key = ("tools", json.dumps(env_kwargs or {}, sort_keys=True, default=str))
        return await self._probe(manager, key, "tools", env_kwargs=env_kwargs)

    async def splits(self, manager: SessionManager) -> list[dict[str, Any]]:
        """``[{"name", "type", "num_tasks"}]``; 501 ``not_implemented`` for an env without a task listing."""
        catalog = await self._probe(manager, ("tasks",), "tasks")
        if catalog is None:
            raise HTTPException(501, f"{self.env_id} publishes no task listing (an env gets one by implementing "
                                     "OpenEnv's TaskProvider methods list_splits, num_tasks, get_task)")
        return catalog

    async def tasks(self, manager: SessionManager, split: str) -> list[dict[str, Any]]:
        """Every task spec of ``split``; 400 ``invalid_task`` for an unknown split."""
        sizes = {s["name"]: s["num_tasks"] for s in await self.splits(manager)}
        if split not in sizes:
            raise HTTPException(400, f"unknown split {split!r} of {self.env_id}; splits: {', '.join(sizes)}")
        params = {"split": split, "start": 0, "stop": sizes[split]}
        return await self._probe(manager, ("tasks", split), "tasks", params)


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent_rl")
    except PackageNotFoundError:
        return None


def _ws_error(exc: BaseException, *, opening: bool) -> dict[str, Any]:
    status, code, detail = describe_error(exc, opening=opening)
    return {"type": "error", "data": {"message": detail, "code": WS_CODES.get(code, "EXECUTION_ERROR"),
                                      "status": status, "error_code": code}}


def _message_error(message: str, code: str, *, status: int = 422, error_code: str = "invalid_request",
                   **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, "status": status, "error_code": error_code,
                                      **extra}}


def _validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return to_jsonable([{k: e.get(k) for k in ("type", "loc", "msg", "input")} for e in exc.errors()])


# ------------------------------------------------------------------------------------------------- WebSocket
class WSSession:
    """One OpenEnv WebSocket connection: at most one live session of the manager, opened by the first ``reset``;
    a reset of the same task (options and env kwargs) resets it in place, a reset of another task opens a new one
    (placed where that task is loaded) and closes the old one."""

    def __init__(self, manager: ClientSessions, env_id: str, max_action_bytes: int, max_message_bytes: int,
                 max_json_depth: int = MAX_JSON_DEPTH) -> None:
        self.manager = manager  # the connection's client's sessions of env_id (servers.access)
        self.max_json_depth = max_json_depth
        self.env_id = env_id
        self.max_action_bytes = max_action_bytes
        self.max_message_bytes = max_message_bytes
        self.session_id: str | None = None
        self.env_kwargs: dict[str, Any] | None = None
        self.options: dict[str, Any] | None = None
        self.tools: list[dict[str, Any]] | None = None
        self.episode_id: str | None = None
        self.episodes = 0
        self.step_count = 0

    async def handle(self, raw: str | bytes) -> tuple[dict[str, Any] | None, bool]:
        """One message (a text frame, or a binary one holding UTF-8 JSON) -> ``(answer or None, close the
        connection)``."""
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return _message_error(f"Invalid JSON: a binary frame that is not UTF-8 ({exc.reason})",
                                      "INVALID_JSON"), False
        if len(raw) > self.max_message_bytes:
            return _message_error(f"message larger than {self.max_message_bytes} bytes", "VALIDATION_ERROR",
                                  status=413, error_code="body_too_large"), False
        depth = json_depth(raw, self.max_json_depth)
        if depth > self.max_json_depth:  # before parsing: json.loads raised RecursionError and dropped the connection
            return _message_error(f"message nested deeper than {self.max_json_depth} levels (refused before "
                                  "parsing)", "VALIDATION_ERROR", status=400, error_code="json_too_deep"), False
        try:
            message = json.loads(raw)
        except ValueError as exc:
            return _message_error(f"Invalid JSON: {exc}", "INVALID_JSON", status=400,
                                  error_code="invalid_json"), False
        if not isinstance(message, dict):
            return _message_error("a message is a JSON object {\"type\": ..., \"data\": ...}",
                                  "VALIDATION_ERROR"), False
        found = lone_surrogate(message, "message")
        if found:
            return _message_error(found, "VALIDATION_ERROR"), False
        kind = message.get("type")
        allowed = {"reset": {"type", "data"}, "step": {"type", "data"}, "state": {"type"}, "close": {"type"}}
        if not isinstance(kind, str) or kind not in allowed:
            hint = "; MCP is served at POST .../mcp" if kind == "mcp" else ""
            return _message_error(f"Unknown message type: {kind!r} (reset, step, state, close){hint}",
                                  "UNKNOWN_TYPE", status=400, error_code="unknown_type"), False
        unknown = sorted(set(message) - allowed[kind])
        data = message.get("data", {})
        if unknown or (kind == "step" and "data" not in message) or not isinstance(data, dict):
            return _message_error(f"Invalid message: a {kind!r} message has the keys {sorted(allowed[kind])} "
                                  f"(data an object){'; unknown: ' + ', '.join(unknown) if unknown else ''}",
                                  "VALIDATION_ERROR"), False
        if kind == "close":
            return None, True
        if kind == "state":
            return {"type": "state", "data": self.state()}, False
        opening = kind == "reset" and self.session_id is None
        try:
            if kind == "reset":
                return await self.reset(ResetBody.model_validate(data)), False
            return await self.step(TextAction.model_validate(data)), False
        except ValidationError as exc:
            return _message_error("Invalid message", "VALIDATION_ERROR", errors=_validation_errors(exc)), False
        except Exception as exc:  # noqa: BLE001  (every failure is an error message; the connection goes on)
            if http_error(exc) is None:
                log.exception("OpenEnv WS %s on %s failed", kind, self.env_id)
            return _ws_error(exc, opening=opening), False

    def state(self) -> dict[str, Any]:
        """OpenEnv ``State`` (``episode_id``, ``step_count``) and what the connection holds: its session, the
        episodes it started, whether the current one is over."""
        session = self.manager.get(self.session_id) if self.manager.owns(self.session_id) else None
        return {"episode_id": self.episode_id, "step_count": self.step_count,
                "session_id": self.session_id if session else None, "env_id": self.env_id,
                "episodes": self.episodes, "done": session.done if session else False}

    async def reset(self, body: ResetBody) -> dict[str, Any]:
        options = body.reset_options()
        reply: tuple[Any, dict[str, Any]] | None = None
        # the same task again: reset the session in place (its worker has the task loaded); another task or other
        # env kwargs: a new session, which the manager places on a worker that has that task loaded, if one has
        if self.session_id is not None and (body.env_kwargs, options) == (self.env_kwargs, self.options):
            try:
                reply = await self.manager.reset(self.session_id, seed=body.seed, options=options)
            except SessionNotFound:  # expired (TTL) or closed by an env failure: open a new one below
                self.session_id = None
            except EnvFailed:  # the manager closed it (a rejected option included)
                self.session_id = None
                raise
        if reply is None:
            await close_quietly(self.manager, self.session_id)
            self.session_id = None
            sid, obs, info = await self.manager.create(self.env_id, seed=body.seed, options=options,
                                                       env_kwargs=body.env_kwargs)
            if self.tools is None or body.env_kwargs != self.env_kwargs:  # what the env declares: per env kwargs
                try:
                    self.tools = await self.manager.info(sid, "tools")
                except BaseException:
                    await close_quietly(self.manager, sid)
                    raise
            self.session_id, self.env_kwargs = sid, body.env_kwargs
        else:
            obs, info = reply
        self.options = options
        self.episodes += 1
        self.episode_id = body.episode_id or f"{self.session_id}-{self.episodes}"
        self.step_count = 0
        return {"type": "observation", "data": {
            "observation": observation(obs, info, session_id=self.session_id, tools=self.tools),
            "reward": None, "done": False}}

    async def step(self, action: TextAction) -> dict[str, Any]:
        if self.session_id is None:
            return _message_error("no episode: send a reset first", "SESSION_ERROR", status=409,
                                  error_code="episode_over")
        if len(action.action.encode("utf-8")) > self.max_action_bytes:
            return _message_error(f"action longer than max_action_bytes={self.max_action_bytes}",
                                  "VALIDATION_ERROR", status=413, error_code="action_too_large")
        try:
            reply = await self.manager.step(self.session_id, action.action)
        except (SessionNotFound, EnvFailed):  # expired or broken: the next reset opens a new session
            self.session_id = None
            raise
        self.step_count += 1
        return {"type": "observation", "data": {
            "observation": observation(reply.observation, reply.info, session_id=self.session_id,
                                       terminated=reply.terminated, truncated=reply.truncated),
            "reward": reply.reward, "done": reply.terminated or reply.truncated}}

    async def aclose(self) -> None:
        await close_quietly(self.manager, self.session_id)
        self.session_id = None


async def _receive(websocket: WebSocket, timeout_s: float | None) -> str | bytes | None:
    """The next frame's text (or bytes); ``None`` when the client left, or stayed silent ``timeout_s`` (the
    connection is then closed: the session TTL applies to the connection too)."""
    try:
        message = await asyncio.wait_for(websocket.receive(), timeout_s)
    except asyncio.TimeoutError:
        await websocket.close(code=1000, reason="idle longer than the session TTL")
        return None
    if message["type"] == "websocket.disconnect":
        return None
    if message.get("text") is not None:
        return message["text"]
    return message.get("bytes") or b""


async def _send(websocket: WebSocket, answer: dict[str, Any]) -> None:
    try:
        text = json.dumps(answer, ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:  # text the client sent, echoed back (the env's own text is already valid)
        text = json.dumps(to_jsonable(answer), ensure_ascii=False)
    await websocket.send_text(text)


async def serve_ws(websocket: WebSocket, env_id: str) -> None:
    """The OpenEnv ``/ws`` channel of ``env_id`` (see the module docstring)."""
    app = websocket.app
    settings = app.state.settings
    client = websocket.scope.get(CLIENT_KEY)
    if client is None:  # servers.access.AccessGate authenticates every handshake before it gets here
        await websocket.send_denial_response(JSONResponse(
            {"detail": "missing or wrong token", "code": "unauthorized"}, status_code=401,
            headers={"WWW-Authenticate": "Bearer"}))
        return
    await websocket.accept()
    conn = WSSession(ClientSessions(app.state.manager, client, env_id), env_id, settings.max_action_bytes,
                     settings.max_body_bytes, settings.max_json_depth)
    try:
        while True:
            raw = await _receive(websocket, settings.session_ttl_s)
            if raw is None:
                break
            answer, stop = await conn.handle(raw)
            if answer is not None:
                await _send(websocket, answer)
            if stop:
                break
    except WebSocketDisconnect:
        pass
    finally:
        await conn.aclose()
        if websocket.application_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(Exception):
                await websocket.close()


# ------------------------------------------------------------------------------------------------ HTTP routes
_E = {"model": ErrorResponse}
_422 = {"model": UnprocessableResponse, "description": "validation errors, or the env rejected the request"}


def build_router(env_id: str, facts: EnvFacts, *, health: bool = True) -> APIRouter:
    """The OpenEnv routes of ``env_id`` (mount under :func:`openenv_path`; ``health=False`` for the root alias)."""
    router = APIRouter(tags=[f"OpenEnv {env_id}"])
    auth = [Depends(get_client)]

    async def _stateless(request: Request, body: ResetBody) -> tuple[ClientSessions, str, Any, dict[str, Any]]:
        manager = ClientSessions(get_manager(request), get_client(request, None), env_id)
        request.state.opening = True
        sid, obs, info = await manager.create(env_id, seed=body.seed, options=body.reset_options(),
                                              env_kwargs=body.env_kwargs)
        request.state.opening = False
        return manager, sid, obs, info

    @router.post("/reset", response_model=ResetAnswer, dependencies=auth,
                 responses={409: _E, 422: _422, 500: _E, 503: _E, 504: _E},
                 summary="OpenEnv reset (stateless: a fresh env, closed after the answer)")
    async def reset(request: Request, body: ResetBody = Body(default_factory=ResetBody)) -> dict[str, Any]:
        """Open a session with the body's selection, return its first observation and close it (OpenEnv's HTTP
        reset is stateless by design; the multi-step path is ``WS /ws``)."""
        manager, sid, obs, info = await _stateless(request, body)
        try:
            tools = await manager.info(sid, "tools")
        finally:
            await close_quietly(manager, sid)
        return {"observation": observation(obs, info, session_id=sid, tools=tools), "reward": None, "done": False}

    @router.post("/step", response_model=StepAnswer, dependencies=auth, response_model_exclude_unset=True,
                 responses={409: _E, 413: _E, 422: _422, 500: _E, 503: _E, 504: _E},
                 summary="OpenEnv step (stateless: a fresh env reset with the body's selection, one step)")
    async def step(request: Request, body: StepBody) -> dict[str, Any]:
        """Play ``action`` on a fresh env: a session opened with the body's other keys (as ``/reset``), one step,
        closed. A gymnasium env steps only after a reset, so that is what a fresh env means here."""
        limit = request.app.state.settings.max_action_bytes
        if len(body.action.action.encode("utf-8")) > limit:
            raise HTTPException(413, f"action longer than max_action_bytes={limit}")
        manager, sid, _, _ = await _stateless(request, body)
        try:
            reply = await manager.step(sid, body.action.action)
        finally:
            await close_quietly(manager, sid)
        return {"observation": observation(reply.observation, reply.info, session_id=sid,
                                           terminated=reply.terminated, truncated=reply.truncated),
                "reward": reply.reward, "done": reply.terminated or reply.truncated}

    @router.get("/state", response_model=EnvState, dependencies=auth, summary="OpenEnv state of a fresh env")
    async def state() -> EnvState:
        """A fresh env's state (OpenEnv's HTTP state is stateless too; a WS session answers ``state`` messages
        with its own)."""
        return EnvState()

    @router.get("/schema", response_model=Schemas, dependencies=auth, summary="OpenEnv JSON schemas")
    async def schema() -> Schemas:
        return Schemas(action=TextAction.model_json_schema(), observation=TextObservation.model_json_schema(),
                       state=EnvState.model_json_schema())

    @router.get("/metadata", response_model=EnvMetadata, dependencies=auth, responses={500: _E, 503: _E, 504: _E},
                summary="OpenEnv metadata, with the env's declared tools")
    async def metadata(request: Request) -> EnvMetadata:
        spec = gymnasium.spec(env_id)
        entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__qualname__",
                                                                                   repr(spec.entry_point))
        request.state.opening = True
        tools = await facts.tools(get_manager(request))
        return EnvMetadata(name=env_id, description=f"gymnasium env {env_id} ({entry}), served by agent_rl",
                           version=_version(), tools=tools)

    if health:
        @router.get("/health", response_model=OpenEnvHealth, summary="OpenEnv health (no token)")
        async def health() -> OpenEnvHealth:
            return OpenEnvHealth()

    # ---- Task API (OpenEnv's routes and shapes)
    _T = {400: _E, 500: _E, 501: _E, 503: _E, 504: _E}

    @router.get("/splits", response_model=list[SplitInfo], dependencies=auth, responses=_T,
                summary="Task API: the env's splits")
    async def splits(request: Request) -> list[dict[str, Any]]:
        request.state.opening = True
        return [{"name": s["name"], "type": s["type"]} for s in await facts.splits(get_manager(request))]

    @router.get("/tasks", response_model=TaskSummary, dependencies=auth, responses=_T,
                summary="Task API: every split with its number of tasks")
    async def task_summary(request: Request) -> dict[str, Any]:
        request.state.opening = True
        return {"env_id": env_id, "splits": await facts.splits(get_manager(request))}

    @router.post("/tasks", response_model=TaskList, dependencies=auth, responses=_T,
                 summary="Task API: the tasks of a split")
    async def list_tasks(request: Request, body: SplitBody) -> dict[str, Any]:
        request.state.opening = True
        return {"tasks": await facts.tasks(get_manager(request), body.split), "env_name": env_id}

    @router.post("/num_tasks", response_model=TaskCount, dependencies=auth, responses=_T,
                 summary="Task API: the number of tasks of a split")
    async def num_tasks(request: Request, body: SplitBody) -> dict[str, Any]:
        request.state.opening = True
        sizes = {s["name"]: s["num_tasks"] for s in await facts.splits(get_manager(request))}
        if body.split not in sizes:
            raise HTTPException(400, f"unknown split {body.split!r} of {env_id}; splits: {', '.join(sizes)}")
        return {"num_tasks": sizes[body.split]}

    @router.post("/task", response_model=OneTask, dependencies=auth, responses=_T,
                 summary="Task API: task `index` of a split (its `reset` options play it)")
    async def get_task(request: Request, body: TaskBody) -> dict[str, Any]:
        request.state.opening = True
        tasks = await facts.tasks(get_manager(request), body.split)
        if not 0 <= body.index < len(tasks):
            raise HTTPException(400, f"index {body.index} out of range: split {body.split!r} has {len(tasks)} tasks")
        return {"task": tasks[body.index]}

    @router.post("/task_range", response_model=TaskList, dependencies=auth, responses=_T,
                 summary="Task API: tasks start <= index < stop of a split")
    async def task_range(request: Request, body: TaskRangeBody) -> dict[str, Any]:
        request.state.opening = True
        tasks = await facts.tasks(get_manager(request), body.split)
        return {"tasks": tasks[body.start:body.stop], "env_name": env_id}

    @router.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_ws(websocket, env_id)

    return router
