"""The oracle in-process, and the env behind the generic FastAPI server (``servers.app``) via ``HTTPEnvPool``:
the same episodes give the same observations, rewards and info over HTTP as in-process."""

from __future__ import annotations

import asyncio

import pytest

from envs.webshop import OraclePolicy, run_oracle


def test_oracle_on_first_val_goals(make_env):
    env = make_env()
    results = [run_oracle(env, i) for i in range(40)]
    # measured with the reference's reward: goal 20 buys the right product and options, but the colour value
    # 'r.brown2070' is normalised to 'brown' on the clicked side only -> options 1/2 -> (3 + 1 + 1 + 1) / 7
    assert [r["goal_idx"] for r in results if not r["won"]] == [20, 28]
    assert results[20]["score"] == pytest.approx(6 / 7)
    assert "r.brown2070" in results[20]["failure"]
    assert results[0]["actions"] == [
        'search[Find me double sided, machine washable decorative pillows with printing technology with size: '
        '28" x 28"]', "click[b0743jkhbv]", 'click[28" x 28"]', "click[buy now]",
    ]
    assert results[15]["actions"][1] == "click[next >]"  # the target is on results page 2


def test_env_behind_http_server_matches_in_process(make_env):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from agent_rl.envclient import HTTPEnvPool
    from servers.app import create_app

    env = make_env(observation_mode="text_rich")
    goals = env.unwrapped.catalog.goals
    expected = {}
    for g in (0, 3, 15):
        obs, info = env.reset(options={"goal_idx": g})
        policy, trace = OraclePolicy(goals[g]), [(obs, 0.0, False, info)]
        while not trace[-1][2]:
            obs, reward, terminated, _, info = env.step(policy.act(info))
            trace.append((obs, reward, terminated, info))
        expected[g] = trace

    app = create_app(["agent_rl/WebShop-v0"], max_sessions=4, workers=1, prestart_workers=0,
                     imports=["envs.webshop.preload"])

    async def run() -> dict:
        got = {}
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with HTTPEnvPool("http://testserver", transport=transport) as pool:
                for g in expected:
                    reset = await pool.reset("agent_rl/WebShop-v0", options={"goal_idx": g},
                                             env_kwargs={"observation_mode": "text_rich"})
                    policy, trace = OraclePolicy(goals[g]), [(reset.observation, 0.0, False, reset.info)]
                    while not trace[-1][2]:
                        r = await pool.step(reset.session_id, policy.act(trace[-1][3]))
                        trace.append((r.observation, r.reward, r.terminated, r.info))
                    await pool.close(reset.session_id)
                    got[g] = trace
        return got

    got = asyncio.run(run())
    for g in expected:
        assert got[g] == expected[g], g
    assert got[0][-1][1] == 1.0 and got[0][-1][3]["reward_details"]["r_option"] == 1.0
