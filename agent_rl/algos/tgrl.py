"""TGRL: temperature-guided credit (algorithms.md section 3). Pure torch, no grad.

Dims: B rows, T response tokens (in the learner T == L: prompt positions and, in full-trajectory mode, observation
tokens carry mask 0; every per-row statistic below is over the row's masked tokens only), E episodes.

Pipeline (what the learner calls, in order):
    js = js_divergence_from_logits(old_logits_of_high_rows, t_low, t_high, chunk_size)  # step 3, (N,) -> (B, T)
    advantages = tgrl_advantages(rewards, group_index, is_high, js, response_mask,
                                 episode_index=episode_index, warmup=step < warmup_steps)  # 3.1, 3.4, 3.5, 3.7
    metrics = tgrl_metrics(rewards, group_index, is_high, success, episode_index)        # 3.2
Low-temperature rows get advantage 0 but keep their loss mask, so they still count in the token-mean denominator
(``algo.low_rows_in_denominator=true``); to drop them from it, zero their rows of the loss mask in the caller.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ._groups import (as_float, check_1d, check_2d, episode_reduce, flat_range, group_ids, segment_mean,
                      segment_quantile, trajectory_ids)
from .advantages import compute_advantages

__all__ = ["tgrl_token_weights", "tgrl_advantages", "tgrl_delta_r", "tgrl_metrics", "masked_row_quantile",
           "AdaptiveHighTemperature"]

_EPS = 1e-8  # algorithms.md section 3, step 4


def masked_row_quantile(x: Tensor, mask: Tensor, q: float) -> Tensor:
    """Per-row quantile of ``x`` over its masked entries, linear interpolation (numpy's default method,
    ``torch.quantile(..., interpolation="linear")``): position ``q (n - 1)`` in the sorted masked values.

    Args:
        x: (B, T) float. mask: (B, T) 0/1. q: in [0, 1].
    Returns:
        (B,) quantiles; 0 for rows without masked entries.
    """
    rows, cols = (mask > 0).nonzero(as_tuple=True)  # (N,) masked entries, each row one segment
    return segment_quantile(x[rows, cols], rows, x.shape[0], q)


@torch.no_grad()
def tgrl_token_weights(
    js: Tensor,
    response_mask: Tensor,
    *,
    episode_index: Tensor | None = None,
    quantile_clip: bool = True,
    q_low: float = 0.05,
    q_high: float = 0.95,
) -> Tensor:
    """TGRL token weights per trajectory (algorithms.md, TGRL step 4), over the trajectory's masked action tokens.

    A trajectory is one episode: with ``episode_index`` the rows sharing a value are one trajectory (per-turn mode:
    the episode's turn rows together), without it each row is its own (full-trajectory mode, single-turn envs). Over
    the N_i masked tokens t of trajectory i (eps = 1e-8):
    ``Jbar_i = mean_t J_t``; ``omega_t = log(1 + (J_t + eps) / (Jbar_i + eps))``; if ``quantile_clip``
    (``algo.js_quantile_clip``) omega is clipped to the trajectory's own ``q_low``..``q_high`` quantiles (5th..95th,
    linear interpolation); ``w_t = omega_t / mean_t omega_t`` (mean 1 over the trajectory). Source: TGRL (arXiv
    2609.33589), "normalised so that each trajectory's mean is 1".

    Worked example (per-turn mode, one episode of two turn rows, no clip effect): J = [0.1, 0.1] and [0.01, 0.01]:
    Jbar = 0.055, omega = [1.036, 1.036], [0.167, 0.167], mean 0.602 -> w = [1.722, 1.722], [0.278, 0.278]. A
    per-row normalisation would give w = 1 everywhere and lose the credit between turns.

    Args:
        js: (B, T) token JS divergences (values where masked out never matter).
        response_mask: (B, T) 0/1.
        episode_index: (B,) int or None (see above).
        quantile_clip, q_low, q_high: the percentile clip.
    Returns:
        (B, T) float weights (dtype of ``js``, float32 for integer input), mean 1 over each trajectory's masked tokens
        (up to rounding), 0 where masked out. A trajectory of all-zero J (a low-temperature episode) gets w = 1.
    Raises:
        ValueError: ``js`` not 2-D, ``response_mask`` of another shape, ``episode_index`` not (B,).
    """
    check_2d("js", js)
    check_2d("response_mask", response_mask, tuple(js.shape))
    m = response_mask > 0
    traj, n_traj = trajectory_ids(response_mask, episode_index)  # (B,)
    rows, cols = m.nonzero(as_tuple=True)  # (N,) masked tokens
    seg = traj[rows]  # (N,) trajectory of each masked token
    j = js[rows, cols].double()  # (N,) float64: the weights are cheap, keep them exact
    j_bar = segment_mean(j, seg, n_traj)  # (E,)
    omega = torch.log1p((j + _EPS) / (j_bar[seg] + _EPS))  # (N,), > 0
    if quantile_clip:
        lo = segment_quantile(omega, seg, n_traj, q_low)[seg]  # (N,)
        hi = segment_quantile(omega, seg, n_traj, q_high)[seg]
        omega = torch.minimum(torch.maximum(omega, lo), hi)
    w = omega / segment_mean(omega, seg, n_traj)[seg].clamp_min(torch.finfo(torch.float64).tiny)  # (N,)
    out_dtype = js.dtype if torch.is_floating_point(js) else torch.float32
    out = torch.zeros(js.shape, dtype=out_dtype, device=js.device)
    out[rows, cols] = w.to(out_dtype)
    return out


@torch.no_grad()
def tgrl_advantages(
    rewards: Tensor,
    group_index: Tensor,
    is_high: Tensor,
    js: Tensor,
    response_mask: Tensor,
    *,
    episode_index: Tensor | None = None,
    warmup: bool = False,
    adv_clip: float | None = 10.0,
    quantile_clip: bool = True,
    std: str = "sample",
) -> Tensor:
    """TGRL token advantages (algorithms.md, TGRL steps 1, 4, 5, 7).

    1. ``A_i`` = GRPO over all G rewards of the group (sample std + 1e-6); with ``episode_index`` each episode counts
       once in the group statistics (per-turn mode).
    2. High rows: ``A_{i,t} = clamp(A_i * w_t, -adv_clip, adv_clip)`` with ``w`` = :func:`tgrl_token_weights`,
       normalised per trajectory (per episode when ``episode_index`` is given, else per row); low rows: 0 (they
       still count in the token-mean denominator through their loss mask).
    3. ``warmup=True`` (the steps s < ``algo.warmup_steps``): plain GRPO ``A_i`` broadcast over the masked tokens of *all*
       rows (no JS, no zeroing, no clamp).

    Worked example (per-turn mode): a winning high episode of two turns, J = [0.1, 0.1] and [0.01, 0.01], group
    advantage 1.5 -> token advantages [2.58, 2.58] and [0.42, 0.42].

    Args:
        rewards: (B,) float. group_index: (B,) int. is_high: (B,) bool.
        js: (B, T) token JS of the row (only read on high rows; zeros elsewhere are fine).
        response_mask: (B, T) 0/1.
        episode_index: (B,) int or None: rows of one episode (one trajectory).
        warmup: see 3. adv_clip: the clamp (None = no clamp).
        quantile_clip: ``algo.js_quantile_clip``. std: ``algo.std`` for the GRPO step.
    Returns:
        (B, T) float advantages, 0 where masked out.
    Raises:
        ValueError: inconsistent shapes (rows of ``rewards``/``is_high``/``response_mask``/``js``), an
            ``episode_index`` spanning several groups, or a bad ``std``.
    """
    rewards = as_float(rewards)
    b = rewards.shape[0]
    check_1d("is_high", is_high, b)
    check_2d("response_mask", response_mask)
    if response_mask.shape[0] != b:
        raise ValueError(f"response_mask has {response_mask.shape[0]} rows, rewards {b}")
    m = response_mask > 0
    adv_row = compute_advantages("grpo", rewards, group_index, episode_index=episode_index, std=std)  # (B,)
    adv = adv_row[:, None].expand(m.shape)  # (B,) -> (B, T)
    if warmup:
        return torch.where(m, adv, 0.0)
    check_2d("js", js, tuple(response_mask.shape))
    w = tgrl_token_weights(js, response_mask, episode_index=episode_index, quantile_clip=quantile_clip)
    adv = adv * w.to(adv.dtype)
    if adv_clip is not None:
        adv = adv.clamp(-adv_clip, adv_clip)
    keep = m & is_high.bool()[:, None]  # low rows: 0
    return torch.where(keep, adv, 0.0)


def _high_low_means(values: Tensor, group_index: Tensor, is_high: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per group: mean of ``values`` over high rows, over low rows, whether the group has both, and whether it is
    informative (both, and its values not all equal: ``flat_range``, the one zero-variance test). All (n_groups,)."""
    inv, n = group_ids(group_index)
    v = as_float(values).double()
    h = is_high.bool()
    z = torch.zeros(n, dtype=torch.float64, device=v.device)
    cnt_h = z.clone().index_add_(0, inv, h.double())
    cnt_l = z.clone().index_add_(0, inv, (~h).double())
    sum_h = z.clone().index_add_(0, inv, torch.where(h, v, 0.0))
    sum_l = z.clone().index_add_(0, inv, torch.where(h, 0.0, v))
    both = (cnt_h > 0) & (cnt_l > 0)
    vmax = torch.full((n,), -torch.inf, dtype=torch.float64, device=v.device).scatter_reduce(0, inv, v, "amax")
    vmin = torch.full((n,), torch.inf, dtype=torch.float64, device=v.device).scatter_reduce(0, inv, v, "amin")
    informative = both & ~flat_range(vmax, vmin)
    return sum_h / cnt_h.clamp_min(1.0), sum_l / cnt_l.clamp_min(1.0), both, informative


