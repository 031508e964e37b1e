"""Issue 34: when a step's groups are played is chosen once from the config (``agent_rl.rollout.schedule``): the
staleness bound as a mode switch is tested here, in one place; the stream's loop-stall probe measures a blocking call
on the event loop (``async/loop_stall_max_s``) and not an awaiting one; the synchronous rounds play the prefetched
tasks first and count them as pending."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_rl.learner.config import AlgoConfig
from agent_rl.progress import Progress
from agent_rl.rollout import GroupSpec, RolloutResult
from agent_rl.rollout.orchestrator import merge_parallel_results, rollout_metrics
from agent_rl.rollout.schedule import ExpertRows, StalenessStream, SyncRounds, choose_schedule, plays_ahead
from agent_rl.types import Episode, Task


class _Cfg:
    """The keys a schedule reads (``trainer``, ``algo``, ``rollout``), as the root config holds them."""

    def __init__(self, k: int, tasks_per_step: int = 2, group_size: int = 2) -> None:
        from agent_rl.config.schema import TrainerConfig
        from agent_rl.rollout.config import RolloutConfig

        self.trainer = TrainerConfig(max_staleness=k, tasks_per_step=tasks_per_step, total_steps=3)
        self.algo = AlgoConfig(name="grpo", group_size=group_size)
        self.rollout = RolloutConfig()


class _Player:
    """Groups of ``group_size`` episodes with reward = group id (never all-equal across a group: rewards differ by
    slot); ``block_s``: a blocking ``time.sleep`` on the event loop inside each group (the defect the probe finds)."""

    def __init__(self, block_s: float = 0.0, prefetch: bool = False) -> None:
        self.block_s, self.loaded, self.rounds = block_s, [], []
        self.prefetched: list[Task] = []
        self.prefetch = self._prefetch if prefetch else None

    def _prefetch(self, tasks: list[Task], episodes_per_task: int) -> None:
        self.prefetched = list(tasks)

    def _group(self, task: Task, temps: list[tuple[float, bool]]) -> list[Episode]:
        return [Episode(task=task, temperature=t, is_high=h, reward=float(task.group_id) + slot)
                for slot, (t, h) in enumerate(temps)]

    async def play_round(self, tasks, step, seed_key, t_high):
        self.rounds.append([t.group_id for t in tasks])
        episodes = [ep for t in tasks for ep in self._group(t, [(1.0, False)] * 2)]
        res = RolloutResult(episodes=episodes, metrics={**rollout_metrics(episodes), "time/rollout_s": 0.0,
                                                        "time/env_wait_frac": 0.0, "time/generate_s": 0.0,
                                                        "throughput/tokens_per_s": 0.0,
                                                        "rollout/episode_retries": 0.0,
                                                        "rollout/failed_episodes": 0.0})
        return merge_parallel_results([res], wall_s=0.0)

    async def play_group(self, spec: GroupSpec) -> list[Episode]:
        await asyncio.sleep(0.01)
        if self.block_s:
            time.sleep(self.block_s)  # blocks the loop: nothing else runs meanwhile
        return self._group(spec.task, spec.temperatures)

    async def load_weights(self, version: int) -> None:
        self.loaded.append(version)

    def counters(self) -> dict[str, float]:
        return {}

    def collected(self, step: int, result: RolloutResult) -> None:
        pass


def _sampler():
    drawn = iter(range(10**6))
    return lambda n: [Task(env_id="x", group_id=next(drawn)) for _ in range(n)]


@pytest.mark.parametrize("k,kind", [(0, SyncRounds), (1, StalenessStream), (3, StalenessStream)])
def test_the_staleness_bound_chooses_the_schedule(k, kind):
    cfg = _Cfg(k)
    assert plays_ahead(cfg) is (k > 0)
    schedule = choose_schedule(cfg, _Player(), Progress(enabled=False), total_steps=3, version=0)
    assert type(schedule) is kind and schedule.plays_episodes
    rows = ExpertRows(lambda step: RolloutResult(episodes=[]))
    assert choose_schedule(cfg, rows, Progress(enabled=False), total_steps=3, version=0) is rows
    assert not rows.plays_episodes and rows.update_metrics(rows.update_started()) == {}


@pytest.mark.parametrize("block_s", [0.0, 0.3])
def test_the_stream_probe_measures_a_blocking_call_on_the_loop(block_s):
    async def main() -> dict[str, float]:
        schedule = StalenessStream(_Cfg(1), _Player(block_s), Progress(enabled=False), total_steps=3, version=0)
        try:
            result = await schedule.collect(1, _sampler())
            assert len(result.episodes) == 4 and result.metrics["async/groups_stale_dropped"] == 0.0
            return schedule.step_metrics()
        finally:
            await schedule.aclose()

    stall = asyncio.run(main())["async/loop_stall_max_s"]
    if block_s:
        assert 0.25 <= stall  # the 0.3 s sleep on the loop, seen by the probe
    else:
        assert stall < 0.25  # awaiting only: the loop ran


def test_sync_rounds_play_the_prefetched_tasks_first_and_count_them_pending():
    async def main() -> None:
        player = _Player(prefetch=True)
        schedule = SyncRounds(_Cfg(0), player, Progress(enabled=False), total_steps=3)
        sample = _sampler()
        res = await schedule.collect(1, sample)
        assert [ep.task.group_id for ep in res.episodes] == [0, 0, 1, 1] and res.versions == [0, 0]
        assert res.metrics["async/groups_stale_dropped"] == 0.0
        schedule.prefetch(1, sample)  # step 2's resets start during step 1's update
        assert [t.group_id for t in player.prefetched] == [2, 3] and schedule.pending_tasks == 2
        await schedule.sync(1)
        await schedule.sync(2, trained=False)  # nothing trained: the engines keep their weights
        assert player.loaded == [1]
        await schedule.collect(2, sample)
        assert player.rounds == [[0, 1], [2, 3]] and schedule.pending_tasks == 0
        schedule.prefetch(3, sample)  # the last step: nothing to prefetch
        assert schedule.pending_tasks == 0 and schedule.update_metrics(schedule.update_started()) == {
            "time/overlap_s": 0.0}

    asyncio.run(main())


def test_rollout_metrics_split_reward_signal_from_success_signal():
    """Three groups: rewards differ only by an invalid-action penalty (no win); one win among losses; all won. Two of
    three groups have unequal rewards, one of three mixes won and lost episodes."""
    def ep(g, reward, won):
        return Episode(task=Task("e", group_id=g), temperature=1.0, is_high=True, reward=reward, won=won)

    eps = [ep(0, -0.1, False), ep(0, -0.3, False), ep(1, 1.0, True), ep(1, 0.0, False), ep(2, 1.0, True),
           ep(2, 1.0, True)]
    m = rollout_metrics(eps)
    assert m["rollout/groups"] == 3 and m["rollout/groups_equal_frac"] == pytest.approx(1 / 3)
    assert m["rollout/groups_mixed_success_frac"] == pytest.approx(1 / 3)
