"""The gateway: an OpenAI-compatible HTTP surface in front of the run's engine that records every sampled token.

Routes (each also under ``/sessions/<id>`` for clients that cannot set headers: ``base_url=.../sessions/<id>/v1``):

- ``POST /v1/chat/completions``: OpenAI chat completions, non-streaming or streaming (``stream=true``: server-sent
  events, the same ids: the reply is generated whole, then sent as chunks), ``tools=`` and ``tool_choice`` (calls
  parsed by ``model.tool_call_format`` and returned as ``tool_calls``; ``tool_choice="none"``: the reply is text);
- ``POST /v1/completions``: a text prompt (its text is data: no control tokens);
- ``GET /v1/models``: the run's policy (any ``model`` name is accepted in requests);
- ``POST /sessions/<id>/reward``: the program's reward of its episode (once);
- ``POST /env/sessions/<env session>/step``: the env server's step route, proxied to the run's env server (the
  program's env session only), so the env's rewards are the episode's unless the program gives one.

Security model (docs/gateway.md): every route needs a bearer token (``servers.access.AccessGate``, as the env
servers: ``Origin`` checked, repeated ``Authorization``/``Origin``/``Host`` refused, bodies bounded and JSON depth
checked by ``servers.middleware.BodyGuardMiddleware``). Each episode has its own token (``GatewaySession.api_key``):
a program holds only its own, and with it reaches only its own episode (another session id is 404
``session_not_found``, the same answer as for an id that does not exist). The run's token (``GatewaySettings.token``,
client ``run``) reaches every session. The server binds loopback by default (:mod:`agent_rl.gateway.server`).
Messages, tools and tool calls are bounded in number; ``max_tokens`` is capped by the run's ``engine.max_new_tokens``;
a prompt over ``rollout.max_prompt_tokens`` is 400 ``context_length_exceeded``; one request at a time per session
(409 ``session_busy``).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from agent_rl.gateway.recorder import (GatewaySession, PromptBuilder, RequestError, Segment, normalize_message,
                                       reply_message)
from agent_rl.gateway.schemas import (ChatCompletionRequest, CompletionRequest, RewardRequest, StepRequest,
                                      ignored_fields)
from agent_rl.rollout.prompts.encoding import encode_data
from agent_rl.types import Generation, Turn
from envs.hosting.jsonable import lone_surrogate
from servers.access import CLIENT_KEY, AccessGate
from servers.middleware import BodyGuardMiddleware

RUN_CLIENT = "run"
"""The client name of the run's own token (reaches every session)."""


@dataclass
class GatewayLimits:
    """Bounds of what a client may send (``env.external.*`` in training)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 512
    max_tools: int = 64
    max_requests: int = 64
    """Model calls per episode; more is 429 ``turn_budget_exhausted``."""
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 256
    """The cap of every call's ``max_tokens`` (the run's ``engine.max_new_tokens``)."""


@dataclass
class GatewaySettings:
    """The settings ``servers.access.AccessGate`` reads: the run's token and every live session's own token."""

    token: str
    sessions: dict[str, GatewaySession] = field(default_factory=dict)
    allowed_origins: list[str] = field(default_factory=list)

    def clients(self) -> dict[str, str]:
        """``{client name: token}``: ``run`` and one entry per live session (its id)."""
        return {RUN_CLIENT: self.token, **{sid: s.api_key for sid, s in self.sessions.items() if not s.closed}}


class Sampler(Protocol):
    """What serves the gateway's calls (:class:`agent_rl.gateway.external.ExternalRollout`)."""

    tokenizer: Any
    builder: PromptBuilder

    async def sample(self, session: GatewaySession, prompt_ids: list[int], *, tools: bool) -> tuple[Generation, bool]:
        """One call's generation at the session's sampling settings, and whether its prompt opened a reasoning
        block."""

    def parse_calls(self, text: str, opened: bool) -> Any:
        """The tool-call format's reading (``ToolCallParse``) of a reply."""

    def decode(self, ids: list[int]) -> str:
        """The text of sampled ids as the replies are read (the tool-call markup kept)."""

    async def env_step(self, session: GatewaySession, env_session: str, action: str) -> Any:
        """One step of the program's env session (``StepResult``)."""


