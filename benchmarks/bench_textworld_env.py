"""TextWorld env in-process (``agent_rl/TextWorld-v0``): game generation, reset (a new game / the same game again),
step cost with and without the expert, and resident memory over many resets. Prints tables; asserts nothing.

    OMP_NUM_THREADS=1 python benchmarks/bench_textworld_env.py --games coin_collector:5,treasure_hunter:10,cooking:5
    python benchmarks/bench_textworld_env.py --part memory --resets 500 --num 20

Games are the test split's first ``--num`` (generated into the cache when missing; generation time is read from each
game's ``meta.json``). Times are wall milliseconds and CPU milliseconds of this process (the machine may be shared).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

ENV_ID = "agent_rl/TextWorld-v0"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, 1e3 * (time.perf_counter() - wall), 1e3 * (time.process_time() - cpu)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def bench_family(family: str, level: int, num: int, steps: int) -> dict[str, float]:
    import gymnasium

    import envs  # noqa: F401
    from envs.textworld.games import generate

    records = generate(family, level, "test", num)
    gen_s = [r.meta.get("generate_s", float("nan")) for r in records]
    row: dict[str, float] = {"generate_s": med(gen_s), "z8_kb": med([r.path.stat().st_size / 1024 for r in records])}
    rng = random.Random(0)
    for expert in (False, True):
        env = gymnasium.make(ENV_ID, family=family, level=level, expert=expert)
        new_game, same_game, step_wall, step_cpu, walk = [], [], [], [], []
        for i in range(num):
            (_, info), wall, _ = timed(lambda: env.reset(options={"split": "test", "index": i}))
            new_game.append(wall)
            (_, info), wall, _ = timed(lambda: env.reset(options={"split": "test", "index": i}))
            same_game.append(wall)
            walk.append(len(info["walkthrough"]))
            for _ in range(steps):
                action = rng.choice(info["admissible_actions"])
                (_, _, term, trunc, info), wall, cpu = timed(lambda: env.step(action))
                step_wall.append(wall)
                step_cpu.append(cpu)
                if term or trunc:
                    break
        env.close()
        tag = "expert" if expert else "plain"
        row[f"reset_new_ms_{tag}"] = med(new_game)
        row[f"reset_same_ms_{tag}"] = med(same_game)
        row[f"step_ms_{tag}"] = med(step_wall)
        row[f"step_cpu_ms_{tag}"] = med(step_cpu)
        row["walkthrough_len"] = med(walk)
    return row


def bench_memory(family: str, level: int, num: int, resets: int, steps: int) -> list[tuple[int, float]]:
    import gymnasium

    import envs  # noqa: F401
    from envs.textworld.games import generate

    generate(family, level, "test", num)
    env = gymnasium.make(ENV_ID, family=family, level=level, expert=True)
    rng = random.Random(0)
    points = [(0, rss_mb())]
    for k in range(1, resets + 1):
        _, info = env.reset(options={"split": "test", "index": rng.randrange(num)})
        for _ in range(steps):
            _, _, term, trunc, info = env.step(rng.choice(info["admissible_actions"]))
            if term or trunc:
                break
        if k % max(1, resets // 5) == 0:
            gc.collect()
            points.append((k, rss_mb()))
    env.close()
    return points


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", default="coin_collector:5,treasure_hunter:10,cooking:5", help="family:level,...")
    p.add_argument("--num", type=int, default=20, help="test-split games per family/level")
    p.add_argument("--steps", type=int, default=20, help="random admissible steps per game")
    p.add_argument("--part", choices=["all", "steps", "memory"], default="all")
    p.add_argument("--resets", type=int, default=300, help="memory part: resets (random games, 5 steps each)")
    args = p.parse_args()
    pairs = [(x.split(":")[0], int(x.split(":")[1])) for x in args.games.split(",") if x]
    if args.part in ("all", "steps"):
        print(f"\nper family/level, median over {args.num} test games x {args.steps} random steps "
              "(plain = expert off; expert = info['expert_action'] each step)")
        head = (f"{'family:level':22s} {'gen s':>6s} {'z8 KB':>6s} {'walk':>5s} {'reset new':>9s} {'reset same':>10s} "
                f"{'step ms':>7s} {'step cpu':>8s} {'reset new+exp':>13s} {'step ms+exp':>11s}")
        print(head)
        for family, level in pairs:
            r = bench_family(family, level, args.num, args.steps)
            name = f"{family}:{level}"
            print(f"{name:22s} {r['generate_s']:6.2f} {r['z8_kb']:6.0f} {r['walkthrough_len']:5.0f} "
                  f"{r['reset_new_ms_plain']:9.1f} {r['reset_same_ms_plain']:10.1f} {r['step_ms_plain']:7.2f} "
                  f"{r['step_cpu_ms_plain']:8.2f} {r['reset_new_ms_expert']:13.1f} {r['step_ms_expert']:11.2f}",
                  flush=True)
    if args.part in ("all", "memory"):
        family, level = pairs[-1]
        points = bench_memory(family, level, args.num, args.resets, 5)
        print(f"\nRSS of one env ({family}:{level}, expert) over {args.resets} resets of {args.num} games, "
              "5 steps each:")
        print("  " + "  ".join(f"{k}: {mb:.0f} MB" for k, mb in points))


if __name__ == "__main__":
    main()
