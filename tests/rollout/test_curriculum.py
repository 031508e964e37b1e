"""trainer.curriculum=pass_rate (agent_rl.rollout.samplers.PassRateSampler): pools by running pass rate, hand-computed;
weights, cooldown re-admission, a resume that draws the same tasks, and the outcomes it learns from (DAPO-filtered
groups included, synchronous and asynchronous collection)."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_rl.rollout.config import PassRateConfig, TaskSamplerConfig
from agent_rl.rollout.orchestrator import RolloutResult, collect_groups
from agent_rl.rollout.producer import PlayedGroup, StepAdmission
from agent_rl.rollout.samplers import PassRateSampler, TaskSampler
from agent_rl.types import Episode, Task

ROWS = [{"problem": f"p{i}", "answer": str(i)} for i in range(6)]
T, F = True, False


def sampler(**kwargs) -> PassRateSampler:
    cfg = PassRateConfig(**{"cooldown_steps": 2, **kwargs})
    return PassRateSampler("agent_rl/Math-v0", TaskSamplerConfig(), cfg, rows=ROWS, seed=3)


def task(i: int) -> Task:
    return Task(env_id="agent_rl/Math-v0", options=dict(ROWS[i]), index=i, group_id=i)  # one group per task


def test_pools_by_running_pass_rate_hand_computed():
    s = sampler()
    # step 1: task 0 4/4 -> 1.0 too easy; task 1 0/4 -> too hard; task 2 1/4 = 0.25 and task 3 3/4 = 0.75 learnable
    s.observe(1, [(task(0), [T, T, T, T]), (task(1), [F, F, F, F]), (task(2), [T, F, F, F]), (task(3), [T, T, T, F])])
    assert list(s.pools()) == [0, 2, 1, 1, 3, 3]  # too_easy, too_hard, learnable, learnable, unseen, unseen
    m = s.step_metrics()
    assert m["curriculum/pool_frac/too_easy"] == m["curriculum/pool_frac/too_hard"] == pytest.approx(1 / 6)
    assert m["curriculum/pool_frac/learnable"] == m["curriculum/pool_frac/unseen"] == pytest.approx(2 / 6)
    assert m["curriculum/learnable_frac"] == 0.5  # 2 of the 4 groups had some but not all episodes won
    # step 2: EMA 0.5: task 2 0.5*0.25 + 0.5*1 = 0.625, task 3 0.5*0.75 + 0.5*1 = 0.875 (< 0.95: still learnable)
    s.observe(2, [(task(2), [T, T, T, T]), (task(3), [T, T, T, T])])
    assert s.rates[2] == pytest.approx(0.625) and s.rates[3] == pytest.approx(0.875)
    assert list(s.pools()) == [0, 2, 1, 1, 3, 3]  # tasks 0, 1: 1 step since their group < cooldown 2
    assert s.step_metrics()["curriculum/learnable_frac"] == 0.0
    # step 3: 2 steps since tasks 0 and 1 were played: re-admitted as unseen
    s.observe(3, [])
    assert list(s.pools()) == [3, 3, 1, 1, 3, 3]
    assert s.step_metrics()["curriculum/pool_frac/unseen"] == pytest.approx(4 / 6)
    # step 4: a re-admitted task is measured afresh (0/4 -> 0.0, not the EMA 0.5 * 1.0 + 0.5 * 0.0)
    s.observe(4, [(task(0), [F, F, F, F])])
    assert s.rates[0] == 0.0 and s.pools()[0] == 2


def test_weights_choose_the_pool_and_no_pool_starves():
    s = sampler(weights={"learnable": 1.0, "too_easy": 0.0, "too_hard": 0.0, "unseen": 0.0})
    s.observe(1, [(task(0), [T, T]), (task(1), [F, F]), (task(2), [T, F]), (task(3), [F, T])])
    drawn = s.sample(2)
    assert sorted(t.index for t in drawn) == [2, 3]  # the two learnable tasks, not twice the same in one call
    assert [t.options for t in drawn] == [ROWS[t.index] for t in drawn] and [t.group_id for t in drawn] == [0, 1]
    assert {t.index for t in s.sample(6)} == {2, 3}  # only learnable tasks carry weight: repeats, never others
    # weight only on an empty pool: the tasks are drawn evenly from the pools that hold some (never starve)
    empty = sampler(weights={"too_easy": 1.0, "learnable": 0.0, "too_hard": 0.0, "unseen": 0.0})
    assert sorted(t.index for t in empty.sample(6)) == [0, 1, 2, 3, 4, 5]
    s.observe(2, [])
    assert s.step_metrics()["curriculum/drawn_frac/learnable"] == 1.0


def _play(s: TaskSampler, steps: range) -> list[list[int]]:
    """Steps of 3 draws each; task i's group at step t wins (i + t) % 4 of 4 episodes (a fixed 'policy')."""
    drawn = []
    for step in steps:
        tasks = s.sample(3)
        drawn.append([t.index for t in tasks])
        s.observe(step, [(t, [k < (t.index + step) % 4 for k in range(4)]) for t in tasks])
    return drawn


