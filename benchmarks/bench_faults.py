"""Fault injection: real training runs (``agent_rl.loop.run`` on ``LocalBackend``: rollout orchestrator, HTTP env
client, tiny policy, learner updates) against env servers that are broken on purpose mid-rollout; nothing may be
lost.

    python benchmarks/bench_faults.py                                # every fault, WebShop servers started here
    python benchmarks/bench_faults.py --env alfworld --faults worker_kill,server_restart
    python benchmarks/bench_faults.py --target compose               # the compose stack's containers (already up)
    python benchmarks/bench_faults.py --max-staleness 1 --fault-step 1 --steps 3   # asynchronous rollouts: step 2's
                                                                     # groups play during step 1 (k steps ahead)

Faults (``--faults``, comma-separated; default all):

* ``worker_kill``    SIGKILL the env worker processes of the server while its sessions are mid-episode.
* ``server_restart`` SIGKILL the whole server mid-rollout, then bring it back on the same port (``--target compose``:
                     SIGKILL the container's main process; its ``restart: unless-stopped`` policy restarts it).
* ``sigstop``        SIGSTOP the server (compose: ``pause``) for ``--stop-s`` seconds, past the client's deadline
                     (``rollout.env_timeout_s=--env-timeout``), then SIGCONT (``unpause``).
* ``conn_drop``      a TCP proxy between trainer and server closes ``--drops`` connections in the middle of a response.
* ``trainer_ckpt``   SIGKILL the trainer (a subprocess) while it writes a checkpoint, then ``trainer.resume=auto``.
* ``autoserver``     SIGKILL the trainer's own auto-started env server mid-rollout (restarted), and again with
                     ``env_server.max_restarts=0`` (the run must stop with a clear error, not hang).

Per fault the table reports: steps trained, episodes (groups x G), episode re-runs after an env failure
(``rollout/episode_retries``), episodes that failed every attempt, groups dropped, *lost* groups (requested but
neither trained with all G members of the same task nor counted as dropped; must be 0), sessions left on the
server after the run (``GET /health``; must be 0), orphan sessions the client deleted after losing an answer, and
the recovery time. The final line is ``faults: <fault>=ok|FAIL ... lost=<total>``; exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_rl.logging import read_metrics  # noqa: E402  (metrics.jsonl rows by kind)
from servers import wait as servers_wait  # noqa: E402  (the one wait-until-/health)

ENVS = {"webshop": ("agent_rl/WebShop-v0", ["--workers", "4", "--import", "envs.webshop.preload"], 8002),
        "alfworld": ("agent_rl/ALFWorld-v0", [], 8001)}
ALL_FAULTS = ["worker_kill", "server_restart", "sigstop", "conn_drop", "trainer_ckpt", "autoserver"]
HITS_EPISODES = {"worker_kill", "server_restart", "sigstop", "conn_drop", "autoserver"}  # must re-run some


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def get_json(url: str, timeout_s: float = 5.0) -> Any:
    """GET ``url`` as JSON, with ``$AGENT_RL_SERVER_TOKEN`` as the bearer token when it is set (the compose target's
    servers want it on every route, and on ``/health`` for its load fields)."""
    import httpx

    token = os.environ.get("AGENT_RL_SERVER_TOKEN")
    async with httpx.AsyncClient(timeout=timeout_s,
                                 headers={"Authorization": f"Bearer {token}"} if token else None) as client:
        response = await client.get(url)
        response.raise_for_status()
        return response.json()


async def wait_healthy(url: str, timeout_s: float) -> float:
    """Seconds until ``url/health`` answers 200 (``servers.wait.wait_healthy`` in a thread; TimeoutError after
    ``timeout_s``)."""
    ready = await asyncio.to_thread(servers_wait.wait_healthy, [url], timeout_s=timeout_s, interval_s=0.2,
                                    request_timeout_s=2.0)
    return ready[url]


# ------------------------------------------------------------------------------------------------ servers
class LocalServer:
    """``python -m servers.serve`` on 127.0.0.1 in its own process group (server + workers)."""

    def __init__(self, env: str, log: Path) -> None:
        self.env_id, self.extra, _ = ENVS[env]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout_s: float = 600.0) -> float:
        cmd = [sys.executable, "-m", "servers.serve", "--env", self.env_id, "--host", "127.0.0.1", "--port",
               str(self.port), "--max-sessions", "64", *self.extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return await wait_healthy(self.url, timeout_s)

    def signal_all(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    async def kill_worker(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    async def crash_and_restart(self) -> float:
        """SIGKILL server and workers; start again on the same port; seconds until healthy."""
        t0 = time.monotonic()
        self.signal_all(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait()
        await asyncio.sleep(1.0)  # down for a moment: requests in between are refused
        await self.start()
        return time.monotonic() - t0

    async def pause(self) -> None:
        self.signal_all(signal.SIGSTOP)

    async def unpause(self) -> None:
        self.signal_all(signal.SIGCONT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal_all(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.signal_all(signal.SIGKILL)
                self.proc.wait()


class ComposeServer:
    """An env service of a running compose project (``docker compose``/``podman-compose up -d``)."""

    def __init__(self, env: str, engine: str, project: str) -> None:
        self.service, self.engine, self.project = env, engine, project
        self.url = f"http://127.0.0.1:{ENVS[env][2]}"

    def _run(self, *args: str) -> str:
        return subprocess.run([self.engine, *args], check=True, capture_output=True, text=True).stdout.strip()

    def container(self) -> str:
        ids = self._run("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={self.project}",
                        "--filter", f"label=com.docker.compose.service={self.service}").split()
        if not ids:
            raise RuntimeError(f"no container of service {self.service} in compose project {self.project}")
        return ids[0]

    async def start(self, timeout_s: float = 600.0) -> float:
        return await wait_healthy(self.url, timeout_s)

    async def kill_worker(self, pid: int) -> None:  # pid as the container sees it (GET /health)
        await asyncio.to_thread(self._run, "exec", self.container(), "python", "-c",
                                f"import os, signal; os.kill({int(pid)}, signal.SIGKILL)")

    async def crash_and_restart(self) -> float:
        """SIGKILL the container's main process from the host (a crash, not a stop): the restart policy brings it
        back; seconds until healthy again."""
        t0 = time.monotonic()
        cid = self.container()
        pid = int(self._run("inspect", "--format", "{{.State.Pid}}", cid))
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(1.0)
        await wait_healthy(self.url, 600.0)
        return time.monotonic() - t0

    async def pause(self) -> None:
        await asyncio.to_thread(self._run, "pause", self.container())

    async def unpause(self) -> None:
        await asyncio.to_thread(self._run, "unpause", self.container())

    def close(self) -> None:  # never leave the container paused
        with contextlib.suppress(Exception):
            if self._run("inspect", "--format", "{{.State.Status}}", self.container()) == "paused":
                self._run("unpause", self.container())


# ------------------------------------------------------------------------------------------------ proxy
class DroppingProxy:
    """TCP proxy 127.0.0.1:port -> upstream that, while armed, closes connections in the middle of a response
    (half of the first response chunk is forwarded, then both sides are closed)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.to_drop = 0
        self.dropped = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, responses: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if responses and self.to_drop > 0:
                        self.to_drop -= 1
                        self.dropped += 1
                        writer.write(data[: max(1, len(data) // 2)])
                        await writer.drain()
                        break
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (client_w, up_w):
                    w.close()

        await asyncio.gather(pipe(client_r, up_w, False), pipe(up_r, client_w, True))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


# ------------------------------------------------------------------------------------------------ one run
@dataclass
class Outcome:
    fault: str
    steps: int = 0
    trained: int = 0
    episodes: int = 0
    retried: int = 0
    failed: int = 0
    dropped: int = 0
    lost: int = 0
    sessions_after: int | None = None
    orphans_closed: int = 0
    recovery_s: float | None = None
    injected: bool = False
    note: str = ""
    ok: bool = False
    problems: list[str] = field(default_factory=list)


class Observer:
    """Wraps ``RolloutOrchestrator.collect`` and checks every step's batch: each kept group has exactly G episodes,
    all of the group's task, none failed, each with at least one turn. Groups neither kept whole nor counted as
    dropped/filtered are *lost*."""

    def __init__(self, out: Outcome) -> None:
        self.out = out
        self.step = 0
        self.in_rollout = asyncio.Event()
        self.pools: list[Any] = []

    def install(self) -> contextlib.AbstractContextManager[None]:
        from agent_rl import local
        from agent_rl.rollout import orchestrator
        from agent_rl.rollout import producer
        from agent_rl.rollout.orchestrator import group_temperatures

        observer, original = self, orchestrator.RolloutOrchestrator.collect
        original_async = producer.AsyncProducer.collect  # trainer.max_staleness >= 1 (--max-staleness)
        original_pool = local.open_env_pool  # the name LocalBackend opens its pool with

        async def collect_async(prod, step, sample_tasks):
            observer.step = step
            observer.in_rollout.set()  # the producer plays ahead: the fault may hit a group of a later step
            try:
                result = await original_async(prod, step, sample_tasks)
            finally:
                observer.in_rollout.clear()
            return observer.account(result, prod.per_step, len(prod.temperatures(step)))

        async def collect(orch, sample_tasks, num_groups, algo, step, **kwargs):
            observer.step = step
            observer.in_rollout.set()
            try:
                result = await original(orch, sample_tasks, num_groups, algo, step, **kwargs)
            finally:
                observer.in_rollout.clear()
            return observer.account(result, num_groups, len(group_temperatures(algo, step, kwargs.get("t_high"))))

        return self._install(collect, collect_async, original, original_async, original_pool)

    def account(self, result: Any, num_groups: int, g: int) -> Any:
        """Count a step's result: kept groups must be whole (G episodes of one task, none failed, each with a turn);
        groups neither kept nor counted as dropped/filtered are lost."""
        eps = result.episodes
        kept = len(eps) // g
        bad = len(eps) % g != 0
        for i in range(kept):
            group = eps[i * g:(i + 1) * g]
            bad |= len({id(ep.task) for ep in group}) != 1 or any(
                ep.failure is not None or not ep.turns for ep in group)
        self.out.lost += max(0, num_groups - kept - result.dropped_groups - result.filtered_groups) + bad
        self.out.episodes += num_groups * g
        self.out.dropped += result.dropped_groups
        self.out.retried += int(result.metrics.get("rollout/episode_retries", 0))
        self.out.failed += int(result.metrics.get("rollout/failed_episodes", 0))
        return result

    def _install(self, collect: Any, collect_async: Any, original: Any, original_async: Any,
                 original_pool: Any) -> contextlib.AbstractContextManager[None]:
        from agent_rl import local
        from agent_rl.rollout import orchestrator, producer

        observer = self

        @contextlib.asynccontextmanager
        async def open_env_pool(cfg, out):
            async with original_pool(cfg, out) as pool:
                observer.pools.append(pool)
                yield pool

        @contextlib.contextmanager
        def patched():
            orchestrator.RolloutOrchestrator.collect = collect
            producer.AsyncProducer.collect = collect_async
            local.open_env_pool = open_env_pool
            try:
                yield
            finally:
                orchestrator.RolloutOrchestrator.collect = original
                producer.AsyncProducer.collect = original_async
                local.open_env_pool = original_pool

        return patched()


def train_overrides(args: argparse.Namespace, out: Path, urls: list[str] | None) -> list[str]:
    ov = [f"env={args.env}", "model=tiny", "algo=grpo", f"trainer.total_steps={args.steps}",
          f"trainer.tasks_per_step={args.tasks_per_step}", f"rollout.max_turns={args.max_turns}",
          "engine.max_new_tokens=16", "trainer.device=cpu", "trainer.progress=false", "trainer.loggers=[jsonl]",
          f"rollout.env_timeout_s={args.env_timeout}", f"rollout.episode_retries={args.episode_retries}",
          f"rollout.retry_backoff_s={args.retry_backoff}", f"trainer.output_dir={out}", "trainer.save_every=1000",
          f"trainer.max_staleness={args.max_staleness}"]
    if urls is not None:
        ov.append(f"env_server.urls=[{','.join(urls)}]")
    return ov


async def sessions_mid_episode(url: str, timeout_s: float = 600.0) -> list[dict]:
    """Wait until the server holds sessions that have stepped at least once; return them."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with contextlib.suppress(Exception):
            live = [s for s in (await get_json(url + "/sessions"))["sessions"] if s["steps"] >= 1 and not s["done"]]
            if live:
                return live
        await asyncio.sleep(0.05)
    raise TimeoutError("no session got mid-episode")


async def run_training(args: argparse.Namespace, fault: str, url: str | None, inject: Any,
                       extra: list[str] | None = None) -> tuple[Outcome, Path]:
    """Train ``--steps`` steps against ``url`` (None: the trainer's auto-started server) while ``inject(observer,
    outcome)`` runs; fills the outcome's counters."""
    from agent_rl.config.compose import load_config
    from agent_rl.local import LocalBackend
    from agent_rl.loop import run
    from agent_rl.progress import Progress

    out_dir = Path(tempfile.mkdtemp(prefix=f"faults_{fault}_", dir=args.work))
    outcome = Outcome(fault)
    observer = Observer(outcome)
    cfg = load_config(train_overrides(args, out_dir, [url] if url else None) + (extra or []))
    with observer.install():
        injector = asyncio.ensure_future(inject(observer, outcome))
        try:
            progress = Progress(enabled=cfg.trainer.progress)
            await run(cfg, out_dir, LocalBackend(cfg, out_dir, progress), progress)
        except Exception as exc:  # noqa: BLE001 (reported)
            outcome.note = f"run raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
        finally:
            if not injector.done():
                injector.cancel()
            try:
                await injector
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # noqa: BLE001 (the injection itself failed: reported)
                outcome.problems.append(f"injector failed: {type(exc).__name__}: {exc}")
    rows = read_metrics(out_dir / "metrics.jsonl", "train")  # training steps (not the eval rows)
    outcome.steps = len(rows)
    outcome.trained = sum(1 for r in rows if r.get("batch/rows"))
    outcome.orphans_closed = sum(getattr(p, "orphans_closed", 0) for p in observer.pools)
    return outcome, out_dir


async def after_run(outcome: Outcome, url: str, args: argparse.Namespace) -> None:
    """Sessions left on the server (the trainer closed its pool; a server-side request still finishing gets a
    moment), then the checks."""
    await asyncio.sleep(1.0)
    outcome.sessions_after = (await get_json(url + "/health", 60.0))["sessions"]
    check(outcome, args)


def check(outcome: Outcome, args: argparse.Namespace) -> None:
    p = outcome.problems
    if not outcome.injected:
        p.append("fault not injected")
    if outcome.lost:
        p.append(f"lost={outcome.lost}")
    if outcome.fault in HITS_EPISODES and outcome.injected and not (outcome.retried or outcome.failed):
        p.append("no episode was affected (the fault missed every env call: lengthen it)")
    if outcome.sessions_after:
        p.append(f"{outcome.sessions_after} sessions left on the server")
    if outcome.trained < args.steps and not outcome.note.startswith("expected stop"):
        p.append(f"trained {outcome.trained}/{args.steps} steps")
    outcome.ok = not p


# ------------------------------------------------------------------------------------------------ faults
async def fault_worker_kill(args, server) -> Outcome:
    async def inject(obs: Observer, out: Outcome) -> None:
        while obs.step < args.fault_step:
            await asyncio.sleep(0.05)
        live = await sessions_mid_episode(server.url)
        # GET /sessions names no worker pids (issue 32); every worker then holds the live sessions' ones
        pids = (await get_json(server.url + "/health"))["worker_pids"]
        for pid in pids:
            await server.kill_worker(pid)
        out.injected = True
        out.note = f"killed every worker (pids {pids}) while {len(live)} session(s) were mid-episode"

    outcome, _ = await run_training(args, "worker_kill", server.url, inject)
    await after_run(outcome, server.url, args)
    return outcome


async def fault_server_restart(args, server) -> Outcome:
    async def inject(obs: Observer, out: Outcome) -> None:
        while obs.step < args.fault_step:
            await asyncio.sleep(0.05)
        await sessions_mid_episode(server.url)
        out.injected = True
        out.recovery_s = await server.crash_and_restart()
        out.note = "server SIGKILLed mid-rollout, back on the same port"

    outcome, _ = await run_training(args, "server_restart", server.url, inject)
    await after_run(outcome, server.url, args)
    return outcome


async def fault_sigstop(args, server) -> Outcome:
    async def inject(obs: Observer, out: Outcome) -> None:
        while obs.step < args.fault_step:
            await asyncio.sleep(0.05)
        await sessions_mid_episode(server.url)
        # Generation between env calls can outlast a short stop; keep the server stopped for --stop-s and until one
        # env call of the trainer has run past the client's deadline (seen by timing the pool's requests).
        pool, missed = obs.pools[-1], [0]
        original_send = pool._send

        async def timed_send(*a: Any, **k: Any) -> Any:
            t = time.monotonic()
            try:
                return await original_send(*a, **k)
            finally:
                if time.monotonic() - t >= args.env_timeout - 0.2:
                    missed[0] += 1

        pool._send = timed_send
        t0 = t_paused = time.monotonic()
        try:  # unpause even when cancelled while the pause command runs (it may complete after the cancel)
            await server.pause()
            t_paused = time.monotonic()
            out.injected = True
            while time.monotonic() - t_paused < args.stop_s or (not missed[0] and
                                                                time.monotonic() - t_paused < 300):
                await asyncio.sleep(0.1)
        finally:
            t1 = time.monotonic()
            await server.unpause()
            pool._send = original_send
            out.recovery_s = time.monotonic() - t_paused
            out.note = (f"stopped {out.recovery_s:.1f} s (client deadline {args.env_timeout:g} s; {missed[0]} "
                        f"request(s) ran past it); pause took {t_paused - t0:.1f} s, unpause "
                        f"{time.monotonic() - t1:.1f} s")

    outcome, _ = await run_training(args, "sigstop", server.url, inject)
    await after_run(outcome, server.url, args)
    return outcome


async def fault_conn_drop(args, server) -> Outcome:
    proxy = DroppingProxy(int(server.url.rsplit(":", 1)[1]))
    await proxy.start()

    async def inject(obs: Observer, out: Outcome) -> None:
        while obs.step < args.fault_step:
            await asyncio.sleep(0.05)
        await sessions_mid_episode(server.url)
        proxy.to_drop = args.drops
        while proxy.to_drop > 0:
            await asyncio.sleep(0.05)
        out.injected = True

    try:
        outcome, _ = await run_training(args, "conn_drop", proxy.url, inject)
    finally:
        await proxy.close()
    outcome.note = f"{proxy.dropped} responses cut mid-way (resets, steps and closes alike)"
    await after_run(outcome, server.url, args)
    return outcome


CHILD = textwrap.dedent("""
    import os, signal, sys
    import torch
    real_save = torch.save
    def save(obj, f, *a, **k):  # SIGKILL this trainer in the middle of writing checkpoint step_{kill_step}
        if os.path.basename(os.path.dirname(str(f))).startswith(".step_{kill_step}.tmp-"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *a, **k)
    torch.save = save
    from agent_rl.train import cli
    sys.argv = ["agent_rl.train"] + sys.argv[1:]
    cli()
""")


async def fault_trainer_ckpt(args, server) -> Outcome:
    """SIGKILL the trainer while checkpoint step_2 is half written (weights and tokenizer written, learner state
    not), then resume with trainer.resume=auto: it must start from step_1, never the partial step_2."""
    from agent_rl.learner.checkpoint import latest_checkpoint

    outcome = Outcome("trainer_ckpt")
    out_dir = Path(tempfile.mkdtemp(prefix="faults_trainer_ckpt_", dir=args.work))
    base = train_overrides(args, out_dir, [server.url]) + ["trainer.save_every=1", "trainer.total_steps=3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", CHILD.format(kill_step=2), *base],
                                    cwd=ROOT, env=env, capture_output=True, text=True)
    t_kill = time.time()
    partial = sorted(p.name for p in (out_dir / "checkpoints").glob(".step_2.tmp-*"))
    latest = latest_checkpoint(out_dir)
    outcome.injected = child.returncode == -signal.SIGKILL and bool(partial)
    resumed = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agent_rl.train", *base,
                                                       "trainer.resume=auto"],
                                      cwd=ROOT, env=env, capture_output=True, text=True)
    rows = read_metrics(out_dir / "metrics.jsonl", "train")  # a resumed step's last row; the eval rows apart
    steps = [r["step"] for r in rows]
    outcome.steps, outcome.trained = len(rows), sum(1 for r in rows if r.get("batch/rows"))
    # "resumed from DIR/checkpoints/step_N at step N+1" (the line may go on, e.g. with the learning rate)
    found = re.search(r"^resumed from \S*/(step_\d+) at step (\d+)\b", resumed.stderr, re.MULTILINE)
    outcome.note = (f"killed rc={child.returncode} leaving {partial}; latest complete={latest and latest.name}; "
                    f"{f'resumed from {found[1]} at step {found[2]}' if found else 'no resume line'}; "
                    f"resumed rc={resumed.returncode}")
    if not (latest is not None and latest.name == "step_1" and found and found.groups() == ("step_1", "2")):
        outcome.problems.append("did not resume from the last complete checkpoint (step_1)")
    if resumed.returncode != 0 or steps != [1, 2, 3] or not (out_dir / "checkpoints" / "step_3").is_dir():
        outcome.problems.append(f"resume rc={resumed.returncode}, logged steps {steps}: {resumed.stderr[-500:]}")
    args_steps, args.steps = args.steps, 3
    # the killed trainer's open sessions stay until the server's TTL reaps them (nobody can name them); the
    # resumed run must leave none of its own
    live = (await get_json(server.url + "/sessions", 30.0))["sessions"]
    outcome.sessions_after = sum(s["created_at"] > t_kill for s in live)
    outcome.note += f"; {len(live) - outcome.sessions_after} session(s) of the killed trainer left to the TTL"
    check(outcome, args)
    args.steps = args_steps
    return outcome


