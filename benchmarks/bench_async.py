"""Asynchronous rollouts, side by side (issue 23; algorithms.md section 7): the same training run at
``trainer.max_staleness`` = 0, 1, 2 on the local backend and on Ray (1 learner rank + 1 rollout worker).

    python benchmarks/bench_async.py                                  # choose_item, tiny, local and ray, k = 0 1 2
    python benchmarks/bench_async.py --env textworld --model smollm2 --steps 6 --backends ray
    python benchmarks/bench_async.py --extra rollout.partial=true --out results.json

Each configuration is one ``python -m agent_rl.train`` subprocess (its own Ray cluster, torch threads); the wall
time of a step is the time between two consecutive rows arriving in its ``metrics.jsonl`` (steps 2..N, so model
loading, Ray start-up and step 1's cold start are left out). Per configuration the table reports: wall per step
(mean over steps 2..N) and its ratio to k = 0 of the same backend, ``time/rollout_s`` (the time the step waited
for its groups), ``time/update_s``, ``time/overlap_s`` (rollouts running during the update), staleness mean/max
(``async/staleness_*``, trained tokens) and the groups discarded for staleness (``async/groups_stale_dropped``,
summed) and the event loop's longest stall over the run (``async/loop_stall_max_s``, k >= 1: a blocking call on
the loop stops every group in flight). At k = 0 it also reports the rollout and update shares of the step
(``rollout_s / wall``, ``update_s / wall``): the speed-up async can give is bounded by the smaller share.

On one machine both backends share its cores: the local backend runs rollout and update as two threads of one
process, Ray as two processes; the numbers are ratios on that machine, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def overrides(args: argparse.Namespace, backend: str, k: int, out: Path) -> list[str]:
    ov = [f"env={args.env}", f"model={args.model}", f"algo={args.algo}", "env_server.mode=local",
          f"trainer.backend={backend}", f"trainer.max_staleness={k}", f"trainer.total_steps={args.steps}",
          f"trainer.tasks_per_step={args.tasks_per_step}", f"rollout.max_turns={args.max_turns}",
          f"engine.max_new_tokens={args.max_new_tokens}", "trainer.progress=false", "trainer.loggers=[jsonl]",
          "trainer.save_episodes=none", "trainer.eval_every=0", f"trainer.save_every={args.steps}",
          f"trainer.output_dir={out}"]
    if backend == "ray":
        ov += ["trainer.num_learners=1", "rollout.num_workers=1"]
    return ov + list(args.extra)


def watch_rows(path: Path, stop: threading.Event, arrivals: list[float]) -> None:
    """Append the arrival time of every new line of ``path`` until ``stop``."""
    seen = 0
    while not stop.is_set():
        if path.is_file():
            n = path.read_text().count("\n")
            now = time.perf_counter()
            arrivals.extend([now] * max(0, n - seen))
            seen = max(seen, n)
        time.sleep(0.05)


def run_one(args: argparse.Namespace, backend: str, k: int, work: Path) -> dict[str, Any]:
    out = work / f"{backend}_k{k}"
    cmd = [sys.executable, "-m", "agent_rl.train", *overrides(args, backend, k, out)]
    arrivals: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch_rows, args=(out / "metrics.jsonl", stop, arrivals), daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    stop.set()
    watcher.join()
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"backend": backend, "k": k, "error": " | ".join(tail)}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("kind") == "train"]
    walls = [b - a for a, b in zip(arrivals, arrivals[1:])][: len(rows) - 1]  # steps 2..N

    def mean(key: str, rs: list[dict] = rows[1:] or rows) -> float:
        vals = [float(r.get(key, 0.0)) for r in rs]
        return sum(vals) / max(len(vals), 1)

    return {"backend": backend, "k": k, "wall_s": sum(walls) / max(len(walls), 1), "run_s": total,
            "rollout_s": mean("time/rollout_s"), "update_s": mean("time/update_s"),
            "overlap_s": mean("time/overlap_s"), "staleness_mean": mean("async/staleness_mean", rows),
            "staleness_max": max(float(r.get("async/staleness_max", 0.0)) for r in rows),
            "stale_dropped": sum(float(r.get("async/groups_stale_dropped", 0.0)) for r in rows),
            "loop_stall_max_s": max((float(r["async/loop_stall_max_s"]) for r in rows
                                     if "async/loop_stall_max_s" in r), default=float("nan")),
            "reward": mean("reward/mean", rows)}


def table(results: list[dict[str, Any]]) -> str:
    base = {r["backend"]: r["wall_s"] for r in results if r["k"] == 0 and "wall_s" in r}
    lines = [f"{'backend':8} {'k':>2} {'wall/step s':>11} {'x k=0':>6} {'rollout s':>9} {'update s':>8} "
             f"{'overlap s':>9} {'stale mean':>10} {'max':>4} {'discarded':>9} {'loop stall s':>12}  shares (k=0)"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['backend']:8} {r['k']:>2} failed: {r['error']}")
            continue
        ratio = r["wall_s"] / base[r["backend"]] if base.get(r["backend"]) else float("nan")
        shares = ""
        if r["k"] == 0 and r["wall_s"] > 0:
            shares = f"rollout {r['rollout_s'] / r['wall_s']:.2f}, update {r['update_s'] / r['wall_s']:.2f}"
        lines.append(f"{r['backend']:8} {r['k']:>2} {r['wall_s']:>11.2f} {ratio:>6.2f} {r['rollout_s']:>9.2f} "
                     f"{r['update_s']:>8.2f} {r['overlap_s']:>9.2f} {r['staleness_mean']:>10.2f} "
                     f"{r['staleness_max']:>4.0f} {r['stale_dropped']:>9.0f} {r['loop_stall_max_s']:>12.3f}  {shares}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--env", default="choose_item", help="env config (choose_item | textworld | alfworld | ...)")
    p.add_argument("--model", default="tiny", help="model config (tiny | smollm2)")
    p.add_argument("--algo", default="grpo")
    p.add_argument("--backends", default="local,ray", help="comma-separated: local, ray")
    p.add_argument("--ks", default="0,1,2", help="trainer.max_staleness values, comma-separated")
    p.add_argument("--steps", type=int, default=5, help="training steps per run (walls: steps 2..N)")
    p.add_argument("--tasks-per-step", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every run (key=value)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_async_") as tmp:
        for backend in [b for b in args.backends.split(",") if b]:
            for k in [int(x) for x in args.ks.split(",") if x != ""]:
                res = run_one(args, backend, k, Path(tmp))
                results.append(res)
                print(json.dumps(res), file=sys.stderr, flush=True)
    print(f"bench_async: env={args.env} model={args.model} algo={args.algo} steps={args.steps} "
          f"tasks_per_step={args.tasks_per_step} cores={os.cpu_count()}")
    print(table(results))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
