"""Advantage estimators (algorithms.md section 1) and DAPO helpers. Pure torch, no grad.

Dims: B rows, T response tokens (in the learner T == L, prompt positions carry mask 0), G group size, E episodes.

Rows versus episodes: in per-turn mode an episode has several rows (one per turn) that share the episode reward.
Group statistics must count each *episode* once, so pass ``episode_index`` to :func:`compute_advantages` (or call it
on the per-episode tensors ``RolloutBatch.episode_rewards`` / ``episode_group_index`` and broadcast with
``advantages[episode_index]``; both give the same result).

All-equal groups (algorithms.md §1: "a group whose rewards are all equal gets A = 0"): every estimator, the DAPO filter
and TGRL (which calls ``grpo``) use one test, ``_groups.flat_range``: a group counts as all-equal when its reward range
``max - min`` is at most ``1e-6 * max(1, max |R|)`` (absolute 1e-6 for rewards in [-1, 1], relative above), so float
rounding (seven float32 0.3 and one value 3e-8 away) gives 0, not whitened noise.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch
from torch import Tensor

from ._groups import as_float, check_1d, check_2d, episode_reduce, flat_range, group_ids, group_stats
from .registry import ADV_ESTIMATORS, AdvEstimator, get_adv_estimator, register_adv_estimator

__all__ = [
    "compute_advantages",
    "grpo_advantages",
    "drgrpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "gigpo_advantages",
    "gigpo_token_advantages",
    "discounted_turn_returns",
    "compute_gae",
    "dapo_overlong_penalty",
    "dapo_keep_groups",
]


@torch.no_grad()
def compute_advantages(
    name: str | Enum,
    rewards: Tensor,
    group_index: Tensor,
    episode_index: Tensor | None = None,
    **kwargs: Any,
) -> Tensor:
    """Outcome advantages by registered estimator name (``algo.adv_estimator``).

    Args:
        name: ``grpo`` | ``drgrpo`` | ``rloo`` | ``reinforce_pp`` or any name added with
            :func:`register_adv_estimator`.
        rewards: (B,) float, scalar reward per row.
        group_index: (B,) int, rows with equal value form a group (same task instance).
        episode_index: optional (B,) int. When given, several rows may belong to one episode (per-turn mode); the
            statistics then count each episode once (its rows must share group and reward) and the episode's
            advantage is broadcast back to its rows. Row-level estimators (``gigpo``) receive it as a keyword.
        **kwargs: passed to the estimator (``grpo``: ``std="sample"|"population"``, ``eps=1e-6``). Built-in
            estimators ignore keywords they do not use, so the trainer can pass the same config keys to any of them
            without branching on the name.
    Returns:
        (B,) advantages, dtype of ``rewards`` (float32 for int/bool rewards).
    Raises:
        ValueError: unknown name (the message lists the valid ones) or bad shapes.
    """
    fn = get_adv_estimator(name)
    rewards = as_float(rewards)
    check_1d("rewards", rewards)
    check_1d("group_index", group_index, rewards.shape[0])
    if ADV_ESTIMATORS.meta(name).get("row_level", False):
        return fn(rewards, group_index, episode_index=episode_index, **kwargs)
    if episode_index is None:
        return fn(rewards, group_index, **kwargs)
    check_1d("episode_index", episode_index, rewards.shape[0])
    ep_rewards, ep_group, inverse, _ = episode_reduce(rewards, group_index, episode_index)
    return fn(ep_rewards, ep_group, **kwargs)[inverse]


@register_adv_estimator(AdvEstimator.GRPO)
@torch.no_grad()
def grpo_advantages(
    rewards: Tensor, group_index: Tensor, std: str = "sample", eps: float = 1e-6, **_: Any
) -> Tensor:
    """GRPO: ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (Shao et al. 2024; algorithms.md section 1).

    Args:
        rewards: (B,) float. group_index: (B,) int.
        std: ``"sample"`` (divide by n-1, the default, ``algo.std``) or ``"population"`` (divide by n).
        eps: added to the std.
    Returns:
        (B,) advantages. A group whose rewards are all equal (range <= 1e-6 * max(1, max |R|)) gets exactly 0
        (checked explicitly, so float rounding can never leak a tiny difference divided by eps); a single-row group
        therefore gets 0.
    Raises:
        ValueError: ``std`` not ``"sample"`` or ``"population"``.
    """
    if std not in ("sample", "population"):
        raise ValueError(f"std must be 'sample' or 'population', got {std!r}")
    st = group_stats(rewards, group_index, unbiased=(std == "sample"))
    adv = (rewards.double() - st["mean"]) / (st["std"] + eps)
    adv = torch.where(st["all_equal"], torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)


@register_adv_estimator(AdvEstimator.DRGRPO)
@torch.no_grad()
def drgrpo_advantages(rewards: Tensor, group_index: Tensor, **_: Any) -> Tensor:
    """Dr.GRPO: ``A_i = R_i - mean_g R`` (Liu et al. 2025; algorithms.md section 1), no std division. Pair it with
    ``loss_agg="seq_mean_token_sum_norm"`` and ``max_len`` (constant divisor G * L_max). An all-equal group (range
    <= 1e-6 * max(1, max |R|)) gets exactly 0.

    Args: rewards (B,) float; group_index (B,) int. Returns: (B,) advantages, in reward units."""
    st = group_stats(rewards, group_index)
    adv = rewards.double() - st["mean"]
    return torch.where(st["all_equal"], torch.zeros_like(adv), adv).to(rewards.dtype)


@register_adv_estimator(AdvEstimator.RLOO)
@torch.no_grad()
def rloo_advantages(rewards: Tensor, group_index: Tensor, **_: Any) -> Tensor:
    """RLOO: ``A_i = R_i - (sum_g R - R_i) / (G - 1)`` (Ahmadian et al. 2024). A single-row group (G = 1) has no
    other rows and gets 0 (algorithms.md section 1); so does an all-equal group (range <= 1e-6 * max(1, max |R|)).

    Args: rewards (B,) float; group_index (B,) int. Returns: (B,) advantages, in reward units."""
    st = group_stats(rewards, group_index)
    r = rewards.double()
    n = st["count"]
    loo_mean = (st["sum"] - r) / (n - 1.0).clamp_min(1.0)
    adv = torch.where(n > 1, r - loo_mean, torch.zeros_like(r))
    return torch.where(st["all_equal"], torch.zeros_like(adv), adv).to(rewards.dtype)


@register_adv_estimator(AdvEstimator.REINFORCE_PP)
@torch.no_grad()
def reinforce_pp_advantages(rewards: Tensor, group_index: Tensor, eps: float = 1e-8, **_: Any) -> Tensor:
    """REINFORCE++: ``A = R - mean_batch R``, then whitened over the batch: ``A / (std_batch A + eps)``
    (algorithms.md §1; ``group_index`` is ignored). The std is the sample std (n-1), as in verl's ``masked_whiten``;
    a batch of equal rewards (range <= 1e-6 * max(1, max |R|), so float rounding does not count) or of one row gets 0.

    Args: rewards (B,) float; group_index (B,) int (unused); eps: added to the std.
    Returns: (B,) whitened advantages (unitless; batch mean 0, sample std 1)."""
    r = rewards.double()
    if r.numel() <= 1 or bool(flat_range(r.max(), r.min())):
        return torch.zeros_like(rewards)
    a = r - r.mean()
    return (a / (a.std(unbiased=True) + eps)).to(rewards.dtype)


@torch.no_grad()
def discounted_turn_returns(
    step_rewards: Tensor, episode_index: Tensor, turn_index: Tensor, gamma: float
) -> Tensor:
    """Discounted return from each turn: ``G_k = sum_{j >= k} gamma^(j - k) r_j`` over the turns j of the same episode
    present in the batch (a turn missing from the batch contributes 0 but still counts in the exponent).

    Args:
        step_rewards: (B,) float, the env reward of each row's turn. episode_index: (B,) int. turn_index: (B,) int.
        gamma: discount.
    Returns:
        (B,) float64 returns.
    """
    ep, n_ep = group_ids(episode_index)
    k = turn_index.long()
    k_max = int(k.max()) + 1 if k.numel() else 0
    dense = torch.zeros(n_ep, k_max + 1, dtype=torch.float64, device=step_rewards.device)  # (E, K + 1), last col 0
    dense.index_put_((ep, k), step_rewards.double(), accumulate=True)
    for j in range(k_max - 1, -1, -1):  # reverse discounted cumsum along turns, vectorised over episodes
        dense[:, j] += gamma * dense[:, j + 1]
    return dense[ep, k]


@register_adv_estimator(AdvEstimator.GIGPO, row_level=True)
@torch.no_grad()
def gigpo_advantages(
    rewards: Tensor,
    group_index: Tensor,
    episode_index: Tensor | None = None,
    turn_index: Tensor | None = None,
    obs_key: Tensor | None = None,
    step_rewards: Tensor | None = None,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    std: str = "sample",
    eps: float = 1e-6,
    **_: Any,
) -> Tensor:
    """GiGPO (Feng et al. 2025; algorithms.md §1, optional): episode-level GRPO advantage plus a step-level advantage
    among the turns of the group that share an identical observation ("anchor state").

    ``A = A_episode + step_weight * A_step``. ``A_episode``: GRPO over the group's episode rewards (each episode once).
    ``A_step``: for each row (turn k) the discounted return ``G_k`` (gamma 0.95, :func:`discounted_turn_returns`),
    normalised GRPO-style (same ``std``/``eps``) among the rows with the same ``group_index`` and ``obs_key``; an anchor
    group of one turn (or of equal returns, within the tolerance of ``grpo``) gets 0.

    Args:
        rewards: (B,) float, episode reward broadcast to the episode's rows (per-turn mode: one row per turn).
        group_index: (B,) int. episode_index: (B,) int. turn_index: (B,) int, 0-based.
        obs_key: (B,) int, identifies the observation the turn acted on (e.g. a stable 63-bit hash of the observation
            text computed by the caller); equal keys in a group form an anchor group.
        step_rewards: (B,) float env reward of each turn; None = sparse: the episode reward on the episode's last
            turn present in the batch, 0 on the others.
        gamma, step_weight, std, eps: see above.
    Returns:
        (B,) advantages, dtype of ``rewards``.
    Raises:
        ValueError: ``episode_index``, ``turn_index`` or ``obs_key`` missing.
    """
    if episode_index is None or turn_index is None or obs_key is None:
        raise ValueError("gigpo needs episode_index, turn_index and obs_key (B,) tensors")
    b = rewards.shape[0]
    for nm, x in (("episode_index", episode_index), ("turn_index", turn_index), ("obs_key", obs_key)):
        check_1d(nm, x, b)
    if b == 0:
        return torch.zeros_like(rewards)
    a_ep = compute_advantages("grpo", rewards, group_index, episode_index=episode_index, std=std, eps=eps)
    if step_rewards is None:
        ep, n_ep = group_ids(episode_index)
        last = torch.full((n_ep,), -1, dtype=torch.long, device=ep.device).scatter_reduce(
            0, ep, turn_index.long(), "amax"
        )
        step_rewards = torch.where(turn_index.long() == last[ep], rewards.double(), 0.0)
    returns = discounted_turn_returns(step_rewards, episode_index, turn_index, gamma)  # (B,) float64
    pairs = torch.stack([group_index.long(), obs_key.long()], dim=1)  # (B, 2): (group, observation)
    anchor = torch.unique(pairs, dim=0, return_inverse=True)[1]  # (B,) anchor-state group id
    a_step = grpo_advantages(returns, anchor, std=std, eps=eps)
    return (a_ep.double() + step_weight * a_step.double()).to(rewards.dtype)


@torch.no_grad()
def gigpo_token_advantages(
    episode_rewards: Tensor,
    episode_group_index: Tensor,
    turn_obs_key: Tensor,
    token_turn: Tensor,
    episode_index: Tensor,
    response_mask: Tensor,
    **kwargs: Any,
) -> Tensor:
    """GiGPO on full-trajectory rows (``rollout.mode=trajectory``): the same per-turn advantages as
    :func:`gigpo_advantages` on per-turn rows, written on each turn's response tokens (docs/algorithms_impl.md,
    "GiGPO"). Choice: a trajectory row holds all of an episode's turns, so the estimator runs on one virtual row per
    (episode, turn) and turn k's tokens get that row's value; the result equals, token by token, what per-turn mode
    gives for the same episodes (tested).

    Args:
        episode_rewards: (E,) float, R of each episode. episode_group_index: (E,) long, its task group.
        turn_obs_key: (E, K) long, the observation key each turn acted on (:func:`gigpo_advantages`'s ``obs_key``;
            keys are >= 0), -1 past an episode's last turn.
        token_turn: (B, T) long, the 0-based turn of each response token (any value where the mask is 0).
        episode_index: (B,) long, each row's episode (0..E-1).
        response_mask: (B, T) 0/1.
        **kwargs: passed to :func:`gigpo_advantages` (``gamma``, ``step_weight``, ``std``, ``eps``).
    Returns:
        (B, T) float32 advantages, 0 where ``response_mask`` is 0.
    Raises:
        ValueError: bad shapes, or a masked token whose turn is not one of its episode's turns.
    """
    r = as_float(episode_rewards)
    check_1d("episode_rewards", r)
    e = r.shape[0]
    check_1d("episode_group_index", episode_group_index, e)
    if turn_obs_key.dim() != 2 or turn_obs_key.shape[0] != e:
        raise ValueError(f"turn_obs_key must be (E={e}, K), got {tuple(turn_obs_key.shape)}")
    check_2d("response_mask", response_mask)
    check_2d("token_turn", token_turn, tuple(response_mask.shape))
    check_1d("episode_index", episode_index, response_mask.shape[0])
    keys = turn_obs_key.long()
    ep_idx, k_idx = (keys >= 0).nonzero(as_tuple=True)  # one virtual per-turn row per (episode, turn)
    a = gigpo_advantages(r[ep_idx], episode_group_index.long()[ep_idx], episode_index=ep_idx, turn_index=k_idx,
                         obs_key=keys[ep_idx, k_idx], **kwargs)
    table = torch.zeros(keys.shape, dtype=torch.float64, device=r.device)  # (E, K)
    table[ep_idx, k_idx] = a.double()
    m = response_mask > 0
    turn = token_turn.long()
    row_ep = episode_index.long()[:, None].expand(turn.shape)
    k_max = keys.shape[1]
    at = turn.clamp(0, max(k_max - 1, 0))
    bad = m & ((turn < 0) | (turn >= k_max))
    if k_max:
        bad |= m & (keys[row_ep, at] < 0)
    if bool(bad.any()):
        raise ValueError("a masked token's token_turn is not one of its episode's turns (turn_obs_key -1 or out of "
                         "range)")
    if k_max == 0:
        return torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    adv = table[row_ep, at]
    return torch.where(m, adv, torch.zeros_like(adv)).float()


@torch.no_grad()
def compute_gae(
    rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the masked tokens of each row (algorithms.md section 1, ``ppo``).

    ``delta_t = r_t + gamma V_{t'} - V_t`` and ``A_t = delta_t + gamma lam A_{t'}``, where t' is the *next masked*
    position of the row (prompt zeros and observation gaps are skipped, as in verl's masked GAE); after the last
    masked token the episode ends (``V = 0``, ``A = 0``). ``returns = A + V``.

    Args:
        rewards: (B, T) float token rewards; only values on masked positions are used (put the episode reward on the
            last response token). To bootstrap a truncated episode, add ``gamma * V_boot`` to its last reward.
        values: (B, T) float critic values.
        response_mask: (B, T) 0/1.
        gamma, lam: discount and GAE lambda.
    Returns:
        ``(advantages (B, T), returns (B, T))``, 0 where ``response_mask`` is 0. Not whitened. Computed in the
        inputs' float dtype (at least float32), returned in the dtype of ``rewards`` (float32 for int rewards).
    Raises:
        ValueError: tensors not 2-D or of different shapes.
    """
    check_2d("rewards", rewards)
    check_2d("values", values, tuple(rewards.shape))
    check_2d("response_mask", response_mask, tuple(rewards.shape))
    b, t_len = rewards.shape
    m = response_mask > 0
    # compute in the inputs' float dtype, at least float32 (float64 inputs stay float64; bf16/int are upcast)
    dt = torch.promote_types(torch.promote_types(as_float(rewards).dtype, as_float(values).dtype), torch.float32)
    r = torch.where(m, rewards.to(dt), 0.0)  # where, not *: non-finite values off the mask never enter
    v = torch.where(m, values.to(dt), 0.0)
    adv = torch.zeros(b, t_len, dtype=dt, device=rewards.device)
    last_gae = torch.zeros(b, dtype=dt, device=rewards.device)
    next_value = torch.zeros(b, dtype=dt, device=rewards.device)
    for t in reversed(range(t_len)):  # sequential in t, vectorised over rows
        mt = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        gae = delta + gamma * lam * last_gae
        last_gae = torch.where(mt, gae, last_gae)  # off-mask positions carry the later value through the gap
        next_value = torch.where(mt, v[:, t], next_value)
        adv[:, t] = torch.where(mt, gae, 0.0)
    returns = torch.where(m, adv + v, 0.0)
    out_dt = rewards.dtype if torch.is_floating_point(rewards) else dt
    return adv.to(out_dt), returns.to(out_dt)