async def fault_autoserver(args, server) -> list[Outcome]:
    """The trainer's own env server (env_server.urls empty) SIGKILLed mid-rollout: restarted, the run goes on; with
    env_server.max_restarts=0 the run stops with the reason within seconds."""
    from agent_rl import runtime

    started: list[Any] = []
    original = runtime.env_server  # open_env_pool starts the run's server through this name

    @contextlib.contextmanager
    def recording(*a):
        with original(*a) as srv:
            started.append(srv)
            yield srv

    results = []
    runtime.env_server = recording
    try:
        for limit in (3, 0):
            started.clear()
            t_kill: list[float] = []

            async def inject(obs: Observer, out: Outcome) -> None:
                while obs.step < args.fault_step or not started:
                    await asyncio.sleep(0.05)
                srv = started[-1]
                await sessions_mid_episode(srv.url)
                os.kill(srv.proc.pid, signal.SIGKILL)
                t_kill.append(time.monotonic())
                out.injected = True
                if limit:
                    while srv.starts < 2:
                        await asyncio.sleep(0.1)
                    out.recovery_s = time.monotonic() - t_kill[0]

            name = "autoserver" if limit else "autoserver_giveup"
            extra = [f"env_server.max_restarts={limit}", "env_server.max_sessions=64"]
            if args.env == "webshop":
                extra += ["env_server.workers=4", "env_server.imports=[envs.webshop.preload]"]
            outcome, _ = await run_training(args, name, None, inject, extra)
            srv = started[-1] if started else None
            if limit:
                outcome.note = f"restarted {srv.restarts if srv else '?'} time(s) on the same URL"
                outcome.sessions_after = 0 if srv is None or srv.proc.poll() is not None else None
                check(outcome, args)
            else:
                stop_s = time.monotonic() - t_kill[0] if t_kill else float("nan")
                ok = "after 0 restart(s)" in outcome.note and outcome.note.startswith("run raised RuntimeError")
                outcome.recovery_s = stop_s
                outcome.note = (f"expected stop {stop_s:.1f} s after the kill: " + outcome.note[:120]) if ok else \
                    f"did not stop with the reason: {outcome.note}"
                outcome.sessions_after = 0
                check(outcome, args)
                if not ok:
                    outcome.problems.append("no clear stop")
                    outcome.ok = False
            results.append(outcome)
    finally:
        runtime.env_server = original
    return results


