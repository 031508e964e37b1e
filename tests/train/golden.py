"""The golden synchronous runs of issue 23 (``trainer.max_staleness=0`` equals the code before asynchronous
rollouts): their overrides and the summary a fixture stores (deterministic metrics of every step, and per weight
tensor of the final checkpoint its float64 sum and sum of squares).

Recorded once, at the commit before asynchronous rollouts, into ``fixtures/golden_k0.json`` with
``python -m tests.train.golden OUT_JSON`` run from that commit's tree; ``test_async.py`` runs the same overrides on
today's code and compares exactly."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

#: every run's common overrides (one list: a key that must be pinned for the comparison is added here).
COMMON = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.total_steps=3",
          "trainer.tasks_per_step=2", "trainer.progress=false", "trainer.loggers=[jsonl]",
          "trainer.save_episodes=none"]

#: name -> the run's own overrides (GRPO; TGRL without warm-up: mixed-temperature groups with JS credit; the lr
#: warm-up counted in optimiser steps, as the preset did when the fixture was recorded: the preset now counts RL steps).
RUNS: dict[str, list[str]] = {
    "grpo": ["algo=grpo"],
    "tgrl": ["algo=tgrl", "algo.warmup_steps=0", "optim.warmup_unit=optimizer_step"],
}

#: metric prefixes that measure time or memory (not deterministic).
NONDETERMINISTIC = ("time/", "throughput/", "perf/")


def summarise(out: Path) -> dict[str, Any]:
    """``{"metrics": [per train step: {name: value}], "weights": {tensor name: [sum, sum of squares]}}`` of run
    directory ``out`` (timings left out; weights of ``checkpoints/step_<last>/model.safetensors`` in float64)."""
    from safetensors.torch import load_file

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metrics = [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)}
               for r in rows if r.get("kind") == "train"]
    last = max((p for p in (out / "checkpoints").glob("step_*")), key=lambda p: int(p.name.split("_")[1]))
    tensors = load_file(str(last / "model.safetensors"))
    weights = {k: [float(v.double().sum()), float(v.double().pow(2).sum())] for k, v in sorted(tensors.items())}
    return {"metrics": metrics, "weights": weights}


def run(name: str, out: Path, extra: list[str] = ()) -> dict[str, Any]:
    """Train golden run ``name`` into ``out`` (with ``extra`` overrides appended) and summarise it."""
    from agent_rl.train import main

    main([*COMMON, *RUNS[name], f"trainer.output_dir={out}", *extra])
    return summarise(out)


if __name__ == "__main__":
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in RUNS:
            result[name] = run(name, Path(tmp) / name)
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
