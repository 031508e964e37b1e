"""ALFWorld env in-process: the cost of starting a game (cold / cached), step speed with and without the TextWorld
patches, and resident memory over many resets. Prints tables; asserts nothing.

    OMP_NUM_THREADS=1 python benchmarks/bench_alfworld_env.py                 # all parts
    python benchmarks/bench_alfworld_env.py --part memory --resets 200 --games 20

Times are CPU seconds of this process (``time.process_time``) and wall seconds; the machine may be shared.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Timer:
    def __enter__(self) -> "Timer":
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu, self.wall = time.process_time() - self.cpu, time.perf_counter() - self.wall


def bench_load(n_games: int) -> None:
    """Start each of ``n_games`` games: cold, again in the same env, in a fresh env, and from the disk cache only."""
    from envs.alfworld import speedups
    from envs.alfworld.data import list_games
    from envs.alfworld.env import ALFWorldEnv

    def clear_memory_caches() -> None:  # what a fresh process starts with
        speedups.SAS_CACHE.clear()
        for cache in speedups.PARSE_CACHES.values():
            cache.clear()

    games = list_games("valid_unseen")[:: max(1, 134 // n_games)][:n_games]
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in ("cold", "same env", "new env", "disk only")}
    saved = os.environ.get("AGENT_RL_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["AGENT_RL_CACHE"] = tmp  # an empty on-disk translation cache (games are passed by path)
        try:
            for gamefile in games:
                clear_memory_caches()
                env = ALFWorldEnv(expert=True)
                for case, target in (("cold", env), ("same env", env), ("new env", ALFWorldEnv(expert=True))):
                    with Timer() as t:
                        target.reset(options={"gamefile": gamefile})
                    rows[case].append((t.cpu, t.wall))
                    if target is not env:
                        target.close()
                clear_memory_caches()
                third = ALFWorldEnv(expert=True)
                with Timer() as t:
                    third.reset(options={"gamefile": gamefile})
                rows["disk only"].append((t.cpu, t.wall))
                third.close()
                env.close()
        finally:
            if saved is None:
                os.environ.pop("AGENT_RL_CACHE", None)
            else:
                os.environ["AGENT_RL_CACHE"] = saved
    print(f"\nStarting a game (reset), {n_games} valid_unseen games, expert=True")
    print(f"{'case':12s} {'cpu mean s':>10s} {'cpu max s':>10s} {'wall mean s':>11s} {'cpu vs cold':>11s}")
    cold = statistics.mean(c for c, _ in rows["cold"])
    for name, values in rows.items():
        cpu = [c for c, _ in values]
        print(f"{name:12s} {statistics.mean(cpu):10.3f} {max(cpu):10.3f} "
              f"{statistics.mean(w for _, w in values):11.3f} {statistics.mean(cpu) / cold:11.3f}")


def bench_steps(n_games: int, n_steps: int) -> None:
    """Steps/s of random admissible actions, TextWorld patched (memoised parsing) versus original."""
    import numpy as np

    from envs.alfworld import patches
    from envs.alfworld.env import ALFWorldEnv

    results = {}
    for label, install in (("original", False), ("patched", True)):
        (patches.install if install else patches.uninstall)()
        env = ALFWorldEnv(expert=False)
        for timed in (False, True):  # pass 1 warms the parse caches (steady state of a long run), pass 2 is timed
            rng = np.random.default_rng(0)
            cpu = wall = 0.0
            steps = 0
            for index in range(n_games):
                _, info = env.reset(options={"split": "valid_unseen", "index": 11 * index})
                for _ in range(n_steps):
                    action = info["admissible_actions"][int(rng.integers(len(info["admissible_actions"])))]
                    with Timer() as t:
                        _, _, terminated, _, info = env.step(action)
                    cpu, wall, steps = cpu + t.cpu, wall + t.wall, steps + 1
                    if terminated:
                        break
        env.close()
        results[label] = (steps / cpu, steps / wall, steps)
    patches.install()
    print(f"\nSteps (random admissible actions, {n_games} games x up to {n_steps} steps, expert=False, 2nd pass)")
    print(f"{'textworld':10s} {'steps':>6s} {'steps/cpu-s':>12s} {'steps/wall-s':>13s}")
    for label, (per_cpu, per_wall, steps) in results.items():
        print(f"{label:10s} {steps:6d} {per_cpu:12.1f} {per_wall:13.1f}")
    print(f"speed-up (cpu): {results['patched'][0] / results['original'][0]:.2f}x")


def bench_memory(n_resets: int, n_games: int, steps: int) -> None:
    """RSS over ``n_resets`` resets cycling over ``n_games`` games: one long-lived env, and a new env per reset."""
    from envs.alfworld.data import list_games
    from envs.alfworld.env import ALFWorldEnv

    games = list_games("valid_unseen")[:: max(1, 134 // n_games)][:n_games]
    print(f"\nResident memory (MB) over {n_resets} resets cycling over {len(games)} valid_unseen games, "
          f"up to {steps} expert steps each, expert=True")
    for mode in ("one env", "env per reset"):
        env = ALFWorldEnv(expert=True) if mode == "one env" else None
        marks: dict[int, float] = {}
        start = time.perf_counter()
        for i in range(n_resets + 1):
            if i % max(1, n_resets // 8) == 0 or i == n_resets:
                gc.collect()
                marks[i] = rss_mb()
            if i == n_resets:
                break
            current = env if env is not None else ALFWorldEnv(expert=True)
            _, info = current.reset(seed=i, options={"gamefile": games[i % len(games)]})
            for _ in range(steps):
                _, _, terminated, _, info = current.step(info["expert_action"])
                if terminated:
                    break
            if env is None:
                current.close()
        if env is not None:
            env.close()
        # Growth after the first pass over the games (the caches are warm then) is what a leak would show.
        warm = [v for k, v in marks.items() if k >= len(games)]
        print(f"{mode:14s} " + "  ".join(f"{k}:{v:.0f}" for k, v in marks.items())
              + f"   growth after warm-up: {warm[-1] - warm[0]:+.1f} MB   ({time.perf_counter() - start:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["all", "load", "steps", "memory"], default="all")
    parser.add_argument("--load-games", type=int, default=5)
    parser.add_argument("--step-games", type=int, default=4)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--resets", type=int, default=200)
    parser.add_argument("--games", type=int, default=20, help="distinct games in the memory loop")
    parser.add_argument("--mem-steps", type=int, default=5)
    args = parser.parse_args()
    import envs  # noqa: F401

    print(f"python {sys.version.split()[0]}, pid {os.getpid()}, start RSS {rss_mb():.0f} MB")
    if args.part in ("all", "load"):
        bench_load(args.load_games)
    if args.part in ("all", "steps"):
        bench_steps(args.step_games, args.steps)
    if args.part in ("all", "memory"):
        bench_memory(args.resets, args.games, args.mem_steps)


if __name__ == "__main__":
    main()
