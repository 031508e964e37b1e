"""Play the TextWorld expert (or the stored walkthroughs) on generated games; print success per family/level.

In-process (default), through a running env server (``--url``), or through one this script starts (``--serve``):

    python scripts/eval_textworld_expert.py --games coin_collector:5,treasure_hunter:10,cooking:5 --num 50
    python scripts/eval_textworld_expert.py --games cooking:8 --num 50 --serve --concurrency 8
    python scripts/eval_textworld_expert.py --games treasure_hunter:20 --deviate 3   # planner after 3 random moves

``--deviate K`` first plays K uniformly random moves (``go``/``look``/``inventory``/``examine``: seeded per game),
so the expert has left the walkthrough and ``info["expert_action"]`` comes from TextWorld's planner. Games are
generated into the cache when missing. Each game is played once within the id's ``TimeLimit`` (100 steps). The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from servers.wait import ServerExited, wait_healthy  # noqa: E402

ENV_ID = "agent_rl/TextWorld-v0"
SAFE = ("go ", "look", "inventory", "examine")


def _action(policy: str, info: dict[str, Any], walkthrough: list[str], t: int, rng: random.Random, deviate: int) -> str:
    if t < deviate:  # moves that cannot lose the game (taking a wrong object loses a treasure hunt)
        return rng.choice([a for a in info["admissible_actions"] if a.startswith(SAFE)])
    if policy == "expert":
        return info["expert_action"]
    return walkthrough[t] if t < len(walkthrough) else "look"


def play_in_process(family: str, level: int, split: str, indices: list[int], policy: str,
                    deviate: int) -> list[dict[str, Any]]:
    import gymnasium

    import envs  # noqa: F401  (registers the ids)

    env = gymnasium.make(ENV_ID, family=family, level=level, expert=policy == "expert")
    results = []
    try:
        for index in indices:
            rng = random.Random(index)
            obs, info = env.reset(options={"split": split, "index": index})
            walkthrough, steps, done = info["walkthrough"], 0, False
            while not done:
                obs, reward, terminated, truncated, info = env.step(
                    _action(policy, info, walkthrough, steps, rng, deviate))
                steps += 1
                done = terminated or truncated
            results.append({"task_id": info["task_id"], "won": bool(info["won"]), "steps": steps,
                            "walkthrough_len": len(walkthrough)})
    finally:
        env.close()
    return results


async def play_over_http(url: str, family: str, level: int, split: str, indices: list[int], policy: str,
                         deviate: int, concurrency: int) -> list[dict[str, Any]]:
    from agent_rl.envclient import HTTPEnvPool

    pool = HTTPEnvPool([u.strip() for u in url.split(",") if u.strip()])
    semaphore = asyncio.Semaphore(concurrency)
    results: list[dict[str, Any]] = []

    async def one(index: int) -> None:
        async with semaphore:
            rng = random.Random(index)
            r = await pool.reset(ENV_ID, options={"split": split, "index": index},
                                 env_kwargs={"family": family, "level": level, "expert": policy == "expert"})
            info, walkthrough, steps, done = r.info, r.info["walkthrough"], 0, False
            try:
                while not done:
                    s = await pool.step(r.session_id, _action(policy, info, walkthrough, steps, rng, deviate))
                    info, steps, done = s.info, steps + 1, s.terminated or s.truncated
            finally:
                await pool.close(r.session_id)
            results.append({"task_id": info["task_id"], "won": bool(info["won"]), "steps": steps,
                            "walkthrough_len": len(walkthrough)})

    try:
        await asyncio.gather(*(one(i) for i in indices))
    finally:
        await pool.aclose()
    return results


def start_server(port: int) -> subprocess.Popen:
    """``python -m servers.serve --env agent_rl/TextWorld-v0`` on 127.0.0.1:``port``, waited for ``/health``."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "servers.serve", "--env", ENV_ID, "--port", str(port),
                             "--log-level", "warning"], cwd=REPO, env=env)
    try:
        wait_healthy([f"http://127.0.0.1:{port}"], timeout_s=120, interval_s=0.3, process=proc)
    except (TimeoutError, ServerExited):
        proc.terminate()
        raise
    return proc


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", default="coin_collector:5,treasure_hunter:10,cooking:5",
                        help="comma-separated family:level pairs")
    parser.add_argument("--split", default="test", choices=["train", "valid", "test"])
    parser.add_argument("--num", type=int, default=50, help="games 0..NUM-1 of the split")
    parser.add_argument("--policy", default="expert", choices=["expert", "walkthrough"])
    parser.add_argument("--deviate", type=int, default=0, help="random admissible actions played first")
    parser.add_argument("--url", default=None, help="env server URL(s), comma-separated; default: in-process")
    parser.add_argument("--serve", action="store_true", help="start an env server for the run and play over HTTP")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent sessions over HTTP")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from envs.textworld.games import generate

    pairs = [(p.split(":")[0], int(p.split(":")[1])) for p in args.games.split(",") if p.strip()]
    indices = list(range(args.num))
    server = start_server(args.port) if args.serve else None
    url = f"http://127.0.0.1:{args.port}" if server else args.url
    rows, summary = [], {}
    try:
        for family, level in pairs:
            t0 = time.perf_counter()
            generate(family, level, args.split, args.num)  # cached after the first run
            gen_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            if url:
                results = asyncio.run(play_over_http(url, family, level, args.split, indices, args.policy,
                                                     args.deviate, args.concurrency))
            else:
                results = play_in_process(family, level, args.split, indices, args.policy, args.deviate)
            play_s = time.perf_counter() - t0
            won = sum(r["won"] for r in results)
            lost = sorted(r["task_id"] for r in results if not r["won"])
            key = f"{family}:{level}"
            summary[key] = {"won": won, "games": len(results), "success": won / max(len(results), 1),
                            "mean_steps": sum(r["steps"] for r in results) / max(len(results), 1),
                            "mean_walkthrough": sum(r["walkthrough_len"] for r in results) / max(len(results), 1),
                            "generate_s": round(gen_s, 1), "play_s": round(play_s, 1), "lost": lost}
            rows.append((key, won, len(results), summary[key]["mean_steps"], summary[key]["mean_walkthrough"],
                         gen_s, play_s))
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    where = f"HTTP {url}" if url else "in-process"
    print(f"\n{args.policy} (deviate {args.deviate}) on {args.split}, {where}")
    print(f"{'family:level':22s} {'won':>4s} {'games':>5s} {'steps':>6s} {'walkthr':>7s} {'gen s':>6s} {'play s':>6s}")
    for key, won, n, steps, walk, gen_s, play_s in rows:
        print(f"{key:22s} {won:4d} {n:5d} {steps:6.1f} {walk:7.1f} {gen_s:6.1f} {play_s:6.1f}")
    out = {"split": args.split, "policy": args.policy, "deviate": args.deviate, "where": where, "results": summary}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
