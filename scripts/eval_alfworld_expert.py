"""Play ALFWorld's (fixed) handcoded expert, or the stored walkthroughs, on a split; print success per task type.

In-process (default) or through an env server (``--url``, using ``agent_rl.envclient.HTTPEnvPool``):

    python scripts/eval_alfworld_expert.py --split valid_unseen
    python scripts/eval_alfworld_expert.py --split valid_seen --url http://127.0.0.1:8001 --concurrency 8
    python scripts/eval_alfworld_expert.py --split valid_unseen --policy walkthrough --limit 30

Each game is played once within the 50-step ``TimeLimit`` of ``agent_rl/ALFWorld-v0``. Exit status 0; the last
line is a JSON summary (``{"split", "policy", "won", "games", "success", "per_task_type", "wall_s"}``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

ENV_ID = "agent_rl/ALFWorld-v0"


def _next_action(policy: str, info: dict[str, Any], walkthrough: list[str], t: int) -> str:
    """The action at turn ``t`` (0-based): the expert's, or the stored walkthrough's (``look`` once it runs out)."""
    if policy == "expert":
        return info["expert_action"]
    return walkthrough[t] if t < len(walkthrough) else "look"


def play_in_process(split: str, indices: list[int], policy: str, max_steps: int, seed: int) -> list[dict[str, Any]]:
    """Play games ``indices`` of ``split`` in one in-process env (game ``i`` with seed ``seed + i``)."""
    import gymnasium

    import envs  # noqa: F401  (registers the ids)

    env = gymnasium.make(ENV_ID, expert=policy == "expert", max_episode_steps=max_steps)
    results = []
    try:
        for index in indices:
            obs, info = env.reset(seed=seed + index, options={"split": split, "index": index})
            walkthrough = info["walkthrough"]
            steps, won, done = 0, False, False
            while not done:
                obs, reward, terminated, truncated, info = env.step(_next_action(policy, info, walkthrough, steps))
                steps += 1
                won, done = bool(info["won"]), terminated or truncated
            results.append({"index": index, "task_type": info["task_type"], "task_id": info["task_id"],
                            "won": won, "steps": steps})
            print(f"[{len(results)}/{len(indices)}] {'WON ' if won else 'LOST'} {steps:2d} steps  {info['task_id']}",
                  flush=True)
    finally:
        env.close()
    return results


async def play_over_http(
    url: str, split: str, indices: list[int], policy: str, concurrency: int, seed: int
) -> list[dict[str, Any]]:
    """Play games ``indices`` of ``split`` through env servers at ``url`` (comma-separated) with the async client
    (game ``i`` with seed ``seed + i``)."""
    from agent_rl.envclient import HTTPEnvPool

    pool = HTTPEnvPool([u.strip() for u in url.split(",") if u.strip()])
    semaphore = asyncio.Semaphore(concurrency)
    results: list[dict[str, Any]] = []

    async def one(index: int) -> None:
        async with semaphore:
            r = await pool.reset(ENV_ID, seed=seed + index, options={"split": split, "index": index},
                                 env_kwargs={"expert": policy == "expert"})
            info, walkthrough = r.info, r.info["walkthrough"]
            steps, won, done = 0, False, False
            try:
                while not done:
                    s = await pool.step(r.session_id, _next_action(policy, info, walkthrough, steps))
                    info = s.info
                    steps += 1
                    won, done = bool(info["won"]), s.terminated or s.truncated
            finally:
                await pool.close(r.session_id)
            results.append({"index": index, "task_type": info["task_type"], "task_id": info["task_id"],
                            "won": won, "steps": steps})
            print(f"[{len(results)}/{len(indices)}] {'WON ' if won else 'LOST'} {steps:2d} steps  {info['task_id']}",
                  flush=True)

    try:
        await asyncio.gather(*(one(i) for i in indices))
    finally:
        await pool.aclose()
    return sorted(results, key=lambda r: r["index"])


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"won", "games", "success", "per_task_type": {type: {"won", "games", "success"}}}`` (success in [0, 1])."""
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        per[r["task_type"]][0] += int(r["won"])
        per[r["task_type"]][1] += 1
    won, games = sum(int(r["won"]) for r in results), len(results)
    return {
        "won": won,
        "games": games,
        "success": won / games if games else 0.0,
        "per_task_type": {t: {"won": w, "games": n, "success": w / n} for t, (w, n) in sorted(per.items())},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="valid_unseen", choices=["train", "valid_seen", "valid_unseen", "valid_train"])
    parser.add_argument("--url", default=None, help="env server URL(s), comma-separated; default: in-process")
    parser.add_argument("--limit", type=int, default=None, help="play only the first N games (sorted by path)")
    parser.add_argument("--indices", default=None, help="comma-separated game indices (overrides --limit)")
    parser.add_argument("--policy", default="expert", choices=["expert", "walkthrough"])
    parser.add_argument("--max-steps", type=int, default=50, help="turn limit (TimeLimit), in-process only")
    parser.add_argument("--seed", type=int, default=0, help="game i is reset with seed SEED + i (expert tie-breaks)")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent sessions over HTTP")
    args = parser.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from envs.alfworld.data import list_games  # no alfworld import

    n_games = len(list_games(args.split))
    if args.indices:
        indices = [int(i) for i in args.indices.split(",")]
    else:
        indices = list(range(n_games if args.limit is None else min(args.limit, n_games)))

    start = time.perf_counter()
    if args.url:
        results = asyncio.run(play_over_http(args.url, args.split, indices, args.policy, args.concurrency, args.seed))
    else:
        results = play_in_process(args.split, indices, args.policy, args.max_steps, args.seed)
    wall = time.perf_counter() - start

    summary = summarize(results)
    print(f"\n{args.policy} on {args.split} ({'HTTP ' + args.url if args.url else 'in-process'}): "
          f"{summary['won']}/{summary['games']} = {100 * summary['success']:.1f}%  in {wall:.0f} s")
    print(f"{'task type':34s} {'won':>5s} {'games':>5s} {'success':>8s}")
    for task_type, s in summary["per_task_type"].items():
        print(f"{task_type:34s} {s['won']:5d} {s['games']:5d} {100 * s['success']:7.1f}%")
    lost = [r["task_id"] for r in results if not r["won"]]
    if lost:
        print("lost:", *lost, sep="\n  ")
    summary.update(split=args.split, policy=args.policy, seed=args.seed, wall_s=round(wall, 1), lost=lost)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
