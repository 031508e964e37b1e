"""Benchmark of ``agent_rl/WebShop-v0``: session creation, reset and step latency (p50/p99), steps/s at 1, 8 and
32 concurrent sessions, in-process and over HTTP (``servers.serve``), and memory per live session.

    OMP_NUM_THREADS=1 python benchmarks/bench_webshop.py                 # in-process + HTTP (starts a server)
    OMP_NUM_THREADS=1 python benchmarks/bench_webshop.py --no-http       # in-process only
    python benchmarks/bench_webshop.py --url http://127.0.0.1:8002       # HTTP against a running server

The load is the scripted oracle (search, result pages, product, options, buy; ~5 steps an episode) on the val goals,
so steps mix BM25 searches, page renders and reward computations. In-process, "N concurrent sessions" means N live
envs stepped in turn by one thread (the server's worker model); over HTTP, N episodes in flight at once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ENV_ID = "agent_rl/WebShop-v0"


def pct(values: list[float], q: float) -> float:
    """q-th percentile (0..100) of ``values`` in the same unit, nearest-rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def row(name: str, ms: list[float]) -> str:
    return f"{name:<44}{pct(ms, 50):>10.3f}{pct(ms, 99):>10.3f}{len(ms):>8}"


def bench_in_process(concurrency: list[int], steps: int, mode: str) -> list[str]:
    import gymnasium as gym

    import envs  # noqa: F401
    from envs.webshop.oracle import OraclePolicy

    lines = []
    t0 = time.perf_counter()
    first = gym.make(ENV_ID, observation_mode=mode)
    cold = (time.perf_counter() - t0) * 1000
    lines.append(f"first env (catalog + BM25 index build, once per process): {cold:.0f} ms")

    create = []
    for _ in range(200):
        t = time.perf_counter()
        gym.make(ENV_ID, observation_mode=mode)
        create.append((time.perf_counter() - t) * 1000)
    lines.append(f"{'in-process, mode=' + mode:<44}{'p50 ms':>10}{'p99 ms':>10}{'n':>8}")
    lines.append(row("session creation (gymnasium.make)", create))

    goals = first.unwrapped.catalog.goals
    for n in concurrency:
        sessions = [gym.make(ENV_ID, observation_mode=mode) for _ in range(n)]
        policies: list[Any] = [None] * n
        infos: list[Any] = [None] * n
        resets, step_ms = [], []
        next_goal = 0

        def start(i: int) -> None:
            nonlocal next_goal
            t = time.perf_counter()
            _, infos[i] = sessions[i].reset(options={"goal_idx": next_goal % 500})
            resets.append((time.perf_counter() - t) * 1000)
            policies[i] = OraclePolicy(goals[next_goal % 500])
            next_goal += 1

        for i in range(n):
            start(i)
        done = 0
        t_start = time.perf_counter()
        while done < steps:
            for i in range(n):
                action = policies[i].act(infos[i])
                t = time.perf_counter()
                _, _, terminated, truncated, infos[i] = sessions[i].step(action)
                step_ms.append((time.perf_counter() - t) * 1000)
                done += 1
                if terminated or truncated:
                    start(i)
        wall = time.perf_counter() - t_start
        lines.append(row(f"reset, {n} sessions", resets))
        lines.append(row(f"step, {n} sessions", step_ms) + f"   {done / wall:,.0f} steps/s (incl. resets)")
    return lines


def memory_per_session(n: int = 500) -> str:
    """Python heap (tracemalloc) held per live session after a reset and three steps."""
    import gymnasium as gym

    import envs  # noqa: F401

    gym.make(ENV_ID)  # catalog and index outside the measurement
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    live = []
    for i in range(n):
        env = gym.make(ENV_ID)
        env.reset(options={"goal_idx": i})
        env.step("search[shirt]")
        env.step("click[next >]")
        live.append(env)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    total = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return f"memory per live session (tracemalloc, {n} sessions after reset + 2 steps): {total / n / 1024:.1f} KiB"


async def bench_http(url: str, concurrency: list[int], steps: int) -> list[str]:
    from agent_rl.envclient import HTTPEnvPool
    from envs.webshop.catalog import get_catalog
    from envs.webshop.oracle import OraclePolicy

    goals = get_catalog().goals
    lines = [f"{'HTTP ' + url:<44}{'p50 ms':>10}{'p99 ms':>10}{'n':>8}"]
    async with HTTPEnvPool(url, max_connections=64) as pool:
        for n in concurrency:
            create, step_ms = [], []
            counter = {"steps": 0, "goal": 0}

            async def worker() -> None:
                while counter["steps"] < steps:
                    g = counter["goal"] % 500
                    counter["goal"] += 1
                    t = time.perf_counter()
                    reset = await pool.reset(ENV_ID, options={"goal_idx": g})
                    create.append((time.perf_counter() - t) * 1000)
                    policy, info = OraclePolicy(goals[g]), reset.info
                    try:
                        while True:
                            action = policy.act(info)
                            t = time.perf_counter()
                            result = await pool.step(reset.session_id, action)
                            step_ms.append((time.perf_counter() - t) * 1000)
                            counter["steps"] += 1
                            info = result.info
                            if result.terminated or result.truncated:
                                break
                    finally:
                        await pool.close(reset.session_id)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(n)))
            wall = time.perf_counter() - t0
            lines.append(row(f"session creation + reset, {n} concurrent", create))
            lines.append(row(f"step, {n} concurrent", step_ms) + f"   {len(step_ms) / wall:,.0f} steps/s (incl. resets)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="steps per concurrency level")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--mode", default="text", choices=["text", "text_rich", "llm"])
    p.add_argument("--no-http", action="store_true")
    p.add_argument("--no-in-process", action="store_true")
    p.add_argument("--url", help="a running server (default: start one with --workers)")
    p.add_argument("--workers", type=int, default=4, help="worker processes of the started server")
    args = p.parse_args(argv)

    if not args.no_in_process:
        print("\n".join(bench_in_process(args.concurrency, args.steps, args.mode)))
        print(memory_per_session())
    if args.no_http:
        return 0
    server = None
    url = args.url
    if url is None:
        sys.path.insert(0, str(REPO / "scripts"))
        from eval_webshop_oracle import _free_port, start_server

        port = _free_port()
        # sessions per worker are capped at 8 by the server: workers * 8 >= the largest concurrency
        workers = max(args.workers, -(-max(args.concurrency) // 8))
        server = start_server(port, workers=workers, max_sessions=max(64, max(args.concurrency)))
        url = f"http://127.0.0.1:{port}"
    try:
        print("\n".join(asyncio.run(bench_http(url, args.concurrency, args.steps))))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
