"""Asynchronous rollouts with bounded, group-aware staleness (algorithms.md section 7, ``trainer.max_staleness``).

With ``k = trainer.max_staleness >= 1`` an :class:`AsyncProducer` (an asyncio task on the run's event loop, built by
the one staleness-bounded schedule, :class:`agent_rl.rollout.schedule.StalenessStream`) keeps
starting groups while the learner's update runs in a worker thread; the training loop's ``collect`` takes the step's
groups from it in order of completion. The rules, exactly as the spec's section 7:

- **Versions.** The engine's weights have version v = the number of completed steps whose weights it holds
  (:class:`agent_rl.engines.VersionedEngine` stamps every generation with the version it started under;
  ``Turn.policy_version``).
- **Throttle.** A group starts only if it can be trained within the bound: with engine version v, groups are
  started for the steps up to ``min(v + 1 + k, total_steps)`` (``tasks_per_step`` each, minus what the current
  step already took), so the producer is at most k steps ahead of the learner. A group's temperatures are fixed
  when it starts, from the step the loop is in then (``temperatures(step)``: warm-up or not, the step's T1).
  TGRL's warm-up keeps its meaning: during warm-up steps groups are started only for warm-up steps (``horizon``),
  and a warm-up group still waiting after the warm-up is played again as a fresh group (not counted as a replay;
  ``async/groups_replayed_after_warmup``), so a step never mixes all-T1 warm-up groups with T0/T1 groups.
- **Admission** (:class:`StepAdmission`, pure): whole groups, in order of completion; a failed group (an episode
  that failed every attempt) is dropped as in synchronous runs; a group whose staleness (the maximum over its
  tokens of ``(step - 1) - version``) exceeds k is discarded and its task played again as a fresh group (new group
  id) at most ``rollout.max_stale_replays`` times, then dropped; a TGRL group (T0 and T1 members) is one unit;
  DAPO's dynamic sampling filters all-equal groups and the producer refills them (at most
  ``tasks_per_step x algo.dapo_max_extra_rounds`` extra groups per step, as the synchronous extra rounds).
- **Weight sync.** ``rollout.partial=false`` (default): a sync waits until the episodes in flight have finished
  under the weights they started with (no new group starts meanwhile), so every token of a group has the version
  of the group's start; the engine keeps one copy of the policy. ``rollout.partial=true``: the sync happens
  between two engine calls, episodes in flight continue with the new weights and their turns carry their own
  versions.
- **Data position.** :attr:`AsyncProducer.pending_tasks` counts the draws from the earliest task not trained yet
  (in flight, completed but not admitted, waiting for a replay) to the last one, so a checkpoint's data position
  excludes them and a resume plays them again (tasks drawn after that one and already trained are played again too:
  at most ``k x tasks_per_step``).

Why threads, not processes, on the local backend: the learner's update and the engine's generation are both torch
ops, which release the GIL, so a worker thread each overlaps them without copying weights between processes (the
hf engine's own copy is a ``load_state_dict`` in memory); the event loop only schedules env calls.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agent_rl.rollout.results import EVENT_COUNTS, GroupSpec, RolloutResult, all_equal, rollout_metrics
from agent_rl.types import Episode, Task

#: a replayed task's group id is its first group id + replays x this (group ids must stay distinct in a stream).
REPLAY_ID_STRIDE = 10**12


def warmup_horizon(algo: Any, step: int, total_steps: int) -> int:
    """The last step a group started in 1-based ``step`` may be trained in: TGRL's last warm-up step while ``step``
    is in the warm-up (``algo.in_warmup``: its groups are all at T1 and trained with plain GRPO), else
    ``total_steps``. The warm-up is the steps s < ``algo.warmup_steps``, so its last step is ``warmup_steps - 1``."""
    return int(algo.warmup_steps) - 1 if algo.in_warmup(step) else int(total_steps)


@dataclass
class PlayedGroup:
    """One group the producer played: its task (with the group id it was played under), the draw it comes from
    (``origin``: 0-based draw index of the producer), how often it was played again after a stale discard, the step
    the loop was in when it started, and its G episodes (slot order)."""

    task: Task
    origin: int
    replays: int
    start_step: int
    episodes: list[Episode]
    horizon: int = 2**62
    """The last step it may be trained in (its sampling's phase: TGRL's warm-up groups only in warm-up steps)."""

    @property
    def failure(self) -> str | None:
        """The first failed episode's reason (the group is dropped), else None."""
        return next((ep.failure for ep in self.episodes if ep.failure is not None), None)

    @property
    def min_version(self) -> int:
        """The oldest policy version among its tokens (0 for a group without turns)."""
        versions = [t.policy_version for ep in self.episodes for t in ep.turns]
        return min(versions) if versions else 0

    @property
    def task_type(self) -> str:
        return next((str(ep.task_type) for ep in self.episodes if ep.task_type), "")


