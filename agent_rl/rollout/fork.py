"""Forked groups, the rollout side (``rollout.fork``): which turns of a base episode are forked, the siblings' slots,
the replay check, and :class:`ForkPlan`, which plays a group's bases, then its siblings, for the group player. An
episode runner sees a fork only as its ``start`` (:class:`EpisodeStart`); the credit is
``agent_rl.algos.fork_advantages`` (docs/algorithms_impl.md, "Forked groups").

A sibling of base b at fork turn t is reset on a fresh session with b's task (reset seed and options) and replays
b's actions of turns 0..t-1 (``rollout.fork.restore=replay``), or opens a session in the snapshot of b's env state
taken after b's turn t-1 (``restore=state``: the env's ``clone_state``/``set_state``, kept where the env lives;
:class:`ForkSource` holds a base's snapshot ids, :class:`SiblingStart` what a sibling starts from). Replay is exact only if the env is deterministic given the task and the action prefix,
so every replayed turn is checked: the prompt the sibling would show (observation, admissible actions, history, in
trajectory mode the whole conversation) must equal b's, and each replayed step's observation, reward and
terminated/truncated flags must equal b's. A difference raises :class:`ReplayMismatch`; the fork plan then
discards the sibling, refuses forking for that env id for the rest of the run (the reason kept in
:attr:`ForkPlan.refused`) and counts it in ``fork/replay_mismatch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from agent_rl.aio import gather_all
from agent_rl.engines.base import caps_of
from agent_rl.envclient.base import EnvClientError, pool_caps
from agent_rl.rollout.config import ForkConfig
from agent_rl.rollout.sessions import EnvCallFailed, EnvSessions
from agent_rl.types import Episode, Task, Turn

log = logging.getLogger(__name__)

#: per-call counters of forking (summed over rounds, workers and streams like the token counts).
FORK_COUNTS = ("fork/groups", "fork/replay_mismatch", "fork/replay_s", "fork/extra_episodes", "fork/replayed_turns",
               "fork/failed_siblings", "fork/select_s", "fork/generated_turns", "fork/filled_episodes",
               "fork/snapshots", "fork/snapshot_s", "fork/snapshots_refused")


@dataclass
class ForkSource:
    """What a base episode keeps for its siblings while they play (the fork plan frees it after the group).

    Attributes:
        keep_cache: keep the base's engine cache (``engine.fork_episode``); its id lands in ``cache``.
        snapshot: take a snapshot of the env state after every turn that is not the last (``restore=state``,
            :meth:`take_snapshot`).
        snapshots: fork turn t -> the snapshot id of the state before turn t (taken after turn t-1).
        reset: the base's reset ``(observation, info)``: a restored sibling rebuilds its prompts from it.
        snapshotter: ``(env id, session id, turn, source)`` -> the snapshot taken into ``snapshots``
            (:meth:`ForkPlan.snapshot`).
    """

    keep_cache: bool = False
    snapshot: bool = False
    cache: list[str] = field(default_factory=list)
    snapshots: dict[int, str] = field(default_factory=dict)
    reset: tuple[Any, dict[str, Any]] | None = None
    snapshotter: Callable[[str, str, int, "ForkSource"], Awaitable[None]] | None = field(default=None, repr=False)

    async def take_snapshot(self, env_id: str, session_id: str, turn: int) -> None:
        """Snapshot the base's env state before its turn ``turn`` (after turn ``turn - 1``)."""
        if self.snapshotter is not None:
            await self.snapshotter(env_id, session_id, turn, self)


@dataclass
class SiblingStart:
    """Where a forked sibling starts: base ``base`` (group slot ``base_slot``) at fork turn ``turn``; ``cache``: the
    base's kept engine cache id (None: none); ``snapshot``: the snapshot id of the base's state before ``turn``
    (None: replay the base's actions); ``reset``: the base's reset ``(observation, info)`` (with ``snapshot``)."""

    base: Episode
    base_slot: int
    turn: int
    cache: str | None = None
    snapshot: str | None = None
    reset: tuple[Any, dict[str, Any]] | None = None
    replay_s: float = 0.0
    """Seconds the sibling's attempts spent replaying or restoring the prefix (``fork/replay_s``)."""
    replayed_turns: int = 0
    """Turns the sibling's attempts replayed or restored (``fork/replayed_turns``)."""