def test_resume_draws_the_same_tasks():
    whole = sampler()
    expected = _play(whole, range(1, 9))
    first = sampler()
    head = _play(first, range(1, 5))
    state = json.loads(json.dumps(first.state_dict()))  # through extra.json
    resumed = sampler()
    resumed.load_state_dict(state)
    assert head + _play(resumed, range(5, 9)) == expected
    assert len({i for step in expected for i in step}) > 1
    # a checkpoint of another task list is refused
    other = PassRateSampler("x", TaskSamplerConfig(), PassRateConfig(), rows=ROWS[:2])
    with pytest.raises(ValueError, match="covers 6 tasks, this run's task list 2"):
        other.load_state_dict(state)


def test_the_curriculum_needs_a_task_list():
    with pytest.raises(ValueError, match="needs a task list"):
        PassRateSampler("x", TaskSamplerConfig(kind="seed"), PassRateConfig())
    index = PassRateSampler("x", TaskSamplerConfig(kind="index", num_tasks=4, options={"split": "train"}),
                            PassRateConfig())
    assert {t.options["index"] for t in index.sample(4)} == {0, 1, 2, 3}


def _episodes(t: Task, won: list[bool]) -> list[Episode]:
    return [Episode(task=t, temperature=1.0, is_high=False, reward=float(w), won=w) for w in won]


def test_dapo_filtered_groups_are_observed_too():
    """collect_groups (synchronous rounds, every backend) and StepAdmission (async) both report every finished group,
    the filtered ones included: the curriculum learns what DAPO's refill throws away."""
    rounds = iter([[task(0), task(1)], [task(2)]])
    wins = {0: [T, T], 1: [T, F], 2: [F, T]}
    metrics = {"time/rollout_s": 1.0, "time/env_wait_frac": 0.0, "throughput/tokens_per_s": 0.0,
               "time/generate_s": 0.0, "rollout/episode_retries": 0.0, "rollout/failed_episodes": 0.0}

    async def play(tasks, seed_key):
        return RolloutResult(episodes=[ep for t in tasks for ep in _episodes(t, wins[t.index])], metrics=metrics)

    result = asyncio.run(collect_groups(play, lambda n: next(rounds), 2, 2, step=1, filter_groups=True,
                                        max_extra_rounds=1))
    assert result.filtered_groups == 1 and len(result.episodes) == 4  # task 0 (all won) filtered, refilled by 2
    assert [(t.index, w) for t, w in result.outcomes] == [(0, [T, T]), (1, [T, F]), (2, [F, T])]

    adm = StepAdmission(step=1, need=1, max_staleness=1, max_replays=0, filter_groups=True, max_extra_rounds=1)
    assert adm.offer(PlayedGroup(task(0), 0, 0, 1, _episodes(task(0), [T, T]))) == "filtered"
    assert adm.offer(PlayedGroup(task(1), 1, 0, 1, _episodes(task(1), [T, F]))) == "admitted"
    assert [(t.index, w) for t, w in adm.outcomes] == [(0, [T, T]), (1, [T, F])]
    s = sampler()
    s.observe(1, adm.outcomes)
    assert list(s.pools()[:2]) == [0, 1] and s.step_metrics()["curriculum/learnable_frac"] == 0.5


def test_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="hard_rate < easy_rate"):
        PassRateConfig(easy_rate=0.1, hard_rate=0.5)
    with pytest.raises(ValueError, match="weights"):
        PassRateConfig(weights={"learnable": 1.0, "medium": 1.0})


def test_the_config_refuses_the_curriculum_without_a_task_list():
    from agent_rl.config.compose import load_config
    from agent_rl.config.schema import ConfigError

    with pytest.raises(ConfigError, match="needs a task list: env.tasks=PATH"):
        load_config(["env=math", "model=tiny", "trainer.curriculum=pass_rate"], check=False)
    cfg = load_config(["env=alfworld", "model=tiny", "trainer.curriculum=pass_rate",
                       "trainer.pass_rate.weights.learnable=0.9"], check=False)  # index kind: 3553 games
    assert cfg.trainer.pass_rate.weights["learnable"] == 0.9 and cfg.trainer.pass_rate.weights["unseen"] == 0.3
