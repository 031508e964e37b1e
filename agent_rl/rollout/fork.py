"""Forked groups, the rollout side (``rollout.fork``, issue 40): which turns of a base episode are forked, the
siblings' slots, and the replay check. The orchestrator plays the siblings (:meth:`RolloutOrchestrator._play` with
``replay=``); the credit is ``agent_rl.algos.fork_advantages`` (docs/algorithms_impl.md, "Forked groups").

A sibling of base b at fork turn t is reset on a fresh session with b's task (reset seed and options) and replays
b's actions of turns 0..t-1 (``rollout.fork.restore=replay``), or opens a session in the snapshot of b's env state
taken after b's turn t-1 (``restore=state``: the env's ``clone_state``/``set_state``, kept where the env lives;
:class:`ForkSource` holds a base's snapshot ids, :class:`SiblingStart` what a sibling starts from). Replay is exact only if the env is deterministic given the task and the action prefix,
so every replayed turn is checked: the prompt the sibling would show (observation, admissible actions, history, in
trajectory mode the whole conversation) must equal b's, and each replayed step's observation, reward and
terminated/truncated flags must equal b's. A difference raises :class:`ReplayMismatch`; the orchestrator then
discards the sibling, refuses forking for that env id for the rest of the run (the reason kept in
``RolloutOrchestrator.fork_refused``) and counts it in ``fork/replay_mismatch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from agent_rl.rollout.config import ForkConfig
from agent_rl.types import Episode, Turn

#: per-call counters of forking (summed over rounds, workers and streams like the token counts).
FORK_COUNTS = ("fork/groups", "fork/replay_mismatch", "fork/replay_s", "fork/extra_episodes", "fork/replayed_turns",
               "fork/failed_siblings", "fork/select_s", "fork/generated_turns", "fork/filled_episodes",
               "fork/snapshots", "fork/snapshot_s", "fork/snapshots_refused")


@dataclass
class ForkSource:
    """What a base episode keeps for its siblings while they play (the orchestrator frees it after the group).

    Attributes:
        keep_cache: keep the base's engine cache (``engine.fork_episode``); its id lands in ``cache``.
        snapshot: take a snapshot of the env state after every turn that is not the last (``restore=state``).
        snapshots: fork turn t -> the snapshot id of the state before turn t (taken after turn t-1).
        reset: the base's reset ``(observation, info)``: a restored sibling rebuilds its prompts from it.
    """

    keep_cache: bool = False
    snapshot: bool = False
    cache: list[str] = field(default_factory=list)
    snapshots: dict[int, str] = field(default_factory=dict)
    reset: tuple[Any, dict[str, Any]] | None = None


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
