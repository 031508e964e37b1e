"""The expert/oracle panels through the OpenEnv WebSocket surface, played by openenv-core's own client
(``GenericEnvClient``): ALFWorld's handcoded expert on a split (default: all 134 ``valid_unseen`` games) and
WebShop's oracle (the env's expert, ``expert=True``) on the ``val`` goals (default: all 500). The same panels as
``scripts/eval_alfworld_expert.py`` and ``scripts/eval_webshop_oracle.py`` over our session API; the tests play a
few games of each (tests/servers/test_server_openenv.py).

    python benchmarks/bench_openenv_panels.py                                 # starts both servers on loopback
    python benchmarks/bench_openenv_panels.py --envs webshop --limit 50
    python benchmarks/bench_openenv_panels.py --alfworld-url http://127.0.0.1:8001 --webshop-url http://127.0.0.1:8002

Each game is one connection (``--concurrency`` at once): ``reset(split=..., index=i, env_kwargs={"expert": true})``
then the expert's action until done. Prints won / played, mean reward, wall time, and the games not won; exit status
1 if ALFWorld's expert loses a game or WebShop's oracle scores below ``--min-score`` / ``--min-success``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servers.wait import ServerExited, wait_healthy  # noqa: E402

PANELS = {
    "alfworld": ("agent_rl/ALFWorld-v0", "valid_unseen", []),
    "webshop": ("agent_rl/WebShop-v0", "val", ["--import", "envs.webshop.preload"]),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env_id: str, extra: list[str], workers: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "servers.serve", "--env", env_id, "--port", str(port), "--workers", str(workers),
           "--max-sessions", str(2 * workers), "--prestart-workers", str(workers), "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy([url], timeout_s=300, interval_s=0.3, process=proc)
    except (TimeoutError, ServerExited):
        proc.kill()
        raise
    return proc, url


async def play_panel(url: str, env_id: str, split: str, indices: list[int], concurrency: int
                     ) -> list[dict[str, Any]]:
    """One expert episode per index over WS, ``concurrency`` connections at once."""
    from openenv import GenericEnvClient

    gate = asyncio.Semaphore(concurrency)
    results: list[dict[str, Any]] = []

    async def one(index: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            try:
                async with GenericEnvClient(base_url=f"{url}/envs/{env_id}", message_timeout_s=600) as env:
                    r = await env.reset(split=split, index=index, seed=index, env_kwargs={"expert": True})
                    task, steps = r.observation["info"].get("task_id"), 0
                    while not r.done:
                        r = await env.step({"action": r.observation["info"]["expert_action"]})
                        steps += 1
                results.append({"index": index, "task_id": task, "won": bool(r.observation["info"].get("won")),
                                "reward": r.reward, "steps": steps, "seconds": time.perf_counter() - t0})
            except Exception as exc:  # a benchmark reports failures and goes on
                results.append({"index": index, "task_id": None, "won": False, "reward": 0.0, "steps": 0,
                                "seconds": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"})

    await asyncio.gather(*(one(i) for i in indices))
    return sorted(results, key=lambda r: r["index"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", default="alfworld,webshop", help="comma-separated: alfworld, webshop")
    p.add_argument("--limit", type=int, default=0, help="first N games/goals of each panel (0: all)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--workers", type=int, default=4, help="worker processes of a server started here")
    p.add_argument("--alfworld-url", default=None, help="a running ALFWorld server instead of starting one")
    p.add_argument("--webshop-url", default=None, help="a running WebShop server instead of starting one")
    p.add_argument("--min-score", type=float, default=0.99, help="WebShop: mean reward at least this")
    p.add_argument("--min-success", type=float, default=0.95, help="WebShop: won fraction at least this")
    args = p.parse_args(argv)
    failed = False
    for name in [e.strip() for e in args.envs.split(",") if e.strip()]:
        env_id, split, extra = PANELS[name]
        given = getattr(args, f"{name}_url")
        proc, url = (None, given) if given else start_server(env_id, extra, args.workers)
        try:
            import httpx

            sizes = {s["name"]: s["num_tasks"] for s in httpx.get(f"{url}/envs/{env_id}/tasks", timeout=600)
                     .json()["splits"]}
            n = sizes[split] if not args.limit else min(args.limit, sizes[split])
            t0 = time.perf_counter()
            results = asyncio.run(play_panel(url, env_id, split, list(range(n)), args.concurrency))
            wall = time.perf_counter() - t0
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
        won = sum(r["won"] for r in results)
        mean = sum(r["reward"] or 0.0 for r in results) / max(1, len(results))
        print(f"{name} {split} over OpenEnv WS (openenv-core GenericEnvClient), expert: won {won}/{len(results)}, "
              f"mean reward {mean:.4f}, {sum(r['steps'] for r in results)} steps, wall {wall:.0f} s "
              f"(concurrency {args.concurrency})")
        for r in results:
            if not r["won"]:
                print(f"  not won: index {r['index']} {r['task_id']} reward {r['reward']} {r.get('error', '')}")
        if name == "alfworld":
            failed |= won != len(results)
        else:
            failed |= mean < args.min_score or won / max(1, len(results)) < args.min_success
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