def group_staleness(group: PlayedGroup, step: int) -> int:
    """A group's staleness if trained at 1-based ``step``: the maximum over its tokens of ``(step - 1) - version``
    (algorithms.md section 7)."""
    return (step - 1) - group.min_version


@dataclass
class StepAdmission:
    """The admission of one step's groups (pure: no clock, no engine), fed one completed group at a time in order of
    completion (:meth:`offer`) until :attr:`done`.

    Args:
        step: the 1-based step the groups are trained in.
        need: groups the step trains (``trainer.tasks_per_step``).
        max_staleness: k; a group whose :func:`group_staleness` > k is discarded.
        max_replays: ``rollout.max_stale_replays``: a discarded group is played again while its ``replays`` are
            below it, else dropped.
        filter_groups: DAPO's dynamic sampling (all-equal groups filtered and refilled).
        max_extra_rounds: ``algo.dapo_max_extra_rounds``: the step consumes at most ``need x (1 + this)`` groups
            (admitted, filtered or failed) when filtering.
    """

    step: int
    need: int
    max_staleness: int
    max_replays: int
    filter_groups: bool = False
    max_extra_rounds: int = 0
    admitted: list[PlayedGroup] = field(default_factory=list)
    replay: list[PlayedGroup] = field(default_factory=list)
    given_up: list[PlayedGroup] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    filtered: int = 0
    stale: int = 0
    stale_by_type: dict[str, int] = field(default_factory=dict)
    expired: list[PlayedGroup] = field(default_factory=list)
    consumed: int = 0  # groups that count against the step's budget (admitted, failed, filtered)
    outcomes: list[tuple[Task, list[bool]]] = field(default_factory=list)  # admitted and filtered: (task, won)

    def offer(self, group: PlayedGroup) -> str:
        """Judge one completed group: ``admitted`` | ``failed`` (dropped, as in synchronous runs) | ``stale_replay``
        (discarded, to be played again) | ``stale_dropped`` (discarded, replays used up) | ``filtered`` (DAPO)."""
        failure = group.failure
        if self.step > group.horizon:  # sampled for another phase (TGRL warm-up, all at T1): played again fresh
            self.expired.append(group)
            return "expired"
        if failure is not None:
            self.failures.append(failure)
            self.consumed += 1
            return "failed"
        if group_staleness(group, self.step) > self.max_staleness:
            self.stale += 1
            kind = group.task_type
            if kind:
                self.stale_by_type[kind] = self.stale_by_type.get(kind, 0) + 1
            if group.replays < self.max_replays:
                self.replay.append(group)
                return "stale_replay"
            self.given_up.append(group)
            return "stale_dropped"
        self.outcomes.append((group.task, [ep.won for ep in group.episodes if ep.fork is None]))  # bases only
        if self.filter_groups and all_equal([ep.reward for ep in group.episodes]):
            self.filtered += 1
            self.consumed += 1
            return "filtered"
        self.admitted.append(group)
        self.consumed += 1
        return "admitted"

    @property
    def taken(self) -> int:
        """Groups that fill the step's quota: admitted ones, and failed ones when not filtering (a synchronous run's
        batch is smaller then; with DAPO's filter failed groups are refilled)."""
        return len(self.admitted) + (0 if self.filter_groups else len(self.failures))

    @property
    def done(self) -> bool:
        if self.taken >= self.need:
            return True
        return self.filter_groups and self.consumed >= self.need * (1 + self.max_extra_rounds)

    def metrics(self) -> dict[str, float]:
        """``async/groups_stale_dropped`` (groups discarded for staleness at this step, replayed or not; per task
        type as ``async/groups_stale_dropped/<type>``), ``async/groups_stale_given_up`` (of those, dropped for good:
        replays used up)."""
        out = {"async/groups_stale_dropped": float(self.stale),
               "async/groups_stale_given_up": float(len(self.given_up)),
               "async/groups_replayed_after_warmup": float(len(self.expired))}
        for kind, n in sorted(self.stale_by_type.items()):
            out[f"async/groups_stale_dropped/{kind}"] = float(n)
        return out


