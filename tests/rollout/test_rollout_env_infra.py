"""Issue 10, section 1: an env that could not judge (``EnvInfraError``) is handled by the orchestrator exactly like
an HTTP 5xx: the episode is re-run from its task, then the whole group is dropped and counted in
``rollout/dropped_groups``; nothing is trained on. Real Code-v0 in a real ``LocalEnvPool`` (threads), with the
sandbox's interpreter path pointing nowhere (the checker exits 127 or cannot be started)."""

from __future__ import annotations

import asyncio

from rollout_fakes import ScriptedEngine

import envs.code.sandbox as sandbox
from agent_rl.envclient import LocalEnvPool
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, get_prompt
from agent_rl.types import Task
from envs.code import load_code

ANSWER = "```python\n" + load_code("mbpp_sanitized")[3].canonical + "\n```"  # a right answer


class CountingPool(LocalEnvPool):
    def __init__(self) -> None:
        super().__init__(max_workers=2, mode="thread")
        self.steps = 0

    async def step(self, session_id, action):
        self.steps += 1
        return await super().step(session_id, action)


def play(groups: int = 2) -> tuple:
    pool = CountingPool()
    engine = ScriptedEngine(lambda prompt, t: ANSWER)
    orch = RolloutOrchestrator(pool, engine, get_prompt("code"),
                               RolloutConfig(episode_retries=1, retry_backoff_s=0.0, max_prompt_tokens=100_000),
                               max_new_tokens=4096)
    specs = [GroupSpec(Task("agent_rl/Code-v0", {"dataset": "mbpp_sanitized", "index": 3}, group_id=g),
                       [(1.0, False)] * 2) for g in range(groups)]

    async def go():
        try:
            return await orch.run_groups(specs)
        finally:
            await pool.aclose()

    return asyncio.run(go()), pool


def test_sandbox_that_cannot_start_drops_the_groups(monkeypatch):
    monkeypatch.setattr(sandbox, "sandbox_python", lambda: "/nonexistent/python3")
    res, pool = play()
    # 2 groups x 2 episodes x (1 + episode_retries) attempts, every one failed: nothing kept, both groups counted.
    assert (res.dropped_groups, res.metrics["rollout/dropped_groups"], res.episodes) == (2, 2.0, [])
    assert pool.steps == 2 * 2 * 2
    assert all("env_infra_error" in f or "could not judge" in f for f in res.failures), res.failures
    assert all("/nonexistent/python3" in f for f in res.failures)


def test_same_rollout_with_a_working_sandbox_is_judged():
    # Control: the same answer with the real sandbox is a reward (the canonical solution of mbpp_sanitized 3),
    # nothing dropped.
    res, pool = play(groups=1)
    assert res.dropped_groups == 0 and len(res.episodes) == 2
    assert [ep.reward for ep in res.episodes] == [1.0, 1.0]
