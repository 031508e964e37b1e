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

import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from agent_rl.gateway.fields import CallOptions, call_options
from agent_rl.gateway.limits import (GatewayLimits, capped, check_call_allowed, check_counts, check_prompt,
                                     check_text_size)
from agent_rl.gateway.recorder import (GatewaySession, Match, Message, PromptBuilder, RequestError, Segment,
                                       normalize_message, reply_message)
from agent_rl.gateway.responses import chat_tools, conversation, remember, response_object
from agent_rl.gateway.routes import ROUTES, build_app, error_body
from agent_rl.gateway.schemas import ChatCompletionRequest, CompletionRequest, ResponsesRequest, RewardRequest
from agent_rl.gateway.sessions import RUN_CLIENT, GatewaySettings, SessionStore
from agent_rl.gateway.shaping import (call_opening, completion_logprobs, cut_at_cap, cut_at_stops, recorded_turn,
                                      token_logprobs)
from agent_rl.rollout.prompts.encoding import encode_data
from agent_rl.types import Generation

log = logging.getLogger(__name__)

__all__ = ["ROUTES", "RUN_CLIENT", "Gateway", "GatewayLimits", "GatewaySettings", "Sampler", "Served", "call_opening",
           "error_body"]


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
    """The sessions (:attr:`store`), their recording and the HTTP app (:attr:`app`: :mod:`agent_rl.gateway.routes`).

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
        self.store = SessionStore(self.settings, max_requests=self.limits.max_requests, auto_sessions=auto_sessions,
                                  session_defaults=session_defaults)
        self.sessions = self.settings.sessions
        self.on_reward = on_reward
        self.requests = 0
        self.prefix_breaks = 0
        self.generated_tokens = 0
        self._causes_seen: set[str] = set()
        self.app = build_app(self)

    # ---------------------------------------------------------------------------------------------- sessions
    @property
    def auto_sessions(self) -> bool:
        """The run's token may open a session by naming it (:class:`SessionStore`)."""
        return self.store.auto_sessions

    @auto_sessions.setter
    def auto_sessions(self, value: bool) -> None:
        self.store.auto_sessions = value

    @property
    def session_defaults(self) -> dict[str, Any]:
        """:class:`GatewaySession` fields of sessions opened by name (:class:`SessionStore`)."""
        return self.store.session_defaults

    @session_defaults.setter
    def session_defaults(self, value: dict[str, Any]) -> None:
        self.store.session_defaults = dict(value)

    def open_session(self, session_id: str | None = None, **kwargs: Any) -> GatewaySession:
        """A new episode's session (``kwargs``: :class:`GatewaySession` fields: temperature, key, ...)."""
        return self.store.open(session_id, **kwargs)

    def close_session(self, session_id: str) -> GatewaySession | None:
        """End a session: its token stops working, its record is returned (None when unknown)."""
        return self.store.close(session_id)

    def post_reward(self, session: GatewaySession, body: RewardRequest) -> dict[str, Any]:
        """Record the program's reward of its episode (once: again is 409 ``reward_exists``); calls ``on_reward``."""
        if session.reward is not None:
            raise RequestError("the episode's reward was already posted", "reward_exists", 409)
        session.reward = float(body.reward)
        session.reward_info = dict(body.info)
        if body.won is not None:
            session.reward_info["won"] = bool(body.won)
        if self.on_reward is not None:
            self.on_reward(session)
        return {"session_id": session.session_id, "reward": session.reward}

    async def env_step(self, session: GatewaySession, env_sid: str, action: str) -> Any:
        """One step of the session's own env session (another is 404 ``session_not_found``; after the reward, 409
        ``episode_over``)."""
        if session.env_session is None or env_sid != session.env_session:
            raise RequestError("session not found", "session_not_found", 404)
        if session.reward is not None:
            raise RequestError("the episode's reward is posted: the episode is over, no more steps",
                               "episode_over", 409)
        return await self.sampler.env_step(session, env_sid, action)

    # ---------------------------------------------------------------------------------------------- serving
    def options(self, data: dict[str, Any], *, handled: tuple[str, ...], tools: list[dict[str, Any]] | None,
                **kwargs: Any) -> CallOptions:
        """The checked :class:`~agent_rl.gateway.fields.CallOptions` of a request's sent fields."""
        names = [t["function"]["name"] for t in tools] if tools else None
        return call_options(data, handled=handled, tool_names=names,
                            single_call_stop=bool(self.sampler.builder.tool_format.stop), **kwargs)

    def _text(self, ids: list[int], tools_mode: bool) -> str:
        if tools_mode:
            return self.sampler.decode(ids)
        return self.sampler.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _shape(self, gen: Generation, cap: int, stops: list[str], tools_mode: bool) -> Generation:
        """A generation cut at the call's cap, then before its first client stop string (:mod:`.shaping`)."""
        gen = cut_at_cap(gen, cap, self.sampler.decode)
        return cut_at_stops(gen, stops, lambda ids: self._text(ids, tools_mode))

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
        check_counts(self.limits, raw_messages, tools)
        check_call_allowed(session)
        messages = [normalize_message(m) for m in raw_messages]
        tools_mode = bool(tools) and opts.tool_choice != "none"
        check_text_size(self.limits, self.sampler.builder,
                        [m["content"] for m in messages] + ([json.dumps(tools)] if tools else []))
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
            check_prompt(self.limits, prompt_ids)
            cap = capped(self.limits, opts.max_new_tokens)
            gen, opened = await self.sampler.sample(session, prompt_ids, tools=tools_mode, max_new_tokens=cap,
                                                    stop=opts.stop, seed=opts.seed)
            gen = self._shape(gen, cap, opts.stop, tools_mode)
            calls: list[tuple[str, dict[str, Any]]] = []
            content, invalid = opening + gen.text, False
            if tools_mode:
                parsed = self.sampler.parse_calls(opening + gen.text, opened)
                if parsed.error is None and parsed.calls:
                    calls, content = list(parsed.calls), parsed.content
                invalid = parsed.error is not None or (bool(opening) and not calls) or (
                    opts.tool_name is not None and any(n != opts.tool_name for n, _ in calls))
            reply = reply_message(content, calls)
            turn = recorded_turn(session, prompt_ids, gen, content, invalid)
            stops = tuple(opts.stop) + tuple(self.sampler.builder.tool_format.stop)
            self.sampler.builder.record(session, messages, tools, match, prompt_ids, reply, turn, stops)
            self._count(session, match, opts)
        finally:
            session.busy = False
        wire = [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
                 "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}} for n, a in calls]
        logprobs = token_logprobs(self.sampler.tokenizer, gen) if opts.logprobs else None
        return Served(response_id=secrets.token_hex(12), content=content, calls=wire,
                      finish_reason="tool_calls" if calls else gen.finish_reason, prompt_tokens=len(prompt_ids),
                      completion_tokens=len(gen.token_ids), logprobs=logprobs, messages=messages, reply=reply)

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
        check_call_allowed(session)
        check_text_size(self.limits, self.sampler.builder, [body.prompt])
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
            check_prompt(self.limits, prompt_ids)
            cap = capped(self.limits, opts.max_new_tokens)
            gen, _ = await self.sampler.sample(session, prompt_ids, tools=False, max_new_tokens=cap,
                                               stop=opts.stop, seed=opts.seed)
            gen = self._shape(gen, cap, opts.stop, False)
            turn = recorded_turn(session, prompt_ids, gen, gen.text, False)
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
        logprobs = completion_logprobs(token_logprobs(self.sampler.tokenizer, gen), body.prompt) \
            if opts.logprobs else None
        return {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
                "model": body.model, "choices": [{"index": 0, "text": gen.text, "finish_reason": gen.finish_reason,
                                                  "logprobs": logprobs}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen.token_ids),
                          "total_tokens": len(prompt_ids) + len(gen.token_ids)},
                "agent_rl_sampling": self.sampling(session, opts.overridden)}

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