class AsyncProducer:
    """The producer of asynchronous rollouts (module docstring): starts groups under the throttle, queues them in
    order of completion, and hands each step its admitted groups.

    Args:
        play_group: plays one group (``GroupSpec``) and returns its G episodes (a local group player's
            :meth:`~agent_rl.rollout.groups.GroupPlayer.play_group`, or a Ray worker's).
        load_weights: ``await load_weights(version)`` puts the weights after ``version`` steps into the engine(s).
        counters: cumulative generation counters (``generate_s``, ``tokens``, ``episode_retries``,
            ``failed_episodes``) for the step metrics.
        temperatures: ``temperatures(step)``: the (temperature, is_high) of a group started while the loop is in
            ``step`` (``group_temperatures``).
        max_staleness, tasks_per_step, total_steps, max_replays, partial, filter_groups, max_extra_rounds: the run's
            ``trainer.max_staleness``, ``trainer.tasks_per_step``, ``trainer.total_steps``,
            ``rollout.max_stale_replays``, ``rollout.partial``, ``algo.dapo_dynamic_sampling``,
            ``algo.dapo_max_extra_rounds``.
        version: the engine's weight version at the start (the resumed step, else 0).
        horizon: ``horizon(step)``: the last step a group started in ``step`` may be trained in (TGRL: the last
            warm-up step during warm-up); None: ``total_steps``.
    """

    def __init__(self, play_group: Callable[[GroupSpec], Awaitable[list[Episode]]],
                 load_weights: Callable[[int], Awaitable[None]], counters: Callable[[], dict[str, float]],
                 temperatures: Callable[[int], list[tuple[float, bool]]], *, max_staleness: int, tasks_per_step: int,
                 total_steps: int, max_replays: int = 2, partial: bool = False, filter_groups: bool = False,
                 max_extra_rounds: int = 0, version: int = 0,
                 horizon: Callable[[int], int] | None = None) -> None:
        self.play_group, self.load_weights, self.counters = play_group, load_weights, counters
        self.temperatures = temperatures
        self.k, self.per_step, self.total_steps = int(max_staleness), int(tasks_per_step), int(total_steps)
        self.max_replays, self.partial = int(max_replays), bool(partial)
        self.filter_groups, self.max_extra_rounds = bool(filter_groups), int(max_extra_rounds)
        self.version = int(version)
        self.horizon = horizon
        self.step = self.version + 1  # the step the loop is in
        self.consumed = 0  # groups the current step has taken (its quota: per_step)
        self.sample_tasks: Callable[[int], list[Task]] | None = None
        self._replay: collections.deque[PlayedGroup] = collections.deque()
        self._inflight: set[asyncio.Future] = set()
        self._done: collections.deque[PlayedGroup] = collections.deque()
        self._error: BaseException | None = None
        self._untrained: dict[int, int] = {}  # draw index -> groups of it not yet trained or dropped
        self.draws = 0
        self._paused = False
        self._wake = asyncio.Event()
        self._arrived = asyncio.Event()
        self._runner: asyncio.Task | None = None
        self._active_s, self._active_since = 0.0, None  # time with >= 1 group in flight
        self._events_last: dict[str, float] = {}
        self._last_counters = {"generate_s": 0.0, "tokens": 0.0, "episode_retries": 0.0, "failed_episodes": 0.0,
                               "prefill_tokens": 0.0, "kv_reuse_tokens": 0.0}
        self._cycle_start = time.perf_counter()

    # ------------------------------------------------------------------ state
    @property
    def pending_tasks(self) -> int:
        """Draws from the earliest one not trained yet to the last one (0 when all are trained or dropped)."""
        return self.draws - min(self._untrained) if self._untrained else 0

    @property
    def groups_in_flight(self) -> int:
        """Groups started and not yet taken by a step (playing, completed, or waiting to be played again)."""
        return len(self._inflight) + len(self._done) + len(self._replay)

    def active_seconds(self) -> float:
        """Seconds so far during which at least one group was in flight (``time/overlap_s`` is its growth during an
        update)."""
        return self._active_s + (time.perf_counter() - self._active_since if self._active_since is not None else 0.0)

    def _target(self) -> int:
        """Groups the throttle allows in the backlog now: the current step's rest and every later step up to
        ``min(version + 1 + k, total_steps)``."""
        last = min(self.version + 1 + self.k, self.total_steps, self._horizon(self.step))
        return max(0, self.per_step * (last - self.step + 1) - self.consumed)

    def _horizon(self, step: int) -> int:
        return self.total_steps if self.horizon is None else int(self.horizon(step))

    # ------------------------------------------------------------------ the producer task
    def start(self, sample_tasks: Callable[[int], list[Task]]) -> None:
        """Start the producer task (once), drawing tasks with ``sample_tasks(n)``."""
        self.sample_tasks = sample_tasks
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            while True:
                while (not self._paused and self._error is None
                       and len(self._inflight) + len(self._done) < self._target()):
                    self._start_one()
                self._wake.clear()
                await self._wake.wait()
        except Exception as exc:  # noqa: BLE001 (drawing a task or its temperatures failed: raised in collect)
            self._error = self._error or exc
            self._arrived.set()

    def _start_one(self) -> None:
        if self._replay:
            prev = self._replay.popleft()
            replays = prev.replays + 1
            task = dataclasses.replace(prev.task, group_id=prev.task.group_id + REPLAY_ID_STRIDE)
            origin = prev.origin
        else:
            assert self.sample_tasks is not None
            task, = self.sample_tasks(1)
            origin, replays = self.draws, 0
            self.draws += 1
            self._untrained[origin] = 1
        spec = GroupSpec(task, list(self.temperatures(self.step)))
        start_step, horizon = self.step, self._horizon(self.step)
        if not self._inflight:
            self._active_since = time.perf_counter()
        job = asyncio.ensure_future(self.play_group(spec))
        self._inflight.add(job)
        job.add_done_callback(lambda fut: self._finished(fut, task, origin, replays, start_step, horizon))

    def _finished(self, fut: asyncio.Future, task: Task, origin: int, replays: int, start_step: int,
                  horizon: int) -> None:
        self._inflight.discard(fut)
        if not self._inflight and self._active_since is not None:
            self._active_s += time.perf_counter() - self._active_since
            self._active_since = None
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:  # engine errors and config mistakes are bugs: raised in the next collect
            self._error = self._error or exc
        else:
            self._done.append(PlayedGroup(task, origin, replays, start_step, list(fut.result()), horizon))
        self._arrived.set()
        self._wake.set()

    def _settle(self, origin: int) -> None:
        """The draw ``origin`` is trained or dropped for good."""
        self._untrained.pop(origin, None)

    # ------------------------------------------------------------------ the loop's side
    async def collect(self, step: int, sample_tasks: Callable[[int], list[Task]]) -> RolloutResult:
        """The groups step ``step`` trains, admitted in order of completion (:class:`StepAdmission`); the metrics of
        a synchronous collect plus ``async/*``. ``time/rollout_s`` is the time this call waited for groups;
        generation counters and ``throughput/tokens_per_s`` cover the step's cycle (from the previous collect's
        end)."""
        self.start(sample_tasks)
        self.step, self.consumed = step, 0
        self._wake.set()
        adm = StepAdmission(step, self.per_step, self.k, self.max_replays, self.filter_groups, self.max_extra_rounds)
        t0 = time.perf_counter()
        while not adm.done:
            if self._error is not None:
                raise self._error
            if not self._done:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            group = self._done.popleft()
            verdict = adm.offer(group)
            if verdict == "stale_replay":
                self._replay.append(group)
            elif verdict == "expired":  # played again as a fresh group, its replays not counted
                self._replay.append(dataclasses.replace(group, replays=group.replays - 1))
            else:
                self._settle(group.origin)
            self.consumed = adm.taken  # a filtered or (with the filter) failed group is refilled
            self._wake.set()
        self.consumed = self.per_step  # the step's quota is closed; the producer fills the next steps
        self._wake.set()
        wall = time.perf_counter() - t0
        now = time.perf_counter()
        cycle = max(now - self._cycle_start, 1e-9)
        self._cycle_start = now
        counters = dict(self.counters())
        delta = {key: counters.get(key, 0.0) - self._last_counters.get(key, 0.0) for key in self._last_counters}
        self._last_counters = {key: counters.get(key, 0.0) for key in self._last_counters}
        episodes = [ep for g in adm.admitted for ep in g.episodes]
        metrics = rollout_metrics(episodes)
        metrics.update({
            "rollout/dropped_groups": float(len(adm.failures)),
            "rollout/episode_retries": delta["episode_retries"],
            "rollout/failed_episodes": delta["failed_episodes"],
            "rollout/filtered_groups": float(adm.filtered),
            "rollout/extra_rounds": float(-(-max(0, adm.consumed - self.per_step) // max(self.per_step, 1))),
            "time/rollout_s": wall,
            "time/env_wait_frac": max(0.0, 1.0 - delta["generate_s"] / cycle),
            "time/generate_s": delta["generate_s"],
            "throughput/tokens_per_s": delta["tokens"] / cycle,
            "throughput/prefill_tokens": delta["prefill_tokens"],  # the cycle's, as the generation counters above
            "throughput/decode_tokens": delta["tokens"],
            "throughput/kv_reuse_tokens": delta["kv_reuse_tokens"],
            "async/groups_in_flight": float(self.groups_in_flight),
            "async/engine_version": float(self.version),
        })
        metrics.update(adm.metrics())
        for key in EVENT_COUNTS:  # the cycle's fork and gateway counters (a fork is part of its group: admitted
            if key in counters:  # or discarded with it; a gateway call counts when it is served)
                metrics[key] = counters[key] - self._events_last.get(key, 0.0)
                self._events_last[key] = counters[key]
        return RolloutResult(episodes=episodes, metrics=metrics, dropped_groups=len(adm.failures),
                             filtered_groups=adm.filtered, failures=list(adm.failures),
                             versions=[g.min_version for g in adm.admitted], outcomes=list(adm.outcomes))

    async def sync(self, version: int) -> None:
        """New weights (after ``version`` steps) into the engine(s): with ``partial=false`` after the episodes in
        flight have finished (no group starts meanwhile), else at once (between two engine calls)."""
        if not self.partial:
            self._paused = True
            try:
                while self._inflight and self._error is None:
                    await asyncio.wait(set(self._inflight))
                await self.load_weights(version)
            finally:
                self._paused = False
        else:
            await self.load_weights(version)
        self.version = int(version)
        self._wake.set()

    async def aclose(self) -> None:
        """Cancel the producer and every group in flight (their tasks are pending: a resume plays them again)."""
        if self._runner is not None:
            self._runner.cancel()
        jobs = list(self._inflight)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*([self._runner] if self._runner is not None else []), *jobs, return_exceptions=True)
        self._runner = None

