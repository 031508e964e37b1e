"""Per-step metrics: console progress bar (tqdm), ``DIR/metrics.jsonl`` and the trackers every row is handed to
(TensorBoard ``DIR/tb``, W&B, MLflow: :mod:`agent_rl.trackers`), and the one reader of ``metrics.jsonl``
(:func:`read_metrics`) that every consumer uses (report, viewer, scripts, benchmarks).

Each JSONL line is one row: ``{"step": int, "kind": KIND, <metric>: float | null, ...}``. ``KIND`` (:data:`KINDS`):

- ``"train"``: one RL training step (``agent_rl.train``, both backends), ``step`` >= 1. Holds every metric name of
  algorithms.md section 6 (``null`` when a step has no value for it, e.g. the learner metrics of a step whose groups
  were all dropped), plus any other metric the rollout or the learner returned (``batch/rows``, ``rollout/...``);
  never an ``eval/`` name. Under a single-temperature algo (no T1 episode: GRPO, TAMPO, a temperature schedule)
  ``tgrl/delta_R``, ``tgrl/success_high`` and ``tgrl/success_low`` are ``null``: there is no TGRL quantity to log.
- ``"eval"``: one in-training evaluation of the held-out panel(s) (``trainer.eval_every``), only ``eval/<panel>/...``
  names; ``step`` = updates done when it ran (0 = before training; at step N it follows that step's ``train`` row).
- ``"sft"``: one behaviour-cloning optimizer step (``agent_rl.sft``): ``sft/...``, ``time/step_s``; step 1 also the
  expert-collection numbers.
- ``"calibration"``: TGRL's temperature probe (``algo.calibration=probe``, algorithms.md 3b), once, step 0 of the
  ``rl`` phase, before the first ``train`` row: ``pairs`` (a list of ``{t_low, t_high, gain_std, pos, var, ext,
  elig, score}``), ``chosen`` (``{t_low, t_high}``) and the probe's size (``agent_rl.calibration.Calibration.row``);
  the one kind whose values are not all numbers.

A run has up to two phases (:data:`PHASES`): ``warm_start`` (behaviour cloning, ``trainer.warm_start=bc``
or ``agent_rl.sft``: ``sft`` rows, steps 1..K, its own counter) then ``rl`` (``train`` rows, steps 1..N). An ``eval``
row names its phase in a ``phase`` field (the warm start's panels at its step 0 = before cloning and step K = after
it; RL's at its steps), so the two step-0 panels of a warm-started run are two rows; the training loop writes the
field on its ``sft`` and ``train`` rows too (without it they are of phase ``warm_start`` and ``rl`` by their kind).
An eval row without ``phase`` (written before phases) is
``rl``, or ``warm_start`` in a file with ``sft`` rows and no ``train`` rows (:func:`row_phase`). Rows sort by phase,
then step, then kind; a file without any ``phase`` field (written before phases) is read as one phase, as before.

A step repeats when a resumed run logs it again (a crash after the row, before the checkpoint): the row written last
wins, per (phase, kind, step). Lines written before rows had a kind are read as what they hold (see
:func:`row_kinds`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from agent_rl.trackers import TensorBoardTracker, Trackers

# algorithms.md section 6: the names are part of the interface.
SECTION6_METRICS: tuple[str, ...] = (
    "reward/mean", "success/rate", "tgrl/delta_R", "tgrl/success_high", "tgrl/success_low",
    "actor/pg_loss", "actor/clipfrac", "actor/approx_kl", "actor/grad_norm", "actor/entropy", "actor/lr",
    "credit/trained_token_frac", "credit/js_mean", "schedule/S", "response/length_mean", "response/truncated_frac",
    "episode/turns_mean", "episode/invalid_action_frac", "time/rollout_s", "time/update_s", "time/env_wait_frac",
    "throughput/tokens_per_s",
)
#: the row kinds of metrics.jsonl (module docstring); the order rows of one step sort in
KINDS: tuple[str, ...] = ("calibration", "train", "sft", "eval")
#: the phases of a run, in order (module docstring)
PHASES: tuple[str, ...] = ("warm_start", "rl")
#: the phase of a row of each kind that is not an eval row
KIND_PHASE = {"sft": "warm_start", "train": "rl"}
#: the words a training step without a learning signal is reported in (its line, the run's end, summary.md)
NO_SIGNAL = "no learning signal (all rewards equal)"
#: metric names of evaluation rows
EVAL_PREFIX = "eval/"
# What the progress bar shows.
BAR_KEYS = {"reward/mean": "R", "success/rate": "succ", "actor/pg_loss": "loss", "actor/approx_kl": "kl",
            "time/rollout_s": "roll_s", "time/update_s": "upd_s", "sft/loss": "ce", "sft/token_acc": "acc",
            "time/step_s": "step_s"}
#: the words a row kind's one-line summary starts with (``RL step 3: R=...``, ``cloning step 5: ce=...``)
STEP_WORDS = {"train": "RL step", "sft": "cloning step"}
SKIPPED_NONFINITE = "actor/skipped_nonfinite"
"""1 on a ``train`` row whose update the learner refused (a non-finite advantage, loss or gradient: nothing applied,
``agent_rl.learner.Learner._optimise``), else 0; in every ``train`` row (0 for a step that trained on nothing), and
the step's progress line says ``update=skipped_nonfinite``."""


