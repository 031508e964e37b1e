"""Compare two training runs step by step: ``metrics.jsonl`` (row by row, per kind and step: every metric both runs
log, except wall-clock times and throughputs) and the parameters of a checkpoint. Used to check that ``trainer.backend=ray`` with one learner and one
rollout worker reproduces ``trainer.backend=local`` (docs/scaling.md, Determinism)::

    python -m agent_rl.train env=choose_item model=tiny algo=tgrl trainer.total_steps=2 trainer.tasks_per_step=2 \\
        trainer.output_dir=DIR_LOCAL
    python -m agent_rl.train env=choose_item model=tiny algo=tgrl trainer.total_steps=2 trainer.tasks_per_step=2 \\
        trainer.backend=ray trainer.num_learners=1 rollout.num_workers=1 trainer.output_dir=DIR_RAY
    python scripts/compare_runs.py DIR_LOCAL DIR_RAY --checkpoint step_2

Prints one table row per differing metric (and the largest difference), the parameters' max |a - b|, and exits 1
when a difference exceeds ``--atol`` + ``--rtol`` * |a| (or a row/key/parameter is missing on one side), 2 when a
run directory has no ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from agent_rl.logging import read_metrics

#: metric name prefixes that measure wall-clock time or speed (never equal across runs)
TIMING_PREFIXES = ("time/", "throughput/", "perf/")


Row = tuple[str, int]  # (kind, step)


def load_metrics(run: Path) -> dict[Row, dict[str, Any]]:
    """``{(kind, step): row}`` of ``run/metrics.jsonl`` (``agent_rl.logging.read_metrics``: a repeated step's last
    row).

    Raises:
        FileNotFoundError: ``run`` has no ``metrics.jsonl``.
    """
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (not a training run directory?)")
    return {(r["kind"], r["step"]): r for r in read_metrics(path)}


def compare_metrics(a: dict[Row, dict[str, Any]], b: dict[Row, dict[str, Any]], *, atol: float, rtol: float,
                    only_common: bool = True) -> tuple[list[str], float, int]:
    """Problems (one line each), the largest |a - b| over numeric metrics, and how many values were compared.
    ``a``, ``b``: :func:`load_metrics` of each run.

    Keys logged by one run only are ignored with ``only_common`` (e.g. the Ray backend's ``rollout/weight_version``),
    but the rows (kind and step) must match."""
    problems: list[str] = []
    worst, count = 0.0, 0
    for kind in sorted({k for k, _ in a} | {k for k, _ in b}):
        sa, sb = sorted(s for k, s in a if k == kind), sorted(s for k, s in b if k == kind)
        if sa != sb:
            problems.append(f"{kind} steps differ: {sa} vs {sb}")
    for kind, step in sorted(set(a) & set(b)):
        ra, rb = a[kind, step], b[kind, step]
        keys = set(ra) & set(rb) if only_common else set(ra) | set(rb)
        for key in sorted(keys):
            if key.startswith(TIMING_PREFIXES) or key in ("step", "kind"):
                continue
            va, vb = ra.get(key), rb.get(key)
            if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)):
                if va != vb:
                    problems.append(f"{kind} step {step} {key}: {va!r} vs {vb!r}")
                continue
            count += 1
            if math.isnan(va) and math.isnan(vb):
                continue
            diff = abs(va - vb)
            worst = max(worst, diff)
            if not diff <= atol + rtol * abs(va):
                problems.append(f"{kind} step {step} {key}: {va!r} vs {vb!r} (|diff| {diff:.3g})")
    return problems, worst, count


def compare_checkpoints(a: Path, b: Path, *, atol: float) -> tuple[list[str], float, int]:
    """Problems, the largest |a - b| over every parameter of ``model*.safetensors`` in two checkpoint folders, and
    the number of tensors compared."""
    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in sorted(folder.glob("model*.safetensors")):
            out.update(load_file(str(f)))
        return out

    ta, tb = tensors(a), tensors(b)
    problems: list[str] = []
    if not ta:
        problems.append(f"no model*.safetensors in {a}")
    if set(ta) != set(tb):
        problems.append(f"parameter names differ: {sorted(set(ta) ^ set(tb))[:5]}")
    worst = 0.0
    for name in sorted(set(ta) & set(tb)):
        if ta[name].shape != tb[name].shape:
            problems.append(f"{name}: shape {tuple(ta[name].shape)} vs {tuple(tb[name].shape)}")
            continue
        diff = float((ta[name].double() - tb[name].double()).abs().max()) if ta[name].numel() else 0.0
        worst = max(worst, diff)
        if diff > atol:
            problems.append(f"{name}: max |diff| {diff:.3g} > {atol}")
    return problems, worst, len(set(ta) & set(tb))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--checkpoint", default="", help="checkpoint folder name under checkpoints/ (e.g. step_2)")
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--param-atol", type=float, default=1e-5)
    args = ap.parse_args(argv)
    try:
        metrics_a, metrics_b = load_metrics(args.run_a), load_metrics(args.run_b)
    except FileNotFoundError as exc:
        print(f"compare_runs: {exc}", file=sys.stderr)
        return 2
    problems, worst, n = compare_metrics(metrics_a, metrics_b, atol=args.atol, rtol=args.rtol)
    print(f"metrics: {n} values compared, max |diff| {worst:.3g}")
    if args.checkpoint:
        p2, w2, n2 = compare_checkpoints(args.run_a / "checkpoints" / args.checkpoint,
                                         args.run_b / "checkpoints" / args.checkpoint, atol=args.param_atol)
        print(f"checkpoint {args.checkpoint}: {n2} tensors compared, max |diff| {w2:.3g}")
        problems += p2
    for line in problems:
        print(f"DIFF {line}")
    print("same within tolerance" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
