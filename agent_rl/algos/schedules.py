"""Temporal scheduling of the credit strength S (algorithms.md section 4; "Not only where, But when", arXiv 2605.25381).

Progress ``tau = clip((step - s_min) / (s_max - s_min), 0, 1)``, step 1-based, ``s_min = floor(N * s_min_ratio)``,
``s_max = floor(N * s_max_ratio)``, N = total training steps. Each schedule maps ``(tau, m)`` to S; S reaches 0 at
``s_max`` and stays 0 (except ``constant``, which is static credit S = 1).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from .registry import ScheduleKind, get_schedule, register_schedule

__all__ = [
    "schedule_value",
    "schedule_progress",
    "linear_schedule",
    "sigmoid_schedule",
    "power_schedule",
    "constant_schedule",
    "none_schedule",
]


def schedule_progress(step: int, total_steps: int, s_min_ratio: float = 0.0, s_max_ratio: float = 0.8) -> float:
    """tau in [0, 1] of algorithms.md section 4. If ``s_max <= s_min`` (tiny runs), tau jumps from 0 to 1 at ``s_max``.

    Returns:
        tau, a python float in [0, 1].
    Raises:
        ValueError: ``total_steps < 1`` or ratios outside [0, 1].
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not (0.0 <= s_min_ratio <= 1.0 and 0.0 <= s_max_ratio <= 1.0):
        raise ValueError(f"s_min_ratio and s_max_ratio must be in [0, 1], got {s_min_ratio}, {s_max_ratio}")
    s_min = math.floor(total_steps * s_min_ratio)
    s_max = math.floor(total_steps * s_max_ratio)
    if s_max <= s_min:
        return 1.0 if step >= s_max else 0.0
    return min(max((step - s_min) / (s_max - s_min), 0.0), 1.0)


def schedule_value(
    kind: str | Enum,
    step: int,
    total_steps: int,
    m: float = 0.99,
    s_min_ratio: float = 0.0,
    s_max_ratio: float = 0.8,
    **kwargs: Any,
) -> float:
    """Credit strength S at ``step`` (1-based) of ``total_steps`` (algorithms.md section 4).

    Args:
        kind: ``linear`` | ``sigmoid`` | ``power`` | ``constant`` | ``none`` | a name added with
            :func:`register_schedule`.
        step: 1-based training step. total_steps: N.
        m: the starting scale (0.99).
        s_min_ratio, s_max_ratio: s_min = floor(N * s_min_ratio), s_max = floor(N * s_max_ratio).
        **kwargs: schedule parameters (``sigmoid``: ``k=8``; ``power``: ``gamma=2``).
    Returns:
        S as a python float in [0, 1].
    Raises:
        ValueError: unknown kind (lists the valid ones), bad step counts.
    """
    fn = get_schedule(kind)
    tau = schedule_progress(step, total_steps, s_min_ratio, s_max_ratio)
    return float(fn(tau, m, **kwargs))


@register_schedule(ScheduleKind.LINEAR)
def linear_schedule(tau: float, m: float) -> float:
    """``S = m (1 - tau)``."""
    return m * (1.0 - tau)


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@register_schedule(ScheduleKind.SIGMOID)
def sigmoid_schedule(tau: float, m: float, k: float = 8.0) -> float:
    """``S = m [sig(-k (tau - 1/2)) - sig(-k/2)] / [sig(k/2) - sig(-k/2)]`` (m at tau = 0, 0 at tau = 1)."""
    return m * (_sig(-k * (tau - 0.5)) - _sig(-k / 2)) / (_sig(k / 2) - _sig(-k / 2))


@register_schedule(ScheduleKind.POWER)
def power_schedule(tau: float, m: float, gamma: float = 2.0) -> float:
    """``S = (m (1 - tau))^gamma``."""
    return (m * (1.0 - tau)) ** gamma


@register_schedule(ScheduleKind.CONSTANT)
def constant_schedule(tau: float, m: float) -> float:
    """``S = 1``: static credit (the rule at full strength all training)."""
    return 1.0


@register_schedule(ScheduleKind.NONE)
def none_schedule(tau: float, m: float) -> float:
    """``S = 0``: the credit rule is off (plain optimisation)."""
    return 0.0