def _clean(value: Any) -> float | None:
    """A JSON-safe float (None for missing/NaN/inf and non-numbers)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def check_kind(kind: str) -> None:
    """Raises ValueError (naming the kinds) when ``kind`` is not one of :data:`KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"unknown metrics row kind {kind!r}; the kinds are {', '.join(KINDS)}")


def row_kinds(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one parsed ``metrics.jsonl`` line: itself when it has a ``kind``; a line written before rows had
    one is read as what it holds: ``sft/`` names -> an ``sft`` row; else its ``eval/`` names -> an ``eval`` row and
    the other names -> a ``train`` row (none when they are all null: the old step-0 line carried every training name
    as null). A line without an integer ``step`` has no row."""
    step = line.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
        return []
    step = int(step)
    if "kind" in line:
        return [{**line, "step": step}]
    if any(k.startswith("sft/") for k in line):
        return [{"step": step, "kind": "sft", **{k: v for k, v in line.items() if k != "step"}}]
    evals = {k: v for k, v in line.items() if k.startswith(EVAL_PREFIX)}
    rest = {k: v for k, v in line.items() if k != "step" and not k.startswith(EVAL_PREFIX)}
    rows = []
    if any(v is not None for v in rest.values()):
        rows.append({"step": step, "kind": "train", **rest})
    if evals:
        rows.append({"step": step, "kind": "eval", **evals})
    return rows


def row_phase(row: dict[str, Any], legacy_eval_phase: str = "rl") -> str:
    """The phase of ``row`` (module docstring): its ``phase`` field, else its kind's (:data:`KIND_PHASE`), else
    ``legacy_eval_phase`` (an eval row written before phases)."""
    phase = row.get("phase")
    if isinstance(phase, str) and phase in PHASES:
        return phase
    return KIND_PHASE.get(str(row.get("kind")), legacy_eval_phase)


def _phase_key(row: dict[str, Any], legacy: str) -> str:
    """:func:`row_phase`, or "" for every row of a file without phases (``legacy`` "")."""
    return row_phase(row, legacy) if legacy else ""


def _legacy_eval_phase(rows: list[dict[str, Any]]) -> str:
    kinds = {r.get("kind") for r in rows}
    return "warm_start" if "sft" in kinds and "train" not in kinds else "rl"


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The rows of the ``metrics.jsonl`` file ``path`` (module docstring), one per (phase, kind, step): when a step
    repeats (a resumed run logged it again) the row written last wins. Sorted by phase (warm start first), step, and
    within a step train/sft before eval (an evaluation at step N ran after update N). Unreadable lines (a line being
    written, one cut by a crash) are skipped; a missing file has no rows.

    Args:
        path: the file (``DIR/metrics.jsonl``).
        kind: only rows of this kind (``"train"``, ``"eval"``, ``"sft"``); None: every row.

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS`.
    """
    if kind is not None:
        check_kind(kind)
    path = Path(path)
    if not path.is_file():
        return []
    parsed = []
    for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict):
            parsed.extend(row_kinds(line))
    legacy = _legacy_eval_phase(parsed)
    if not any("phase" in row for row in parsed):  # a file written before phases: one phase, ordered as before
        legacy = ""
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for row in parsed:
        key = (_phase_key(row, legacy), str(row["kind"]), row["step"])
        rows.pop(key, None)  # the later row replaces the earlier one
        rows[key] = row
    order = {k: i for i, k in enumerate(KINDS)}
    phases = {p: i for i, p in enumerate(("", *PHASES))}
    out = sorted(rows.values(), key=lambda r: (phases[_phase_key(r, legacy)], r["step"],
                                               order.get(str(r["kind"]), len(KINDS))))
    return [r for r in out if kind is None or r["kind"] == kind]


def metrics_by_step(path: str | Path, kind: str) -> dict[int, dict[str, Any]]:
    """``{step: row}`` of the ``kind`` rows of ``path`` (:func:`read_metrics`)."""
    return {r["step"]: r for r in read_metrics(path, kind)}


def drop_records_from(path: Path, step: int, phase: str | None = None) -> int:
    """Rewrite the JSONL file ``path`` without its rows of steps >= ``step`` (any kind; only those of ``phase``
    when given, :func:`row_phase`) and its unreadable lines (e.g. one cut by a crash), so a run resumed at ``step``
    does not log those steps twice. Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    parsed = []
    for line in lines:
        try:
            row = json.loads(line)
            parsed.append((line, row, int(row["step"])))
        except (ValueError, KeyError, TypeError):
            pass
    legacy = _legacy_eval_phase([row for _, row, _ in parsed if isinstance(row, dict)])
    kept = [line for line, row, s in parsed if s < step or (phase is not None and row_phase(row, legacy) != phase)]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
    return len(lines) - len(kept)