# ------------------------------------------------------------------------------------------------ main
def table(outcomes: list[Outcome]) -> str:
    head = ["fault", "steps", "trained", "episodes", "retried", "failed", "dropped", "lost", "sessions_after",
            "orphans_closed", "recovery_s", "ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in outcomes:
        rec = "" if o.recovery_s is None else f"{o.recovery_s:.1f}"
        lines.append(f"| {o.fault} | {o.steps} | {o.trained} | {o.episodes} | {o.retried} | {o.failed} | "
                     f"{o.dropped} | {o.lost} | {o.sessions_after} | {o.orphans_closed} | {rec} | "
                     f"{'ok' if o.ok else 'FAIL'} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = set(faults) - set(ALL_FAULTS)
    if unknown:
        raise SystemExit(f"unknown faults {sorted(unknown)}; known: {', '.join(ALL_FAULTS)}")
    args.work = Path(tempfile.mkdtemp(prefix="bench_faults_"))
    if args.target == "compose":
        server: Any = ComposeServer(args.env, args.engine, args.project)
    else:
        server = LocalServer(args.env, args.work / "server.log")
    print(f"env {args.env} ({ENVS[args.env][0]}), target {args.target}; work dir {args.work}", flush=True)
    outcomes: list[Outcome] = []
    try:
        started = await server.start()
        print(f"server {server.url} healthy after {started:.1f} s", flush=True)
        for fault in faults:
            print(f"\n== {fault}", flush=True)
            t0 = time.monotonic()
            try:
                result = await globals()[f"fault_{fault}"](args, server)
            except Exception as exc:  # noqa: BLE001 (a harness failure is a failed fault, reported)
                result = Outcome(fault, note=f"harness error {type(exc).__name__}: {exc}", problems=["harness error"])
            for o in result if isinstance(result, list) else [result]:
                outcomes.append(o)
                print(f"{o.fault}: {'ok' if o.ok else 'FAIL ' + '; '.join(o.problems)} ({time.monotonic() - t0:.0f} s)"
                      f"  {o.note}\n" + table([o]).splitlines()[-1], flush=True)
    finally:
        server.close()
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    print()
    print(table(outcomes))
    print(f"(env {args.env}, target {args.target}, {args.steps} steps x {args.tasks_per_step} groups x G=4, "
          f"max_turns {args.max_turns}, env_timeout {args.env_timeout:g} s, episode_retries {args.episode_retries}, "
          f"retry_backoff {args.retry_backoff:g} s)")
    lost = sum(o.lost for o in outcomes)
    print("faults: " + " ".join(f"{o.fault}={'ok' if o.ok else 'FAIL'}" for o in outcomes) + f" lost={lost}")
    return 0 if outcomes and all(o.ok for o in outcomes) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Faults: " + ", ".join(ALL_FAULTS),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=sorted(ENVS), default="webshop")
    p.add_argument("--faults", default=",".join(ALL_FAULTS), help="comma-separated (default: all)")
    p.add_argument("--target", choices=["local", "compose"], default="local",
                   help="local: servers started here (python -m servers.serve); compose: the running containers")
    p.add_argument("--engine", default="podman", help="compose target: docker | podman (container commands)")
    p.add_argument("--project", default="agent_rl", help="compose target: the compose project name")
    p.add_argument("--steps", type=int, default=3, help="training steps per fault run (default 3)")
    p.add_argument("--fault-step", type=int, default=2, help="inject during this step's rollout (default 2)")
    p.add_argument("--tasks-per-step", type=int, default=2, help="groups per step (G=4 episodes each)")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--env-timeout", type=float, default=5.0, help="rollout.env_timeout_s (client deadline), s")
    p.add_argument("--stop-s", type=float, default=12.0, help="sigstop: how long the server stays stopped, s")
    p.add_argument("--drops", type=int, default=4, help="conn_drop: responses cut")
    p.add_argument("--episode-retries", type=int, default=3, help="rollout.episode_retries")
    p.add_argument("--retry-backoff", type=float, default=2.0, help="rollout.retry_backoff_s")
    p.add_argument("--max-staleness", type=int, default=0,
                   help="trainer.max_staleness (>= 1: asynchronous rollouts, the producer plays ahead of the learner)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (runs, logs)")
    args = p.parse_args()
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the servers started here are stopped too
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
