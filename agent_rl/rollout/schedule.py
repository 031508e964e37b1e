"""*When* a step's groups are played, chosen once from the config (:func:`choose_schedule`); a backend offers only
*where* they are played (a :class:`Player`).

Three schedules, one interface (what :func:`agent_rl.loop.run` calls, in its order):

- :class:`SyncRounds` (``trainer.max_staleness=0``): the step's groups are played in rounds after the previous
  step's weights are loaded (:func:`agent_rl.rollout.collect_groups`: DAPO's dynamic sampling draws new tasks for the
  groups it filters); a player that offers ``prefetch`` starts the next step's env resets before the update.
- :class:`StalenessStream` (``trainer.max_staleness=k`` >= 1, algorithms.md section 7): the one
  :class:`~agent_rl.rollout.producer.AsyncProducer` of the code base keeps starting groups (``Player.play_group``)
  while the learner updates, at most k steps ahead; ``collect`` admits the step's groups, ``sync`` loads the new
  weights (``rollout.partial=false``: after the episodes in flight). A probe task measures the event loop's longest
  stall per step (``async/loop_stall_max_s``: a blocking call on the loop stops every group).
- :class:`ExpertRows` (behaviour cloning): fixed rows per step, no episodes played.

The metric defaults of a step (``async/groups_stale_dropped``, ``time/overlap_s``: 0 in synchronous runs) come from
the schedule, so every row of one run has the same keys.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Protocol

from agent_rl.progress import step_phase
from agent_rl.rollout.results import GroupSpec, RolloutResult, collect_groups, group_temperatures, split_groups
from agent_rl.rollout.producer import AsyncProducer, warmup_horizon
from agent_rl.types import Episode, Task

#: seconds between two wakeups of the loop-stall probe (its resolution; a stall is the gap beyond it).
PROBE_INTERVAL_S = 0.005


def plays_ahead(cfg: Any) -> bool:
    """Whether the run's rollouts play ahead of the learner (``trainer.max_staleness`` >= 1: the
    :class:`StalenessStream`; the engines then sample with weights the update does not touch). The one place the
    staleness bound is read as a mode switch (its value is checked by ``TrainerConfig``)."""
    return cfg.trainer.max_staleness > 0


class Player(Protocol):
    """Where a step's groups are played: one process's orchestrator (``agent_rl.local``) or the Ray rollout
    workers (``agent_rl.distributed.backend``). Returned by ``Backend.open``.

    Attributes:
        prefetch: ``prefetch(tasks, episodes_per_task)`` starts the env resets of the next step's groups now (they
            are played first by the next round), or None when the player has none.
    """

    prefetch: Callable[[list[Task], int], None] | None

    async def play_round(self, tasks: list[Task], step: int, seed_key: int, t_high: float | None) -> RolloutResult:
        """One group per task of ``tasks`` at step ``step``'s temperatures (T1 = ``t_high`` when given), rollout seed
        key ``seed_key`` (:func:`collect_groups`); the result's ``versions`` are set by the schedule."""

    async def play_group(self, spec: GroupSpec) -> list[Episode]:
        """One group (the stream: several play at once); its G episodes, each turn stamped with its version."""

    async def play_specs(self, specs: list[GroupSpec], seed_key: int) -> RolloutResult:
        """Groups at the temperatures their specs give, rollout seed key ``seed_key`` (TGRL's calibration probe,
        ``agent_rl.calibration``; before any step is collected); failed groups dropped as in a round."""

    async def load_weights(self, version: int) -> None:
        """The learner's weights after ``version`` updates into the engines (between two engine calls)."""

    def counters(self) -> dict[str, float]:
        """The stream's totals (``generate_s``, ``tokens``, ``prefill_tokens``, ``kv_reuse_tokens``, ...)."""

    def collected(self, step: int, result: RolloutResult) -> None:
        """The step's kept groups, for the player's own records (Ray: ``weight_versions.jsonl``, worker restarts
        into ``result.metrics``)."""


