"""Small vectorised helpers shared by the algos modules: group statistics, per-episode reduction, and positions
counted among masked tokens. Private: the public functions in the other modules document the shapes they take."""

from __future__ import annotations

import torch
from torch import Tensor

FLAT_RTOL = 1e-6
"""Tolerance of the zero-variance test (:func:`flat_range`): a group whose reward range ``max - min`` is at most
``FLAT_RTOL * max(1, max |R|)`` counts as all-equal and gets advantage 0 (algorithms.md section 1). Exact equality
would let float rounding through: seven float32 0.3 and one 3e-8 away give REINFORCE++ advantages -0.181 / +1.270."""


def flat_range(vmax: Tensor, vmin: Tensor) -> Tensor:
    """The one zero-variance test of the algos package: True where a group with largest value ``vmax`` and smallest
    ``vmin`` (same shape, any float dtype) is flat, i.e. ``vmax - vmin <= FLAT_RTOL * max(1, |vmax|, |vmin|)``
    (absolute 1e-6 for rewards of magnitude <= 1, relative 1e-6 above). Returns a bool tensor of that shape."""
    vmax, vmin = vmax.double(), vmin.double()
    scale = torch.maximum(vmax.abs(), vmin.abs()).clamp_min(1.0)
    return (vmax - vmin) <= FLAT_RTOL * scale


def as_float(x: Tensor) -> Tensor:
    """Return ``x`` as a floating tensor (bool/int -> float32); floating tensors are returned unchanged."""
    return x if torch.is_floating_point(x) else x.float()


def check_1d(name: str, x: Tensor, b: int | None = None) -> None:
    """Raise ``ValueError`` unless ``x`` is 1-D (of length ``b`` when given)."""
    if x.dim() != 1 or (b is not None and x.shape[0] != b):
        want = f"({b},)" if b is not None else "(B,)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")


def check_2d(name: str, x: Tensor, shape: tuple[int, ...] | None = None) -> None:
    """Raise ``ValueError`` unless ``x`` is 2-D (of ``shape`` when given)."""
    if x.dim() != 2 or (shape is not None and tuple(x.shape) != tuple(shape)):
        want = str(tuple(shape)) if shape is not None else "(B, T)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")


