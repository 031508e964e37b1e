"""Credit rules at token and turn level (algorithms.md §5), and :func:`apply_credit`, the one call the learner makes.

Dims: B rows, T response tokens. In the learner T == L (prompt + response): the response mask has leading zeros on
the prompt and, in full-trajectory mode, zero gaps on observation tokens. Every positional rule here (the TP token
index j and length L, forking top-k, quantiles) counts positions **among the row's masked tokens only** (cumsum of the
mask), never raw column indices; a trajectory (TGRL weights, TP positions) is the episode: in per-turn mode the
concatenation of its turn rows in turn order.

Rows and turns (algorithms.md section 0):
- per-turn mode: one row = one turn; ``turn_index``/``num_turns`` give the turn k of K, ``episode_index`` ties the
  turns of an episode together. Turn-level rules act per row.
- full-trajectory mode: one row = one episode (``turn_index = 0``, ``num_turns = 1``); the turn structure is not
  visible to turn-level rules, which then act per episode: ``tp`` at turn level trains the whole row, ``js`` at turn
  level gives weight 1, ``empg`` has no next turn. Token-level rules see all the episode's action tokens of the row
  (observation gaps skipped) and work as in per-turn mode.

Levels each built-in rule supports (``credit.level``; any other pair raises ``ValueError``):

============  =====  =====  ===========================================================================
rule          token  turn   effect
============  =====  =====  ===========================================================================
uniform       yes    yes    advantages broadcast, mask unchanged (w = 1)
js            yes    yes    token: TGRL weights w_t normalised per trajectory; turn: row mean J / episode
                            mean; A * w
tp            yes    yes    loss mask: trajectory token j of L kept iff j >= floor(L S) (last kept; j, L
                            over the episode's turn rows in order, ``scope=turn``: per row); turn k of K
                            kept iff k >= floor(K S) (last turn kept)
forking       yes    no     loss mask: H_t >= S * eps, eps = 80th percentile of H over the batch's tokens
entropy_adv   yes    yes    A + S min(alpha H, |A| / kappa); turn: H = row mean entropy
empg          no     yes    EMPG turn advantages over the batch of rows (needs (B,) advantages)
============  =====  =====  ===========================================================================

The schedule's S applies to every rule, S = 0 always meaning plain optimisation. ``tp``, ``forking`` and
``entropy_adv`` use S as the spec writes it (``forking``: the relaxed threshold S * eps, so S = 1 is static
Forking-Tok and S = 0 trains every token). ``js`` and ``empg`` have no S in the spec: they are interpolated,
``w_S = 1 + S (w - 1)`` and ``A_S = (1 - S) A + S A_empg``, so S = 1 (``schedule=constant``) is the rule exactly as
section 5 writes it (a documented choice).

Composition with TGRL: the learner runs these rules as one stage of the advantage pipeline of
``agent_rl.algos.pipeline`` (base estimator -> TGRL JS weights -> credit rule -> low-row mask -> clamp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from ._groups import (check_1d, check_2d, group_ids, masked_mean_rows, masked_positions, segment_quantile,
                      trajectory_ids)
from .registry import CREDIT_RULES, CreditLevel, CreditRuleName, as_name, get_credit_rule, register_credit_rule
from .tgrl import tgrl_token_weights

__all__ = [
    "CreditInputs",
    "apply_credit",
    "tp_mask",
    "turn_tp_mask",
    "forking_mask",
    "entropy_adv",
    "empg_advantages",
    "next_turn_values",
]

_ROUND_GUARD = 1e-9  # floor(L S) / ceil(L (1 - S)) of decimal S computed in binary: 0.29 * 100 = 28.999999999999996


@dataclass
class CreditInputs:
    """Everything a credit rule may need, per row.

    Attributes:
        advantages: (B,) row advantage (episode advantage broadcast to its turns) or (B, T) token advantages.
        response_mask: (B, T) 0/1 loss mask before credit.
        turn_index: (B,) long, 0-based turn of the row within its episode (0 in full-trajectory mode).
        num_turns: (B,) long, K of the row's episode (1 in full-trajectory mode).
        episode_index: (B,) long, rows of the same episode share it.
        entropy: (B, T) token entropy at the row's temperature (detached); needed by forking/entropy_adv/empg.
        js: (B, T) token JS (TGRL), zeros for low rows; needed by js.
        is_high: (B,) bool (informational; rules do not need it).
    """

    advantages: Tensor
    response_mask: Tensor
    turn_index: Tensor
    num_turns: Tensor
    episode_index: Tensor
    entropy: Tensor | None = None
    js: Tensor | None = None
    is_high: Tensor | None = None

    def __post_init__(self) -> None:
        check_2d("response_mask", self.response_mask)
        b, t = self.response_mask.shape
        if self.advantages.dim() == 1:
            check_1d("advantages", self.advantages, b)
        else:
            check_2d("advantages", self.advantages, (b, t))
        for name in ("turn_index", "num_turns", "episode_index"):
            check_1d(name, getattr(self, name), b)
        for name in ("entropy", "js"):
            if getattr(self, name) is not None:
                check_2d(name, getattr(self, name), (b, t))
        if self.is_high is not None:
            check_1d("is_high", self.is_high, b)

    @property
    def token_advantages(self) -> Tensor:
        """(B, T) advantages (a (B,) input broadcast over tokens)."""
        a = self.advantages
        return a[:, None].expand(self.response_mask.shape) if a.dim() == 1 else a  # (B,) -> (B, T)

    def require(self, field_name: str, rule: str) -> Tensor:
        """The optional field, or ``ValueError`` naming the rule that needs it."""
        v = getattr(self, field_name)
        if v is None:
            raise ValueError(f"credit rule {rule!r} needs CreditInputs.{field_name}")
        return v


@torch.no_grad()
def apply_credit(
    name: str | Enum, inputs: CreditInputs, S: float, level: str | Enum = "token", **rule_kwargs: Any
) -> tuple[Tensor, Tensor]:
    """Apply the registered credit rule ``name`` at ``level`` with schedule strength ``S`` (spec sections 4-5).

    Args:
        name: ``uniform`` | ``js`` | ``tp`` | ``forking`` | ``entropy_adv`` | ``empg`` | a registered name.
        inputs: :class:`CreditInputs`.
        S: credit strength from :func:`agent_rl.algos.schedule_value`, in [0, 1].
        level: ``"token"`` or ``"turn"`` (``credit.level``); see the table in this module's docstring.
        **rule_kwargs: rule parameters (``entropy_adv``: ``alpha``, ``kappa``; ``empg``: ``zeta``; ``js``:
            ``quantile_clip``).
    Returns:
        ``(advantages (B, T) float, loss_mask (B, T))``: advantages are 0 where ``response_mask`` is 0; ``loss_mask``
        is a subset of ``response_mask`` with its dtype. Use ``loss_mask`` for the policy loss and its token count
        (``credit/trained_token_frac = loss_mask.sum() / response_mask.sum()``).
    Raises:
        ValueError: unknown rule or level, a rule/level pair the rule does not define, S outside [0, 1], or a
            missing input the rule needs.
    """
    lv = as_name(level)
    if lv not in {e.value for e in CreditLevel}:
        raise ValueError(f"unknown credit level {lv!r} (credit.level); valid: {[e.value for e in CreditLevel]}")
    fn = get_credit_rule(name)
    levels = CREDIT_RULES.meta(name)["levels"]
    if lv not in levels:
        raise ValueError(f"credit rule {as_name(name)!r} is not defined at level {lv!r}; it supports {list(levels)}")
    if not (0.0 <= S <= 1.0) or math.isnan(S):
        raise ValueError(f"S must be in [0, 1], got {S}")
    adv, mask = fn(inputs, float(S), lv, **rule_kwargs)
    rm = inputs.response_mask > 0
    keep = rm & (mask > 0)
    adv = torch.where(rm, adv.float(), 0.0)
    return adv, keep.to(inputs.response_mask.dtype)


# ----------------------------------------------------------------------------------------------------------------------
# The rule functions (public: usable directly)
# ----------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def tp_mask(response_mask: Tensor, S: float, *, episode_index: Tensor | None = None) -> Tensor:
    """Trajectory-percentile mask, token level (TP-Schedule, arXiv 2605.25381; algorithms.md, credit rule ``tp``).

    A trajectory's action token j (0-based, counted among masked tokens) of L is kept iff ``j >= floor(L S)``; the
    last token of the trajectory is always kept. With ``episode_index`` the rows sharing a value are one trajectory,
    taken **in row order** (per-turn mode: the episode's turn rows in turn order, so j and L run over the
    concatenation of its turn responses and early turns are switched on last); without it each row is its own
    trajectory (full-trajectory mode, or ``credit.kwargs.scope=turn``).

    Worked examples: one row, L = 5, S = 0.5 -> floor(2.5) = 2 -> tokens 2, 3, 4 kept. Three turn rows of 10 tokens
    of one episode, S = 0.5 -> L = 30, cut 15: turn 0 untrained, turn 1 tokens 5..9, turn 2 all (15 of 30); per-row
    reading: tokens 5..9 of each turn.

    Args:
        response_mask: (B, T) 0/1 (prompt zeros and observation gaps are skipped when counting).
        S: in [0, 1]. S = 0 keeps all masked tokens; S close to 1 keeps only the last.
        episode_index: (B,) int or None (see above).
    Returns:
        (B, T) mask, dtype of ``response_mask``, a subset of it.
    Raises:
        ValueError: ``response_mask`` not 2-D, ``episode_index`` not (B,).
    """
    check_2d("response_mask", response_mask)
    m = response_mask > 0
    j, n = masked_positions(m)  # (B, T) position inside the row, (B,) masked tokens of the row
    traj, n_traj = trajectory_ids(response_mask, episode_index)  # (B,)
    # offset of each row = masked tokens of the earlier rows of its trajectory (exclusive cumsum in row order)
    order = torch.sort(traj, stable=True).indices  # (B,) trajectory-major, row order inside
    n_sorted, traj_sorted = n[order], traj[order]
    csum = n_sorted.cumsum(0) - n_sorted  # (B,) exclusive running count in that order
    start = torch.zeros(n_traj, dtype=torch.long, device=m.device).scatter_reduce(
        0, traj_sorted, csum, "amin", include_self=False)  # (E,) running count at each trajectory's first row
    offset = torch.empty_like(n)
    offset[order] = csum - start[traj_sorted]  # (B,)
    total = torch.zeros(n_traj, dtype=torch.long, device=m.device).index_add_(0, traj, n)[traj]  # (B,) L
    pos = j + offset[:, None]  # (B, T) position in the trajectory
    cut = torch.floor(total.double() * S + _ROUND_GUARD).long()  # (B,)
    keep = m & ((pos >= cut[:, None]) | (pos == (total - 1)[:, None]))
    return keep.to(response_mask.dtype)


@torch.no_grad()
def turn_tp_mask(turn_index: Tensor, num_turns: Tensor, S: float) -> Tensor:
    """Trajectory-percentile mask, turn level (algorithms.md section 5): turn k (0-based) of K is kept iff
    ``k >= floor(K S)``; the last turn (k = K - 1) is always kept (the token rule's "last token" carried over to
    turns, so S = 1 keeps the final turn rather than nothing: a documented choice).

    Args:
        turn_index: (B,) long. num_turns: (B,) long. S: in [0, 1].
    Returns:
        (B,) float32 0/1.
    Raises:
        ValueError: ``turn_index`` / ``num_turns`` not 1-D of the same length.
    """
    check_1d("turn_index", turn_index)
    check_1d("num_turns", num_turns, turn_index.shape[0])
    k = turn_index.long()
    n = num_turns.long()
    cut = torch.floor(n.double() * S + _ROUND_GUARD).long()
    return ((k >= cut) | (k == n - 1)).float()


@torch.no_grad()
def forking_mask(entropy: Tensor, response_mask: Tensor, S: float, *, quantile: float = 0.8) -> Tensor:
    """High-entropy "forking token" selection with TP-Schedule's relaxed threshold (Wang et al. 2025; TP-Schedule
    arXiv 2605.25381 section 3, "mu_t >= S(tau) * eps"; algorithms.md, credit rule ``forking``).

    ``eps`` = the ``quantile`` (0.8) quantile of the entropy over **all masked tokens of the batch** (linear
    interpolation): the static Forking-Tok threshold, the top 20% of tokens. Token t is kept iff
    ``H_t >= S * eps``; the selection replaces the loss mask. S = 1 is static Forking-Tok, S = 0 keeps every token,
    a decaying S starts at the static set and widens it.

    Worked example: 100 tokens with H = 0.01 * rank (rank 1..100): eps = 0.802; S = 0.99 keeps the 21 tokens with
    H >= 0.794, S = 0.5 the 60 with H >= 0.401.

    Args:
        entropy: (B, T) token entropies (old policy, detached, at the row's temperature).
        response_mask: (B, T) 0/1. S: in [0, 1]. quantile: in [0, 1].
    Returns:
        (B, T) mask, dtype of ``response_mask``; all zeros when nothing is masked in.
    Raises:
        ValueError: ``response_mask`` not 2-D, ``entropy`` of another shape, ``quantile`` outside [0, 1].
    """
    check_2d("response_mask", response_mask)
    check_2d("entropy", entropy, tuple(response_mask.shape))
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    m = response_mask > 0
    h = entropy.double()
    if not bool(m.any()):
        return torch.zeros_like(response_mask)
    vals = h[m]  # (N,) the batch's masked tokens
    eps = segment_quantile(vals, torch.zeros_like(vals, dtype=torch.long), 1, quantile)[0]  # linear interpolation
    keep = m & (h >= S * eps)
    return keep.to(response_mask.dtype)


@torch.no_grad()
def entropy_adv(advantages: Tensor, entropy: Tensor, S: float, alpha: float = 0.4, kappa: float = 2.0) -> Tensor:
    """Entropy-shaped advantage (Cheng et al. 2025; algorithms.md section 5):
    ``A_t = A + S min(alpha H_t, |A| / kappa)``, H detached. The bonus is >= 0 and at most ``|A| / kappa``, so for
    kappa > 1 and S <= 1 it never flips the sign of A (it shrinks negative advantages). Worked example: A = -1,
    H = 2, S = 1 -> -1 + min(0.8, 0.5) = -0.5.

    Args:
        advantages: (B,) or (B, T). entropy: (B, T). S: in [0, 1].
    Returns:
        (B, T) float advantages (the caller masks them).
    Raises:
        ValueError: ``entropy`` not 2-D or ``advantages`` neither (B,) nor (B, T).
    """
    check_2d("entropy", entropy)
    a = advantages[:, None].expand(entropy.shape) if advantages.dim() == 1 else advantages  # (B,) -> (B, T)
    check_2d("advantages", a, tuple(entropy.shape))
    h = entropy.detach().float().clamp_min(0.0)
    a = a.float()
    return a + S * torch.minimum(alpha * h, a.abs() / kappa)


@torch.no_grad()
def empg_advantages(
    advantages: Tensor, turn_entropy: Tensor, next_turn_entropy: Tensor, has_next: Tensor, zeta: float = 0.05
) -> Tensor:
    """EMPG turn advantages (Wang et al. 2025, arXiv 2509.09265; algorithms.md section 5), over the batch of turns.

    ``Hn = (H - min H) / (max H - min H)`` over the batch (0 if all equal); the next turn's entropy is normalised with
    the same min/max (clamped to [0, 1]); ``g = exp(-Hn) / mean exp(-Hn)``;
    ``A_k = g_k A + zeta exp(-Hn_{k+1}) [has next]``; then ``A_k -= mean_batch A_k``.

    Args:
        advantages: (B,) turn advantages (episode advantage broadcast to turns).
        turn_entropy: (B,) mean token entropy of the turn. next_turn_entropy: (B,) that of the next turn (any value
            where there is none). has_next: (B,) bool. zeta: the future-clarity bonus scale.
    Returns:
        (B,) float32; zero-mean over the batch (empty batch -> empty).
    Raises:
        ValueError: an input not 1-D of length B.
    """
    check_1d("advantages", advantages)
    b = advantages.shape[0]
    for name, x in (("turn_entropy", turn_entropy), ("next_turn_entropy", next_turn_entropy), ("has_next", has_next)):
        check_1d(name, x, b)
    if b == 0:
        return advantages.float()
    h = turn_entropy.double()
    lo, hi = h.min(), h.max()
    span = hi - lo
    if float(span) > 0:
        hn = (h - lo) / span
        hn_next = ((next_turn_entropy.double() - lo) / span).clamp(0.0, 1.0)
    else:
        hn = torch.zeros_like(h)
        hn_next = torch.zeros_like(h)
    g = torch.exp(-hn) / torch.exp(-hn).mean()
    a = g * advantages.double() + zeta * torch.exp(-hn_next) * has_next.double()
    return (a - a.mean()).float()


def next_turn_values(values: Tensor, episode_index: Tensor, turn_index: Tensor) -> tuple[Tensor, Tensor]:
    """For each row, the value of the row of the same episode with ``turn_index + 1``, if present in the batch.

    Args:
        values: (B,) float. episode_index: (B,) int. turn_index: (B,) int.
    Returns:
        ``(next_values (B,), has_next (B,) bool)``; ``next_values`` is 0 where there is no next row.
    Raises:
        ValueError: ``values`` not 1-D.
    """
    check_1d("values", values)
    ep, _ = group_ids(episode_index)
    k = turn_index.long()
    stride = int(k.max()) + 2 if k.numel() else 1
    key = ep * stride + k  # (B,) unique per (episode, turn)
    sorted_key, order = torch.sort(key)
    pos = torch.searchsorted(sorted_key, key + 1).clamp_max(max(key.numel() - 1, 0))
    has_next = sorted_key[pos] == key + 1 if key.numel() else torch.zeros(0, dtype=torch.bool)
    nxt = values[order[pos]] if key.numel() else values
    return torch.where(has_next, nxt, torch.zeros_like(nxt)), has_next


# ----------------------------------------------------------------------------------------------------------------------
# Registered rules: (inputs, S, level, **kwargs) -> (advantages (B, T), mask (B, T))
# ----------------------------------------------------------------------------------------------------------------------
@register_credit_rule(CreditRuleName.UNIFORM, levels=("token", "turn"))
def _uniform(inputs: CreditInputs, S: float, level: str) -> tuple[Tensor, Tensor]:
    """w = 1 (algorithms.md section 5): the advantage as given, the mask unchanged."""
    return inputs.token_advantages, inputs.response_mask


@register_credit_rule(CreditRuleName.JS, levels=("token", "turn"))
def _js(inputs: CreditInputs, S: float, level: str, quantile_clip: bool = True) -> tuple[Tensor, Tensor]:
    """Token: TGRL weights normalised per trajectory (:func:`tgrl_token_weights` over the episode's rows); turn:
    w_k = (mean_t J of row + 1e-8) / (mean over the episode's rows + 1e-8) (mean 1 over the episode; an episode of
    all-zero J gets 1). Scheduled as ``1 + S (w - 1)``."""
    js = inputs.require("js", "js")
    m = inputs.response_mask
    if level == "token":
        w = tgrl_token_weights(js, m, episode_index=inputs.episode_index, quantile_clip=quantile_clip).float()
    else:
        j_row = masked_mean_rows(js.double(), m).double()  # (B,) turn mean J
        ep, n_ep = group_ids(inputs.episode_index)
        ep_sum = torch.zeros(n_ep, dtype=torch.float64, device=js.device).index_add_(0, ep, j_row)
        ep_cnt = torch.zeros(n_ep, dtype=torch.float64, device=js.device).index_add_(0, ep, torch.ones_like(j_row))
        ep_mean = (ep_sum / ep_cnt)[ep]  # (B,)
        w = ((j_row + 1e-8) / (ep_mean + 1e-8)).float()[:, None].expand(m.shape)  # (B,) -> (B, T)
    w = 1.0 + S * (w - 1.0)
    return inputs.token_advantages.float() * w, m


def _turn_order(inputs: CreditInputs) -> Tensor:
    """(B,) permutation putting each episode's rows in turn order (episode-major), for rules that read rows of one
    trajectory in order."""
    by_turn = torch.sort(inputs.turn_index, stable=True).indices
    return by_turn[torch.sort(inputs.episode_index[by_turn], stable=True).indices]


@register_credit_rule(CreditRuleName.TP, levels=("token", "turn"))
def _tp(inputs: CreditInputs, S: float, level: str, scope: str = "trajectory") -> tuple[Tensor, Tensor]:
    """Acts on the loss mask only (algorithms.md, rule ``tp``). Token level: :func:`tp_mask` over the trajectory
    (the episode's turn rows in turn order; ``scope="turn"``: each row alone); turn level: :func:`turn_tp_mask`."""
    m = inputs.response_mask
    if level == "turn":
        keep_turn = turn_tp_mask(inputs.turn_index, inputs.num_turns, S)  # (B,)
        return inputs.token_advantages, m * keep_turn[:, None].to(m.dtype)
    if scope == "turn":
        return inputs.token_advantages, tp_mask(m, S)
    if scope != "trajectory":
        raise ValueError(f"credit.kwargs.scope={scope!r} is not valid; valid values: trajectory, turn")
    order = _turn_order(inputs)  # (B,)
    keep = torch.empty_like(m)
    keep[order] = tp_mask(m[order], S, episode_index=inputs.episode_index[order])
    return inputs.token_advantages, keep


@register_credit_rule(CreditRuleName.FORKING, levels=("token",))
def _forking(inputs: CreditInputs, S: float, level: str, quantile: float = 0.8) -> tuple[Tensor, Tensor]:
    """Loss mask = :func:`forking_mask` (token level only: the threshold is a quantile over the batch's tokens)."""
    h = inputs.require("entropy", "forking")
    return inputs.token_advantages, forking_mask(h, inputs.response_mask, S, quantile=quantile)


@register_credit_rule(CreditRuleName.ENTROPY_ADV, levels=("token", "turn"))
def _entropy_adv(
    inputs: CreditInputs, S: float, level: str, alpha: float = 0.4, kappa: float = 2.0
) -> tuple[Tensor, Tensor]:
    """:func:`entropy_adv` with token entropy H_t (token level) or the row's mean entropy (turn level)."""
    h = inputs.require("entropy", "entropy_adv")
    m = inputs.response_mask
    if level == "turn":
        h = masked_mean_rows(h.float(), m)[:, None].expand(m.shape)  # (B,) -> (B, T)
    return entropy_adv(inputs.token_advantages, h, S, alpha=alpha, kappa=kappa), m


@register_credit_rule(CreditRuleName.EMPG, levels=("turn",))
def _empg(inputs: CreditInputs, S: float, level: str, zeta: float = 0.05) -> tuple[Tensor, Tensor]:
    """:func:`empg_advantages` over the rows of the batch (turn k's entropy = its row's mean token entropy; the next
    turn is the row of the same episode with turn_index + 1, when present). Scheduled as ``(1 - S) A + S A_empg``.
    Needs (B,) advantages."""
    h = inputs.require("entropy", "empg")
    if inputs.advantages.dim() != 1:
        raise ValueError("credit rule 'empg' needs (B,) turn advantages, got (B, T)")
    m = inputs.response_mask
    h_turn = masked_mean_rows(h.float(), m)  # (B,)
    h_next, has_next = next_turn_values(h_turn, inputs.episode_index, inputs.turn_index)
    a = inputs.advantages.float()
    a_empg = empg_advantages(a, h_turn, h_next, has_next, zeta=zeta)
    a = (1.0 - S) * a + S * a_empg
    return a[:, None].expand(m.shape), m