class SyncRounds:
    """Synchronous rounds: a step's groups are played after the previous step's weights are loaded, in rounds of
    :meth:`Player.play_round` (DAPO refill: :func:`collect_groups`); the next step's resets are prefetched during the
    update when the player offers it. Tasks prefetched and not played yet are :attr:`pending_tasks`."""

    plays_episodes = True
    groups_in_flight = 0

    def __init__(self, cfg: Any, player: Player, progress: Any, *, total_steps: int) -> None:
        self.cfg, self.player, self.progress, self.total_steps = cfg, player, progress, total_steps
        self._prefetched: list[Task] = []

    @property
    def pending_tasks(self) -> int:
        return len(self._prefetched)

    async def collect(self, step: int, sample_tasks: Callable[[int], list[Task]],
                      t_high: float | None = None) -> RolloutResult:
        cfg = self.cfg
        temps = group_temperatures(cfg.algo, step, t_high)
        self.progress.phase(step_phase(self.progress, step, self.total_steps, "rollout"),
                            total=cfg.trainer.tasks_per_step * len(temps))

        def take(n: int) -> list[Task]:  # the prefetched tasks first (their resets are running)
            tasks, self._prefetched = self._prefetched[:n], self._prefetched[n:]
            return tasks + sample_tasks(n - len(tasks))

        async def play(tasks: list[Task], seed_key: int) -> RolloutResult:
            return await self.player.play_round(tasks, step, seed_key, t_high)

        result = await collect_groups(play, take, cfg.trainer.tasks_per_step, len(temps), step,
                                      filter_groups=cfg.algo.dapo_dynamic_sampling,
                                      max_extra_rounds=cfg.algo.dapo_max_extra_rounds)
        result.versions = [min((t.policy_version for ep in group for t in ep.turns), default=0)
                           for group in split_groups(result.episodes)]
        result.metrics.setdefault("async/groups_stale_dropped", 0.0)
        self.player.collected(step, result)
        return result

    def prefetch(self, step: int, sample_tasks: Callable[[int], list[Task]]) -> None:
        """After step ``step``'s collect: the next step's env resets start now (run during the update)."""
        if step < self.total_steps and self.player.prefetch is not None:
            self._prefetched = sample_tasks(self.cfg.trainer.tasks_per_step)
            self.player.prefetch(self._prefetched, self.cfg.algo.group_size)

    def update_started(self) -> Any:
        return None

    def update_metrics(self, mark: Any) -> dict[str, float]:
        return {"time/overlap_s": 0.0}

    async def sync(self, version: int, *, trained: bool = True) -> None:
        """The weights after ``version`` updates into the engines (a step that trained nothing changed none)."""
        if trained:
            await self.player.load_weights(version)

    def step_metrics(self) -> dict[str, float]:
        return {}

    async def aclose(self) -> None:
        self._prefetched = []