@torch.no_grad()
def dapo_overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025; algorithms.md section 1), to add to the reward.

    ``R_len = 0`` if ``|y| <= L_max - L_c``; ``((L_max - L_c) - |y|) / L_c`` if ``|y| <= L_max``; ``-1`` beyond.

    Args:
        lengths: (B,) int or float response lengths |y| in tokens.
        max_len: L_max. cache_len: L_c (> 0; 0 gives the hard cliff 0 / -1).
    Returns:
        (B,) float32 penalties in [-1, 0].
    """
    y = lengths.double()
    start = float(max_len - cache_len)
    if cache_len <= 0:
        ramp = torch.zeros_like(y)
    else:
        ramp = (start - y) / float(cache_len)
    out = torch.where(y <= start, torch.zeros_like(y), torch.where(y <= max_len, ramp, torch.full_like(y, -1.0)))
    return out.float()


@torch.no_grad()
def dapo_keep_groups(rewards: Tensor, group_index: Tensor) -> Tensor:
    """DAPO dynamic-sampling filter: keep rows whose group's rewards are not all equal (such groups give GRPO
    advantage 0 everywhere; equal means range <= 1e-6 * max(1, max |R|), the estimators' test). A single-row group
    is dropped. The rollout orchestrator calls it on each group's episode rewards. Args: rewards (B,), group_index (B,).
    Returns: (B,) bool, True = keep. Raises: ValueError on bad shapes."""
    check_1d("rewards", rewards)
    check_1d("group_index", group_index, rewards.shape[0])
    return ~group_stats(as_float(rewards), group_index)["all_equal"]
