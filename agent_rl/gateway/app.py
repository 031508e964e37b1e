"""The gateway: an OpenAI-compatible HTTP surface in front of the run's engine that records every sampled token.

Routes (each also under ``/sessions/<id>`` for clients that cannot set headers: ``base_url=.../sessions/<id>/v1``):

- ``POST /v1/chat/completions``: OpenAI chat completions, non-streaming or streaming (``stream=true``: server-sent
  events, the same ids: the reply is generated whole, then sent as chunks), ``tools=`` and ``tool_choice`` (calls
  parsed by ``model.tool_call_format`` and returned as ``tool_calls``; ``tool_choice="none"``: the reply is text);
- ``POST /v1/completions``: a text prompt (its text is data: no control tokens);
- ``POST /v1/responses``: the Responses API (text and function-call items, ``previous_response_id`` within the
  session, streaming as Responses events), served and recorded as a chat call (:mod:`agent_rl.gateway.responses`);
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
Every request field is honoured or refused with a 400 naming it (:mod:`agent_rl.gateway.fields`); the sampling
distribution is the trainer's, said in each reply (``agent_rl_sampling``). Errors, the gate's and the body guard's
included, are OpenAI-shaped; an unknown route is 404 ``unknown_route`` naming the routes served; a repeated
``X-Session-ID`` is 400 ``duplicate_header``; calls after the episode's reward is posted are 409 ``episode_over``.
Messages, tools and tool calls are bounded in number; ``max_tokens`` is capped by the run's ``engine.max_new_tokens``;
a prompt over ``rollout.max_prompt_tokens`` is 400 ``context_length_exceeded``; one request at a time per session
(409 ``session_busy``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_rl.gateway.fields import CallOptions, call_options, cut_at_stop
from agent_rl.gateway.recorder import (GatewaySession, Match, Message, PromptBuilder, RequestError, Segment,
                                       normalize_message, reply_message)
from agent_rl.gateway.responses import chat_tools, conversation, remember, response_events, response_object
from agent_rl.gateway.schemas import (ChatCompletionRequest, CompletionRequest, ResponsesRequest, RewardRequest,
                                      StepRequest)
from agent_rl.rollout.prompts.encoding import encode_data
from agent_rl.types import Generation, Turn
from envs.hosting.jsonable import lone_surrogate
from servers.access import CLIENT_KEY, AccessGate
from servers.middleware import BodyGuardMiddleware

log = logging.getLogger(__name__)

ROUTES = ("GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses",
          "POST /sessions/<id>/reward", "POST /env/sessions/<env session>/step", "GET /health",
          "(each /v1 route also under /sessions/<id>/v1)")
"""What the gateway serves (named by the 404 of any other route)."""

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
    """What serves the gateway's calls (:class:`agent_rl.gateway.external.ProgramEpisode`)."""

    tokenizer: Any
    builder: PromptBuilder

    async def sample(self, session: GatewaySession, prompt_ids: list[int], *, tools: bool,
                     max_new_tokens: int | None = None, stop: list[str] | None = None,
                     seed: int | None = None) -> tuple[Generation, bool]:
        """One call's generation at the session's sampling settings (``max_new_tokens``: the engine's cap of the
        call; ``stop``: the client's stop strings, added to the engine's; ``seed``: mixed into the row seed), and
        whether its prompt opened a reasoning block."""

    def parse_calls(self, text: str, opened: bool) -> Any:
        """The tool-call format's reading (``ToolCallParse``) of a reply."""

    def sampling_rule(self) -> dict[str, Any]:
        """The run's sampling beside the episode's temperature: ``{"top_p", "top_k"}``."""

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


