"""What a forked sibling's start costs (``rollout.fork``, issue 40): replaying the base's actions against copying the
game's state, on TextWorld.

A sibling forked at turn t of its base needs the env at the base's state after t actions. agent_rl replays them on a
fresh session (a reset and t steps, each checked against the base's turn). The alternative an env could offer is a
state copy (``clone_state`` / ``set_state``); TextWorld has one, ``copy()`` of its running game (a new Z-machine
interpreter set to the same memory, plus copies of TextWorld's quest trackers). Because the fork turn is chosen
after the base episode ends (``select=entropy|js|divergence`` read the whole episode), a copy would have to be taken
at every turn of every base, and one more for each sibling. This measures, on one game (the walkthrough's actions):
a reset, a step, a ``copy()`` of the game at its current state, and the resident memory one kept copy adds.

    OMP_NUM_THREADS=1 python benchmarks/bench_fork_restore.py --family coin_collector --level 5 --copies 20

Prints a table and JSON; asserts nothing. (ALFWorld keeps its game state inside the fast_downward PDDL library,
which has no copy: a sibling can only replay there.)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_mb() -> float:
    """Resident memory of this process now (``/proc/self/statm``), MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="coin_collector")
    ap.add_argument("--level", type=int, default=5)
    ap.add_argument("--games", type=int, default=3, help="games 0..N-1 of the train split")
    ap.add_argument("--copies", type=int, default=20, help="copies kept to measure their memory")
    args = ap.parse_args()
    import gymnasium

    import envs  # noqa: F401  (registers the ids)

    resets, steps, copies = [], [], []
    env = gymnasium.make("agent_rl/TextWorld-v0", family=args.family, level=args.level).unwrapped
    for index in range(args.games):
        t0 = time.perf_counter()
        _, info = env.reset(seed=0, options={"index": index})
        resets.append(time.perf_counter() - t0)
        for action in info["walkthrough"][:-1]:  # stop before the winning move: the game stays running
            t0 = time.perf_counter()
            env.step(action)
            steps.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            copy = env._tw.copy()  # TextWorld's own copy of the running game (interpreter + trackers)
            copies.append(time.perf_counter() - t0)
            copy.close()
    before = rss_mb()
    kept = [env._tw.copy() for _ in range(args.copies)]
    per_copy = (rss_mb() - before) / max(len(kept), 1)
    for game in kept:
        game.close()
    env.close()
    ms = {name: 1000 * statistics.mean(v) for name, v in (("reset", resets), ("step", steps), ("copy", copies))}
    row = {"family": args.family, "level": args.level, "games": args.games, "steps_timed": len(steps),
           "reset_ms": round(ms["reset"], 2), "step_ms": round(ms["step"], 2), "copy_ms": round(ms["copy"], 2),
           # one copy to start a sibling costs as many replayed steps as this, before the copies of every base turn
           "copy_over_step": round(ms["copy"] / ms["step"], 1), "copy_mb": round(per_copy, 2)}
    print(" | ".join(row))
    print(" | ".join(str(v) for v in row.values()))
    print(json.dumps(row))


if __name__ == "__main__":
    main()
