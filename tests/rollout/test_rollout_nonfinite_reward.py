"""A reward a float32 batch cannot hold (NaN, +-inf, 3.5e38, 1e308: finite in float64, inf in float32) is an env
failure at every door (``envs.numbers.checked_reward``), never a reward: the episode is re-run, then its group is
dropped and counted in ``rollout/failed_episodes``. Played through the real orchestrator on the real pools: the
hosting core in threads and in worker processes (``LocalEnvPool``), the env server over HTTP (``HTTPEnvPool`` on
``servers.app``), a server that answers such a reward itself (the client's door), a grader (Math-v0), and the sum
of rewards that each fit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import sys
from pathlib import Path

import httpx
import pytest
from rollout_fakes import ScriptedEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # user_env_module, servers_helpers

from servers_helpers import ECHO, make_app, serve_asgi  # noqa: E402

import envs.math.env as math_env  # noqa: E402
from agent_rl.envclient import EnvServerError, HTTPEnvPool, LocalEnvPool  # noqa: E402
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, build_rollout_batch, get_prompt  # noqa: E402
from agent_rl.types import Episode, Task, Turn  # noqa: E402
from envs.numbers import FLOAT32_MAX, RewardError, checked_reward  # noqa: E402

BAD = ["nan", "inf", "-inf", "3.5e38", "-3.5e38", "1e308"]


@contextlib.asynccontextmanager
async def open_pool(kind: str):
    if kind == "http":
        app = make_app([ECHO])
        async with serve_asgi(app):
            async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0) as pool:
                yield pool
    else:
        async with LocalEnvPool(max_workers=2, mode=kind, imports=["user_env_module"]) as pool:
            yield pool


def play(kind: str, actions: list[str], groups: int = 2, env_id: str = ECHO, options: dict | None = None,
         prompt: str = "textworld"):
    """``groups`` groups of 2 episodes, each answering ``actions`` turn by turn, one re-run per episode."""
    def policy(text: str, t: float) -> str:  # turn k's action ("Now at step k+1" in the TextWorld prompt)
        if prompt != "textworld":
            return actions[0]
        k = int(re.search(r"Now at step (\d+)", text).group(1)) - 1
        return f"<action>{actions[k]}</action>"

    engine = ScriptedEngine(policy)

    async def go():
        async with open_pool(kind) as pool:
            cfg = RolloutConfig(max_turns=len(actions), episode_retries=1, retry_backoff_s=0.0,
                                max_prompt_tokens=100_000)
            orch = RolloutOrchestrator(pool, engine, get_prompt(prompt), cfg, max_new_tokens=4096, seed=0)
            specs = [GroupSpec(Task(env_id, dict(options or {}), group_id=g, seed=g), [(1.0, False)] * 2)
                     for g in range(groups)]
            return await orch.run_groups(specs)

    return asyncio.run(go())


def test_checked_reward_rule():
    assert [checked_reward(v) for v in (0, 1.5, True, -FLOAT32_MAX, FLOAT32_MAX)] == [0.0, 1.5, 1.0, -FLOAT32_MAX,
                                                                                       FLOAT32_MAX]
    assert FLOAT32_MAX == 3.4028234663852886e38
    for v in [float(x) for x in BAD] + [None, "1.0", object(), 10 ** 400]:
        with pytest.raises(RewardError):
            checked_reward(v, "the env's reward")


@pytest.mark.parametrize("kind", ["thread", "http"])
@pytest.mark.parametrize("value", BAD)
def test_bad_env_reward_fails_the_episode(kind, value):
    res = play(kind, [f"reward:{value}", "stop"])
    # 2 groups x 2 episodes, each failed on both attempts: every group dropped, nothing to train on
    assert (res.dropped_groups, res.episodes) == (2, [])
    assert res.metrics["rollout/failed_episodes"] == 4.0 and res.metrics["rollout/episode_retries"] == 4.0
    assert all("not finite" in f or "outside the float32 range" in f for f in res.failures), res.failures


@pytest.mark.slow
@pytest.mark.parametrize("value", ["nan", "1e308"])
def test_bad_env_reward_in_worker_processes(value):
    res = play("process", [f"reward:{value}", "stop"], groups=1)
    assert (res.dropped_groups, res.episodes, res.metrics["rollout/failed_episodes"]) == (1, [], 2.0)


@pytest.mark.parametrize("kind", ["thread", "http"])
def test_fitting_rewards_are_kept(kind):
    # control: the same episodes with rewards a batch holds are trained on, sums exact
    res = play(kind, ["reward:-3.4e38", "stop"], groups=1)
    assert res.dropped_groups == 0 and [ep.reward for ep in res.episodes] == [-3.4e38 + 1.0] * 2
    assert res.metrics["rollout/failed_episodes"] == 0.0


@pytest.mark.parametrize("kind", ["thread", "http"])
def test_a_sum_beyond_float32_fails_the_episode(kind):
    # each step's 3e38 fits float32; the episode's 6e38 + 1 does not
    res = play(kind, ["reward:3e38", "reward:3e38", "stop"], groups=1)
    assert (res.dropped_groups, res.episodes) == (1, [])
    assert "the episode's reward" in res.failures[0] and "float32" in res.failures[0]


def test_server_never_answers_a_bad_reward():
    # the env server's own answer: a 500 naming the reward (a NaN used to go out as JSON null)
    async def go():
        app = make_app([ECHO])
        async with serve_asgi(app) as client:
            sid = (await client.post("/sessions", json={"env_id": ECHO})).json()["session_id"]
            r = await client.post(f"/sessions/{sid}/step", json={"action": "reward:nan"})
            gone = await client.post(f"/sessions/{sid}/step", json={"action": "stop"})
            return r, gone

    r, gone = asyncio.run(go())
    assert r.status_code == 500 and r.json()["code"] == "env_error" and "not finite" in r.json()["detail"]
    assert gone.status_code == 404  # the env that gave it is closed, never stepped again


@pytest.mark.parametrize("body", ['{"observation": "o", "reward": null, "terminated": false, "truncated": false}',
                                  '{"observation": "o", "reward": NaN, "terminated": false, "truncated": false}',
                                  '{"observation": "o", "reward": 1e400, "terminated": false, "truncated": false}',
                                  '{"observation": "o", "reward": 1e308, "terminated": false, "truncated": false}',
                                  '{"observation": "o", "reward": -3.5e38, "terminated": false, "truncated": false}'])
def test_client_refuses_a_bad_reward_from_any_server(body):
    # a server that is not this project's answers the step with such a reward (httpx's MockTransport serves it)
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sessions":
            return httpx.Response(200, json={"session_id": "s1", "observation": "o", "info": {}})
        return httpx.Response(200, content=body.encode(), headers={"content-type": "application/json"})

    async def go():
        async with HTTPEnvPool("http://localhost", transport=httpx.MockTransport(answer), retries=0) as pool:
            reset = await pool.reset(ECHO)
            return await pool.step(reset.session_id, "a")

    with pytest.raises(EnvServerError) as info:
        asyncio.run(go())
    assert info.value.code == "invalid_reward"
    assert "not finite" in str(info.value) or "float32" in str(info.value) or "a number" in str(info.value)


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e308])
def test_grader_reward_breaking_the_rule_fails_the_episode(monkeypatch, value):
    # a grader (Math-v0's score_response) answering such a reward: an env failure, as any env's
    real = math_env.score_response
    monkeypatch.setattr(math_env, "score_response", lambda *a, **k: {**real(*a, **k), "reward": value})
    res = play("thread", ["\\boxed{2}"], groups=1, env_id="agent_rl/Math-v0",
               options={"problem": "1 + 1?", "answer": "2"}, prompt="math")
    assert (res.dropped_groups, res.episodes, res.metrics["rollout/failed_episodes"]) == (1, [], 2.0)
    monkeypatch.setattr(math_env, "score_response", real)
    ok = play("thread", ["\\boxed{2}"], groups=1, env_id="agent_rl/Math-v0",
              options={"problem": "1 + 1?", "answer": "2"}, prompt="math")
    assert [ep.reward for ep in ok.episodes] == [1.0, 1.0]


@pytest.mark.parametrize("value", [math.nan, -math.inf, 3.5e38, 1e308])
def test_batch_refuses_an_episode_reward_breaking_the_rule(value):
    turn = Turn(prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.1], action="a", reward=value)
    ep = Episode(task=Task("e"), temperature=1.0, is_high=False, turns=[turn], reward=value)
    with pytest.raises(RewardError, match="episode 0's reward"):
        build_rollout_batch([ep], pad_token_id=0)
    assert json.dumps(checked_reward(1.0)) == "1.0"