@dataclass
class EpisodeStart:
    """Where an episode starts beyond its task (an episode runner's ``start``; None: a fresh session): a forked
    sibling's ``sibling`` (its prefix replayed or restored), or a base episode's ``source`` (what it keeps for its
    siblings)."""

    sibling: SiblingStart | None = None
    source: ForkSource | None = None


class ReplayMismatch(RuntimeError):
    """A sibling's replay of its base's actions did not reproduce the base's turn (the env is not deterministic given
    the task and the action prefix)."""


def base_count(cfg: ForkConfig, group_size: int, *, first_high: int | None = None) -> int:
    """How many of a group's ``group_size`` slots play base episodes: all of them (``budget=extra``), or
    ``max(1, G // (1 + points * siblings))`` (``budget=episodes`` and ``budget=turns``: the forks fill the rest).
    ``select=divergence`` keeps at least 2 bases (``min(2, G)``): a base forks where it first acts differently from
    another base (the group's T0 episode), so a lone base would never fork (a TGRL group of G = 4 with points=1,
    siblings=3 played 1 base and no sibling: a run of bases only, not a forked one). With 2 bases of a TGRL group
    (slots 0 and 1: T0 and a T1 episode) the T1 base forks at its divergence turn.

    ``first_high``: the group's first T1 slot (TGRL: ``n_low``; None for a group without one). The bases always
    reach it, whatever ``select``: a sibling samples at its base's temperature, so bases of T0 slots only would make
    the whole group T0, and TGRL trains only T1 rows (algorithms.md section 3): a TGRL group of G = 4 with
    points=1, siblings=8 under ``budget=turns`` played its T0 episode and 8 T0 siblings and trained nothing (grad
    norm 0 at every step after warm-up)."""
    if not cfg.enabled or cfg.budget == "extra":
        return group_size
    floor = min(2, group_size) if cfg.select == "divergence" else 1
    if first_high is not None:
        floor = max(floor, min(group_size, first_high + 1))
    return max(floor, group_size // (1 + cfg.points * cfg.siblings))


def budget_order(jobs: Sequence[tuple[int, int, int]], bases: Sequence[Episode]) -> list[tuple[int, int, int]]:
    """The sibling ``jobs`` (``(base, fork turn, slot)``) in the order a budget (``budget=episodes|turns``) takes
    them: the siblings of T1 bases first, then the others, each in their order. TGRL trains only T1 rows (algorithms.md
    section 3), so a T0 base's siblings are the ones a budget should drop (their rows would carry no advantage); a
    group without T1 episodes keeps its order. (Before this, a TGRL group under ``select=divergence`` spent its
    turn budget on the T0 base's siblings first, listed before the T1 base's.)"""
    return sorted(jobs, key=lambda job: not bases[job[0]].is_high)


def turn_budget_jobs(jobs: Sequence[tuple[int, int, int]], bases: Sequence[Episode], group_size: int
                     ) -> list[tuple[int, int, int]]:
    """``budget=turns``: the siblings ``jobs`` (``(base, fork turn, slot)``, in order) that fit the group's budget of
    generated turns, G plain episodes' worth estimated from the bases: ``budget = round(G * mean base turns)``. The
    bases' own turns are spent first; a sibling forked at turn t of a base of n turns is expected to generate the
    n - t turns after the fork (its replayed prefix is not generated), and is taken, in order, while the expected
    total stays within the budget (a job that does not fit is skipped, a shorter later one may still fit). The
    turns actually generated are counted in ``fork/generated_turns``."""
    if not bases:
        return []
    used = sum(len(ep.turns) for ep in bases)  # the bases' own turns, spent first
    budget = round(group_size * used / len(bases))
    out = []
    for b, t, slot in jobs:
        cost = max(1, len(bases[b].turns) - t)
        if used + cost <= budget:
            out.append((b, t, slot))
            used += cost
    return out


def generated_turns(episodes: Sequence[Episode]) -> int:
    """Turns sampled by the policy over ``episodes`` (a sibling's replayed turns before its fork excluded)."""
    return sum(len(ep.turns) - (ep.fork.turn if ep.fork is not None else 0) for ep in episodes)


def fork_turns(cfg: ForkConfig, bases: Sequence[Episode], *, seed: int, group_id: int,
               token_js: Sequence[Sequence[Sequence[float]] | None] | None = None) -> list[list[int]]:
    """The fork turns of each base episode (ascending, each in ``1..len(turns)-1``: one replayed turn at least and a
    turn of the base after it), by ``cfg.select`` (:class:`ForkConfig`). A failed base gets none. ``uniform`` draws
    with ``numpy.random.default_rng([seed, group_id, slot])``: the same rollout seed gives the same turns. ``js``
    ranks the turns by the mean of ``token_js[slot][turn]`` (each base's per-turn token JS,
    ``HFEngine.token_js``; ties to the earlier turn) and needs it for every base that has candidate turns.

    Raises:
        ValueError: ``select=js`` without ``token_js`` for a base."""
    out: list[list[int]] = []
    ref = next((ep for ep in bases if not ep.is_high), bases[0]) if bases else None
    for slot, ep in enumerate(bases):
        cands = list(range(1, len(ep.turns))) if ep.failure is None else []
        n = min(cfg.points, len(cands))
        if n == 0:
            out.append([])
            continue
        if cfg.select == "uniform":
            rng = np.random.default_rng([int(seed) & (2**63 - 1), int(group_id) & (2**63 - 1), slot])
            picked = [cands[i] for i in rng.choice(len(cands), size=n, replace=False)]
        elif cfg.select in ("entropy", "js"):
            if cfg.select == "entropy":
                score = [surprisal(ep.turns[k]) for k in cands]
            else:
                per_turn = token_js[slot] if token_js is not None and slot < len(token_js) else None
                if per_turn is None or len(per_turn) < len(ep.turns):
                    raise ValueError(f"rollout.fork.select=js: no token JS for base slot {slot}")
                score = [sum(per_turn[k]) / len(per_turn[k]) if per_turn[k] else 0.0 for k in cands]
            picked = [cands[i] for i in sorted(range(len(cands)), key=lambda i: (-score[i], cands[i]))[:n]]
        else:  # divergence: the first turn where this base acts differently from the reference (T0) episode
            other = ref if ep is not ref else next((o for o in bases if o is not ep and o.failure is None), None)
            first = None if other is None else first_divergence(ep, other)
            picked = [first] if first is not None and 1 <= first < len(ep.turns) else []
        out.append(sorted(picked))
    return out


def surprisal(turn: Turn) -> float:
    """Mean ``-logprob`` of a turn's sampled tokens (nats): a one-sample estimate of the mean token entropy of the
    sampling distribution at those positions (0 for an empty response)."""
    lps = list(turn.response_logprobs)
    return -sum(lps) / len(lps) if lps else 0.0


def first_divergence(a: Episode, b: Episode) -> int | None:
    """The first turn index where episodes ``a`` and ``b`` of one task took different actions (None: ``a``'s
    actions are a prefix of ``b``'s)."""
    for k, turn in enumerate(a.turns):
        if k >= len(b.turns) or turn.action != b.turns[k].action:
            return k
    return None


def sibling_slot(group_size: int, base_slot: int, point: int, sibling: int, cfg: ForkConfig) -> int:
    """The sampling-seed slot of sibling ``sibling`` of fork point ``point`` of the base in ``base_slot``: after the
    group's G slots, so no sibling samples with a base's row seeds (``row_seed(seed, group, slot, turn)``: with the
    base's slot it would resample the base's continuation exactly)."""
    return group_size + (base_slot * cfg.points + point) * cfg.siblings + sibling


def spare_slots(cfg: ForkConfig, bases: Sequence[Episode], jobs: Sequence[tuple[int, int, int]],
                group_size: int) -> int:
    """``budget=episodes|turns``: how many of the group's unplayed slots (those after its ``bases``) are played as
    plain episodes because the planned sibling ``jobs`` (after the budget) leave budget unspent. ``episodes``: the
    slots the jobs do not fill, ``G - bases - jobs``; ``turns``: what is left of ``round(G * mean base turns)`` after
    the bases' turns and the jobs' expected turns (:func:`turn_budget_jobs`), in whole mean-base episodes, at most
    ``G - bases``. 0 under ``budget=extra``, without bases, or when forking is off.

    Why: a budget is what the group may spend, not a cap that silently shrinks the batch. Without this, a group with
    no fork turn (``select=divergence`` when the bases already differ at turn 0, a base of one turn, an env whose
    forks are refused) played only its bases: TGRL with divergence forks, 1 point x 8 siblings under
    ``budget=turns``, generated 152 turns a step against TGRL's ~300 and trained on 2 episodes a group instead of 4."""
    if not cfg.enabled or cfg.budget == "extra" or not bases:
        return 0
    free = max(0, group_size - len(bases))
    if cfg.budget == "episodes":
        return max(0, free - len(jobs))
    base_turns = [len(ep.turns) for ep in bases]
    mean = sum(base_turns) / len(bases)
    if mean <= 0:
        return free
    used = sum(base_turns) + sum(len(bases[b].turns) - t for b, t, _ in jobs)
    return max(0, min(free, int((round(group_size * mean) - used) // mean)))


def check_replayed_prompt(k: int, prompt_ids: Sequence[int], base: Turn) -> None:
    """Raise :class:`ReplayMismatch` unless the replayed turn ``k``'s prompt ids equal the base's."""
    if list(prompt_ids) != list(base.prompt_ids):
        at = next((i for i, (x, y) in enumerate(zip(prompt_ids, base.prompt_ids)) if x != y),
                  min(len(prompt_ids), len(base.prompt_ids)))
        raise ReplayMismatch(f"turn {k}: the replayed prompt differs from the base's at token {at} "
                             f"({len(prompt_ids)} vs {len(base.prompt_ids)} tokens): observation or admissible actions")


def check_replayed_step(k: int, observation: str, reward: float, terminated: bool, truncated: bool,
                        base: Turn) -> None:
    """Raise :class:`ReplayMismatch` unless the replayed step ``k`` gave the base's observation, reward and flags."""
    if observation != base.observation:
        raise ReplayMismatch(f"turn {k}: the replayed step's observation differs from the base's "
                             f"({observation[:80]!r} vs {base.observation[:80]!r})")
    if float(reward) != float(base.reward) or bool(terminated) != base.terminated or bool(truncated) != base.truncated:
        raise ReplayMismatch(f"turn {k}: the replayed step's reward/terminated/truncated ({reward}, {terminated}, "
                             f"{truncated}) differ from the base's ({base.reward}, {base.terminated}, {base.truncated})")


PlayOne = Callable[[Task, float, bool, int, "EpisodeStart | None"], Awaitable[Episode]]
"""``(task, temperature, is_high, slot, start) -> episode``: the group player's one episode (concurrency, retries)."""


class ForkPlan:
    """A group's episodes under ``rollout.fork``: its bases, the fork turns and siblings of each, the env-state
    snapshots and kept engine caches they start from, and the fork counters (:data:`FORK_COUNTS`). With forks off,
    every slot of the group is a plain episode.

    Args:
        cfg: :class:`ForkConfig` (``rollout.fork``).
        env: the player's :class:`~agent_rl.rollout.sessions.EnvSessions` (snapshots go to its pool).
        engine: the engine (its declared ``fork_cache``, ``kv_reuse`` and ``token_js``).
        deterministic: the env family's declaration (``envs.families.EnvFamily.deterministic``): False refuses
            forking up front under ``restore=replay``; True or None: forks are made, every replay checked.
        js_temperatures: (T0, T1) of ``select=js``.

    Raises:
        ValueError: ``restore=state`` with a pool that declares no snapshots (``PoolCaps.snapshots``); ``select=js``
            without the engine's token JS or the temperatures.
    """

    def __init__(self, cfg: ForkConfig, env: EnvSessions, engine: Any, *, deterministic: bool | None = None,
                 js_temperatures: tuple[float, float] | None = None) -> None:
        self.cfg, self.env, self.engine = cfg, env, engine
        self.deterministic, self.js_temperatures = deterministic, js_temperatures
        if cfg.enabled and cfg.restore == "state" and not pool_caps(env.pool).snapshots:
            raise ValueError(f"rollout.fork.restore=state needs an env pool with snapshot/restore/drop_snapshot "
                             f"({type(env.pool).__name__} has none; LocalEnvPool and HTTPEnvPool have them)")
        if cfg.enabled and cfg.select == "js" and (js_temperatures is None or not caps_of(engine).token_js):
            raise ValueError("rollout.fork.select=js needs the engine's token JS (engine=hf) and the JS "
                             "temperatures (algo.t_low, T1)")
        self.refused: dict[str, str] = {}
        """env id -> why forking is refused for it (the first replay mismatch)."""
        self.counts = dict.fromkeys(FORK_COUNTS, 0.0)

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def reset_counts(self) -> None:
        """Zero the fork counters (the start of a run or a stream)."""
        self.counts = dict.fromkeys(FORK_COUNTS, 0.0)

    def event_counts(self) -> dict[str, float]:
        """The fork counters with ``rollout.fork`` on, else none."""
        return dict(self.counts) if self.cfg.enabled else {}

    def refuse(self, env_id: str, reason: str) -> None:
        """Refuse forking for ``env_id`` for the rest of the run (:attr:`refused`), logged once with the reason."""
        if env_id not in self.refused:
            self.refused[env_id] = reason
            log.warning("rollout.fork refused for %s for the rest of the run: %s", env_id, reason)

    async def before_attempt(self, start: EpisodeStart | None) -> None:
        """Before each attempt of an episode: a base's re-run takes its snapshots afresh."""
        if start is not None and start.source is not None:
            await self.free_source(start.source)

    def after_sibling(self, sibling: SiblingStart) -> None:
        """Count a sibling's replayed prefix (its attempts' time and turns)."""
        self.counts["fork/replay_s"] += sibling.replay_s
        self.counts["fork/replayed_turns"] += sibling.replayed_turns

    # ------------------------------------------------------------------ a group
    async def play(self, task: Task, temperatures: Sequence[tuple[float, bool]], one: PlayOne,
                   seed: int) -> list[Episode]:
        """One group's episodes: its base episodes (every slot, or the first :func:`base_count` under a budget)
        concurrently, then, with forks on, the forked siblings of each concurrently, after the bases in (base, fork
        point, sibling) order. ``one`` plays one episode; ``seed``: the run's rollout seed (``select=uniform``). A
        sibling whose replay mismatched is discarded and forking refused for the env id (``fork/replay_mismatch``);
        a sibling that failed is discarded (``fork/failed_siblings``): neither drops the group. Forks only start
        once every base finished without failure. Under ``budget=episodes|turns`` the budget the siblings leave
        unspent is played as plain episodes of the next slots (:func:`spare_slots`, ``fork/filled_episodes``),
        concurrently with the siblings; the order is bases, those, then siblings."""
        g_size = len(temperatures)
        n_base = base_count(self.cfg, g_size,
                            first_high=next((i for i, (_, high) in enumerate(temperatures) if high), None))
        env_id = task.env_id
        by_state = self.cfg.restore == "state"
        if self.cfg.enabled and self.deterministic is False and not by_state:
            self.refuse(env_id, "the env family declares that its episodes do not replay exactly "
                                "(envs.families.EnvFamily.deterministic); rollout.fork.restore=state forks an "
                                "env that has clone_state/set_state")
        forking = self.cfg.enabled and env_id not in self.refused
        # each base's kept engine cache (its siblings' prefix) and, with restore=state, its env-state snapshots
        sources = [ForkSource(keep_cache=forking and caps_of(self.engine).fork_cache, snapshot=forking and by_state,
                              snapshotter=self.snapshot) for _ in range(n_base)]
        try:
            bases = list(await gather_all(*(
                one(task, t, h, slot, EpisodeStart(source=sources[slot]) if forking else None)
                for slot, (t, h) in enumerate(temperatures[:n_base]))))
            if not self.cfg.enabled:
                return bases
            if any(ep.failure is not None for ep in bases):
                return bases  # the group is dropped whole: no forks, no fill
            jobs = await self._sibling_jobs(task, temperatures, bases, seed) if env_id not in self.refused else []
            if by_state:  # a sibling needs its fork turn's snapshot (none where snapshots were refused)
                jobs = [(b, t, slot) for b, t, slot in jobs if t in sources[b].snapshots]
                # the snapshots no sibling uses are dropped now, not when the group ends
                await gather_all(*(self.free_source(src, keep={t for b2, t, _ in jobs if b2 == b})
                                   for b, src in enumerate(sources)))
            n_fill = spare_slots(self.cfg, bases, jobs, g_size)
            fill_slots = enumerate(temperatures[n_base:n_base + n_fill], start=n_base)
            sibs, fill = await gather_all(self._siblings(task, bases, jobs, sources, one),
                                          gather_all(*(one(task, t, h, slot, None) for slot, (t, h) in fill_slots)))
            self.counts["fork/filled_episodes"] += len(fill)
            eps = bases + list(fill) + sibs
            self.counts["fork/generated_turns"] += generated_turns(eps)
            return eps
        finally:
            if caps_of(self.engine).kv_reuse:
                for eid in (e for src in sources for e in src.cache):
                    self.engine.end_episode(eid)
            await gather_all(*(self.free_source(src) for src in sources))

    async def snapshot(self, env_id: str, session_id: str, turn: int, source: ForkSource) -> None:
        """Snapshot a base's env state before its turn ``turn`` into ``source.snapshots`` (``restore=state``). An env
        without ``clone_state``/``set_state`` (the pool's 422 ``invalid_request``) refuses forking for ``env_id``
        and the base plays on; any other failure fails the attempt (:class:`EnvCallFailed`)."""
        if env_id in self.refused:
            source.snapshot = False
            return
        t0 = time.perf_counter()
        try:
            source.snapshots[turn] = await asyncio.wait_for(self.env.pool.snapshot(session_id), self.env.timeout_s)
        except Exception as exc:  # noqa: BLE001 (a client error, a timeout, a broken server)
            code = exc.code if isinstance(exc, EnvClientError) else None
            if code in ("at_capacity", "quota_exceeded"):  # max_snapshots (or the client's): no fork from this turn
                self.counts["fork/snapshots_refused"] += 1
                return
            if code != "invalid_request":  # the env failed: so did the attempt
                raise EnvCallFailed(f"snapshot: {type(exc).__name__}: {exc}") from exc
            self.refuse(env_id, f"rollout.fork.restore=state: {exc}")
            source.snapshot = False
            return
        finally:
            self.counts["fork/snapshot_s"] += time.perf_counter() - t0
        self.counts["fork/snapshots"] += 1

    async def free_source(self, source: ForkSource, keep: set[int] | frozenset[int] = frozenset()) -> None:
        """Drop a base's env-state snapshots but those of the fork turns in ``keep`` (best effort, bounded by
        ``rollout.env_timeout_s``: a server that cannot be reached drops them at its TTL)."""
        snapshots = [sid for t, sid in source.snapshots.items() if t not in keep]
        source.snapshots = {t: sid for t, sid in source.snapshots.items() if t in keep}
        for snapshot_id in snapshots:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.env.pool.drop_snapshot(snapshot_id), self.env.timeout_s)

    async def _fork_js(self, temperatures: Sequence[tuple[float, bool]],
                       bases: list[Episode]) -> list[list[list[float]]]:
        """Each base's per-turn token JS (``select=js``, ``HFEngine.token_js``) between T0 = ``js_temperatures[0]``
        and T1 = the group's high temperature (its first high slot's: the step's T1 under ``algo.t_high=auto``;
        ``js_temperatures[1]`` when the group has no high slot), one scoring forward per base in a worker thread;
        the time is counted in ``fork/select_s``."""
        t_low, t_high = self.js_temperatures  # type: ignore[misc]  (checked in __init__)
        t_high = next((t for t, high in temperatures if high), t_high)
        t0 = time.perf_counter()
        out = []
        for ep in bases:
            turns = [(t.prompt_ids, t.response_ids) for t in ep.turns]
            out.append(await asyncio.to_thread(self.engine.token_js, turns, t_low, t_high) if turns else [])
        self.counts["fork/select_s"] += time.perf_counter() - t0
        return out

    async def _sibling_jobs(self, task: Task, temperatures: Sequence[tuple[float, bool]], bases: list[Episode],
                            seed: int) -> list[tuple[int, int, int]]:
        """The siblings to play for a group's finished ``bases``: ``(base, fork turn, slot)``, after the budget."""
        cfg, g_size, n_base = self.cfg, len(temperatures), len(bases)
        token_js = await self._fork_js(temperatures, bases) if cfg.select == "js" else None
        points = fork_turns(cfg, bases, seed=seed, group_id=task.group_id, token_js=token_js)
        jobs = [(b, t, sibling_slot(g_size, b, p, j, cfg)) for b, turns in enumerate(points)
                for p, t in enumerate(turns) for j in range(cfg.siblings)]
        if cfg.budget != "extra":
            jobs = budget_order(jobs, bases)  # a T1 base's siblings first: TGRL trains only T1 rows
        if cfg.budget == "episodes":
            jobs = jobs[:max(0, g_size - n_base)]
        elif cfg.budget == "turns":
            jobs = turn_budget_jobs(jobs, bases, g_size)
        return jobs

    async def _siblings(self, task: Task, bases: list[Episode], jobs: list[tuple[int, int, int]],
                        sources: list[ForkSource], one: PlayOne) -> list[Episode]:
        """Play the forked sibling ``jobs`` (:meth:`_sibling_jobs`) of a group's finished ``bases``; ``sources``:
        what each base kept (:class:`ForkSource`: engine cache, snapshots)."""

        async def sibling(b: int, t: int, slot: int) -> Episode | None:
            base, src = bases[b], sources[b]
            start = SiblingStart(base, b, t, cache=src.cache[0] if src.cache else None,
                                 snapshot=src.snapshots.get(t),  # none unless restore=state
                                 reset=src.reset)
            try:
                return await one(task, base.temperature, base.is_high, slot, EpisodeStart(sibling=start))
            except ReplayMismatch as exc:
                self.counts["fork/replay_mismatch"] += 1
                self.refuse(task.env_id, str(exc))
                return None
            finally:
                self.after_sibling(start)

        played = await gather_all(*(sibling(*job) for job in jobs))
        kept = [ep for ep in played if ep is not None and ep.failure is None]
        self.counts["fork/failed_siblings"] += sum(ep is not None and ep.failure is not None for ep in played)
        self.counts["fork/extra_episodes"] += len(kept)
        self.counts["fork/groups"] += float(bool(kept))
        return kept
