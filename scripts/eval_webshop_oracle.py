"""Run the scripted WebShop oracle on the goals of a split and report score and success per category.

    python scripts/eval_webshop_oracle.py                       # starts a local env server, 500 val goals over HTTP
    python scripts/eval_webshop_oracle.py --url http://127.0.0.1:8002
    python scripts/eval_webshop_oracle.py --in-process          # no server: the env in this process

Acceptance (issue 5): mean score >= 0.99 and success >= 0.95 on the 500 ``val`` goals through the HTTP server
(the reference implementation's own oracle: 0.994 / 0.96). Goals the oracle cannot complete are listed with the
reason (which reward factor fell short, and why). Exit status 1 when a threshold is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from servers.wait import ServerExited, wait_healthy  # noqa: E402

ENV_ID = "agent_rl/WebShop-v0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, workers: int, max_sessions: int) -> subprocess.Popen:
    """``python -m servers.serve`` for WebShop with the catalog prebuilt in the forkserver; waits for /health."""
    cmd = [
        sys.executable, "-m", "servers.serve", "--env", ENV_ID, "--import", "envs.webshop.preload",
        "--port", str(port), "--workers", str(workers), "--max-sessions", str(max_sessions),
        "--prestart-workers", str(workers), "--log-level", "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_healthy([f"http://127.0.0.1:{port}"], timeout_s=120, interval_s=0.3, process=proc)
    except (TimeoutError, ServerExited):
        proc.terminate()
        raise
    return proc


async def run_http(url: str, goal_ids: list[int], goals: list[dict[str, Any]], concurrency: int) -> list[dict]:
    """Oracle episodes through ``HTTPEnvPool`` (one session per episode, ``concurrency`` at once)."""
    from agent_rl.envclient import HTTPEnvPool
    from envs.webshop.oracle import OraclePolicy, describe_shortfall

    semaphore = asyncio.Semaphore(concurrency)

    async def episode(pool: HTTPEnvPool, goal_idx: int) -> dict[str, Any]:
        async with semaphore:
            reset = await pool.reset(ENV_ID, options={"goal_idx": goal_idx})
            policy = OraclePolicy(goals[goal_idx])
            info, reward, terminated, steps = reset.info, 0.0, False, 0
            try:
                while True:
                    result = await pool.step(reset.session_id, policy.act(info))
                    steps += 1
                    info, reward, terminated = result.info, result.reward, result.terminated
                    if result.terminated or result.truncated:
                        break
            finally:
                await pool.close(reset.session_id)
            failure = policy.failure
            if not terminated:
                failure = failure or f"no purchase within {steps} steps"
            elif reward < 1.0 and failure is None:
                failure = describe_shortfall(info.get("reward_details") or {}, goals[goal_idx],
                                             info.get("selected_options") or {})
            return {"goal_idx": goal_idx, "score": float(reward) if terminated else 0.0,
                    "won": bool(terminated and reward == 1.0), "steps": steps, "failure": failure}

    async with HTTPEnvPool(url, max_connections=max(8, concurrency)) as pool:
        return list(await asyncio.gather(*(episode(pool, i) for i in goal_ids)))


def run_in_process(goal_ids: list[int]) -> list[dict[str, Any]]:
    import gymnasium as gym

    import envs  # noqa: F401
    from envs.webshop.oracle import run_oracle

    env = gym.make(ENV_ID)
    return [run_oracle(env, i) for i in goal_ids]


def report(results: list[dict[str, Any]], goals: list[dict[str, Any]]) -> tuple[float, float]:
    """Print score/success per category, then the failures; return (mean score, success rate)."""
    by_category: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_category[goals[r["goal_idx"]]["category"]].append(r)
    print(f"{'category':<16}{'goals':>7}{'score':>9}{'success':>9}")
    for category in sorted(by_category):
        rs = by_category[category]
        print(f"{category:<16}{len(rs):>7}{sum(r['score'] for r in rs) / len(rs):>9.4f}"
              f"{sum(r['won'] for r in rs) / len(rs):>9.3f}")
    score = sum(r["score"] for r in results) / len(results)
    success = sum(r["won"] for r in results) / len(results)
    steps = sum(r["steps"] for r in results) / len(results)
    print(f"{'all':<16}{len(results):>7}{score:>9.4f}{success:>9.3f}   (mean steps {steps:.2f})")
    failed = [r for r in results if not r["won"]]
    print(f"\nGoals the oracle does not complete with score 1 ({len(failed)}):")
    for r in failed:
        print(f"  goal {r['goal_idx']:>4}  score {r['score']:.4f}  {r['failure']}")
    return score, success


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="an running env server serving agent_rl/WebShop-v0 (default: start one)")
    p.add_argument("--in-process", action="store_true", help="run the env in this process (no HTTP)")
    p.add_argument("--split", default="val", choices=["val", "train", "all"])
    p.add_argument("--limit", type=int, default=None, help="first N goals of the split only")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight over HTTP")
    p.add_argument("--workers", type=int, default=2, help="worker processes of the started server")
    p.add_argument("--out", type=Path, help="write the per-goal results as JSON here")
    p.add_argument("--min-score", type=float, default=0.99)
    p.add_argument("--min-success", type=float, default=0.95)
    args = p.parse_args(argv)

    from envs.webshop.catalog import get_catalog
    from envs.webshop.env import VAL_GOALS

    goals = get_catalog().goals
    ranges = {"val": range(VAL_GOALS), "train": range(VAL_GOALS, len(goals)), "all": range(len(goals))}
    goal_ids = list(ranges[args.split])[: args.limit]
    t0 = time.time()
    if args.in_process:
        mode = "in-process"
        results = run_in_process(goal_ids)
    else:
        server = None
        url = args.url
        if url is None:
            port = _free_port()
            server = start_server(port, workers=args.workers, max_sessions=max(16, args.concurrency))
            url = f"http://127.0.0.1:{port}"
        mode = f"HTTP {url}"
        try:
            results = asyncio.run(run_http(url, goal_ids, goals, args.concurrency))
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
    elapsed = time.time() - t0
    print(f"WebShop oracle, {args.split} split, {len(goal_ids)} goals, {mode}, {elapsed:.1f} s\n")
    score, success = report(results, goals)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    ok = score >= args.min_score and success >= args.min_success
    print(f"\nacceptance (score >= {args.min_score}, success >= {args.min_success}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
