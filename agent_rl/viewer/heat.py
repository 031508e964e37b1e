"""Token heatmap colours: each quantity of the episode store -> a CSS background per action token, with a legend.

Scales are per episode (the page says which): advantage is diverging around 0 (red < 0 < green, scaled by the
largest |advantage| of the episode); JS, entropy and surprise (-log-prob) are sequential from 0 to the episode's
largest value; ``trained`` is green (the loss mask trained the token) or grey (masked out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: ``?color=`` values -> (record field, label).
QUANTITIES: dict[str, tuple[str, str]] = {
    "adv": ("advantage", "final token advantage"),
    "js": ("js", "JS divergence (T0 vs T1)"),
    "entropy": ("entropy", "entropy (nats)"),
    "trained": ("trained", "trained by the loss mask"),
    "logprob": ("logprob", "surprise -log p (engine, nats)"),
}
_RGB = {"adv+": (22, 150, 60), "adv-": (210, 40, 40), "js": (120, 60, 200), "entropy": (230, 130, 0),
        "logprob": (30, 100, 220), "trained": (22, 150, 60)}
MAX_ALPHA = 0.85


@dataclass(frozen=True)
class Scale:
    """What a colour means on one page: ``quantity`` (a key of QUANTITIES), ``vmax`` (> 0; for ``adv`` the scale is
    [-vmax, vmax]); ``available`` False when the episode has no values of it (e.g. eval: no learner numbers)."""

    quantity: str
    vmax: float
    available: bool = True


def episode_scale(record: dict[str, Any], quantity: str) -> Scale:
    """The scale of ``quantity`` over every action token of the episode ``record``."""
    field = QUANTITIES[quantity][0]
    values = [v for t in record.get("turns", []) for v in (t.get(field) or []) if v is not None]
    if quantity == "trained":
        return Scale(quantity, 1.0, bool(values))
    if quantity == "logprob":
        values = [-v for v in values]
    vmax = max((abs(v) for v in values), default=0.0)
    return Scale(quantity, vmax if vmax > 0 else 1.0, bool(values))


def _rgba(rgb: tuple[int, int, int], alpha: float) -> str:
    alpha = max(0.0, min(MAX_ALPHA, alpha))
    return f"rgba({rgb[0]}, {rgb[1]}, {rgb[2]}, {alpha:.3f})"


def colour(value: float | None, scale: Scale) -> str:
    """CSS ``background-color`` of one token (``transparent`` when it has no value)."""
    if value is None or not scale.available:
        return "transparent"
    q = scale.quantity
    if q == "trained":
        return _rgba(_RGB["trained"], 0.45) if value else "rgba(140, 140, 140, 0.35)"
    if q == "adv":
        return _rgba(_RGB["adv+" if value >= 0 else "adv-"], MAX_ALPHA * abs(value) / scale.vmax)
    if q == "logprob":
        value = -value
    return _rgba(_RGB[q], MAX_ALPHA * max(value, 0.0) / scale.vmax)


def legend(scale: Scale) -> list[tuple[str, str]]:
    """(CSS colour, label) stops of the page's legend, low to high."""
    q, v = scale.quantity, scale.vmax
    if q == "trained":
        return [(colour(0, scale), "masked (no gradient)"), (colour(1, scale), "trained")]
    stops = [-v, -v / 2, 0.0, v / 2, v] if q == "adv" else [0.0, v / 4, v / 2, 3 * v / 4, v]
    if q == "logprob":
        return [(colour(-s, scale), f"{s:.3g}") for s in stops]
    return [(colour(s, scale), f"{s:.3g}") for s in stops]


def fmt(value: Any) -> str:
    """A stored number as an attribute value: the JSON decimal itself (``str(float)`` round-trips), '' for null."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    return str(value)