def _per_episode(
    rewards: Tensor, group_index: Tensor, is_high: Tensor, episode_index: Tensor | None, *extra: Tensor
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    if episode_index is None:
        return as_float(rewards), group_index, is_high, list(extra)
    ep_r, ep_g, _, ex = episode_reduce(rewards, group_index, episode_index, is_high, *extra)
    return ep_r, ep_g, ex[0], ex[1:]


@torch.no_grad()
def tgrl_delta_r(
    rewards: Tensor, group_index: Tensor, is_high: Tensor, episode_index: Tensor | None = None,
    *, with_count: bool = False
) -> float | tuple[float, int]:
    """Exploration gain ``delta_R = mean R(high) - mean R(low)`` per group, averaged over the step's *informative*
    groups: those with both high and low episodes whose G rewards are not all equal (algorithms.md §3 step 2 and
    "Uninformative steps (revised)", metric ``tgrl/delta_R``; a flat group's gain is 0 and only diluted the mean).
    0.0 when no group is informative (e.g. in warm-up, or a step in which nothing won).

    Args:
        rewards: (B,) float. group_index: (B,) int. is_high: (B,) bool.
        episode_index: (B,) int, optional: count each episode once (per-turn mode).
        with_count: also return the number of informative groups (``tgrl/delta_R_groups``).
    Returns:
        python float, in reward units (``(delta_R, n_informative)`` with ``with_count``).
    Raises:
        ValueError: an ``episode_index`` value spanning several groups.
    """
    r, g, h, _ = _per_episode(rewards, group_index, is_high, episode_index)
    check_1d("rewards", r)
    mean_h, mean_l, _, informative = _high_low_means(r, g, h)
    n = int(informative.sum())
    value = float((mean_h - mean_l)[informative].mean()) if n else 0.0
    return (value, n) if with_count else value


@torch.no_grad()
def tgrl_metrics(
    rewards: Tensor,
    group_index: Tensor,
    is_high: Tensor,
    success: Tensor | None = None,
    episode_index: Tensor | None = None,
) -> dict[str, float]:
    """The TGRL step metrics of algorithms.md §3 step 2 and §6: ``tgrl/delta_R``, ``tgrl/delta_R_groups`` (the
    number of informative groups it averages over), ``tgrl/success_high``, ``tgrl/success_low``.

    Args:
        rewards: (B,) float. group_index: (B,) int. is_high: (B,) bool.
        success: (B,) bool, the episode was won; None = ``rewards > 0``.
        episode_index: (B,) int, optional: count each episode once (per-turn mode).
    Returns:
        dict of python floats; a success rate over zero episodes is 0.0. Empty when no row is high: a batch sampled
        at one temperature (GRPO, TAMPO, a temperature schedule) has no T1 episode, and a ``tgrl/success_low`` equal
        to its success rate or a ``tgrl/delta_R`` of 0 would read as a measured TGRL quantity. TGRL's warm-up (every
        episode at T1, flagged high) keeps them.
    """
    if not bool(is_high.bool().any()):
        return {}
    succ = (as_float(rewards) > 0) if success is None else success.bool()
    r, g, h, (s,) = _per_episode(rewards, group_index, is_high, episode_index, succ)
    h = h.bool()
    s = s.double()
    n_h, n_l = int(h.sum()), int((~h).sum())
    delta_r, n_informative = tgrl_delta_r(r, g, h, with_count=True)
    return {
        "tgrl/delta_R": delta_r,
        "tgrl/delta_R_groups": float(n_informative),
        "tgrl/success_high": float(s[h].mean()) if n_h else 0.0,
        "tgrl/success_low": float(s[~h].mean()) if n_l else 0.0,
    }


class AdaptiveHighTemperature:
    """Adaptive T1 of ``algo.t_high=auto`` (algorithms.md section 3, "adaptive high temperature"): a discounted UCB
    (Garivier and Moulines 2011, "On upper-confidence bound policies for switching bandit problems") over the rungs
    ``algo.t_high_ladder`` with ``tgrl/delta_R`` as the reward of the rung a step used.

    Steps: ``step`` is the run's 1-based step. During TGRL's warm-up (``step < algo.warmup_steps``: W - 1 steps)
    every episode uses the middle rung (``agent_rl.learner.config.t_high_value``, 1.2 of the default ladder) and
    nothing is observed. After it, n = ``step - (W - 1)`` (1, 2, ...) and before step n one T1 is picked for every group
    started in that step, from the observations of steps t < n:

    - a rung never picked is tried first, lowest first; then a rung picked but with no observation yet (its step
      trained nothing, or, under ``trainer.max_staleness``, is still being played), lowest first;
    - otherwise, with g = ``algo.t_high_discount`` and c = ``algo.t_high_ucb_c``:
      ``N_T = sum_{t<n, T1_t=T} g^(n-1-t)``, ``X_T = sum_{t<n, T1_t=T} g^(n-1-t) delta_R_t / N_T``,
      ``score(T) = X_T + c sqrt(ln(sum_T N_T) / N_T)`` (the log clamped at 0, which only binds when steps went
      unobserved: then ``sum N_T`` can fall below 1); the highest score wins, ties to the lower T.

    A step's pick is fixed the first time it is asked (:meth:`t_high` is idempotent, so every group of the step,
    DAPO's extra rounds included, shares it) and is part of the state: :meth:`state_dict` (JSON-serialisable, saved
    in checkpoints' ``extra.json``) restores a run that picks what an uninterrupted one would.

    Args:
        algo: the ``AlgoConfig`` (reads ``t_high_ladder``, ``t_high_discount``, ``t_high_ucb_c``, ``warmup_steps``;
            ``t_high`` need not be ``auto``: the class only needs the ladder).
    Raises:
        ValueError: an empty or not strictly increasing ladder, a discount outside (0, 1], c < 0.
    """

    def __init__(self, algo: Any) -> None:
        self.ladder = [float(t) for t in algo.t_high_ladder]
        if not self.ladder or any(b <= a for a, b in zip(self.ladder, self.ladder[1:])):
            raise ValueError(f"t_high_ladder={self.ladder} must be a non-empty, strictly increasing list")
        self.discount, self.c = float(algo.t_high_discount), float(algo.t_high_ucb_c)
        if not 0.0 < self.discount <= 1.0 or self.c < 0:
            raise ValueError(f"t_high_discount={self.discount} must be in (0, 1] and t_high_ucb_c={self.c} >= 0")
        #: the number of warm-up steps: the steps s < algo.warmup_steps (algorithms.md section 3, step 7)
        self.warmup_steps = max(int(algo.warmup_steps) - 1, 0) if algo.name == "tgrl" else 0
        # the middle rung (agent_rl.learner.config.ladder_middle, the config side's t_high_value; a test keeps the
        # two equal: this package imports no agent_rl config)
        self.warmup_t_high = self.ladder[(len(self.ladder) - 1) // 2]
        #: post-warm-up step n -> [rung index picked, delta_R observed or None]
        self._steps: dict[int, list[Any]] = {}

    # ------------------------------------------------------------------ the rule
    def scores(self, step: int) -> dict[float, float]:
        """``{T: score(T)}`` before ``step`` over the rungs with statistics (N_T > 0), from observations of earlier
        steps (empty in warm-up). ``+inf`` nowhere: rungs without statistics are left out (they are tried first)."""
        n = step - self.warmup_steps
        if n < 1:
            return {}
        counts, sums = self._statistics(n)
        total = sum(counts)
        log_total = max(math.log(total), 0.0) if total > 0 else 0.0
        return {self.ladder[i]: sums[i] / counts[i] + self.c * math.sqrt(log_total / counts[i])
                for i in range(len(self.ladder)) if counts[i] > 0}

    def t_high(self, step: int) -> float:
        """The T1 of the groups started in 1-based ``step`` (picked once per step, then the same every call)."""
        n = step - self.warmup_steps
        if n < 1:
            return self.warmup_t_high
        if n not in self._steps:
            self._steps[n] = [self._pick(n), None]
        return self.ladder[self._steps[n][0]]

    def observe(self, step: int, delta_r: float, informative_groups: float | None = None) -> None:
        """Record ``tgrl/delta_R`` of 1-based ``step`` (after its update). Warm-up steps are ignored; so is a
        non-finite value, and (revised rule, algorithms.md §3 "Uninformative steps") a step with
        ``informative_groups == 0`` (``tgrl/delta_R_groups``: no group's rewards varied): it is no observation, the
        step counts as picked but unobserved and the discount clock still advances. ``informative_groups=None``:
        the count is unknown, the value is taken.

        Raises:
            ValueError: ``step`` (after warm-up) had no pick (:meth:`t_high` was never asked for it), or was
                observed already.
        """
        n = step - self.warmup_steps
        if n < 1 or not math.isfinite(float(delta_r)) or (informative_groups is not None and informative_groups <= 0):
            return
        if n not in self._steps:
            raise ValueError(f"step {step} has no T1 pick to observe (ask t_high({step}) before its rollout)")
        if self._steps[n][1] is not None:
            raise ValueError(f"step {step}'s delta_R was observed already")
        self._steps[n][1] = float(delta_r)

    def _statistics(self, n: int) -> tuple[list[float], list[float]]:
        """Discounted ``N_T`` and ``sum g^(n-1-t) delta_R_t`` per rung over observed steps t < n (ascending t, so
        the sums are the same floats in every process)."""
        counts, sums = [0.0] * len(self.ladder), [0.0] * len(self.ladder)
        for t in sorted(self._steps):
            rung, delta = self._steps[t]
            if t < n and delta is not None:
                w = self.discount ** (n - 1 - t)
                counts[rung] += w
                sums[rung] += w * delta
        return counts, sums

    def _pick(self, n: int) -> int:
        picked = {self._steps[t][0] for t in self._steps if t < n}
        for i in range(len(self.ladder)):  # never picked: lowest first
            if i not in picked:
                return i
        counts, sums = self._statistics(n)
        for i in range(len(self.ladder)):  # picked, no statistics yet: lowest first
            if counts[i] <= 0:
                return i
        total = sum(counts)
        log_total = max(math.log(total), 0.0)
        best, best_score = 0, -math.inf
        for i in range(len(self.ladder)):  # ascending T and a strict '>': ties go to the lower T
            score = sums[i] / counts[i] + self.c * math.sqrt(log_total / counts[i])
            if score > best_score:
                best, best_score = i, score
        return best

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """``{"ladder": [...], "steps": [[n, T1, delta_R or None], ...]}`` (JSON-serialisable; n counts from the end
        of warm-up)."""
        return {"ladder": list(self.ladder),
                "steps": [[t, self.ladder[r], d] for t, (r, d) in sorted(self._steps.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`.

        Raises:
            ValueError: the state was saved with another ladder, or names a T1 that is not a rung.
        """
        ladder = [float(t) for t in state["ladder"]]
        if ladder != self.ladder:
            raise ValueError(f"the adaptive-T1 state was saved with t_high_ladder={ladder}, this run has "
                             f"{self.ladder}")
        steps: dict[int, list[Any]] = {}
        for t, t1, d in state["steps"]:
            if float(t1) not in self.ladder:
                raise ValueError(f"the adaptive-T1 state names T1={t1}, not a rung of {self.ladder}")
            steps[int(t)] = [self.ladder.index(float(t1)), None if d is None else float(d)]
        self._steps = steps