class MetricsLogger:
    """Writes the rows of each step (module docstring) to ``metrics.jsonl`` (appended, so a resumed run continues
    the file) and the console, and hands each row and checkpoint to the trackers (:class:`agent_rl.trackers.Trackers`:
    TensorBoard, W&B, MLflow); the training loop's one metrics sink.

    Args:
        out_dir: run directory.
        total_steps: for the progress bar.
        start_step: first step of this process (1, or the resumed step). The file's rows of steps >= ``start_step``
            (a crashed run logged past its last checkpoint: those steps run again) are dropped; at 1 (a run from
            the start) every row, the step-0 evaluation included; with ``phase``, only that phase's rows.
        phase: the run's phase (:data:`PHASES`), written on every row (so a file written with phases is read by
            phase, :func:`read_metrics`); None: rows without one, and a fresh start drops every row of the file.
        tensorboard: attach the phase's TensorBoard tracker (``out_dir/tb`` events,
            :class:`agent_rl.trackers.TensorBoardTracker`) to the trackers until :meth:`close`.
        progress: tqdm bar (else one plain line per training step).
        trackers: the run's W&B / MLflow runs (:class:`agent_rl.trackers.Trackers`), given every row written and
            rewound to ``start_step`` as the file is (:meth:`~agent_rl.trackers.Trackers.rewind`); their owner
            closes them. None: a group of this logger's own (TensorBoard only).
    """

    def __init__(self, out_dir: str | Path, *, total_steps: int, start_step: int = 1, tensorboard: bool = True,
                 progress: bool = True, phase: str | None = None, trackers: Trackers | None = None) -> None:
        if phase is not None and phase not in PHASES:
            raise ValueError(f"unknown run phase {phase!r}; the phases are {', '.join(PHASES)}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self.phase = phase
        self.trackers = trackers if trackers is not None else Trackers()
        drop_records_from(self.path, start_step if start_step > 1 else 0, phase)
        if start_step > 1:  # the trackers drop the same steps (a resume)
            self.trackers.rewind(start_step)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = TensorBoardTracker.for_phase(self.out_dir, phase) if tensorboard else None
        if self._tb is not None:
            self.trackers.attach(self._tb)
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step - 1, desc="train", unit="step", dynamic_ncols=True)

    def log_calibration(self, row: dict[str, Any]) -> dict[str, Any]:
        """The ``calibration`` row (step 0): ``row`` as given to ``metrics.jsonl``; its numbers to the trackers as
        ``calibration/t_low``, ``calibration/t_high`` and ``calibration/score/<T_low>_<T_high>``. Returns the row
        written."""
        line = {"step": 0, "kind": "calibration", **({"phase": self.phase} if self.phase else {}), **row}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        scalars = {"calibration/t_low": row["chosen"]["t_low"], "calibration/t_high": row["chosen"]["t_high"]}
        scalars.update({f"calibration/score/{p['t_low']:g}_{p['t_high']:g}": p["score"] for p in row["pairs"]})
        self.trackers.log(0, {"step": 0, "kind": "calibration", **scalars})
        return line

    def log(self, step: int, metrics: dict[str, Any], *, kind: str = "train") -> dict[str, Any]:
        """Record ``metrics`` of ``step``: a ``kind`` row of the names outside ``eval/`` (a ``train`` row always
        holds the section-6 names), then, when there are ``eval/`` names, an ``eval`` row of those (an evaluation
        that ran at this step). ``kind="eval"``: only the ``eval`` row. Returns the ``kind`` row written.

        Raises:
            ValueError: an unknown ``kind``, or ``kind="eval"`` with a name outside ``eval/``.
        """
        check_kind(kind)
        evals = {k: v for k, v in metrics.items() if k.startswith(EVAL_PREFIX)}
        rest = {k: v for k, v in metrics.items() if not k.startswith(EVAL_PREFIX)}
        if kind == "eval" and rest:
            raise ValueError(f"an eval row holds only {EVAL_PREFIX} names; got {sorted(rest)[:5]}")
        rows = []
        if kind != "eval":
            row: dict[str, Any] = {"step": step, "kind": kind, **({"phase": self.phase} if self.phase else {})}
            if kind == "train":
                row.update((name, _clean(rest.get(name))) for name in SECTION6_METRICS)
                row[SKIPPED_NONFINITE] = 1.0 if rest.get(SKIPPED_NONFINITE) else 0.0
            for name, value in sorted(rest.items()):
                if name not in row:
                    row[name] = _clean(value)
            rows.append(row)
        if evals or kind == "eval":
            phase = {"phase": self.phase} if self.phase is not None else {}
            rows.append({"step": step, "kind": "eval", **phase, **{k: _clean(v) for k, v in sorted(evals.items())}})
        for row in rows:
            self._file.write(json.dumps(row) + "\n")
            self.trackers.log(step, row)
        self._file.flush()
        record = rows[0]
        if kind != "eval":  # the bar counts steps; an evaluation prints its own lines (agent_rl.eval.training)
            shown = {short: f"{record[k]:.3g}" for k, short in BAR_KEYS.items() if record.get(k) is not None}
            if record.get(SKIPPED_NONFINITE):
                shown["update"] = "skipped_nonfinite"
            if self._bar is not None:
                self._bar.set_postfix(shown, refresh=False)
                self._bar.update(1)
            else:
                print(f"{STEP_WORDS.get(kind, 'step')} {step}: " + " ".join(f"{k}={v}" for k, v in shown.items()),
                      file=sys.stderr, flush=True)
        return record

    def checkpoint(self, step: int, path: Path) -> None:
        """Checkpoint ``path`` of ``step`` was written: its path to the trackers (W&B summary, MLflow tag)."""
        self.trackers.checkpoint(step, path)

    def close(self) -> None:
        """Close the file and the phase's TensorBoard tracker (the run's trackers stay open: their owner's)."""
        self._file.close()
        if self._tb is not None:
            self.trackers.detach(self._tb)
        if self._bar is not None:
            self._bar.close()
