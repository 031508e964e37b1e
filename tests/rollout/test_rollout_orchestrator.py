"""Orchestrator on ChooseItem with a scripted deterministic engine: group composition, per-episode temperature,
token ids preserved, failure handling, truncation, dynamic sampling."""

from __future__ import annotations

import asyncio
import re

import pytest
from rollout_fakes import FlakyPool, ScriptedEngine, SimplePool, local_pool

from agent_rl.learner.config import AlgoConfig
from agent_rl.rollout import (
    GroupSpec,
    RolloutConfig,
    RolloutOrchestrator,
    TaskSampler,
    TaskSamplerConfig,
    build_rollout_batch,
    get_prompt,
    group_temperatures,
)
from agent_rl.types import Task
from waiting import wait_until_async

ENV = "agent_rl/ChooseItem-v0"


def target_of(prompt: str) -> str:
    return re.findall(r"pick the (\w+)", prompt)[-1]


def right(prompt: str, temperature: float) -> str:
    """Always the right item."""
    return f"<think>easy</think><action>pick {target_of(prompt)}</action>"


def make(pool, policy=right, **cfg) -> tuple[RolloutOrchestrator, ScriptedEngine]:
    engine = ScriptedEngine(policy)
    orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), RolloutConfig(**cfg), max_new_tokens=64)
    return orch, engine


def tasks(n: int, seed: int = 0) -> list[Task]:
    return TaskSampler(ENV, TaskSamplerConfig(kind="seed"), seed=seed).sample(n)


def test_group_temperatures_tgrl_and_warmup():
    tgrl = AlgoConfig(name="tgrl", warmup_steps=3)  # the warm-up: the steps s < 3
    assert group_temperatures(tgrl, 3) == [(0.3, False), (1.2, True), (1.2, True), (1.2, True)]
    assert group_temperatures(tgrl, 2) == [(1.2, True)] * 4  # warm-up: all high
    grpo = AlgoConfig(name="grpo", temperature=0.7, group_size=5)
    assert group_temperatures(grpo, 1) == [(0.7, False)] * 5


def test_groups_temperature_rows_and_token_ids():
    orch, engine = make(local_pool())
    algo = AlgoConfig(name="tgrl", warmup_steps=0)
    res = asyncio.run(orch.collect(TaskSampler(ENV, TaskSamplerConfig(), seed=1).sample, 3, algo, step=1))
    assert len(res.episodes) == 12 and res.dropped_groups == 0
    for g in range(3):
        group = res.episodes[4 * g: 4 * g + 4]
        assert [ep.temperature for ep in group] == [0.3, 1.2, 1.2, 1.2]
        assert [ep.is_high for ep in group] == [False, True, True, True]
        assert len({ep.task.group_id for ep in group}) == 1 and len({ep.task.seed for ep in group}) == 1
    for ep in res.episodes:
        assert ep.won and ep.reward == 1.0 and len(ep.turns) == 1
        turn = ep.turns[0]
        expected = engine.tokenizer.encode(f"<think>easy</think><action>pick {ep.task_type}</action>")
        assert turn.response_ids == expected  # exactly what the engine sampled
        assert turn.response_logprobs == pytest.approx([-(j + 1) * ep.temperature / 100 for j in range(len(expected))])
        assert turn.action == f"pick {ep.task_type}" and not turn.invalid
    # Generation was batched: all 12 first-turn prompts in one call.
    assert len(engine.calls[0][0]) == 12
    batch = build_rollout_batch(res.episodes, pad_token_id=0)
    assert batch.temperature.tolist() == pytest.approx([0.3, 1.2, 1.2, 1.2] * 3)
    rows = (batch.response_mask > 0)
    for i in range(batch.num_rows):  # engine log-probs sit on the response tokens, at the row's temperature
        lp = batch.engine_logprobs[i][rows[i]]
        assert lp.tolist() == pytest.approx([-(j + 1) * batch.temperature[i].item() / 100 for j in range(len(lp))])
    m = res.metrics
    assert m["success/rate"] == 1.0 and m["reward/mean"] == 1.0 and m["episode/turns_mean"] == 1.0
    assert m["episode/invalid_action_frac"] == 0.0 and m["rollout/dropped_groups"] == 0.0
    assert 0.0 <= m["time/env_wait_frac"] <= 1.0 and m["throughput/tokens_per_s"] > 0


