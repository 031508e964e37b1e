"""The gateway with the real ``openai`` client, the real HF engine and the tiny model: recorded ids are the engine's
sampled ids and each call's prompt is the previous prompt + the sampled response + only the new messages; a
history-rewriting program shows a prefix break and two segments; a crashing program is re-run and never scored;
streaming and non-streaming give the same ids at temperature 0; a ReAct text agent (no tools) through the
per-episode base URL; and the attacker's view: token, other sessions, bounds, caps."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from agent_rl.engines import EngineBase, get_engine
from agent_rl.envclient import LocalEnvPool
from agent_rl.gateway import ExternalConfig, ExternalRollout
from agent_rl.gateway.server import GatewayServer
from agent_rl.learner.config import AlgoConfig, ModelConfig
from agent_rl.models import load_policy
from agent_rl.rollout import RolloutConfig, TaskSampler, TaskSamplerConfig, build_rollout_batch
from agent_rl.rollout.prompts.encoding import chat_ids
from envs.examples.calculator import CALCULATOR_TOOLS
from waiting import HANG_S, closed_by_server, http

torch.set_num_threads(1)
ENV = "agent_rl/Calculator-v0"


@pytest.fixture(scope="module")
def policy():
    model, tok = load_policy(ModelConfig(name="tiny"))
    return model.eval(), tok


class RecordingEngine(EngineBase):
    """The real HF engine, its every output kept (to compare the gateway's recorded ids with what it sampled); it
    declares the HF engine's EOS ids (``EngineBase.eos_token_ids``) and no capabilities."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.eos_token_ids = engine.eos_token_ids
        self.outputs: list[tuple[list[int], list[int], list[float]]] = []
        self._lock = threading.Lock()

    def generate(self, prompts, temperatures, **kwargs):
        gens = self.engine.generate(prompts, temperatures, **kwargs)
        with self._lock:
            self.outputs += [(list(p), list(g.token_ids), list(g.logprobs)) for p, g in zip(prompts, gens)]
        return gens

    def end_episode(self, episode_id: str) -> None:
        self.engine.end_episode(episode_id)


def play(policy, program: str, *, groups: int = 1, max_new_tokens: int = 12, engine=None,
         tasks_override: str | None = None, mode: str = "turn", **external):
    """Play ``groups`` TGRL groups of ``program`` on Calculator; returns the result and its metrics (the gateway's
    counters among them, :data:`agent_rl.rollout.orchestrator.GATEWAY_COUNTS`)."""
    model, tok = policy
    engine = engine or get_engine("hf", model, tok, seed=0)
    cfg = RolloutConfig(max_turns=3, episode_retries=1, retry_backoff_s=0.0, mode=mode)

    async def go():
        pool = LocalEnvPool()
        orch = ExternalRollout(pool, engine, cfg, ExternalConfig(program=program, tasks=tasks_override or ENV,
                                                                 **external),
                               max_new_tokens=max_new_tokens, seed=0)
        try:
            sampler = TaskSampler(ENV, TaskSamplerConfig(kind="seed"), seed=0)
            res = await orch.collect(sampler.sample, groups, AlgoConfig(name="tgrl", warmup_steps=0), step=1)
            return res, res.metrics
        finally:
            await orch.aclose()
            await pool.aclose()

    return asyncio.run(go())


def test_recorded_ids_are_the_engines_and_prompts_extend(policy):
    _, tok = policy
    engine = RecordingEngine(get_engine("hf", policy[0], tok, seed=0))
    res, metrics = play(policy, "tests.gateway.programs:calculator_tools", engine=engine)
    assert res.dropped_groups == 0 and len(res.episodes) == 4
    assert [ep.temperature for ep in res.episodes] == [0.3, 1.2, 1.2, 1.2]  # TGRL's T0/T1 slots
    sampled = {(tuple(p), tuple(r)): lp for p, r, lp in engine.outputs}
    turns = [t for ep in res.episodes for t in ep.turns]
    assert metrics["gateway/requests"] == len(turns) == len(engine.outputs) and metrics["gateway/prefix_breaks"] == 0
    for ep in res.episodes:
        for k, turn in enumerate(ep.turns):
            # the turn's ids are exactly one engine output (prompt in, ids and log-probs out)
            assert sampled[(tuple(turn.prompt_ids), tuple(turn.response_ids))] == turn.response_logprobs
            if k:  # token-in/token-out: the previous prompt and its sampled response, then the new messages only
                prev = ep.turns[k - 1]
                assert turn.prompt_ids[:len(prev.prompt_ids) + len(prev.response_ids)] == \
                    prev.prompt_ids + prev.response_ids
    first = res.episodes[0].turns[0]
    # the first prompt: the program's messages and the env's tools rendered on the orchestrator's path
    assert tok.decode(first.prompt_ids).count('"name": "calc"') == 1
    batch = build_rollout_batch(res.episodes, pad_token_id=tok.pad_token_id)
    assert batch.num_rows == len(turns)
    assert int(batch.response_mask.sum()) == sum(len(t.response_ids) for t in turns)  # only sampled ids trained


def test_prefix_break_starts_a_second_segment(policy):
    res, metrics = play(policy, "tests.gateway.programs:rewriting")
    assert metrics["gateway/prefix_breaks"] == 4 and metrics["gateway/segments"] == 8
    assert metrics["gateway/attempts"] == 4
    for ep in res.episodes:
        assert [t.info["segment"] for t in ep.turns] == [0, 0, 1] and ep.reward == 0.5
        a, b, c = ep.turns
        assert b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
        assert c.prompt_ids[:len(b.prompt_ids)] != b.prompt_ids  # rendered anew, not merged
        assert "Summary of the problem" in policy[1].decode(c.prompt_ids)


def test_prefix_break_in_trajectory_mode_gives_one_row_per_segment(policy):
    """``rollout.mode=trajectory``: a segment's turns extend each other (the recorded ids spliced), so each segment
    is one row; the rewritten history starts a second row, never merged into the first."""
    _, tok = policy
    res, metrics = play(policy, "tests.gateway.programs:rewriting", mode="trajectory")
    assert metrics["gateway/prefix_breaks"] == 4 and res.dropped_groups == 0
    batch = build_rollout_batch(res.episodes, pad_token_id=tok.pad_token_id, mode="trajectory")
    assert batch.num_rows == 8  # 4 episodes x 2 segments
    assert batch.episode_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch.turn_index.tolist() == [0, 1] * 4 and batch.num_turns.tolist() == [2] * 8
    for e, ep in enumerate(res.episodes):
        a, b, c = ep.turns  # segments 0, 0, 1
        first, second = batch.input_ids[2 * e], batch.input_ids[2 * e + 1]
        n0, n1 = len(b.prompt_ids) + len(b.response_ids), len(c.prompt_ids) + len(c.response_ids)
        assert first[:n0].tolist() == b.prompt_ids + b.response_ids and second[:n1].tolist() == c.prompt_ids + c.response_ids
        # only what the policy sampled is trained, once: the responses of a and b in row 0, of c in row 1
        assert int(batch.response_mask[2 * e].sum()) == len(a.response_ids) + len(b.response_ids)
        assert int(batch.response_mask[2 * e + 1].sum()) == len(c.response_ids)
        assert batch.engine_logprobs[2 * e + 1][len(c.prompt_ids):n1].tolist() == pytest.approx(c.response_logprobs)


def test_crashing_program_is_rerun_never_scored(policy, caplog):
    res, metrics = play(policy, "tests.gateway.programs:crash_first_attempt")
    assert res.metrics["rollout/episode_retries"] == 1 and res.dropped_groups == 0
    assert metrics["gateway/attempts"] == 5  # the crashed attempt is counted, its episode played again
    assert [ep.reward for ep in res.episodes] == [1.0] * 4  # the re-run's reward; the crash gave none
    assert not any(ep.won for ep in res.episodes)  # a reward alone is no success: won comes from the env or program
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agent_rl.gateway.external"):
        res, _ = play(policy, "tests.gateway.programs:always_crash")
    assert res.dropped_groups == 1 and res.episodes == [] and "harness always crashes" in res.failures[0]
    # every failed attempt in the run log with its full reason and the program's traceback
    failed = [r for r in caplog.records if "failed after" in r.message]
    assert len(failed) >= 2 and all(r.exc_info and "harness always crashes" in r.message for r in failed)
    res, _ = play(policy, "tests.gateway.programs:no_reward")
    assert res.dropped_groups == 1 and "no reward" in res.failures[0]


def test_react_text_agent_per_session_url(policy):
    res, metrics = play(policy, "tests.gateway.programs:react_text")
    assert res.dropped_groups == 0 and metrics["gateway/prefix_breaks"] == 0
    for ep in res.episodes:
        assert 1 <= len(ep.turns) <= 3 and all(t.info["segment"] == 0 for t in ep.turns)
        for k in range(1, len(ep.turns)):
            prev = ep.turns[k - 1]
            assert ep.turns[k].prompt_ids[:len(prev.prompt_ids) + len(prev.response_ids)] == \
                prev.prompt_ids + prev.response_ids


# ------------------------------------------------------------------------------------------------ one live gateway
class Live:
    """An ExternalRollout's gateway served in a background event loop with an open stream (calls from this thread)."""

    def __init__(self, policy, max_new_tokens: int = 12, auto_sessions: bool = False, engine=None,
                 max_prompt_tokens: int = 2000, **external) -> None:
        model, tok = policy
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        engine = engine or get_engine("hf", model, tok, seed=0)
        self.orch = ExternalRollout(None, engine, RolloutConfig(max_prompt_tokens=max_prompt_tokens),
                                    ExternalConfig(program="tests.gateway.programs:no_reward", **external),
                                    max_new_tokens=max_new_tokens, seed=0, auto_sessions=auto_sessions)
        self.call(self.orch.runner.start())
        self.call(self.orch.open_stream(seed_key=0))
        self.url = self.orch.runner.base_url
        self.token = self.orch.runner.gateway.settings.token

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(HANG_S)

    def session(self, **kwargs):
        return self.orch.runner.gateway.open_session(**kwargs)

    def client(self, session, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=session.api_key, max_retries=0, timeout=HANG_S, **kw)

    def close(self) -> None:
        self.call(self.orch.close_stream())
        self.call(self.orch.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def live(policy):
    gw = Live(policy)
    yield gw
    gw.close()


def _ids(session):
    return [(t.prompt_ids, t.response_ids) for t in session.turns]


def test_streaming_and_non_streaming_same_ids_at_temperature_0(live):
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    plain, streamed = live.session(temperature=0.0), live.session(temperature=0.0)
    reply = live.client(plain).chat.completions.create(model="x", messages=messages, max_tokens=12)
    stream = live.client(streamed).chat.completions.create(model="x", messages=messages, max_tokens=12, stream=True,
                                                           stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert _ids(plain) == _ids(streamed) and len(plain.turns) == 1
    # the same ids with tools too
    a, b = live.session(temperature=0.0), live.session(temperature=0.0)
    r1 = live.client(a).chat.completions.create(model="x", messages=messages, tools=CALCULATOR_TOOLS, max_tokens=12)
    list(live.client(b).chat.completions.create(model="x", messages=messages, tools=CALCULATOR_TOOLS, max_tokens=12,
                                                stream=True))
    assert _ids(a) == _ids(b) and r1.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_client_sampling_is_the_trainers_said_in_the_reply_max_tokens_capped(live, policy):
    s = live.session(temperature=0.0)
    t = live.session(temperature=0.0)
    messages = [{"role": "user", "content": "Count to ten."}]
    r = live.client(s).chat.completions.create(model="x", messages=messages, max_tokens=10**9, temperature=2.0,
                                               logit_bias={"42": 100}, top_p=0.5)
    live.client(t).chat.completions.create(model="x", messages=messages)
    assert r.usage.completion_tokens <= 12 and len(r.choices) == 1  # capped at engine.max_new_tokens
    assert _ids(s) == _ids(t)  # temperature 2.0, top_p and logit_bias changed nothing: the trainer's sampling
    # the reply says so; the call keeps the fields' names and sizes, never their values
    assert r.agent_rl_sampling == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "rule": "trainer",
                                   "overridden": ["logit_bias", "temperature", "top_p"]}
    assert s.ignored[0] == {"temperature": 3, "logit_bias": 11, "top_p": 3}
    # the first prompt is the orchestrator's render of the messages
    assert s.turns[0].prompt_ids == chat_ids(policy[1], messages)


def test_completions_and_models(live):
    s = live.session(temperature=0.0)
    c = live.client(s)
    assert [m.id for m in c.models.list().data] == ["policy"]
    first = c.completions.create(model="x", prompt="Once upon a time", max_tokens=6)
    c.completions.create(model="x", prompt="Once upon a time" + first.choices[0].text + " and then", max_tokens=6)
    a, b = s.turns
    assert len(a.response_ids) <= 6 and len(a.response_logprobs) == len(a.response_ids)  # cut at max_tokens
    assert first.usage.completion_tokens == len(a.response_ids)
    assert b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
    assert s.prefix_breaks == 0
    c.completions.create(model="x", prompt="Something else", max_tokens=4)
    assert s.prefix_breaks == 1 and [t.info["segment"] for t in s.turns] == [0, 0, 1]


def test_attacker_view(live):
    mine, other = live.session(temperature=0.0), live.session(temperature=0.0)
    url = f"{live.url}/v1/chat/completions"
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    auth = {"Authorization": f"Bearer {mine.api_key}"}
    assert http.post(url, json=body).status_code == 401  # no token
    assert http.post(url, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    # my key cannot reach another episode, by header or by URL; the same answer as for an unknown id
    r = http.post(url, json=body, headers={**auth, "X-Session-ID": other.session_id})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    r = http.post(f"{live.url}/sessions/{other.session_id}/v1/chat/completions", json=body, headers=auth)
    assert r.status_code == 404
    r = http.post(f"{live.url}/sessions/{other.session_id}/reward", json={"reward": 1.0}, headers=auth)
    assert r.status_code == 404 and other.reward is None and other.turns == []
    assert http.post(f"{live.url}/env/sessions/whatever/step", json={"action": "x"}, headers=auth).status_code == 404
    # a browser page of another origin, a repeated Authorization header
    assert http.post(url, json=body, headers={**auth, "Origin": "http://evil.example"}).status_code == 403
    assert http.post(url, json=body, headers=[("Authorization", f"Bearer {mine.api_key}"),
                                               ("Authorization", f"Bearer {other.api_key}")]).status_code == 400
    # bounded: the body, the messages, the tools, hostile shapes
    big = {**body, "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]}
    assert http.post(url, json=big, headers=auth).status_code == 413
    many = {**body, "messages": [{"role": "user", "content": "x"}] * 513}
    assert http.post(url, json=many, headers=auth).json()["error"]["code"] == "too_many_messages"
    tools = {**body, "tools": [CALCULATOR_TOOLS[0]] * 65}
    assert http.post(url, json=tools, headers=auth).json()["error"]["code"] == "too_many_tools"
    deep = '{"model": "x", "messages": ' + "[" * 5000 + "]" * 5000 + "}"
    assert http.post(url, content=deep, headers={**auth, "Content-Type": "application/json"}).status_code == 400
    bad = {**body, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert http.post(url, json=bad, headers=auth).status_code == 400
    assert http.post(url, json={**body, "messages": []}, headers=auth).status_code == 400
    assert http.post(url, json={**body, "max_tokens": -1}, headers=auth).status_code == 400
    long_prompt = {**body, "messages": [{"role": "user", "content": "word " * 3000}]}
    assert http.post(url, json=long_prompt, headers=auth).json()["error"]["code"] == "context_length_exceeded"
    assert mine.turns == [] and other.turns == []  # nothing refused was recorded
    # the reward: once, finite
    rw = f"{live.url}/sessions/{mine.session_id}/reward"
    nan = http.post(rw, content='{"reward": NaN}', headers={**auth, "Content-Type": "application/json"})
    assert nan.status_code in (400, 422) and mine.reward is None
    assert http.post(rw, json={"reward": 0.25}, headers=auth).status_code == 200 and mine.reward == 0.25
    assert http.post(rw, json={"reward": 1.0}, headers=auth).status_code == 409 and mine.reward == 0.25
    # a closed episode's key stops working
    live.orch.runner.gateway.close_session(mine.session_id)
    assert http.post(url, json=body, headers=auth).status_code == 401
    # the run's token reaches a session by id; without one it is an error, not a new episode
    run = {"Authorization": f"Bearer {live.token}"}
    assert http.post(url, json=body, headers={**run, "X-Session-ID": other.session_id}).status_code == 200
    assert http.post(url, json=body, headers={**run, "X-Session-ID": "nope"}).status_code == 404
    assert len(other.turns) == 1


def _post(url: str, raw: str, headers: dict[str, str]) -> httpx.Response:
    return http.post(url, content=raw, headers={**headers, "Content-Type": "application/json"})


def test_attacker_view_text_session_keys_and_rewards(live):
    """Text that is not Unicode, a session named twice, an edited tool call, a reward that is not a number: each a 4xx
    with a code, nothing recorded."""
    s, other = live.session(temperature=0.0), live.session(temperature=0.0)
    auth = {"Authorization": f"Bearer {s.api_key}"}
    chat, completions = f"{live.url}/v1/chat/completions", f"{live.url}/v1/completions"
    # a lone UTF-16 surrogate is legal JSON but not text: 400 invalid_text wherever it is, never a 500
    for url, raw in [(chat, '{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}'),
                     (chat, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}'),
                     (chat, '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
                            '"function": {"name": "f", "description": "\\ud800"}}]}'),
                     (completions, '{"prompt": "x\\udc00", "max_tokens": 2}')]:
        r = _post(url, raw, auth)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text", r.text
        assert "U+D" in r.json()["error"]["message"] or "unicode" in r.json()["error"]["message"]
    rw = f"{live.url}/sessions/{s.session_id}/reward"
    r = _post(rw, '{"reward": 1.0, "info": {"note": "\\ud800"}}', auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text" and s.reward is None
    # the session named by the URL and by the header at once: they must agree (the run's token too)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    run = {"Authorization": f"Bearer {live.token}"}
    for headers in ({**auth, "X-Session-ID": other.session_id}, {**run, "X-Session-ID": other.session_id}):
        r = http.post(f"{live.url}/sessions/{s.session_id}/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == "session_mismatch"
    assert http.post(f"{live.url}/sessions/{s.session_id}/v1/chat/completions", json=body,
                      headers={**auth, "X-Session-ID": s.session_id}).status_code == 200
    # a reward is a JSON number: not a string, not a boolean
    for raw in ('{"reward": "1.5"}', '{"reward": true}', '{"reward": "NaN"}'):
        r = _post(rw, raw, auth)
        assert r.status_code == 400 and s.reward is None, raw
    assert s.turns and other.turns == []
    # text that cannot fit the prompt budget is refused before it is encoded (4 MiB held the event loop ~8 s)
    huge = {**body, "messages": [{"role": "user", "content": "word " * 400_000}]}
    r = http.post(chat, json=huge, headers=auth)
    assert r.json()["error"]["code"] == "context_length_exceeded" and "at least" in r.json()["error"]["message"]
    r = http.post(completions, json={"prompt": "word " * 400_000}, headers=auth)
    assert r.json()["error"]["code"] == "context_length_exceeded" and "at least" in r.json()["error"]["message"]
    builder, tok = live.orch.runner.builder, live.orch.runner.tokenizer
    for text in (" " * 5000, "\n" + " " * 4000, "é€😀" * 500, "word " * 2000, "<|im_end|>" * 300):
        assert 0 < builder.fewest_tokens([text]) <= len(tok.encode(text, add_special_tokens=False)), text[:8]
    # an earlier tool call's arguments edited to a value Python calls equal (1 -> true, 1 -> 1.0): a prefix break
    call = {"type": "function", "function": {"name": "calc", "arguments": {"x": 1}}}
    for edited in ('{"x": true}', '{"x": 1.0}'):
        t = live.session(temperature=0.0)
        c = live.client(t)
        first = [{"role": "user", "content": "q"}]
        c.chat.completions.create(model="x", messages=first, max_tokens=2)
        t.segments[-1].messages[-1] = {"role": "assistant", "content": "", "tool_calls": [call]}  # as if sampled
        sent = {"id": "a", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}
        history = first + [{"role": "assistant", "content": "", "tool_calls": [sent]},
                           {"role": "tool", "tool_call_id": "a", "content": "2"}]
        c.chat.completions.create(model="x", messages=history, max_tokens=2)
        assert t.prefix_breaks == 0  # the arguments as sampled extend the segment
        history[1] = {"role": "assistant", "content": "",
                      "tool_calls": [{**sent, "function": {"name": "calc", "arguments": edited}}]}
        c.chat.completions.create(model="x", messages=history + [{"role": "user", "content": "and?"}], max_tokens=2)
        assert t.prefix_breaks == 1 and [turn.info["segment"] for turn in t.turns] == [0, 0, 1], edited


def test_standalone_sessions_named_by_the_client(policy):
    """The standalone gateway opens sessions by name: the run's own client name is not one, and a reward names an
    open session (posted once: a second one, or one for a session that never called, is refused)."""
    gw = Live(policy, auto_sessions=True)
    rewarded: list[str] = []
    gw.orch.runner.gateway.on_reward = lambda session: (rewarded.append(session.session_id),
                                                        gw.orch.runner.gateway.close_session(session.session_id))
    try:
        run = {"Authorization": f"Bearer {gw.token}"}
        url = f"{gw.url}/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = http.post(url, json=body, headers={**run, "X-Session-ID": "run"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id"
        # the run's token still works (a session named "run" took its place in the gate before)
        assert http.post(url, json=body, headers={**run, "X-Session-ID": "s1"}).status_code == 200
        r = http.post(f"{gw.url}/sessions/never/reward", json={"reward": 1.0}, headers=run)
        assert r.status_code == 404 and "never" not in gw.orch.runner.gateway.sessions
        assert http.post(f"{gw.url}/sessions/s1/reward", json={"reward": 1.0}, headers=run).status_code == 200
        assert http.post(f"{gw.url}/sessions/s1/reward", json={"reward": 0.0}, headers=run).status_code == 404
        assert rewarded == ["s1"]
    finally:
        gw.close()


def test_a_refused_call_opens_no_session(policy):
    """The standalone gateway opened the session a refused call named (1,021 refusals filled its 1,024-session
    cap): a call refused before it plays a turn leaves no session, and a good call still opens one."""
    gw = Live(policy, auto_sessions=True)
    try:
        run = {"Authorization": f"Bearer {gw.token}"}
        url = f"{gw.url}/v1/chat/completions"
        too_many = {"messages": [{"role": "user", "content": "hi"}] * 513, "max_tokens": 2}  # max_messages=512
        long = {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 2}  # over the prompt cap
        for i in range(40):
            r = httpx.post(url, json=too_many if i % 2 else long, headers={**run, "X-Session-ID": f"refused-{i}"},
                           timeout=60)
            assert r.status_code == 400, r.text
        r = httpx.post(f"{gw.url}/sessions/refused-x/v1/completions", json={"prompt": "word " * 5000},
                       headers=run, timeout=60)
        assert r.status_code == 400, r.text
        assert not gw.orch.runner.gateway.sessions
        good = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(url, json=good, headers={**run, "X-Session-ID": "s1"}, timeout=60).status_code == 200
        assert list(gw.orch.runner.gateway.sessions) == ["s1"]
    finally:
        gw.close()


def test_a_gateway_connection_that_stops_mid_body_is_closed(live):
    """30 connections with the run's token that stop mid-body were never closed; past the body timeout each is."""
    import socket

    server = GatewayServer(live.orch.runner.gateway.app, body_timeout_s=1.0)
    live.call(server.start())
    socks = []
    try:
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                      f"{live.token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                      '{"messages":'.encode())
            socks.append(s)
        assert closed_by_server(socks) == 30  # each closed at its body deadline
    finally:
        for s in socks:
            s.close()
        live.call(server.stop())


def test_gateway_binds_loopback_only_by_default(live):
    with pytest.raises(ValueError, match="not loopback"):
        GatewayServer(live.orch.runner.gateway.app, host="0.0.0.0")


# ------------------------------------------------------------------------------------------------ task files, commands
@pytest.fixture()
def task_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": i + 1}) + "\n" for i in range(3)))
    return str(path)


def test_task_file_rows_are_the_task_dicts(policy, task_file):
    res, metrics = play(policy, "tests.gateway.programs:file_task", groups=2, tasks_override=task_file)
    assert res.dropped_groups == 0 and len(res.episodes) == 8
    assert [ep.reward for ep in res.episodes] == [0.25] * 8  # the program's own reward (the tiny model is random)
    prompts = [policy[1].decode(ep.turns[0].prompt_ids) for ep in res.episodes]
    assert all("What is 0 + 1?" in p for p in prompts[:4]) and all("What is 1 + 1?" in p for p in prompts[4:])


COMMAND = f"{sys.executable} -m tests.gateway.command_program MODE"


@pytest.mark.parametrize("mode,reward_via", [("print", "print"), ("post", "post")])
def test_command_template_program(policy, task_file, mode, reward_via):
    cmd = COMMAND.replace("MODE", mode)
    res, _ = play(policy, "", command=cmd, tasks_override=task_file)
    assert res.dropped_groups == 0 and [ep.reward for ep in res.episodes] == [0.25] * 4
    assert all(ep.turns[-1].info["via"] == reward_via for ep in res.episodes)


def test_failing_command_is_an_env_failure(policy, task_file):
    cmd = COMMAND.replace("MODE", "fail")
    res, _ = play(policy, "", command=cmd, tasks_override=task_file)
    assert res.dropped_groups == 1 and "status 3" in res.failures[0]


def test_a_thread_program_past_its_timeout_is_an_env_failure(policy, task_file):
    res, _ = play(policy, "tests.gateway.programs:slow", tasks_override=task_file, timeout_s=1.0)
    assert res.dropped_groups == 1 and "timed out after 1 s" in res.failures[0]


def _gone(pid: int) -> bool:
    """No process ``pid`` left (a zombie counts as gone: it runs nothing, and its parent may be a PID 1 that never
    reaps)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_command_programs_argv_and_environment_hold_no_secret(policy, task_file, tmp_path, monkeypatch):
    """While each of the 4 programs of a group runs, its ``/proc/<pid>/cmdline`` (what every local user reads)
    holds neither its key nor its session's, and its ``/proc/<pid>/environ`` holds its own key as
    ``OPENAI_API_KEY`` (the real openai client finds it and ``OPENAI_BASE_URL`` unaided) and nothing of the
    trainer's secrets: only the allow-list, the names ``env.external.env_pass`` lists, and the episode's values."""
    from agent_rl.gateway.command import PROGRAM_ENV_KEEP

    secrets_ = {"AGENT_RL_SERVER_TOKEN": "server-token-sentinel", "VLLM_API_KEY": "vllm-key-sentinel",
                "AWS_SECRET_ACCESS_KEY": "aws-sentinel", "WANDB_API_KEY": "wandb-sentinel"}
    for name, value in secrets_.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MY_TOOL_SETTING", "passed-on-purpose")
    cmd = f"{sys.executable} -m tests.gateway.command_program inspect {tmp_path}"
    seen: dict[int, tuple[bytes, dict[str, str]]] = {}

    def inspect() -> None:
        deadline = time.monotonic() + 300
        while len(seen) < 4 and time.monotonic() < deadline:
            for f in tmp_path.glob("*.pid"):
                pid = int(f.read_text() or 0)
                if pid and pid not in seen:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    raw = Path(f"/proc/{pid}/environ").read_bytes()
                    seen[pid] = (cmdline, dict(kv.split("=", 1) for kv in raw.decode().split("\0") if kv))
            time.sleep(0.05)
        (tmp_path / "go").write_text("")

    watcher = threading.Thread(target=inspect)
    watcher.start()
    try:
        res, _ = play(policy, "", command=cmd, tasks_override=task_file, env_pass=["MY_TOOL_SETTING"])
    finally:
        (tmp_path / "go").write_text("")
        watcher.join()
    assert res.dropped_groups == 0 and [ep.reward for ep in res.episodes] == [0.25] * 4
    assert len(seen) == 4
    keys = set()
    given = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENT_RL_SESSION_ID", "AGENT_RL_TASK", "PYTHONUNBUFFERED",
             "MY_TOOL_SETTING"}
    for cmdline, env in seen.values():
        key = env["OPENAI_API_KEY"]
        keys.add(key)
        assert len(key) >= 32 and key.encode() not in cmdline
        assert cmdline.split(b"\0")[-3:-1] == [b"inspect", str(tmp_path).encode()]
        assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:") and env["OPENAI_BASE_URL"].endswith("/v1")
        assert env["MY_TOOL_SETTING"] == "passed-on-purpose"
        assert not set(secrets_) & set(env)
        assert not any(v in "\0".join(env.values()) for v in secrets_.values())
        assert set(env) <= set(PROGRAM_ENV_KEEP) | given | {k for k in env if k.startswith("LC_")}
    assert len(keys) == 4  # each episode its own key


def test_a_helper_left_behind_is_killed_and_does_not_hold_the_attempt(policy, task_file, tmp_path):
    """Each program prints its reward and exits, leaving a ``sleep 40`` in the background that holds its stdout;
    against a 20 s timeout (a Python program that imports openai takes 3 s to start on this loaded machine; the
    3 s case with shell programs: tests/gateway/test_command.py): the rewards are read (no attempt failed, none
    waited for the helper: asyncio's ``Process.wait`` waits for the pipes a helper holds), and every helper is gone
    when the rollout returns."""
    cmd = f"{sys.executable} -m tests.gateway.command_program helper {tmp_path}"
    t0 = time.monotonic()
    res, _ = play(policy, "", command=cmd, tasks_override=task_file, timeout_s=20.0)
    wall = time.monotonic() - t0
    pids = [tuple(map(int, f.read_text().split())) for f in tmp_path.glob("*.pids")]
    print(f"4 programs with a 40 s helper each, timeout 20 s: rollout {wall:.1f} s")
    assert res.dropped_groups == 0 and [ep.reward for ep in res.episodes] == [0.25] * 4
    assert all(ep.turns[-1].info["via"] == "print" for ep in res.episodes)
    assert len(pids) == 4 and all(_gone(main) and _gone(helper) for main, helper in pids)


def test_the_timeout_ends_the_group_and_reads_the_reward_printed_before(policy, task_file, tmp_path):
    """``hang``: each program prints its reward and runs on past the 20 s timeout: the whole group (the program
    and its helper) is killed at the timeout and the printed reward counts. ``silent``: the same without a reward
    (8 s): an env failure ("timed out"), the group dropped after its re-run, and every process of every attempt
    gone."""
    hang, silent = tmp_path / "hang", tmp_path / "silent"
    hang.mkdir()
    silent.mkdir()
    res, _ = play(policy, "", command=f"{sys.executable} -m tests.gateway.command_program hang {hang}",
                  tasks_override=task_file, timeout_s=20.0)
    assert res.dropped_groups == 0 and [ep.reward for ep in res.episodes] == [0.25] * 4
    pids = [tuple(map(int, f.read_text().split())) for f in hang.glob("*.pids")]
    assert len(pids) == 4 and all(_gone(p) for pair in pids for p in pair)
    res, _ = play(policy, "", command=f"{sys.executable} -m tests.gateway.command_program silent {silent}",
                  tasks_override=task_file, timeout_s=8.0)
    assert res.dropped_groups == 1 and "timed out after 8 s" in res.failures[0]
    pids = [tuple(map(int, f.read_text().split())) for f in silent.glob("*.pids")]
    assert len(pids) >= 2 and all(_gone(p) for pair in pids for p in pair)


# ------------------------------------------------------------------------------------------------ rewards a batch cannot hold
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "3.5e38", "1e308"])
def test_program_reward_from_a_task_row_breaking_the_rule_fails(policy, tmp_path, value):
    # a task file's row carries the reward the program returns: NaN, inf or beyond float32 fails the episode
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "reward": value}) + "\n")
    res, metrics = play(policy, "tests.gateway.programs:row_reward", tasks_override=str(path))
    assert (res.dropped_groups, res.episodes, metrics["rollout/failed_episodes"]) == (1, [], 4.0)
    assert "the program's reward" in res.failures[0], res.failures
    path.write_text(json.dumps({"question": "What is 1 + 1?", "reward": "-3.4e38"}) + "\n")  # control: it fits
    res, _ = play(policy, "tests.gateway.programs:row_reward", tasks_override=str(path))
    assert [ep.reward for ep in res.episodes] == [-3.4e38] * 4


@pytest.mark.parametrize("line", ["NaN", "-Infinity", "1e400", "1e308", '{"reward": 3.5e38}', '{"reward": NaN}'])
def test_command_printing_a_reward_breaking_the_rule_fails(policy, task_file, line):
    raw = shlex.quote(f"raw={line}").replace("{", "{{").replace("}", "}}")  # the template's own braces: literal
    res, metrics = play(policy, "", command=COMMAND.replace("MODE", raw),
                        tasks_override=task_file)
    assert (res.dropped_groups, res.episodes, metrics["rollout/failed_episodes"]) == (1, [], 4.0)
    assert "not finite" in res.failures[0] or "float32" in res.failures[0], res.failures


def test_env_rewards_summing_beyond_float32_fail(policy):
    # the program steps its env (user/Echo-v0) twice through the gateway, 3e38 each: the env's sum is the episode's
    # reward, 6e38 (inf in float32): an env failure
    model, tok = policy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # user_env_module

    async def go():
        pool = LocalEnvPool(imports=["user_env_module"])
        orch = ExternalRollout(pool, get_engine("hf", model, tok, seed=0),
                               RolloutConfig(max_turns=3, episode_retries=1, retry_backoff_s=0.0),
                               ExternalConfig(program="tests.gateway.programs:echo_steps", tasks="user/Echo-v0"),
                               max_new_tokens=4, seed=0)
        try:
            sampler = TaskSampler("user/Echo-v0", TaskSamplerConfig(kind="seed"), seed=0)
            return await orch.collect(sampler.sample, 1, AlgoConfig(name="grpo", group_size=2), step=1)
        finally:
            await orch.aclose()
            await pool.aclose()

    res = asyncio.run(go())
    assert (res.dropped_groups, res.episodes, res.metrics["rollout/failed_episodes"]) == (1, [], 2.0)
    assert "the episode's reward" in res.failures[0] and "float32" in res.failures[0], res.failures


@pytest.mark.parametrize("raw", ['{"reward": NaN}', '{"reward": Infinity}', '{"reward": 1e400}', '{"reward": 1e308}',
                                 '{"reward": -3.5e38}', '{"reward": null}'])
def test_posted_reward_breaking_the_rule_is_refused(live, raw):
    s = live.session(temperature=0.0)
    r = _post(f"{live.url}/sessions/{s.session_id}/reward", raw, {"Authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 400 and s.reward is None, (raw, r.text)
    assert _post(f"{live.url}/sessions/{s.session_id}/reward", '{"reward": 3.4e38}',
                 {"Authorization": f"Bearer {s.api_key}"}).status_code == 200 and s.reward == 3.4e38
