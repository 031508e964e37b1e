"""Per-step metrics: console progress bar (tqdm), ``DIR/metrics.jsonl`` and TensorBoard (``DIR/tb``).

Every JSONL line holds ``step`` and every metric name of algorithms.md section 6 (``null`` when a step has no value
for it, e.g. the learner metrics of a step whose groups were all dropped), plus any other metric the rollout or the
learner returned. Under a single-temperature algo every episode counts as "low": ``tgrl/delta_R`` and
``tgrl/success_high`` read 0.0 and ``tgrl/success_low`` equals ``success/rate``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

# algorithms.md section 6: the names are part of the interface.
SECTION6_METRICS: tuple[str, ...] = (
    "reward/mean", "success/rate", "tgrl/delta_R", "tgrl/success_high", "tgrl/success_low",
    "actor/pg_loss", "actor/clipfrac", "actor/approx_kl", "actor/grad_norm", "actor/entropy", "actor/lr",
    "credit/trained_token_frac", "credit/js_mean", "schedule/S", "response/length_mean", "response/truncated_frac",
    "episode/turns_mean", "episode/invalid_action_frac", "time/rollout_s", "time/update_s", "time/env_wait_frac",
    "throughput/tokens_per_s",
)
# What the progress bar shows.
BAR_KEYS = {"reward/mean": "R", "success/rate": "succ", "actor/pg_loss": "loss", "actor/approx_kl": "kl",
            "time/rollout_s": "roll_s", "time/update_s": "upd_s"}


def _clean(value: Any) -> float | None:
    """A JSON-safe float (None for missing/NaN/inf and non-numbers)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def drop_records_from(path: Path, step: int) -> int:
    """Rewrite the JSONL file ``path`` without its records of steps >= ``step`` (and unreadable lines, e.g. one cut
    by a crash), so a run resumed at ``step`` does not log those steps twice. Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            if int(json.loads(line)["step"]) < step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            pass
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
    return len(lines) - len(kept)


class MetricsLogger:
    """Writes one record per step to the console, ``metrics.jsonl`` (appended, so a resumed run continues the file)
    and TensorBoard.

    Args:
        out_dir: run directory.
        total_steps: for the progress bar.
        start_step: first step of this process (1, or the resumed step).
        tensorboard: write ``out_dir/tb`` events.
        progress: tqdm bar (else one plain line per step).
    """

    def __init__(self, out_dir: str | Path, *, total_steps: int, start_step: int = 1, tensorboard: bool = True,
                 progress: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        drop_records_from(self.path, start_step)  # a crashed run logged past its last checkpoint: steps re-run now
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out_dir / "tb"))
            except ImportError:  # tensorboard missing: JSONL and console still work
                self._tb = None
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step - 1, desc="train", unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float | None]:
        """Record ``metrics`` of ``step``; returns the JSON record written (section-6 names always present)."""
        record: dict[str, Any] = {"step": step}
        for name in SECTION6_METRICS:
            record[name] = _clean(metrics.get(name))
        for name, value in sorted(metrics.items()):
            if name not in record:
                record[name] = _clean(value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in record.items():
                if name != "step" and value is not None:
                    self._tb.add_scalar(name, value, step)
            self._tb.flush()
        shown = {short: f"{record[k]:.3g}" for k, short in BAR_KEYS.items() if record.get(k) is not None}
        if self._bar is not None:
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(1)
        else:
            print(f"step {step}: " + " ".join(f"{k}={v}" for k, v in shown.items()), file=sys.stderr, flush=True)
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()