def _check_text(body: BaseModel) -> None:
    """Refuse a body with a lone UTF-16 surrogate (legal JSON, not text: no tokenizer encodes it, no reply could
    echo it): 400 ``invalid_text`` naming the field, as the env servers do (``envs.hosting.jsonable``)."""
    found = lone_surrogate(body.model_dump(), "body")
    if found:
        raise RequestError(found, "invalid_text")


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": code},
                         "detail": message, "code": code}, status_code=status)


class Gateway:
    """The sessions, their recording and the HTTP app (:attr:`app`, wrapped by the access gate and body guard).

    Args:
        sampler: generation and env steps (:class:`Sampler`).
        token: the run's token (client ``run``).
        model_name: the name ``/v1/models`` lists.
        limits: :class:`GatewayLimits`.
        auto_sessions: the run's token may open a session by naming it (``X-Session-ID``; the standalone gateway);
            in training sessions are opened by the trainer only.
        session_defaults: :class:`GatewaySession` fields of sessions opened by name (``auto_sessions``).
        on_reward: called with a session once its reward is posted (the standalone gateway stores the episode).
    """

    def __init__(self, sampler: Sampler, *, token: str, model_name: str = "policy",
                 limits: GatewayLimits | None = None, auto_sessions: bool = False,
                 allowed_origins: list[str] | None = None, session_defaults: dict[str, Any] | None = None,
                 on_reward: Callable[[GatewaySession], None] | None = None) -> None:
        self.sampler, self.model_name = sampler, model_name
        self.limits = limits or GatewayLimits()
        self.settings = GatewaySettings(token=token, allowed_origins=list(allowed_origins or []))
        self.sessions = self.settings.sessions
        self.auto_sessions = auto_sessions
        self.session_defaults = dict(session_defaults or {})
        self.on_reward = on_reward
        self.requests = 0
        self.prefix_breaks = 0
        self.app = self._build_app()

    # ---------------------------------------------------------------------------------------------- sessions
    def open_session(self, session_id: str | None = None, **kwargs: Any) -> GatewaySession:
        """A new episode's session (``kwargs``: :class:`GatewaySession` fields: temperature, key, ...)."""
        sid = session_id or secrets.token_hex(16)
        if sid == RUN_CLIENT:  # the gate's client names are the session ids and the run's own name
            raise RequestError(f"the session id {RUN_CLIENT!r} is reserved", "invalid_session_id")
        if sid in self.sessions:
            raise RequestError(f"session {sid!r} exists", "session_exists", 409)
        session = GatewaySession(session_id=sid, max_requests=self.limits.max_requests,
                                 **{**self.session_defaults, **kwargs})
        self.sessions[sid] = session
        return session

    def close_session(self, session_id: str) -> GatewaySession | None:
        """End a session: its token stops working, its record is returned (None when unknown)."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.closed = True
        return session

    def _session(self, request: Request, path_sid: str | None, *, open_new: bool = True) -> GatewaySession:
        client = request.scope.get(CLIENT_KEY)
        header_sid = request.headers.get("x-session-id")
        if path_sid is not None and header_sid is not None and header_sid != path_sid:
            raise RequestError("the session in the URL and the X-Session-ID header differ; send one or the same",
                               "session_mismatch")
        sid = path_sid or header_sid
        if client != RUN_CLIENT:  # a session's own token: only that session
            if sid is not None and sid != client:
                raise RequestError("session not found", "session_not_found", 404)
            sid = client
        if sid is None and client == RUN_CLIENT and self.auto_sessions:
            sid = "default"
        if sid is None:
            raise RequestError("no session: send X-Session-ID or use base_url .../sessions/<id>/v1",
                               "session_required", 400)
        session = self.sessions.get(sid)
        if session is None and client == RUN_CLIENT and self.auto_sessions and open_new:
            if len(sid) > 128 or not all(c.isalnum() or c in "-_." for c in sid):
                raise RequestError("a session id is 1-128 characters of [A-Za-z0-9_.-]", "invalid_session_id")
            if len(self.sessions) >= 1024:
                raise RequestError("too many open sessions", "too_many_sessions", 429)
            session = self.open_session(sid)
        if session is None or session.closed:
            raise RequestError("session not found", "session_not_found", 404)
        return session

    @contextlib.contextmanager
    def _call_session(self, request: Request, path_sid: str | None) -> Iterator[GatewaySession]:
        """The session of one model call (:meth:`_session`); one the call opened by name is closed again when the
        call is refused before it played a turn (a refused request opens nothing)."""
        known = set(self.sessions)
        session = self._session(request, path_sid)
        try:
            yield session
        except BaseException:
            if session.session_id not in known and not session.turns:
                self.close_session(session.session_id)
            raise

    # ---------------------------------------------------------------------------------------------- serving
    def _check(self, body: ChatCompletionRequest) -> None:
        lim = self.limits
        if len(body.messages) > lim.max_messages:
            raise RequestError(f"{len(body.messages)} messages; at most {lim.max_messages}", "too_many_messages")
        if body.tools is not None and len(body.tools) > lim.max_tools:
            raise RequestError(f"{len(body.tools)} tools; at most {lim.max_tools}", "too_many_tools")

    def _cap(self, requested: int | None) -> int:
        cap = self.limits.max_new_tokens
        return cap if requested is None else min(int(requested), cap)

    def _start_call(self, session: GatewaySession) -> None:
        if session.busy:
            raise RequestError("another request of this session is running (one at a time)", "session_busy", 409)
        if session.requests >= session.max_requests:
            raise RequestError(f"the episode's {session.max_requests} model calls are used", "turn_budget_exhausted",
                               429)

    def _check_text_size(self, texts: list[str]) -> None:
        """Refuse text that cannot fit the prompt budget before it is rendered and encoded (encoding 4 MiB held the
        event loop, which serves every session and the generation batcher, for ~8 s)."""
        fewest = self.sampler.builder.fewest_tokens(texts)
        if fewest > self.limits.max_prompt_tokens:
            raise RequestError(f"the prompt is at least {fewest} tokens; at most {self.limits.max_prompt_tokens}",
                               "context_length_exceeded")

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if len(prompt_ids) > self.limits.max_prompt_tokens:
            raise RequestError(f"the prompt is {len(prompt_ids)} tokens; at most {self.limits.max_prompt_tokens}",
                               "context_length_exceeded")

    async def chat(self, session: GatewaySession, body: ChatCompletionRequest) -> dict[str, Any]:
        """Serve one chat completion in ``session``: the prompt (recorded ids spliced in, or a new segment), one
        generation at the session's sampling, the call parsed, the turn recorded. Returns the OpenAI response."""
        self._check(body)
        self._start_call(session)
        messages = [normalize_message(m.model_dump(exclude_unset=False)) for m in body.messages]
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        tools_mode = bool(tools) and body.tool_choice != "none"
        self._check_text_size([m["content"] for m in messages] + ([json.dumps(tools)] if tools else []))
        session.busy = True
        try:
            prompt_ids, extends = self.sampler.builder.prompt(session, messages, tools)
            self._check_prompt(prompt_ids)
            gen, opened = await self.sampler.sample(session, prompt_ids, tools=tools_mode)
            gen = self._cut(gen, self._cap(body.max_completion_tokens or body.max_tokens))
            calls: list[tuple[str, dict[str, Any]]] = []
            content, invalid = gen.text, False
            if tools_mode:
                parsed = self.sampler.parse_calls(gen.text, opened)
                if parsed.error is None and parsed.calls:
                    calls, content = list(parsed.calls), parsed.content
                invalid = parsed.error is not None
            reply = reply_message(content, calls)
            turn = self._turn(session, prompt_ids, gen, content, invalid)
            self.sampler.builder.record(session, messages, tools, extends, prompt_ids, reply, turn)
            self._count(session, extends, ignored_fields(body))
        finally:
            session.busy = False
        finish = "tool_calls" if calls else gen.finish_reason
        message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
        if calls:
            message["tool_calls"] = [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
                                      "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
                                     for n, a in calls]
        return {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.model, "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                                  "logprobs": None}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen.token_ids),
                          "total_tokens": len(prompt_ids) + len(gen.token_ids)}}

    async def completion(self, session: GatewaySession, body: CompletionRequest) -> dict[str, Any]:
        """Serve one text completion: a prompt that starts with the segment's text (prompt + sampled text) gets the
        recorded ids and only its new text encoded; any other prompt starts a new segment."""
        self._start_call(session)
        self._check_text_size([body.prompt])
        session.busy = True
        try:
            seg = session.segments[-1] if session.segments else None
            seg_text = seg.messages[0]["content"] if seg is not None and seg.messages and \
                seg.messages[0]["role"] == "_text" else None
            extends = seg_text is not None and len(body.prompt) > len(seg_text) and body.prompt.startswith(seg_text)
            tok = self.sampler.tokenizer
            if extends:
                prompt_ids = seg.ids + encode_data(tok, body.prompt[len(seg_text):])
            else:
                prompt_ids = encode_data(tok, body.prompt)
            if not prompt_ids:
                raise RequestError("prompt is empty")
            self._check_prompt(prompt_ids)
            gen, _ = await self.sampler.sample(session, prompt_ids, tools=False)
            gen = self._cut(gen, self._cap(body.max_tokens))
            turn = self._turn(session, prompt_ids, gen, gen.text, False)
            if not extends:
                if session.segments:
                    session.prefix_breaks += 1
                session.segments.append(Segment([], None, [], [], []))
            seg = session.segments[-1]
            seg.messages = [{"role": "_text", "content": body.prompt + gen.text}]
            seg.prompt_ids, seg.response_ids = list(prompt_ids), list(gen.token_ids)
            seg.ids = list(prompt_ids) + list(gen.token_ids)
            turn.segment = turn.info["segment"] = len(session.segments) - 1
            session.turns.append(turn)
            self._count(session, extends, ignored_fields(body))
        finally:
            session.busy = False
        return {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
                "model": body.model, "choices": [{"index": 0, "text": gen.text, "finish_reason": gen.finish_reason,
                                                  "logprobs": None}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen.token_ids),
                          "total_tokens": len(prompt_ids) + len(gen.token_ids)}}

    def _cut(self, gen: Generation, cap: int) -> Generation:
        """A generation cut at ``cap`` tokens (a prefix of a sample is a sample: ``finish_reason="length"``)."""
        if len(gen.token_ids) <= cap:
            return gen
        ids = list(gen.token_ids[:cap])
        text = self.sampler.decode(ids)
        return Generation(token_ids=ids, logprobs=list(gen.logprobs[:cap]), text=text, finish_reason="length",
                          cached_tokens=gen.cached_tokens, policy_version=gen.policy_version)

    @staticmethod
    def _turn(session: GatewaySession, prompt_ids: list[int], gen: Generation, action: str, invalid: bool) -> Turn:
        version = gen.policy_version if gen.policy_version is not None else session.policy_version
        return Turn(prompt_ids=list(prompt_ids), response_ids=list(gen.token_ids),
                    response_logprobs=list(gen.logprobs), action=action, invalid=invalid,
                    response_truncated=gen.finish_reason == "length", policy_version=int(version))

    def _count(self, session: GatewaySession, extends: bool, ignored: dict[str, Any]) -> None:
        session.requests += 1
        session.ignored.append(ignored)
        self.requests += 1
        if not extends and len(session.segments) > 1:
            self.prefix_breaks += 1

    # ---------------------------------------------------------------------------------------------- HTTP
    def _build_app(self) -> Any:
        app = FastAPI(title="agent_rl gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(RequestError)
        async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
            return _error(exc.status, str(exc), exc.code)

        @app.exception_handler(RequestValidationError)
        async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            code = "invalid_text" if first.get("type") == "string_unicode" else "invalid_request"  # lone surrogate
            return _error(400, f"{where}: {first.get('msg', 'invalid request')}"[:500], code)

        def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                "owned_by": "agent_rl"}]}

        async def chat(request: Request, body: ChatCompletionRequest, sid: str | None = None) -> Any:
            _check_text(body)
            with self._call_session(request, sid) as session:
                result = await self.chat(session, body)
            if not body.stream:
                return result
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(_chat_chunks(result, include_usage), media_type="text/event-stream")

        async def completions(request: Request, body: CompletionRequest, sid: str | None = None) -> Any:
            _check_text(body)
            with self._call_session(request, sid) as session:
                result = await self.completion(session, body)
            if not body.stream:
                return result
            return StreamingResponse(_completion_chunks(result), media_type="text/event-stream")

        async def reward(request: Request, sid: str, body: RewardRequest) -> dict[str, Any]:
            _check_text(body)
            session = self._session(request, sid, open_new=False)  # a reward names an episode that exists
            if session.reward is not None:
                raise RequestError("the episode's reward was already posted", "reward_exists", 409)
            session.reward = float(body.reward)
            session.reward_info = dict(body.info)
            if body.won is not None:
                session.reward_info["won"] = bool(body.won)
            if self.on_reward is not None:
                self.on_reward(session)
            return {"session_id": session.session_id, "reward": session.reward}

        async def env_step(request: Request, env_sid: str, body: StepRequest) -> Any:
            _check_text(body)
            session = self._session(request, None, open_new=False)
            if session.env_session is None or env_sid != session.env_session:
                raise RequestError("session not found", "session_not_found", 404)
            return await self.sampler.env_step(session, env_sid, body.action)

        for prefix in ("", "/sessions/{sid}"):
            app.add_api_route(prefix + "/v1/models", models, methods=["GET"])
            app.add_api_route(prefix + "/v1/chat/completions", chat, methods=["POST"])
            app.add_api_route(prefix + "/v1/completions", completions, methods=["POST"])
        app.add_api_route("/sessions/{sid}/reward", reward, methods=["POST"])
        app.add_api_route("/env/sessions/{env_sid}/step", env_step, methods=["POST"])

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok"}

        guarded = BodyGuardMiddleware(app, self.limits.max_body_bytes)
        return AccessGate(guarded, self.settings)


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def _pieces(text: str, size: int = 16) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


async def _chat_chunks(result: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """The chat completion ``result`` as OpenAI stream chunks: the role, the content in pieces, the tool calls
    (one chunk each, arguments whole), the finish reason, the usage when asked, ``[DONE]``."""
    base = {k: result[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = result["choices"][0]
    msg = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(msg.get("content") or ""):
        yield chunk({"content": piece})
    for i, call in enumerate(msg.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield _sse({**base, "choices": [], "usage": result["usage"]})
    yield b"data: [DONE]\n\n"


async def _completion_chunks(result: dict[str, Any]) -> AsyncIterator[bytes]:
    choice = result["choices"][0]
    base = {k: result[k] for k in ("id", "object", "created", "model")}
    for piece in _pieces(choice["text"]):
        yield _sse({**base, "choices": [{"index": 0, "text": piece, "finish_reason": None, "logprobs": None}]})
    yield _sse({**base, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"],
                                     "logprobs": None}]})
    yield b"data: [DONE]\n\n"

