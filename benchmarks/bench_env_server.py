"""Env-server benchmark: steps/s and p50/p99 step latency at 1, 8, 32 concurrent sessions, in-process
(``LocalEnvPool``, worker processes) versus over HTTP (``python -m servers.serve`` + ``HTTPEnvPool``); and the
server's three protocols side by side on one server (``--modes http,ws,mcp``): our session API (``HTTPEnvPool``),
OpenEnv's WebSocket channel (openenv-core's ``GenericEnvClient``, one connection per session slot, kept across
episodes: each new episode is a reset on it) and MCP (the ``mcp`` SDK's ``Client``, one per slot, stateless 2026
protocol: ``reset`` / ``act`` tool calls naming the episode), each session count run for every protocol in turn.

Workload (the AgentGym peer's, measured on these machines): each session plays 20-step episodes of uniformly random
admissible actions on ALFWorld ``valid_unseen`` games drawn uniformly; an episode is a new session (reset), closed
after its last step, so at 8 and 32 sessions other sessions keep resetting while one steps. The peer served
6.6 / 6.4 / 4.3 steps/s at 1 / 8 / 32 sessions with step p99 25.7 s at 32, and leaked ~6.7 MB per reset.

    python benchmarks/bench_env_server.py                         # the table (about 4-5 minutes)
    python benchmarks/bench_env_server.py --sessions 1,8 --duration 20 --modes http
    python benchmarks/bench_env_server.py --sessions 1,8 --modes http --url http://127.0.0.1:8001   # a container
    python benchmarks/bench_env_server.py --resets 1000 --sessions 4            # RSS every 100 resets
    python benchmarks/bench_env_server.py --resets 1000 --sessions 4 --games 8  # same, game caches full early
    python benchmarks/bench_env_server.py --probe --sessions 8,32  # one session steps while the others reset
    python benchmarks/bench_env_server.py --env agent_rl/Calculator-v0 --duration 5   # any registered env
    python benchmarks/bench_env_server.py --modes http,ws,mcp      # our API vs OpenEnv WS vs MCP (docs/servers.md)

Goals (issue 2): HTTP overhead < 15% at 1 session; 32 sessions >= 1.6x the steps/s of 1 session; >= 2x the peer at
32 sessions (>= 8.6 steps/s); step p99 < 1 s at 32 sessions while others reset; memory flat over 1,000 resets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_rl.envclient import EnvClientError, EnvPool, HTTPEnvPool, LocalEnvPool, ResetResult, StepResult  # noqa: E402
from servers.wait import ServerExited, wait_healthy  # noqa: E402

PEER = {1: 6.6, 8: 6.4, 32: 4.3}  # AgentGym's ALFWorld server, steps/s (step p99 25.7 s at 32)


@dataclass
class Run:
    """What one (mode, sessions) configuration measured."""

    mode: str
    sessions: int
    steps: int = 0
    resets: int = 0
    elapsed_s: float = 0.0
    step_latencies: list[float] = field(default_factory=list)
    reset_latencies: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s else 0.0

    def pct(self, q: float, values: list[float] | None = None) -> float:
        values = sorted(self.step_latencies if values is None else values)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]


def task_options(env_id: str, split: str, n_games: int, rng: random.Random) -> dict[str, Any] | None:
    """ALFWorld, TextWorld: a uniformly drawn game of the split; other envs: their own random task (seeded)."""
    if "ALFWorld" in env_id or "TextWorld" in env_id:
        return {"split": split, "index": rng.randrange(n_games)}
    return None


async def session_loop(pool: EnvPool, run: Run, args: argparse.Namespace, n_games: int, window: tuple[float, float],
                       rng: random.Random) -> None:
    """One session slot: episodes of ``args.episode_steps`` random admissible actions until the window ends.
    Only steps and resets that complete inside ``window`` (after the ramp-up) are counted."""
    begin, deadline = window

    def counted(t: float) -> bool:
        return begin <= t <= deadline

    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        try:
            r = await pool.reset(args.env, env_kwargs=args.env_kwargs, seed=rng.randrange(2**31),
                                 options=task_options(args.env, args.split, n_games, rng))
        except Exception as exc:  # count and go on: a benchmark reports failures, it does not stop on them
            run.errors += 1
            print(f"  reset failed: {exc}", file=sys.stderr)
            await asyncio.sleep(0.5)
            continue
        t1 = time.perf_counter()
        if counted(t1):
            run.reset_latencies.append(t1 - t0)
            run.resets += 1
        info = r.info
        try:
            for _ in range(args.episode_steps):
                if time.perf_counter() >= deadline:
                    break
                actions = info.get("admissible_actions") or ["look"]
                t0 = time.perf_counter()
                s = await pool.step(r.session_id, rng.choice(actions))
                t1 = time.perf_counter()
                if counted(t1):
                    run.step_latencies.append(t1 - t0)
                    run.steps += 1
                info = s.info
                if s.terminated or s.truncated:
                    break
        except Exception as exc:
            run.errors += 1
            print(f"  step failed: {exc}", file=sys.stderr)
        finally:
            await pool.close(r.session_id)


async def measure(pool: EnvPool, mode: str, sessions: int, args: argparse.Namespace, n_games: int) -> Run:
    """Run ``sessions`` session slots for ``ramp + duration`` seconds; count the last ``duration`` seconds."""
    run = Run(mode, sessions)
    begin = time.perf_counter() + args.ramp
    window = (begin, begin + args.duration)
    await asyncio.gather(*(session_loop(pool, run, args, n_games, window, random.Random(args.seed * 1000 + i))
                           for i in range(sessions)))
    run.elapsed_s = args.duration
    return run


class OpenEnvWSPool:
    """The :class:`EnvPool` calls over OpenEnv's WebSocket channel with openenv-core's own async client: a session
    is a connection (``reset`` takes an idle one or opens one, and resets the server session on it in place;
    ``close`` hands the connection back for the next episode)."""

    def __init__(self, base_url: str) -> None:
        from openenv import GenericEnvClient  # deferred: openenv-core imports gradio (seconds), only ws mode needs it

        self._client_cls = GenericEnvClient  # imported here, before the clock runs
        self.base_url = base_url
        self._idle: list[Any] = []
        self._by_session: dict[str, Any] = {}

    async def reset(self, env_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None,
                    env_kwargs: dict[str, Any] | None = None):
        client = self._idle.pop() if self._idle else await self._client_cls(
            base_url=self.base_url, message_timeout_s=600).connect()
        try:
            r = await client.reset(seed=seed, env_kwargs=env_kwargs, **(options or {}))
        except Exception:
            self._idle.append(client)
            raise
        sid = r.observation["session_id"]
        self._by_session[sid] = client
        return ResetResult(sid, r.observation["text"], r.observation["info"])

    async def step(self, session_id: str, action: str):
        r = await self._by_session[session_id].step({"action": action})
        o = r.observation
        return StepResult(o["text"], r.reward, o["terminated"], o["truncated"], o["info"])

    async def close(self, session_id: str) -> None:
        client = self._by_session.pop(session_id, None)
        if client is not None:
            self._idle.append(client)

    async def aclose(self) -> None:
        for client in self._idle + list(self._by_session.values()):
            await client.close()
        self._idle, self._by_session = [], {}


class MCPPool:
    """The :class:`EnvPool` calls as MCP tool calls with the ``mcp`` SDK's client (default protocol negotiation:
    the stateless 2026 protocol against this server): one client per session slot, kept across episodes (the next
    ``reset`` names the previous episode, which is reset in place); an action ``cmd`` is ``act(command=cmd)`` for
    an env whose tool is ``act``, else ``name[arg]`` is the call ``name`` with ``arg`` as its one argument."""

    def __init__(self, mcp_url: str) -> None:
        import mcp.client.streamable_http  # noqa: F401  (deferred: only mcp mode needs the SDK; before the clock runs)

        self.mcp_url = mcp_url
        self._idle: list[dict[str, Any]] = []
        self._by_session: dict[str, dict[str, Any]] = {}
        self._tools: dict[str, str] | None = None  # tool name -> its first required argument

    async def _slot(self) -> dict[str, Any]:
        """A client running in a task of its own (its transport's task group lives and ends there)."""
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()

        async def own() -> None:
            try:
                async with Client(streamable_http_client(
                        self.mcp_url, http_client=httpx2.AsyncClient(timeout=600))) as client:
                    ready.set_result(client)
                    await stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        task = asyncio.create_task(own())
        client = await ready
        if self._tools is None:
            listed = (await client.list_tools()).tools
            self._tools = {t.name: (t.input_schema.get("required") or ["command"])[0] for t in listed}
        return {"client": client, "stop": stop, "task": task, "sid": None}

    def _call(self, action: str) -> tuple[str, dict[str, Any]]:
        assert self._tools is not None
        if "act" in self._tools:
            return "act", {"command": action}
        name, _, rest = action.partition("[")
        if name in self._tools and rest.endswith("]"):
            return name, {self._tools[name]: rest[:-1]}
        return next(iter(t for t in self._tools if t not in ("reset", "close"))), {"command": action}

    async def reset(self, env_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None,
                    env_kwargs: dict[str, Any] | None = None):
        slot = self._idle.pop() if self._idle else await self._slot()
        arguments = {k: v for k, v in {"seed": seed, "options": options, "env_kwargs": env_kwargs,
                                       "session_id": slot["sid"]}.items() if v is not None}
        r = await slot["client"].call_tool("reset", arguments)
        if r.is_error:
            self._idle.append(slot)
            raise EnvClientError(r.content[0].text, code=(r.structured_content or {}).get("error_code"))
        slot["sid"] = r.structured_content["session_id"]
        self._by_session[slot["sid"]] = slot
        return ResetResult(slot["sid"], r.structured_content["observation"], r.structured_content["info"])

    async def step(self, session_id: str, action: str):
        name, arguments = self._call(action)
        r = await self._by_session[session_id]["client"].call_tool(name, {**arguments, "session_id": session_id})
        if r.is_error:
            raise EnvClientError(r.content[0].text, code=(r.structured_content or {}).get("error_code"))
        c = r.structured_content
        return StepResult(c["observation"], c["reward"], c["terminated"], c["truncated"], c["info"])

    async def close(self, session_id: str) -> None:
        slot = self._by_session.pop(session_id, None)
        if slot is not None:
            self._idle.append(slot)

    async def aclose(self) -> None:
        for slot in self._idle + list(self._by_session.values()):
            if slot["sid"] is not None:
                with contextlib.suppress(Exception):
                    await slot["client"].call_tool("close", {"session_id": slot["sid"]})
            slot["stop"].set()
            await asyncio.gather(slot["task"], return_exceptions=True)
        self._idle, self._by_session = [], {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, max_sessions: int, reset_nice: int | None = None
                 ) -> tuple[subprocess.Popen, str]:
    """``python -m servers.serve`` (the entry point the images run) on a free loopback port."""
    port = free_port()
    cmd = [sys.executable, "-m", "servers.serve", "--env", args.env, "--port", str(port), "--max-sessions",
           str(max_sessions), "--log-level", "warning",
           "--reset-nice", str(args.reset_nice if reset_nice is None else reset_nice)]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy([url], timeout_s=300, interval_s=0.25, request_timeout_s=2.0, process=proc)
    except (TimeoutError, ServerExited):
        proc.kill()
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def rss_mb(pid: int) -> float:
    """Current resident set size of a process, MiB (``/proc/<pid>/status``; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def count_games(args: argparse.Namespace) -> int:
    """Games drawn from: the split's (ALFWorld), or its first ``--games`` only (TextWorld: ``--games``, default 50)."""
    if "TextWorld" in args.env:
        return args.games or 50
    if "ALFWorld" not in args.env:
        return 0
    from envs.alfworld import list_games

    n = len(list_games(args.split))
    return min(n, args.games) if args.games else n


async def warmup(args: argparse.Namespace, n_games: int) -> None:
    """Reset every game of the split once (fills the env's on-disk game cache, so that the rows below measure the
    steady state rather than which mode ran first)."""
    if not n_games:
        return
    start = time.perf_counter()
    workers = os.cpu_count() or 2
    pool = LocalEnvPool(max_workers=workers, mode="process", preload_envs=[args.env])
    queue = list(range(n_games))

    async def worker() -> None:
        while queue:
            r = await pool.reset(args.env, env_kwargs=args.env_kwargs,
                                 options={"split": args.split, "index": queue.pop()})
            await pool.close(r.session_id)

    await asyncio.gather(*(worker() for _ in range(workers)))
    await pool.aclose()
    print(f"warm-up: {n_games} games reset once in {time.perf_counter() - start:.0f} s", flush=True)


async def bench_table(args: argparse.Namespace) -> None:
    counts = [int(s) for s in args.sessions.split(",")]
    n_games = count_games(args)
    if args.warmup:
        await warmup(args, n_games)
    runs: dict[tuple[str, int], Run] = {}
    max_sessions = max(counts)
    # HTTP first: the local rows then run with the warmer game cache, so the overhead is not understated.
    protocols = [m for m in ("ws", "mcp") if m in args.modes]
    if protocols:  # our API, OpenEnv WS and MCP on one server, each session count for every protocol in turn
        modes = (["http"] if "http" in args.modes else []) + protocols
        proc, url = (None, args.url) if args.url else start_server(args, max_sessions)
        path = f"/envs/{args.env}"
        try:
            make = {"http": lambda: HTTPEnvPool(url, max_connections=2 * max_sessions),
                    "ws": lambda: OpenEnvWSPool(url + path), "mcp": lambda: MCPPool(url + path + "/mcp")}
            for n in counts:
                for mode in modes:
                    print(f"{mode:<5} {n:>3} sessions for {args.ramp:.0f} + {args.duration:.0f} s ...", flush=True)
                    pool = make[mode]()  # a fresh client per row; closing it frees the sessions it kept
                    runs[mode, n] = await measure(pool, mode, n, args, n_games)
                    await pool.aclose()
        finally:
            if proc is not None:
                stop_server(proc)
    elif "http" in args.modes:
        # --url: an env server already running (e.g. the compose container: the container network's cost)
        proc, url = (None, args.url) if args.url else start_server(args, max_sessions)
        try:
            pool = HTTPEnvPool(url, max_connections=2 * max_sessions)
            for n in counts:
                print(f"http   {n:>3} sessions for {args.ramp:.0f} + {args.duration:.0f} s ...", flush=True)
                runs["http", n] = await measure(pool, "http", n, args, n_games)
            await pool.aclose()
        finally:
            if proc is not None:
                stop_server(proc)

    if "local" in args.modes:
        pool = LocalEnvPool(max_workers=args.workers or max_sessions, mode="process", preload_envs=[args.env])
        for n in counts:
            print(f"local  {n:>3} sessions for {args.ramp:.0f} + {args.duration:.0f} s ...", flush=True)
            runs["local", n] = await measure(pool, "local", n, args, n_games)
        await pool.aclose()
    print(f"\nenv {args.env} ({args.split}), {args.episode_steps}-step episodes of random admissible actions, "
          f"{args.duration:.0f} s measured per row after {args.ramp:.0f} s ramp-up, {os.cpu_count()} CPUs, "
          f"load average before: {os.getloadavg()[0]:.1f}")
    head = (f"{'sessions':>8} | {'mode':>5} | {'steps/s':>7} | {'vs 1 sess':>9} | {'p50 step s':>10} | "
            f"{'p99 step s':>10} | {'p50 reset s':>11} | {'steps':>6} | {'resets':>6} | {'errors':>6} | "
            f"{'http/local':>10} | {'vs http':>7} | {'vs peer':>7}")
    print(head)
    print("-" * len(head))
    for n in counts:
        for mode in ("local", "http", "ws", "mcp"):
            run = runs.get((mode, n))
            if run is None:
                continue
            base = runs.get((mode, counts[0]))
            other = runs.get(("local", n))
            ratio = f"{run.steps_per_s / other.steps_per_s:10.2f}" if mode == "http" and other else f"{'':>10}"
            api = runs.get(("http", n))
            vs_api = f"{run.steps_per_s / api.steps_per_s:7.2f}" if mode in ("ws", "mcp") and api else f"{'':>7}"
            peer = f"{run.steps_per_s / PEER[n]:7.2f}" if n in PEER and "ALFWorld" in args.env else f"{'':>7}"
            scaling = run.steps_per_s / base.steps_per_s if base.steps_per_s else float("nan")
            print(f"{n:>8} | {mode:>5} | {run.steps_per_s:7.2f} | {scaling:9.2f} | "
                  f"{run.pct(0.5):10.3f} | {run.pct(0.99):10.3f} | {run.pct(0.5, run.reset_latencies):11.2f} | "
                  f"{run.steps:>6} | {run.resets:>6} | {run.errors:>6} | {ratio} | {vs_api} | {peer}")
    if "ALFWorld" in args.env:
        print("peer (AgentGym): 6.6 / 6.4 / 4.3 steps/s at 1 / 8 / 32 sessions, step p99 25.7 s at 32")
    lo, hi = counts[0], counts[-1]
    for mode in ("local", "http", "ws", "mcp"):
        if (mode, lo) in runs and (mode, hi) in runs and runs[mode, lo].steps_per_s:
            print(f"{mode}: {hi} sessions deliver {runs[mode, hi].steps_per_s / runs[mode, lo].steps_per_s:.2f}x "
                  f"the steps/s of {lo} (goal >= 1.6x); step p99 at {hi}: {runs[mode, hi].pct(0.99):.3f} s "
                  f"(goal < 1 s)")
    if ("local", lo) in runs and ("http", lo) in runs:
        overhead = 1 - runs["http", lo].steps_per_s / runs["local", lo].steps_per_s
        step_overhead = runs["http", lo].pct(0.5) / runs["local", lo].pct(0.5) - 1
        print(f"HTTP overhead at {lo} session(s): {100 * overhead:.1f}% fewer steps/s (goal < 15%); p50 step "
              f"latency {100 * step_overhead:+.1f}% (the per-step cost alone, free of which games were cached)")


async def bench_probe(args: argparse.Namespace) -> None:
    """``--probe``: one session steps (random admissible actions) while N-1 others do nothing but reset (open a
    random game, close it, again). Its step latency is what "a reset must not stall other sessions" means; the
    peer serves one request at a time, so there every reset (0.6-3.5 s) lands in some step's latency."""
    counts = [int(s) for s in args.sessions.split(",")]
    n_games = count_games(args)
    print(f"\nprobe: 1 stepping session + N-1 sessions resetting back to back, {args.duration:.0f} s per row")
    print(f"{'sessions':>8} | {'reset nice':>10} | {'probe steps':>11} | {'p50 step s':>10} | {'p99 step s':>10} | "
          f"{'max step s':>10} | {'resets':>6} | {'errors':>6}")
    for nice in (args.reset_nice, 0) if args.reset_nice else (0,):
        proc, url = start_server(args, max(counts), reset_nice=nice)
        try:
            async with HTTPEnvPool(url, max_connections=2 * max(counts)) as pool:
                for n in counts:
                    run = Run("probe", n)
                    deadline = time.perf_counter() + args.duration
                    rng = random.Random(args.seed)

                    async def resetter(i: int) -> None:
                        r_rng = random.Random(args.seed * 1000 + i)
                        while time.perf_counter() < deadline:
                            try:
                                r = await pool.reset(args.env, env_kwargs=args.env_kwargs,
                                                     options=task_options(args.env, args.split, n_games, r_rng))
                            except Exception as exc:  # an env crash is reported, and the benchmark goes on
                                run.errors += 1
                                print(f"  reset failed: {exc}", file=sys.stderr)
                                continue
                            run.resets += 1
                            await pool.close(r.session_id)

                    async def prober() -> None:
                        while time.perf_counter() < deadline:
                            try:
                                r = await pool.reset(args.env, env_kwargs=args.env_kwargs,
                                                     options=task_options(args.env, args.split, n_games, rng))
                                info = r.info
                                for _ in range(args.episode_steps):
                                    if time.perf_counter() >= deadline:
                                        break
                                    action = rng.choice(info.get("admissible_actions") or ["look"])
                                    t0 = time.perf_counter()
                                    s = await pool.step(r.session_id, action)
                                    run.step_latencies.append(time.perf_counter() - t0)
                                    info = s.info
                                    if s.terminated or s.truncated:
                                        break
                                await pool.close(r.session_id)
                            except Exception as exc:
                                run.errors += 1
                                print(f"  probe failed: {exc}", file=sys.stderr)

                    await asyncio.gather(prober(), *(resetter(i) for i in range(1, n)))
                    print(f"{n:>8} | {nice:>10} | {len(run.step_latencies):>11} | {run.pct(0.5):10.3f} | "
                          f"{run.pct(0.99):10.3f} | {max(run.step_latencies, default=float('nan')):10.3f} | "
                          f"{run.resets:>6} | {run.errors:>6}", flush=True)
        finally:
            stop_server(proc)


async def bench_resets(args: argparse.Namespace) -> None:
    """``--resets N``: N resets (each a new session, one step, closed) over ``--sessions``' first count of
    concurrent sessions through the HTTP server; prints the server's and its workers' RSS every 100 resets."""
    import httpx

    concurrency = int(args.sessions.split(",")[0])
    n_games = count_games(args)
    proc, url = start_server(args, max(concurrency, 1))
    rng = random.Random(args.seed)
    done = 0
    rows: list[tuple[int, float, float, int]] = []

    def memory() -> tuple[float, float, int]:
        health = httpx.get(url + "/health", timeout=10).json()
        return rss_mb(proc.pid), sum(rss_mb(p) for p in health["worker_pids"]), health["started_workers"]

    async def one(pool: HTTPEnvPool) -> None:
        nonlocal done
        while done < args.resets:
            done += 1
            try:
                r = await pool.reset(args.env, env_kwargs=args.env_kwargs, seed=rng.randrange(2**31),
                                     options=task_options(args.env, args.split, n_games, rng))
                actions = r.info.get("admissible_actions") or ["look"]
                await pool.step(r.session_id, rng.choice(actions))
                await pool.close(r.session_id)
            except Exception as exc:  # an env crash is reported, and the count goes on
                print(f"  reset {done} failed: {exc}", file=sys.stderr)
            if done % 100 == 0:
                server, workers, started = memory()
                rows.append((done, server, workers, started))
                print(f"{done:>6} resets: server {server:7.1f} MiB, workers {workers:8.1f} MiB, "
                      f"started workers {started}", flush=True)

    try:
        start = time.perf_counter()
        async with HTTPEnvPool(url) as pool:
            await asyncio.gather(*(one(pool) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        stop_server(proc)
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        total = (last[1] + last[2]) - (first[1] + first[2])
        per_reset = 1024 * total / max(1, last[0] - first[0])
        print(f"\n{args.resets} resets in {elapsed:.0f} s; RSS (server + workers) {first[1] + first[2]:.1f} MiB after "
              f"{first[0]} -> {last[1] + last[2]:.1f} MiB after {last[0]}: {per_reset:+.1f} KiB per reset "
              f"(peer: ~6.7 MB per reset)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="agent_rl/ALFWorld-v0")
    p.add_argument("--split", default="valid_unseen")
    p.add_argument("--env-kwargs", type=json.loads, default=None,
                   help='JSON env kwargs, e.g. \'{"family": "cooking", "level": 3}\' (TextWorld)')
    p.add_argument("--sessions", default="1,8,32", help="comma-separated concurrent session counts")
    p.add_argument("--duration", type=float, default=40.0, help="measured seconds per (mode, sessions) row")
    p.add_argument("--ramp", type=float, default=10.0,
                   help="seconds run before measuring (every session's first reset starts at once)")
    p.add_argument("--episode-steps", type=int, default=20)
    p.add_argument("--modes", default="local,http",
                   help="comma-separated: local (LocalEnvPool), http (our session API), ws (OpenEnv WebSocket, "
                        "openenv-core's client), mcp (MCP, the mcp SDK's client); http/ws/mcp share one server")
    p.add_argument("--url", default=None, help="http mode: measure this running server (e.g. the compose container "
                                               "http://127.0.0.1:8001) instead of starting one on loopback")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per session)")
    p.add_argument("--resets", type=int, default=0, help="memory mode: this many resets, RSS every 100")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--games", type=int, default=0,
                   help="draw from the first N games of the split only (0: all); with --resets, a small N fills "
                        "the per-process game caches quickly, so what remains is any per-reset leak")
    p.add_argument("--warmup", action="store_true", help="reset every game once first (fills the game cache)")
    p.add_argument("--reset-nice", type=int, default=10, help="server's --reset-nice (resets below steps)")
    p.add_argument("--probe", action="store_true",
                   help="probe mode: one stepping session while the others only reset (with and without nice)")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    asyncio.run(bench_resets(args) if args.resets else bench_probe(args) if args.probe else bench_table(args))


if __name__ == "__main__":
    main()
