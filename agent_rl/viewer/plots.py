"""Training curves of the overview page: one PNG (matplotlib, Agg, no pyplot state: safe in server threads)."""

from __future__ import annotations

import io
import math
from typing import Any


def curves_png(curves: list[tuple[str, dict[str, tuple[list[float], list[float]]]]], title: str = "") -> bytes:
    """A grid of small line plots, one per (title, {metric: (steps, values)}); a placeholder when there is none."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    n = max(1, len(curves))
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(3.2 * cols, 2.3 * rows), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    if not curves:
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "no metrics.jsonl records yet", ha="center", va="center")
        ax.set_axis_off()
    for i, (name, series) in enumerate(curves):
        ax: Any = fig.add_subplot(rows, cols, i + 1)
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, linewidth=1.2, label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        steps = {x for xs, _ in series.values() for x in xs}
        if len(steps) == 1:  # one point: a readable integer axis around it
            ax.set_xlim(min(steps) - 1, min(steps) + 1)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("step", fontsize=7)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