def group_ids(group_index: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer group labels (B,) to dense ids 0..n-1. Returns ``(inverse (B,) long, n)``."""
    if group_index.numel() == 0:
        return group_index.long(), 0
    uniq, inv = torch.unique(group_index, return_inverse=True)
    return inv, int(uniq.numel())


def group_stats(values: Tensor, group_index: Tensor, unbiased: bool = True) -> dict[str, Tensor]:
    """Per-row statistics of the row's group, computed in float64.

    Args:
        values: (B,) float.
        group_index: (B,) int; rows with equal value form a group.
        unbiased: sample std (divide by n-1) if True, population std (divide by n) if False. A single-row group has
            std 0 with either choice (the n-1 = 0 case is defined as 0, never NaN).
    Returns:
        dict of (B,) float64 tensors: ``mean``, ``std``, ``count``, ``sum``, ``all_equal`` (bool: the group's range
        is within the tolerance of :func:`flat_range`, ``max - min <= 1e-6 * max(1, max |v|)``).
    """
    inv, n = group_ids(group_index)
    v = values.double()
    count = torch.zeros(n, dtype=torch.float64, device=v.device).index_add_(0, inv, torch.ones_like(v))
    total = torch.zeros(n, dtype=torch.float64, device=v.device).index_add_(0, inv, v)
    mean = total / count.clamp_min(1.0)
    sq = torch.zeros(n, dtype=torch.float64, device=v.device).index_add_(0, inv, (v - mean[inv]) ** 2)
    denom = (count - 1.0) if unbiased else count
    var = torch.where(denom > 0, sq / denom.clamp_min(1.0), torch.zeros_like(sq))
    vmax = torch.full((n,), -torch.inf, dtype=torch.float64, device=v.device).scatter_reduce(0, inv, v, "amax")
    vmin = torch.full((n,), torch.inf, dtype=torch.float64, device=v.device).scatter_reduce(0, inv, v, "amin")
    return {
        "mean": mean[inv],
        "std": var.sqrt()[inv],
        "count": count[inv],
        "sum": total[inv],
        "all_equal": flat_range(vmax, vmin)[inv],
    }


def episode_reduce(
    rewards: Tensor, group_index: Tensor, episode_index: Tensor, *extra: Tensor
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """Reduce row-level tensors to one entry per episode (per-turn mode has several rows per episode).

    Args:
        rewards: (B,) float, the episode reward broadcast to the episode's rows (the mean over the rows is taken).
        group_index: (B,) int, must be constant within an episode.
        episode_index: (B,) int, rows of the same episode share it.
        extra: more (B,) tensors constant within an episode (e.g. ``is_high``); the first row's value is taken.
    Returns:
        ``(ep_rewards (E,), ep_group_index (E,), inverse (B,) long, [ep_extra (E,), ...])`` with ``inverse`` mapping
        each row to its episode, so ``ep_values[inverse]`` broadcasts back to rows.
    Raises:
        ValueError: an episode spans several groups.
    """
    inv, e = group_ids(episode_index)
    r = as_float(rewards)
    count = torch.zeros(e, dtype=r.dtype, device=r.device).index_add_(0, inv, torch.ones_like(r))
    ep_r = torch.zeros(e, dtype=r.dtype, device=r.device).index_add_(0, inv, r) / count.clamp_min(1.0)
    g = group_index.long()
    gmax = torch.full((e,), torch.iinfo(torch.long).min, dtype=torch.long, device=g.device).scatter_reduce(
        0, inv, g, "amax"
    )
    gmin = torch.full((e,), torch.iinfo(torch.long).max, dtype=torch.long, device=g.device).scatter_reduce(
        0, inv, g, "amin"
    )
    if bool((gmax != gmin).any()):
        raise ValueError("an episode_index value spans several group_index values")
    # first row of each episode: smallest row position per episode
    pos = torch.arange(inv.numel(), device=inv.device)
    first = torch.full((e,), inv.numel(), dtype=torch.long, device=inv.device).scatter_reduce(0, inv, pos, "amin")
    return ep_r, gmax, inv, [x[first] for x in extra]


def masked_positions(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Positions counted among masked tokens only (prompt zeros and observation gaps are skipped).

    Args:
        mask: (B, T) 0/1.
    Returns:
        ``(j (B, T) long, L (B,) long)``: ``j`` is the 0-based index of each masked token among its row's masked tokens
        (meaningless where mask is 0), ``L`` the number of masked tokens of each row.
    """
    m = mask > 0
    c = m.long().cumsum(dim=-1)  # (B, T) running count of masked tokens
    return c - 1, c[:, -1] if m.shape[-1] > 0 else torch.zeros(m.shape[0], dtype=torch.long, device=m.device)


def masked_mean_rows(x: Tensor, mask: Tensor) -> Tensor:
    """Per-row mean of ``x`` (B, T) over ``mask`` (B, T); rows without masked tokens give 0. Returns (B,)."""
    m = mask > 0
    total = torch.where(m, x, torch.zeros_like(x)).sum(-1)  # where, not x * m: a non-finite masked-out x stays out
    return total / m.sum(-1).clamp_min(1).to(x.dtype)


def segment_mean(values: Tensor, seg: Tensor, n_seg: int) -> Tensor:
    """Mean of ``values`` (N,) per segment id ``seg`` (N,) long in 0..n_seg-1; empty segments give 0. Returns
    (n_seg,) in the dtype of ``values``."""
    total = torch.zeros(n_seg, dtype=values.dtype, device=values.device).index_add_(0, seg, values)
    count = torch.zeros(n_seg, dtype=values.dtype, device=values.device).index_add_(0, seg, torch.ones_like(values))
    return total / count.clamp_min(1.0)


def segment_quantile(values: Tensor, seg: Tensor, n_seg: int, q: float) -> Tensor:
    """Quantile ``q`` of ``values`` (N,) within each segment (``seg`` (N,) long in 0..n_seg-1), linear
    interpolation (numpy's default: position ``q (n - 1)`` in the segment's sorted values). Empty segments give 0.

    Vectorised: one stable sort by value, then a stable sort by segment, so each segment's values lie contiguous and
    ascending; the two neighbours of each quantile position are gathered from there. Returns (n_seg,).
    """
    if values.numel() == 0:
        return torch.zeros(n_seg, dtype=values.dtype, device=values.device)
    by_value = torch.sort(values, stable=True).indices  # (N,)
    by_seg = torch.sort(seg[by_value], stable=True).indices  # (N,) segment-major, value-ascending inside
    sorted_vals = values[by_value][by_seg]
    count = torch.zeros(n_seg, dtype=torch.long, device=values.device).index_add_(0, seg, torch.ones_like(seg))
    start = count.cumsum(0) - count  # (n_seg,) first position of each segment
    pos = q * (count - 1).clamp_min(0).to(values.dtype)
    lo = pos.floor().long()
    hi = torch.minimum(lo + 1, (count - 1).clamp_min(0))
    last = values.numel() - 1
    v_lo = sorted_vals[(start + lo).clamp(0, last)]
    v_hi = sorted_vals[(start + hi).clamp(0, last)]
    out = v_lo + (pos - lo.to(values.dtype)) * (v_hi - v_lo)
    return torch.where(count > 0, out, torch.zeros_like(out))


def trajectory_ids(response_mask: Tensor, episode_index: Tensor | None) -> tuple[Tensor, int]:
    """Dense trajectory id per row (B,) and their number: ``episode_index`` remapped to 0..E-1, or each row its own
    trajectory when ``episode_index`` is None.

    Raises:
        ValueError: ``episode_index`` not (B,).
    """
    b = response_mask.shape[0]
    if episode_index is None:
        return torch.arange(b, device=response_mask.device), b
    check_1d("episode_index", episode_index, b)
    return group_ids(episode_index.to(response_mask.device))