def test_multi_turn_history_and_invalid_flags():
    # Two unparsable answers, then the right one: 3 turns, 2 invalid. The orchestrator only flags them: a penalty is
    # the env's (envs.wrappers.InvalidActionPenalty via rollout.invalid_penalty; tests/envs/test_wrappers.py), and
    # this fake pool has none, so the reward stays 1.
    def policy(prompt: str, t: float) -> str:
        n = prompt.count("[Action")
        return "hmm" if "Nothing happens" not in prompt or n < 2 else f"<action>pick {target_of(prompt)}</action>"

    def policy3(prompt: str, t: float) -> str:
        step = int(re.findall(r"\(step (\d+)\)", prompt)[-1])
        return "hmm" if step < 3 else f"<action>pick {target_of(prompt)}</action>"

    orch, engine = make(SimplePool(), policy3, invalid_penalty=0.1, history_length=2)
    res = asyncio.run(orch.run_groups([GroupSpec(tasks(1)[0], [(1.0, False)])]))
    (ep,) = res.episodes
    assert [t.invalid for t in ep.turns] == [True, True, False]
    assert ep.won and ep.reward == pytest.approx(1.0)
    assert ep.turns[0].observation == "Nothing happens."
    # The third prompt shows the last 2 turns (history_length) with their actions.
    third = engine.tokenizer.decode(ep.turns[2].prompt_ids)
    assert "[Observation 1]" in third and "[Action 2] hmm" in third and "[Observation 0]" not in third
    assert res.metrics["episode/invalid_action_frac"] == pytest.approx(2 / 3)


def test_max_turns_and_response_truncation_recorded():
    orch, _ = make(SimplePool(), lambda p, t: "x" * 100, max_turns=2)
    orch.generator.gen_kwargs["max_new_tokens"] = 10
    res = asyncio.run(orch.run_groups([GroupSpec(tasks(1)[0], [(1.0, False)] * 2)]))
    for ep in res.episodes:
        assert len(ep.turns) == 2 and not ep.won and not ep.turns[-1].terminated
        assert all(t.response_truncated and len(t.response_ids) == 10 for t in ep.turns)
    assert res.metrics["response/truncated_frac"] == 1.0
    assert res.metrics["episode/truncated_frac"] == 1.0


def test_prompt_too_long_fails_group():
    orch, _ = make(SimplePool(), max_prompt_tokens=20)
    res = asyncio.run(orch.run_groups([GroupSpec(tasks(1)[0], [(1.0, False)] * 2)]))
    assert res.episodes == [] and res.dropped_groups == 1
    assert len(res.failures) == 1 and res.failures[0].startswith("prompt_too_long (") and "> 20 tokens" in res.failures[0]


def test_env_failure_retried_then_group_dropped():
    bad_seed = tasks(2)[1].seed

    # Group 0: its first reset fails once -> the episode is re-run and the group kept.
    # Group 1: every reset fails -> 1 + episode_retries attempts per episode, then the group is dropped and counted.
    def fail(n: int, options: dict) -> bool:
        return n == 0

    pool = FlakyPool(SimplePool(), fail)
    orig = pool.inner.reset

    async def reset(env_id, *, seed=None, options=None, env_kwargs=None):
        if seed == bad_seed:
            raise ConnectionError("always down")
        return await orig(env_id, seed=seed, options=options, env_kwargs=env_kwargs)

    pool.inner.reset = reset
    orch, _ = make(pool, episode_retries=2, retry_backoff_s=0.01)
    specs = [GroupSpec(t, [(1.0, False)] * 2) for t in tasks(2)]
    res = asyncio.run(orch.run_groups(specs))
    assert res.dropped_groups == 1 and res.metrics["rollout/dropped_groups"] == 1.0
    assert len(res.episodes) == 2 and all(ep.task.seed != bad_seed and ep.won for ep in res.episodes)
    # 2 good episodes (one retried once) + 2 bad episodes x 3 attempts = 2 + 1 + 6 reset calls.
    assert pool.reset_calls == 9
    # the metrics say what happened: 1 + 2 x 2 re-runs, 2 episodes failed every attempt
    assert res.metrics["rollout/episode_retries"] == 5.0 and res.metrics["rollout/failed_episodes"] == 2.0
    assert res.failures == ["env: ConnectionError: always down"]  # why the group was dropped (the trainer warns)