class StalenessStream:
    """A staleness-bounded stream (``trainer.max_staleness=k`` >= 1, algorithms.md section 7): the run's one
    :class:`AsyncProducer`, over :meth:`Player.play_group`, :meth:`Player.load_weights` and
    :meth:`Player.counters`, started at weight version ``version``; a probe task records the event loop's longest
    stall between two :meth:`step_metrics` calls (``async/loop_stall_max_s``)."""

    plays_episodes = True

    def __init__(self, cfg: Any, player: Player, progress: Any, *, total_steps: int, version: int) -> None:
        t, algo = cfg.trainer, cfg.algo
        self.cfg, self.player, self.progress, self.total_steps = cfg, player, progress, total_steps
        self._t_high: float | None = None
        self.producer = AsyncProducer(
            player.play_group, player.load_weights, player.counters,
            lambda step: group_temperatures(algo, step, self._t_high), max_staleness=t.max_staleness,
            tasks_per_step=t.tasks_per_step, total_steps=total_steps, max_replays=cfg.rollout.max_stale_replays,
            partial=cfg.rollout.partial, filter_groups=algo.dapo_dynamic_sampling,
            max_extra_rounds=algo.dapo_max_extra_rounds, version=version,
            horizon=lambda step: warmup_horizon(algo, step, total_steps))
        self._stall_s = 0.0
        self._last_wake: float | None = None
        self._probe: asyncio.Task | None = None

    @property
    def pending_tasks(self) -> int:
        return self.producer.pending_tasks

    @property
    def groups_in_flight(self) -> int:
        """Groups started and not trained (a checkpoint counts them: a resume plays them again)."""
        return self.producer.groups_in_flight

    async def _watch_loop(self) -> None:
        """Wake every :data:`PROBE_INTERVAL_S`; the longest gap beyond it is the loop's longest stall."""
        self._last_wake = time.perf_counter()
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            self._stall_s = max(self._stall_s, self._gap())
            self._last_wake = time.perf_counter()

    def _gap(self) -> float:
        """Seconds beyond :data:`PROBE_INTERVAL_S` since the probe's last wakeup (0 before it first ran)."""
        if self._last_wake is None:
            return 0.0
        return max(0.0, time.perf_counter() - self._last_wake - PROBE_INTERVAL_S)

    async def collect(self, step: int, sample_tasks: Callable[[int], list[Task]],
                      t_high: float | None = None) -> RolloutResult:
        if self._probe is None:
            self._probe = asyncio.ensure_future(self._watch_loop())
        temps = group_temperatures(self.cfg.algo, step, t_high)
        self.progress.phase(step_phase(self.progress, step, self.total_steps, "rollout"),
                            total=self.cfg.trainer.tasks_per_step * len(temps))
        self._t_high = t_high  # the T1 of groups started from now on (section 7: fixed at a group's start)
        result = await self.producer.collect(step, sample_tasks)
        result.metrics.setdefault("async/groups_stale_dropped", 0.0)
        self.player.collected(step, result)
        return result

    def prefetch(self, step: int, sample_tasks: Callable[[int], list[Task]]) -> None:
        """Nothing: the producer runs ahead itself."""

    def update_started(self) -> tuple[float, float]:
        return time.perf_counter(), self.producer.active_seconds()

    def update_metrics(self, mark: tuple[float, float]) -> dict[str, float]:
        """``time/overlap_s``: seconds of the update during which groups were played (``mark``:
        :meth:`update_started`, taken at the update's start)."""
        t0, a0 = mark
        return {"time/overlap_s": min(self.producer.active_seconds() - a0, time.perf_counter() - t0)}

    async def sync(self, version: int, *, trained: bool = True) -> None:
        """The weights after ``version`` updates (v = s after step s, trained or not: section 7); with
        ``rollout.partial=false`` after the episodes in flight (:meth:`AsyncProducer.sync`)."""
        await self.producer.sync(version)

    def step_metrics(self) -> dict[str, float]:
        """``async/loop_stall_max_s``: the event loop's longest stall since the last call (seconds)."""
        stall = max(self._stall_s, self._gap())  # a stall still going on counts now (this call ends it)
        self._stall_s = 0.0
        if self._last_wake is not None:
            self._last_wake = time.perf_counter()
        return {"async/loop_stall_max_s": stall}

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self.producer.aclose()


class ExpertRows:
    """Fixed expert rows (behaviour cloning): step ``step`` trains ``rows(step)`` (``RolloutResult.batch``, its
    metrics); no episodes are played, no weights go to an engine per step."""

    plays_episodes = False
    pending_tasks = 0
    groups_in_flight = 0

    def __init__(self, rows: Callable[[int], RolloutResult]) -> None:
        self.rows = rows

    async def collect(self, step: int, sample_tasks: Callable[[int], list[Task]],
                      t_high: float | None = None) -> RolloutResult:
        return self.rows(step)

    def prefetch(self, step: int, sample_tasks: Callable[[int], list[Task]]) -> None:
        """Nothing: no episodes are played."""

    def update_started(self) -> Any:
        return None

    def update_metrics(self, mark: Any) -> dict[str, float]:
        return {}

    async def sync(self, version: int, *, trained: bool = True) -> None:
        """Nothing: the engine (the eval panel's) is synced by the backend before it plays."""

    def step_metrics(self) -> dict[str, float]:
        return {}

    async def aclose(self) -> None:
        pass


Schedule = SyncRounds | StalenessStream | ExpertRows


def choose_schedule(cfg: Any, player: Player | ExpertRows, progress: Any, *, total_steps: int,
                    version: int) -> Schedule:
    """The run's schedule: ``player`` itself when it is :class:`ExpertRows`, else :class:`StalenessStream` when
    :func:`plays_ahead`, else :class:`SyncRounds`. ``version``: the weight version the engines hold (the resumed
    step, else 0)."""
    if isinstance(player, ExpertRows):
        return player
    if plays_ahead(cfg):
        return StalenessStream(cfg, player, progress, total_steps=total_steps, version=version)
    return SyncRounds(cfg, player, progress, total_steps=total_steps)

