"""The group player: groups of episodes of one kind (an :class:`~agent_rl.rollout.episode.EpisodeRunner`) played
concurrently, generation batched across episodes; the one episode path of training, evaluation and behaviour
cloning.

Every episode is an asyncio task that alternates env calls and generation requests. Generation requests go to one
:class:`~agent_rl.rollout.generation.GenerationBatcher` per run (a :meth:`GroupPlayer.run_groups` call or a stream),
which takes every prompt waiting, calls ``engine.generate`` in a worker thread (``asyncio.to_thread``) so env calls
keep running, and hands each episode its own :class:`~agent_rl.types.Generation` back.

Determinism: the turn ``k`` of the episode in slot ``s`` of group ``g`` samples with
``row_seed(rollout_seed, g, s, k)`` (``agent_rl.engines.row_seed``; ``rollout_seed`` is drawn from the generator's
seed and :meth:`GroupPlayer.run_groups`'s ``seed_key``, the step and round in training). With the same seed, the
same groups give the same episodes whatever the env latencies, batch sizes, worker count or arrival order (group ids
must be distinct within one ``run_groups`` call, as ``TaskSampler``'s are). An episode re-run after an env failure
samples as its first attempt did.

Failures: an env call that raises or times out fails the episode attempt
(:class:`~agent_rl.rollout.sessions.EnvCallFailed`); the episode is re-run from the same task up to
``rollout.episode_retries`` times; a group with an episode that still fails is dropped whole and counted
(``rollout/dropped_groups``). Engine errors propagate (they are bugs).

Forks (``rollout.fork``): a group's bases, siblings and snapshots are the :class:`~agent_rl.rollout.fork.ForkPlan`'s;
the player asks it to play each group.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agent_rl.aio import gather_all
from agent_rl.rollout.config import ForkConfig, RolloutConfig
from agent_rl.rollout.episode import EpisodeRunner, Sampling
from agent_rl.rollout.fork import EpisodeStart, ForkPlan, PlayOne
from agent_rl.rollout.generation import GenerationBatcher
from agent_rl.rollout.results import GroupSpec, RolloutResult, collect_groups, group_temperatures, rollout_metrics
from agent_rl.rollout.sessions import EnvCallFailed
from agent_rl.types import Episode, Generation, Task


@dataclass
class Stream:
    """An open stream (:meth:`GroupPlayer.open_stream`): its batcher, the task serving it, and the bound on
    concurrent episodes (None: none)."""

    batcher: GenerationBatcher
    server: asyncio.Task
    sem: asyncio.Semaphore | None


class GroupPlayer:
    """Plays groups of ``runner``'s episodes (module docstring).

    Args:
        runner: the :class:`EpisodeRunner` of one episode (its ``env`` and ``generator`` are the player's too).
        cfg: :class:`RolloutConfig` (concurrency, retries, timeouts).
        fork: the forks of its groups (default ``cfg.fork``); refused for a runner that declares ``can_fork``
            False.
        deterministic, fork_js_temperatures: as :class:`~agent_rl.rollout.fork.ForkPlan`.
        on_episode: called with every finished (or failed) episode (the evaluation's per-task records).

    Raises:
        ValueError: forks on for a runner that cannot fork; the fork plan's refusals.
    """

    def __init__(self, runner: EpisodeRunner, cfg: RolloutConfig, *, fork: ForkConfig | None = None,
                 deterministic: bool | None = None, fork_js_temperatures: tuple[float, float] | None = None,
                 on_episode: Callable[[Episode], None] | None = None) -> None:
        fork = cfg.fork if fork is None else fork
        if fork.enabled and not runner.can_fork:
            raise ValueError(f"{runner.kind} does not fork groups (rollout.fork.points=0): "
                             f"{type(runner).__name__} declares can_fork=False")
        self.runner, self.cfg, self.on_episode = runner, cfg, on_episode
        self.env, self.generator, self.engine = runner.env, runner.generator, runner.generator.engine
        self.forks = ForkPlan(fork, runner.env, self.engine, deterministic=deterministic,
                              js_temperatures=fork_js_temperatures)
        self.stream: Stream | None = None
        self._runs = 0  # run_groups calls (the default seed key)
        self._retries = 0  # episode re-runs after an env failure, in the current run_groups call or stream
        self._failed_episodes = 0  # episodes of the open stream that failed every attempt
        self.reset_counts()

    # ------------------------------------------------------------------ what the backends set and read
    @property
    def policy_version(self) -> int:
        """The version of the engine's weights each turn records (:attr:`Generator.policy_version`)."""
        return self.generator.policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.generator.policy_version = version

    @property
    def on_turn(self) -> Callable[[Generation], None] | None:
        """Called with every turn's generation (:attr:`Generator.on_turn`)."""
        return self.generator.on_turn

    @on_turn.setter
    def on_turn(self, hook: Callable[[Generation], None] | None) -> None:
        self.generator.on_turn = hook

    @property
    def fork_refused(self) -> dict[str, str]:
        """env id -> why forking is refused for it (:attr:`ForkPlan.refused`)."""
        return self.forks.refused

    @property
    def last_batcher(self) -> GenerationBatcher | None:
        """The batcher of the last run (generation statistics: benchmarks)."""
        return self.generator.last_batcher

    def event_counts(self) -> dict[str, float]:
        """Counters of ``results.EVENT_COUNTS`` kept since :meth:`reset_counts`: the fork plan's with forks on and
        the runner's own (the gateway's). They reach a round's metrics and :meth:`stream_counters`."""
        return {**self.forks.event_counts(), **self.runner.event_counts()}

    def reset_counts(self) -> None:
        """Zero the counters of :meth:`event_counts`."""
        self.forks.reset_counts()
        self.runner.reset_counts()

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, tasks: Sequence[Task], episodes_per_task: int) -> None:
        """Start the env resets of the next step's episodes now (the runner's :meth:`EpisodeRunner.prefetch`); the
        next :meth:`collect` plays these tasks first (its first round) and uses the open sessions."""
        self.runner.prefetch(tasks, episodes_per_task)

    @property
    def num_prefetched_tasks(self) -> int:
        """Tasks drawn by :meth:`prefetch` and not yet played (a checkpoint's data position excludes them)."""
        return len(self.env.prefetched_tasks)

    async def aclose(self) -> None:
        """Cancel prefetched resets, close their sessions, and close the runner."""
        await self.env.aclose()
        await self.runner.aclose()

    # ------------------------------------------------------------------ one episode, one group
    def _one(self, batcher: GenerationBatcher, sem: asyncio.Semaphore | None) -> PlayOne:
        """The run's one-episode function: bounded by ``sem``, counted live by ``batcher``, with re-runs."""

        async def one(task: Task, temperature: float, is_high: bool, slot: int,
                      start: EpisodeStart | None = None) -> Episode:
            async with sem if sem is not None else contextlib.nullcontext():
                batcher.episode_started()
                try:
                    return await self._episode(task, Sampling(temperature, is_high), slot, start)
                finally:
                    batcher.episode_finished()

        return one

    async def _episode(self, task: Task, sampling: Sampling, slot: int, start: EpisodeStart | None) -> Episode:
        """An episode with re-runs from the same task; a final failure is returned as ``Episode.failure`` (a forked
        sibling's :class:`~agent_rl.rollout.fork.ReplayMismatch` is raised, never re-run)."""
        reason = ""
        ep: Episode | None = None
        for attempt in range(self.cfg.episode_retries + 1):
            if attempt:
                self._retries += 1
                await asyncio.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            try:
                await self.forks.before_attempt(start)
                ep = await self.runner.run(task, sampling, slot, start)
                break
            except EnvCallFailed as exc:
                reason = str(exc)
        if ep is None:
            ep = Episode(task=task, temperature=sampling.temperature, is_high=sampling.is_high,
                         failure=f"env: {reason}")
        if self.on_episode is not None:
            self.on_episode(ep)
        return ep

    async def _group(self, spec: GroupSpec, batcher: GenerationBatcher, one: PlayOne) -> list[Episode]:
        """One group's episodes, as the fork plan plays them (the run's rollout seed picks uniform fork turns)."""
        seed = batcher.seed if batcher.seed is not None else 0
        return await self.forks.play(spec.task, spec.temperatures, one, seed)

    # ------------------------------------------------------------------ rounds
    async def run_groups(self, groups: Sequence[GroupSpec], *, seed_key: int | None = None) -> RolloutResult:
        """Play every episode of ``groups`` concurrently; drop groups with a failed episode.

        The rollout seed is ``default_rng([seed, seed_key]).integers(2**31)`` (``seed_key``: :meth:`collect` passes
        the step and round, so steps never reuse random streams and a resumed run samples as the uninterrupted one
        would have; default: a per-player counter); turn k of slot s of group g samples with
        ``row_seed(rollout seed, g, s, k)`` (module docstring: independent of batching and env timing).

        Returns:
            RolloutResult whose ``episodes`` hold only complete groups (order: group, then episode) and whose
            metrics are computed over them (plus ``rollout/dropped_groups``, ``rollout/episode_retries``: episode
            re-runs after an env failure, ``rollout/failed_episodes``: episodes that failed every attempt).
        """
        t0 = time.perf_counter()
        self.env.env_s = 0.0
        self._retries = 0
        batcher = self.generator.open(self._runs if seed_key is None else seed_key)
        self._runs += 1
        server = asyncio.create_task(batcher.run())
        sem = asyncio.Semaphore(self.cfg.max_concurrent_episodes) if self.cfg.max_concurrent_episodes > 0 else None
        one = self._one(batcher, sem)
        self.reset_counts()
        try:  # structured: cancelled or failed, every episode is cancelled and has finished before this returns
            results = await gather_all(*(self._group(g, batcher, one) for g in groups))
        except BaseException:
            server.cancel()  # no episode is left to wait for a generation
            raise
        finally:
            batcher.close()
            with contextlib.suppress(asyncio.CancelledError):
                await server
            self.generator.close()
            await self.env.release({g.task.group_id for g in groups})
        return self._result(results, batcher, time.perf_counter() - t0)

    def _result(self, results: Sequence[list[Episode]], batcher: GenerationBatcher, wall: float) -> RolloutResult:
        """A run's :class:`RolloutResult`: its complete groups and their metrics."""
        kept: list[Episode] = []
        dropped = 0
        failures: list[str] = []
        for eps in results:
            failed = [ep.failure for ep in eps if ep.failure is not None]
            if failed:
                dropped += 1
                failures.append(failed[0])
            else:
                kept.extend(eps)
        metrics = rollout_metrics(kept)
        metrics.update({
            "rollout/dropped_groups": float(dropped),
            "rollout/episode_retries": float(self._retries),
            "rollout/failed_episodes": float(sum(ep.failure is not None for eps in results for ep in eps)),
            "time/rollout_s": wall,
            "time/env_wait_frac": max(0.0, 1.0 - batcher.busy_s / wall) if wall > 0 else 0.0,
            "time/generate_s": batcher.busy_s,
            "time/env_calls_s": self.env.env_s,  # summed over concurrent episodes
            "throughput/tokens_per_s": batcher.generated_tokens / wall if wall > 0 else 0.0,
            "throughput/prefill_tokens": float(batcher.prefill_tokens),
            "throughput/decode_tokens": float(batcher.generated_tokens),
            "throughput/kv_reuse_tokens": float(batcher.kv_reuse_tokens),
        })
        metrics.update(self.event_counts())
        return RolloutResult(episodes=kept, metrics=metrics, dropped_groups=dropped, failures=failures)

    async def collect(self, sample_tasks: Callable[[int], list[Task]], num_groups: int, algo: Any, step: int, *,
                      filter_groups: bool = False, max_extra_rounds: int = 0,
                      t_high: float | None = None) -> RolloutResult:
        """Rollout of one training step: ``num_groups`` tasks, G episodes each (:func:`group_temperatures`, T1 =
        ``t_high`` when given: the step's pick under ``algo.t_high=auto``), in rounds of :meth:`run_groups`
        (:func:`collect_groups`: DAPO's dynamic sampling and its extra rounds). Tasks given to :meth:`prefetch` are
        played first."""
        temps = group_temperatures(algo, step, t_high)

        def take(n: int) -> list[Task]:
            tasks = self.env.take_tasks(n)
            return tasks + sample_tasks(n - len(tasks))

        async def play(tasks: list[Task], seed_key: int) -> RolloutResult:
            return await self.run_groups([GroupSpec(t, temps) for t in tasks], seed_key=seed_key)

        return await collect_groups(play, take, num_groups, len(temps), step, filter_groups=filter_groups,
                                    max_extra_rounds=max_extra_rounds)

    # ------------------------------------------------------------------ a stream of groups (asynchronous rollouts)
    async def open_stream(self, seed_key: int) -> None:
        """Start one long-lived batcher for :meth:`play_group` calls that come and go (the asynchronous producer,
        :mod:`agent_rl.rollout.producer`). Its rollout seed is drawn as in :meth:`run_groups` from ``seed_key``; rows
        keep their (group id, slot, turn) keys, so group ids must stay distinct for the stream's life. Counters
        (:meth:`stream_counters`) add up until :meth:`close_stream`."""
        if self.generator.batcher is not None:
            raise RuntimeError("a stream or run_groups call is already open on this orchestrator")
        self.env.env_s, self._retries, self._failed_episodes = 0.0, 0, 0
        self.reset_counts()
        batcher = self.generator.open(int(seed_key))
        n = self.cfg.max_concurrent_episodes
        self.stream = Stream(batcher, asyncio.create_task(batcher.run()), asyncio.Semaphore(n) if n > 0 else None)

    async def play_group(self, spec: GroupSpec) -> list[Episode]:
        """Play the G episodes of ``spec`` concurrently on the open stream (:meth:`open_stream`); returns them in slot
        order, failed ones with ``Episode.failure`` set (the caller drops such a group, as :meth:`run_groups`
        does)."""
        stream = self.stream
        if stream is None:
            raise RuntimeError("play_group needs open_stream() first")
        eps = await self._group(spec, stream.batcher, self._one(stream.batcher, stream.sem))
        self._failed_episodes += sum(ep.failure is not None for ep in eps)
        return eps

    def stream_counters(self) -> dict[str, float]:
        """Totals of the open stream: ``generate_s`` (engine busy), ``tokens`` generated, ``prefill_tokens`` and
        ``kv_reuse_tokens`` (prompt tokens computed / taken from the engine's cache), ``episode_retries``,
        ``failed_episodes``, ``env_calls_s`` (summed over concurrent episodes), and :meth:`event_counts`."""
        b = self.stream.batcher if self.stream is not None else None
        return {"generate_s": b.busy_s if b is not None else 0.0,
                "tokens": float(b.generated_tokens) if b is not None else 0.0,
                "prefill_tokens": float(b.prefill_tokens) if b is not None else 0.0,
                "kv_reuse_tokens": float(b.kv_reuse_tokens) if b is not None else 0.0,
                "episode_retries": float(self._retries), "failed_episodes": float(self._failed_episodes),
                "env_calls_s": self.env.env_s, **self.event_counts()}

    async def close_stream(self) -> None:
        """Stop the stream's batcher (episodes still waiting for generation get no answer: cancel them first)."""
        stream = self.stream
        if stream is not None:
            stream.batcher.close()
            try:
                await stream.server
            finally:
                self.stream = None
                self.generator.close()