def test_env_step_timeout_counts_as_failure():
    class SlowStep(SimplePool):
        async def step(self, session_id, action):
            await asyncio.sleep(600)

    # the fake's reset answers at once, even on a busy machine; its step would last 10 minutes (ended at 1 s)
    orch, _ = make(SlowStep(), episode_retries=0, env_timeout_s=1.0)
    res = asyncio.run(orch.run_groups([GroupSpec(tasks(1)[0], [(1.0, False)])]))
    assert res.dropped_groups == 1 and res.episodes == []


def test_dynamic_sampling_filters_equal_reward_groups():
    # Right answer only for odd group ids: even groups have all-equal rewards (all 0) and are filtered.
    def policy(prompt: str, t: float) -> str:
        return "<action>pick " + target_of(prompt) + "</action>"

    sampler = TaskSampler(ENV, TaskSamplerConfig(), seed=0)
    orch, _ = make(SimplePool(), policy)
    # mixed rewards within a group: low-temperature episode wins, high ones answer wrong.
    orch.engine.policy = lambda p, t: policy(p, t) if t < 1 else "<action>zzz</action>"
    algo = AlgoConfig(name="tgrl", warmup_steps=0)
    res = asyncio.run(orch.collect(sampler.sample, 2, algo, 1, filter_groups=True, max_extra_rounds=2))
    assert len(res.episodes) == 8 and res.filtered_groups == 0
    orch.engine.policy = lambda p, t: "<action>zzz</action>"  # every group all-0 -> filtered, 2 extra rounds
    res = asyncio.run(orch.collect(sampler.sample, 2, algo, 1, filter_groups=True, max_extra_rounds=2))
    assert res.episodes == [] and res.filtered_groups == 2 + 2 + 2 and res.metrics["rollout/extra_rounds"] == 2


def test_trajectory_mode_prompts_extend_conversation():
    def policy3(prompt: str, t: float) -> str:
        return "hmm" if prompt.count("Nothing happens") < 2 else f"<action>pick {target_of(prompt)}</action>"

    orch, engine = make(SimplePool(), policy3, mode="trajectory")
    res = asyncio.run(orch.run_groups([GroupSpec(tasks(1)[0], [(1.0, False)])]))
    (ep,) = res.episodes
    assert len(ep.turns) == 3 and ep.won
    for prev, nxt in zip(ep.turns, ep.turns[1:]):
        n = len(prev.prompt_ids)
        assert nxt.prompt_ids[:n] == prev.prompt_ids  # token-in: the conversation only grows
        assert nxt.prompt_ids[n:n + len(prev.response_ids)] == prev.response_ids
    batch = build_rollout_batch(res.episodes, pad_token_id=0, mode="trajectory")
    assert batch.num_rows == 1 and int(batch.response_mask.sum()) == sum(len(t.response_ids) for t in ep.turns)


def test_sampler_is_resumable():
    a = TaskSampler("x", TaskSamplerConfig(kind="index", num_tasks=5, options={"split": "train"}), seed=3)
    first = [t.options["index"] for t in a.sample(7)]
    assert sorted(first[:5]) == [0, 1, 2, 3, 4]  # one epoch visits every task once
    b = TaskSampler("x", TaskSamplerConfig(kind="index", num_tasks=5, options={"split": "train"}), seed=3)
    b.load_state_dict({"position": 4})
    assert [t.options["index"] for t in b.sample(3)] == first[4:7]
    assert all(t.options["split"] == "train" for t in b.sample(2))