def error_body(message: str, code: str, param: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` (plus ``detail`` and ``code`` at the
    top, the env servers' shape, for clients of both)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}, "detail": message,
            "code": code}


def _error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, code, param), status_code=status)


def call_opening(fmt: Any, name: str | None) -> str:
    """The text a tool-call format writes before a call's name (``name`` None) or, for a named function, before its
    arguments: hermes ``<tool_call>\\n{"name": "`` / ``<tool_call>\\n{"name": "f", "arguments": ``. Read from
    the format's own :meth:`render_call`, so every registered format has one."""
    probe_name, probe_key = "zzAgentRlNamezz", "zzAgentRlArgzz"
    rendered = fmt.render_call(probe_name if name is None else name, {probe_key: 0})
    if name is None:
        return rendered[:rendered.index(probe_name)]
    return rendered[:rendered.index("{" + json.dumps(probe_key))]


@dataclass
class Served:
    """One served chat call: what the client gets (``content``, ``calls`` in the wire form, ``finish_reason``,
    ``logprobs`` when asked) and the sizes of the usage."""

    response_id: str
    content: str
    calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[dict[str, Any]] | None
    messages: list[Message]
    reply: Message


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
        self.generated_tokens = 0
        self._causes_seen: set[str] = set()
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
        named = request.headers.getlist("x-session-id")
        if len(named) > 1:  # ambiguous (a proxy may read the last): refused like the gate's repeated headers
            raise RequestError("the X-Session-ID header is sent more than once (one is allowed)", "duplicate_header")
        header_sid = named[0] if named else None
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
    def _check_counts(self, messages: list[Any], tools: list[Any] | None) -> None:
        lim = self.limits
        if len(messages) > lim.max_messages:
            raise RequestError(f"{len(messages)} messages; at most {lim.max_messages}", "too_many_messages")
        if tools is not None and len(tools) > lim.max_tools:
            raise RequestError(f"{len(tools)} tools; at most {lim.max_tools}", "too_many_tools")

    def _cap(self, requested: int | None) -> int:
        cap = self.limits.max_new_tokens
        return cap if requested is None else min(int(requested), cap)

    def _start_call(self, session: GatewaySession) -> None:
        if session.busy:
            raise RequestError("another request of this session is running (one at a time)", "session_busy", 409)
        if session.reward is not None:
            raise RequestError("the episode's reward is posted: the episode is over, no more calls",
                               "episode_over", 409)
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

    def _single_call_stop(self) -> bool:
        return bool(self.sampler.builder.tool_format.stop)

    def options(self, data: dict[str, Any], *, handled: tuple[str, ...], tools: list[dict[str, Any]] | None,
                **kwargs: Any) -> CallOptions:
        """The checked :class:`~agent_rl.gateway.fields.CallOptions` of a request's sent fields."""
        names = [t["function"]["name"] for t in tools] if tools else None
        return call_options(data, handled=handled, tool_names=names, single_call_stop=self._single_call_stop(),
                            **kwargs)

    def _text(self, ids: list[int], tools_mode: bool) -> str:
        if tools_mode:
            return self.sampler.decode(ids)
        return self.sampler.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _stop_cut(self, gen: Generation, stops: list[str], tools_mode: bool) -> Generation:
        """The generation ended before its first client stop string (ids and text: :func:`cut_at_stop`)."""
        if not stops:
            return gen
        cut = cut_at_stop(list(gen.token_ids), gen.text, stops, lambda ids: self._text(ids, tools_mode))
        if cut is None:
            return gen
        k, text = cut
        return Generation(token_ids=list(gen.token_ids[:k]), logprobs=list(gen.logprobs[:k]), text=text,
                          finish_reason="stop", cached_tokens=gen.cached_tokens, policy_version=gen.policy_version)

    def _logprobs(self, gen: Generation) -> list[dict[str, Any]]:
        """OpenAI's ``logprobs.content``: each sampled token's text, log-prob at the call's temperature and bytes;
        no alternatives (``top_logprobs`` empty)."""
        tok = self.sampler.tokenizer
        out = []
        for token_id, lp in zip(gen.token_ids, gen.logprobs):
            text = tok.decode([int(token_id)])
            out.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8", "replace")),
                        "top_logprobs": []})
        return out

    def sampling(self, session: GatewaySession, overridden: dict[str, int]) -> dict[str, Any]:
        """The sampling rule of a reply (``agent_rl_sampling`` in every response): the trainer's temperature (the
        episode's), top_p and top_k, and the client's sampling fields it replaced."""
        return {"temperature": session.temperature, **self.sampler.sampling_rule(), "rule": "trainer",
                "overridden": sorted(overridden)}

    async def serve_call(self, session: GatewaySession, raw_messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None, opts: CallOptions) -> Served:
        """Serve one chat call in ``session`` (chat completions and the Responses API): the prompt (recorded ids
        spliced in, or a new segment), one generation at the session's sampling under the call's cap, stop strings
        and seed, the tool call parsed, the turn recorded.

        Raises:
            RequestError: a refused request (nothing of the session changes).
        """
        self._check_counts(raw_messages, tools)
        self._start_call(session)
        messages = [normalize_message(m) for m in raw_messages]
        tools_mode = bool(tools) and opts.tool_choice != "none"
        self._check_text_size([m["content"] for m in messages] + ([json.dumps(tools)] if tools else []))
        session.busy = True
        try:
            prompt_ids, match = self.sampler.builder.prompt(session, messages, tools)
            opening = ""
            if tools_mode and opts.tool_choice in ("required", "function"):  # the reply starts as a call
                try:
                    opening = call_opening(self.sampler.builder.tool_format, opts.tool_name)
                except ValueError:  # a format whose calls do not start with their name
                    raise RequestError(f"tool_choice: {opts.tool_choice!r} is not served with the "
                                       f"{self.sampler.builder.tool_format.name} format", "unsupported_parameter",
                                       param="tool_choice") from None
                prompt_ids = prompt_ids + [int(i) for i in self.sampler.tokenizer.encode(
                    opening, add_special_tokens=False)]
            self._check_prompt(prompt_ids)
            cap = self._cap(opts.max_new_tokens)
            gen, opened = await self.sampler.sample(session, prompt_ids, tools=tools_mode, max_new_tokens=cap,
                                                    stop=opts.stop, seed=opts.seed)
            gen = self._stop_cut(self._cut(gen, cap), opts.stop, tools_mode)
            calls: list[tuple[str, dict[str, Any]]] = []
            content, invalid = opening + gen.text, False
            if tools_mode:
                parsed = self.sampler.parse_calls(opening + gen.text, opened)
                if parsed.error is None and parsed.calls:
                    calls, content = list(parsed.calls), parsed.content
                invalid = parsed.error is not None or (bool(opening) and not calls) or (
                    opts.tool_name is not None and any(n != opts.tool_name for n, _ in calls))
            reply = reply_message(content, calls)
            turn = self._turn(session, prompt_ids, gen, content, invalid)
            stops = tuple(opts.stop) + tuple(self.sampler.builder.tool_format.stop)
            self.sampler.builder.record(session, messages, tools, match, prompt_ids, reply, turn, stops)
            self._count(session, match, opts)
        finally:
            session.busy = False
        wire = [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
                 "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}} for n, a in calls]
        return Served(response_id=secrets.token_hex(12), content=content, calls=wire,
                      finish_reason="tool_calls" if calls else gen.finish_reason, prompt_tokens=len(prompt_ids),
                      completion_tokens=len(gen.token_ids), logprobs=self._logprobs(gen) if opts.logprobs else None,
                      messages=messages, reply=reply)

    async def chat(self, session: GatewaySession, body: ChatCompletionRequest) -> dict[str, Any]:
        """Serve one chat completion (:meth:`serve_call`); returns the OpenAI response."""
        data = body.model_dump(exclude_unset=True)
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        opts = self.options(data, handled=("messages", "tools"), tools=tools)
        raw = [m.model_dump(exclude_unset=False) for m in body.messages]
        served = await self.serve_call(session, raw, tools, opts)
        message: dict[str, Any] = {"role": "assistant",
                                   "content": served.content if (served.content or not served.calls) else None}
        if served.calls:
            message["tool_calls"] = served.calls
        logprobs = {"content": served.logprobs, "refusal": None} if served.logprobs is not None else None
        return {"id": f"chatcmpl-{served.response_id}", "object": "chat.completion", "created": int(time.time()),
                "model": body.model, "choices": [{"index": 0, "message": message,
                                                  "finish_reason": served.finish_reason, "logprobs": logprobs}],
                "usage": {"prompt_tokens": served.prompt_tokens, "completion_tokens": served.completion_tokens,
                          "total_tokens": served.prompt_tokens + served.completion_tokens},
                "agent_rl_sampling": self.sampling(session, opts.overridden)}

    async def responses(self, session: GatewaySession, body: ResponsesRequest) -> dict[str, Any]:
        """Serve one Responses API call (:mod:`agent_rl.gateway.responses`, :meth:`serve_call`); returns the
        ``response`` object."""
        data = body.model_dump(exclude_unset=True)
        tools = chat_tools(data.get("tools"))
        choice = data.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
            data["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        if data.get("include"):
            wanted = data.pop("include")
            if not isinstance(wanted, list) or set(wanted) - {"message.output_text.logprobs"}:
                raise RequestError("include: only 'message.output_text.logprobs' is served", "unsupported_parameter",
                                   param="include")
            data["logprobs"] = True
        opts = self.options(data, handled=("input", "instructions", "previous_response_id", "tools"), tools=tools,
                            max_tokens_fields=("max_output_tokens",))
        messages = conversation(session, data)
        served = await self.serve_call(session, messages, tools, opts)
        response = response_object(data, served, self.sampling(session, opts.overridden))
        response["id"] = f"resp_{served.response_id}"
        wire_reply: dict[str, Any] = {"role": "assistant", "content": served.content}
        if served.calls:
            wire_reply["tool_calls"] = served.calls
        remember(session, response["id"], messages[1:] if data.get("instructions") else messages, wire_reply)
        return response

    async def completion(self, session: GatewaySession, body: CompletionRequest) -> dict[str, Any]:
        """Serve one text completion: a prompt that starts with the segment's text (prompt + sampled text) gets the
        recorded ids and only its new text encoded; any other prompt starts a new segment. A reply that ended on
        an end token (EOS: not in the text the client got) is followed by the recorded ids without it, in a new
        segment (the next prompt is what the client's text encodes to, never a token it does not hold)."""
        opts = self.options(body.model_dump(exclude_unset=True), handled=("prompt",), tools=None,
                            chat_logprobs=False)
        self._start_call(session)
        self._check_text_size([body.prompt])
        session.busy = True
        try:
            seg = session.segments[-1] if session.segments else None
            seg_text = seg.messages[0]["content"] if seg is not None and seg.messages and \
                seg.messages[0]["role"] == "_text" else None
            extends = seg_text is not None and len(body.prompt) > len(seg_text) and body.prompt.startswith(seg_text)
            tok = self.sampler.tokenizer
            restart = False
            if extends:
                assert seg is not None
                response = list(seg.response_ids)
                if response and response[-1] in self.sampler.builder.eos_ids:
                    response, restart = response[:-1], True
                prompt_ids = list(seg.prompt_ids) + response + encode_data(tok, body.prompt[len(seg_text):])
            else:
                prompt_ids = encode_data(tok, body.prompt)
            if not prompt_ids:
                raise RequestError("prompt is empty")
            self._check_prompt(prompt_ids)
            cap = self._cap(opts.max_new_tokens)
            gen, _ = await self.sampler.sample(session, prompt_ids, tools=False, max_new_tokens=cap,
                                               stop=opts.stop, seed=opts.seed)
            gen = self._stop_cut(self._cut(gen, cap), opts.stop, False)
            turn = self._turn(session, prompt_ids, gen, gen.text, False)
            match = Match(extends and not restart, None if extends or not session.segments else "text_edited",
                          restart=restart)
            if not match.extends:
                if session.segments and not restart:
                    session.prefix_breaks += 1
                    session.breaks["text_edited"] = session.breaks.get("text_edited", 0) + 1
                session.segments.append(Segment([], None, [], [], []))
            seg = session.segments[-1]
            seg.messages = [{"role": "_text", "content": body.prompt + gen.text}]
            seg.prompt_ids, seg.response_ids = list(prompt_ids), list(gen.token_ids)
            seg.ids = list(prompt_ids) + list(gen.token_ids)
            turn.segment = turn.info["segment"] = len(session.segments) - 1
            session.turns.append(turn)
            self._count(session, match, opts)
        finally:
            session.busy = False
        logprobs = None
        if opts.logprobs:
            content = self._logprobs(gen)
            offsets, at = [], len(body.prompt)
            for item in content:
                offsets.append(at)
                at += len(item["token"])
            logprobs = {"tokens": [c["token"] for c in content], "token_logprobs": [c["logprob"] for c in content],
                        "top_logprobs": None, "text_offset": offsets}
        return {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
                "model": body.model, "choices": [{"index": 0, "text": gen.text, "finish_reason": gen.finish_reason,
                                                  "logprobs": logprobs}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen.token_ids),
                          "total_tokens": len(prompt_ids) + len(gen.token_ids)},
                "agent_rl_sampling": self.sampling(session, opts.overridden)}

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

    def _count(self, session: GatewaySession, match: Match, opts: CallOptions) -> None:
        session.requests += 1
        session.ignored.append(dict(opts.overridden))
        self.requests += 1
        self.generated_tokens += len(session.turns[-1].response_ids) if session.turns else 0
        if not match.extends and not match.restart and len(session.segments) > 1:
            self.prefix_breaks += 1
            cause = match.cause or "text_edited"
            level = logging.INFO if cause in self._causes_seen else logging.WARNING  # each cause shown once
            self._causes_seen.add(cause)
            log.log(level, "gateway: session %s: prefix break (%s) at call %d: %s", session.session_id[:12], cause,
                    session.requests, match.detail or "the prompt's text differs")

    # ---------------------------------------------------------------------------------------------- HTTP
    def _build_app(self) -> Any:
        app = FastAPI(title="agent_rl gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(RequestError)
        async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
            return _error(exc.status, str(exc), exc.code, exc.param)

        @app.exception_handler(RequestValidationError)
        async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
            first = exc.errors()[0] if exc.errors() else {}
            loc = [str(p) for p in first.get("loc", ())]
            where = ".".join(loc)
            code = "invalid_text" if first.get("type") == "string_unicode" else "invalid_request"  # lone surrogate
            param = loc[1] if len(loc) > 1 and loc[0] == "body" else None
            return _error(400, f"{where}: {first.get('msg', 'invalid request')}"[:500], code, param)

        @app.exception_handler(StarletteHTTPException)
        async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            if exc.status_code in (404, 405):
                what = "not found" if exc.status_code == 404 else f"does not take {request.method}"
                return _error(exc.status_code, f"{request.method} {request.url.path[:200]}: {what}; this gateway "
                                               f"serves {', '.join(ROUTES)}", "unknown_route" if
                              exc.status_code == 404 else "method_not_allowed")
            return _error(exc.status_code, str(exc.detail), "http_error")

        @app.exception_handler(Exception)
        async def _unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: logged, still OpenAI-shaped
            log.error("gateway: %s %s failed", request.method, request.url.path[:200], exc_info=exc)
            return JSONResponse(error_body(f"internal error ({type(exc).__name__})", "internal_error",
                                           kind="server_error"), status_code=500)

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

        async def responses(request: Request, body: ResponsesRequest, sid: str | None = None) -> Any:
            _check_text(body)
            session = self._session(request, sid)
            result = await self.responses(session, body)
            if not body.stream:
                return result
            return StreamingResponse(response_events(result), media_type="text/event-stream")

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
            if session.reward is not None:
                raise RequestError("the episode's reward is posted: the episode is over, no more steps",
                                   "episode_over", 409)
            return await self.sampler.env_step(session, env_sid, body.action)

        for prefix in ("", "/sessions/{sid}"):
            app.add_api_route(prefix + "/v1/models", models, methods=["GET"])
            app.add_api_route(prefix + "/v1/chat/completions", chat, methods=["POST"])
            app.add_api_route(prefix + "/v1/completions", completions, methods=["POST"])
            app.add_api_route(prefix + "/v1/responses", responses, methods=["POST"])
        app.add_api_route("/sessions/{sid}/reward", reward, methods=["POST"])
        app.add_api_route("/env/sessions/{env_sid}/step", env_step, methods=["POST"])

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok"}

        def refusal(status: int, code: str, message: str) -> dict[str, Any]:
            return error_body(message, code)

        guarded = BodyGuardMiddleware(app, self.limits.max_body_bytes, render=refusal)
        return AccessGate(guarded, self.settings, render=refusal)


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

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                          "logprobs": logprobs}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(msg.get("content") or ""):
        yield chunk({"content": piece})
    for i, call in enumerate(msg.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, choice["finish_reason"], choice.get("logprobs"))  # the sampled tokens' log-probs, all at once
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

