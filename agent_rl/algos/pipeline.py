"""The token-advantage pipeline of one learner step, as five pure stages (algorithms.md sections 1, 3, 4, 5).

    base estimator -> TGRL JS weights -> credit rule -> low-row mask -> clamp

1. **Base estimator** (``algo.adv_estimator``): episode-level (B,) advantages (``compute_advantages`` over the
   episodes, broadcast to their rows) or, for ``algo=ppo``, GAE token advantages (B, T). Computed by the caller.
2. **TGRL JS weights** (:func:`js_weight_stage`): ``A_t = A * (1 + s (w_t - 1))``, w normalised per trajectory (the
   episode's turn rows together) at token level, or per turn row relative to the episode mean at turn level.
3. **Credit rule** (``credit=...``, :func:`agent_rl.algos.apply_credit`) at the schedule's strength S: reshapes the
   advantages (``entropy_adv``, ``empg``) or the loss mask (``tp``, ``forking``).
4. **Low-row mask** (:func:`low_row_stage`): TGRL's T0 rows get advantage 0 (they give group statistics, no
   gradient) and, with ``algo.low_rows_in_denominator=false``, leave the loss mask too.
5. **Clamp** (:func:`clamp_stage`): TGRL's ``clamp(A, -adv_clip, adv_clip)``.

:func:`advantage_plan` decides, from the config and the step, which stages run and with which strength, so every
ablation of the two papers is a config (table in docs/training.md); :func:`token_advantages` runs the plan. The plan's
choices (each documented where it is made):

- ``algo=tgrl`` after warm-up: stages 2 (strength 1), 3, 4 and 5. ``credit=uniform`` is the "mixed groups, uniform
  credit" ablation: stage 2 off, stage 4 still on (the ablation removes the JS weights only). ``credit=js`` *is*
  stage 2, at strength S when a schedule is set (``schedule != none``), else 1; stage 3 is then empty. A rule that
  needs (B,) row advantages (``empg``) runs before stage 2.
- ``algo=tgrl`` in warm-up (the steps s < ``algo.warmup_steps``): plain GRPO over all G episodes; ``credit=js`` is off,
  any other rule runs at S; no low-row mask, no clamp.
- Other algorithms: stage 3 only; ``credit=js`` runs stage 2 at strength S (``schedule=constant`` for full weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._groups import check_1d
from .credit import CreditInputs, apply_credit

__all__ = ["AdvantagePlan", "advantage_plan", "js_weight_stage", "low_row_stage", "clamp_stage", "token_advantages"]

#: credit rules that reshape (B,) row advantages: they run before the JS weights (stage 2).
ROW_ADVANTAGE_RULES = ("empg",)


@dataclass(frozen=True)
class AdvantagePlan:
    """Which pipeline stages run in one step, and how strongly (see module docstring).

    Attributes:
        js_strength: stage 2 strength s in ``1 + s (w - 1)``; None = stage 2 off.
        js_level: ``token`` (per-trajectory token weights) or ``turn`` (turn weights).
        credit: stage 3 rule name; None = stage 3 off.
        level: stage 3 ``credit.level``. S: stage 3 strength.
        credit_first: stage 3 runs before stage 2 (rules in ``ROW_ADVANTAGE_RULES``).
        zero_low_rows: stage 4 on. low_rows_in_denominator: stage 4 keeps low rows in the loss mask.
        adv_clip: stage 5 bound; None = off.
    """

    js_strength: float | None
    js_level: str
    credit: str | None
    level: str
    S: float
    credit_first: bool
    zero_low_rows: bool
    low_rows_in_denominator: bool
    adv_clip: float | None


def advantage_plan(*, is_tgrl: bool, warmup: bool, credit: str, level: str, S: float, scheduled: bool,
                   adv_clip: float | None = 10.0, low_rows_in_denominator: bool = True) -> AdvantagePlan:
    """The stages of :func:`token_advantages` for one step (rules in the module docstring).

    Args:
        is_tgrl: ``algo.name == "tgrl"``. warmup: the step is inside ``algo.warmup_steps``.
        credit: ``credit.name``. level: ``credit.level``. S: the schedule's strength this step (algorithms.md 4).
        scheduled: a schedule is set (``schedule.kind != none`` or ``schedule.value`` given).
        adv_clip: ``algo.adv_clip`` (TGRL only). low_rows_in_denominator: ``algo.low_rows_in_denominator``.
    Returns:
        :class:`AdvantagePlan`.
    """
    tgrl_on = is_tgrl and not warmup
    if credit == "js":
        if is_tgrl and warmup:  # 3.7: plain GRPO over all G
            js_strength = None
        else:
            js_strength = S if (scheduled or not is_tgrl) else 1.0
        js_level, rule = level, None
    else:
        js_strength = 1.0 if tgrl_on and credit != "uniform" else None
        js_level, rule = "token", credit
    return AdvantagePlan(
        js_strength=js_strength, js_level=js_level, credit=rule, level=level, S=float(S),
        credit_first=rule in ROW_ADVANTAGE_RULES, zero_low_rows=tgrl_on,
        low_rows_in_denominator=low_rows_in_denominator, adv_clip=adv_clip if tgrl_on else None)


@torch.no_grad()
def js_weight_stage(inputs: CreditInputs, strength: float, level: str = "token", quantile_clip: bool = True
                    ) -> Tensor:
    """Stage 2: ``A_t * (1 + strength (w_t - 1))`` with TGRL's JS weights (the ``js`` credit rule: token weights
    normalised per trajectory, or turn weights at ``level="turn"``).

    Args:
        inputs: :class:`CreditInputs` with ``js`` (B, T) and ``advantages`` (B,) or (B, T).
        strength: in [0, 1]. level: ``token`` | ``turn``. quantile_clip: ``algo.js_quantile_clip``.
    Returns:
        (B, T) float advantages, 0 where ``response_mask`` is 0.
    Raises:
        ValueError: ``inputs.js`` missing, strength outside [0, 1].
    """
    adv, _ = apply_credit("js", inputs, strength, level=level, quantile_clip=quantile_clip)
    return adv


@torch.no_grad()
def low_row_stage(advantages: Tensor, loss_mask: Tensor, is_high: Tensor, in_denominator: bool = True
                  ) -> tuple[Tensor, Tensor]:
    """Stage 4: TGRL's low-temperature rows get advantage 0; with ``in_denominator=False`` they also leave the loss
    mask (and so the token-mean denominator).

    Args:
        advantages: (B, T). loss_mask: (B, T) 0/1. is_high: (B,) bool.
    Returns:
        ``(advantages (B, T), loss_mask (B, T))``.
    Raises:
        ValueError: ``is_high`` not (B,).
    """
    check_1d("is_high", is_high, advantages.shape[0])
    high = is_high.bool()[:, None]  # (B,) -> (B, 1)
    advantages = torch.where(high, advantages, torch.zeros_like(advantages))
    if not in_denominator:
        loss_mask = loss_mask * high.to(loss_mask.dtype)
    return advantages, loss_mask


@torch.no_grad()
def clamp_stage(advantages: Tensor, adv_clip: float | None) -> Tensor:
    """Stage 5: ``clamp(A, -adv_clip, adv_clip)`` (TGRL step 5); ``adv_clip=None`` returns ``advantages``."""
    return advantages if adv_clip is None else advantages.clamp(-adv_clip, adv_clip)


@torch.no_grad()
def token_advantages(plan: AdvantagePlan, inputs: CreditInputs, *, quantile_clip: bool = True,
                     credit_kwargs: dict[str, Any] | None = None) -> tuple[Tensor, Tensor]:
    """Run the pipeline: stages 2-5 of ``plan`` on the base advantages in ``inputs.advantages`` (stage 1).

    Args:
        plan: from :func:`advantage_plan`.
        inputs: :class:`CreditInputs`; ``advantages`` (B,) row advantages or (B, T) token advantages (GAE);
            ``js`` needed when stage 2 runs, ``entropy`` when the rule reads it, ``is_high`` when stage 4 runs.
        quantile_clip: ``algo.js_quantile_clip``. credit_kwargs: ``credit.kwargs`` of the stage 3 rule.
    Returns:
        ``(advantages (B, T) float32, loss_mask (B, T) float32)``; advantages are 0 wherever the loss mask is 0.
    Raises:
        ValueError: from the stages (missing inputs, bad names or levels).
    """
    kw = credit_kwargs or {}
    adv, mask = inputs.advantages, inputs.response_mask
    if plan.credit is not None and plan.credit_first:
        adv, mask = apply_credit(plan.credit, inputs, plan.S, level=plan.level, **kw)
    if plan.js_strength is not None:
        adv = js_weight_stage(_with(inputs, adv), plan.js_strength, plan.js_level, quantile_clip)
    if plan.credit is not None and not plan.credit_first:
        adv, mask = apply_credit(plan.credit, _with(inputs, adv, mask), plan.S, level=plan.level, **kw)
    adv = _with(inputs, adv).token_advantages.float()  # (B,) -> (B, T) when no stage ran
    if plan.zero_low_rows:
        if inputs.is_high is None:
            raise ValueError("the low-row stage needs CreditInputs.is_high")
        adv, mask = low_row_stage(adv, mask, inputs.is_high, plan.low_rows_in_denominator)
    adv = clamp_stage(adv, plan.adv_clip)
    keep = mask > 0
    return torch.where(keep, adv, torch.zeros_like(adv)), keep.float()


def _with(inputs: CreditInputs, advantages: Tensor, response_mask: Tensor | None = None) -> CreditInputs:
    """``inputs`` with other advantages (and loss mask): stages pass their output on."""
    return CreditInputs(
        advantages=advantages, response_mask=inputs.response_mask if response_mask is None else response_mask,
        turn_index=inputs.turn_index, num_turns=inputs.num_turns, episode_index=inputs.episode_index,
        entropy=inputs.entropy, js=inputs.js, is_high=inputs.is_high)