def test_env_wait_fraction_accounting():
    # One episode: reset waits >= 0.3 s, generation takes >= 0.2 s, the step is instant. Wall-clock values grow on a
    # loaded machine, so the test checks the accounting (env_wait_frac = 1 - generate_s / rollout_s) and the lower
    # bounds that sleeping guarantees, not seconds.
    class SlowReset(SimplePool):
        async def reset(self, env_id, **kw):
            await asyncio.sleep(0.3)
            return await super().reset(env_id, **kw)

    orch, engine = make(SlowReset())
    engine.delay_s = 0.2
    res = asyncio.run(orch.run_groups([GroupSpec(tasks(1)[0], [(1.0, False)])]))
    m = res.metrics
    assert m["time/generate_s"] >= 0.2 and m["time/rollout_s"] >= 0.5
    assert m["time/env_wait_frac"] == pytest.approx(1.0 - m["time/generate_s"] / m["time/rollout_s"])
    assert 0.0 < m["time/env_wait_frac"] < 1.0


def test_prefetch_resets_are_used_by_next_collect():
    pool = SimplePool()
    orch, _ = make(pool)
    sampler = TaskSampler(ENV, TaskSamplerConfig(), seed=5)
    algo = AlgoConfig(name="grpo", group_size=3)

    async def go():
        orch.prefetch(sampler.sample(2), 3)
        assert orch.num_prefetched_tasks == 2
        async def all_reset():  # the resets run while "the learner updates": wait for them by count, not by time
            return pool.resets == 6
        await wait_until_async(all_reset, "the 6 prefetched resets")
        res = await orch.collect(sampler.sample, 2, algo, step=1)
        await orch.aclose()
        return res

    res = asyncio.run(go())
    assert pool.resets == 6 and orch.num_prefetched_tasks == 0  # no new reset: the open sessions were played
    assert [ep.task.group_id for ep in res.episodes] == [0, 0, 0, 1, 1, 1] and sampler.position == 2
    assert all(ep.won for ep in res.episodes) and pool.envs == {}


def test_high_repetition_penalty_only_on_high_rows():
    """algo.high_repetition_penalty reaches the engine per row: 1.05 on T1 rows, 1.0 on T0 rows, and is not passed
    at all when every row is 1.0 (engines without the argument keep working)."""

    class PenaltyEngine(ScriptedEngine):
        def __init__(self, policy):
            super().__init__(policy)
            self.penalties: list[tuple[list[float], list[float]]] = []

        def generate(self, prompts, temperatures, *, repetition_penalties=None, **kwargs):
            self.penalties.append((list(temperatures), list(repetition_penalties or [])))
            return super().generate(prompts, temperatures, **kwargs)

    engine = PenaltyEngine(right)
    orch = RolloutOrchestrator(local_pool(), engine, get_prompt("generic"), RolloutConfig(), max_new_tokens=64,
                               high_repetition_penalty=1.05)
    asyncio.run(orch.collect(TaskSampler(ENV, TaskSamplerConfig(), seed=1).sample, 2,
                             AlgoConfig(name="tgrl", warmup_steps=0), step=1))
    pairs = [(t, p) for temps, pens in engine.penalties for t, p in zip(temps, pens)]
    assert pairs and {p for t, p in pairs if t == 1.2} == {1.05} and {p for t, p in pairs if t == 0.3} == {1.0}

    engine = PenaltyEngine(right)
    orch = RolloutOrchestrator(local_pool(), engine, get_prompt("generic"), RolloutConfig(), max_new_tokens=64)
    asyncio.run(orch.collect(TaskSampler(ENV, TaskSamplerConfig(), seed=1).sample, 1,
                             AlgoConfig(name="tgrl", warmup_steps=0), step=1))
    assert all(pens == [] for _, pens in engine.penalties)
