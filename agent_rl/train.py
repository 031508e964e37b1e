"""Entry point: ``python -m agent_rl.train env=alfworld algo=tgrl [key=value ...]`` (Hydra overrides).

One training step, top to bottom (:func:`train_loop`): rollout (groups of episodes against the env servers) ->
``build_rollout_batch`` -> ``learner.update`` -> log (console bar, ``DIR/metrics.jsonl``, ``DIR/tb``) -> checkpoint
(``DIR/checkpoints/step_N``). ``trainer.resume=auto`` continues from the latest checkpoint in ``trainer.output_dir``.

Small CPU budget used by the acceptance check and the tests::

    python -m agent_rl.train env=alfworld algo=tgrl model=tiny trainer.total_steps=2 trainer.output_dir=DIR \\
        trainer.tasks_per_step=1 rollout.max_turns=3 engine.max_new_tokens=16
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import numpy as np
import torch

from agent_rl.config import Config, ConfigError, load_config, to_yaml


# ------------------------------------------------------------------------------------------------ the loop
async def train_loop(cfg: Config, out: Path) -> dict[str, Any]:
    """Run steps ``start..trainer.total_steps``; returns the last step's logged record."""
    from agent_rl.engines import get_engine, set_torch_threads
    from agent_rl.learner import Learner
    from agent_rl.learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from agent_rl.logging import MetricsLogger
    from agent_rl.models import load_policy
    from agent_rl.rollout import RolloutOrchestrator, TaskSampler, build_rollout_batch, get_prompt

    for module in cfg.trainer.imports:  # a user's registry entries (estimators, losses, credit rules, schedules)
        importlib.import_module(module)
    seed_everything(cfg.trainer.seed)
    set_torch_threads(cfg.engine.num_threads)
    device = resolve_device(cfg.trainer.device)
    model, tokenizer = load_policy(cfg.model)
    learner = Learner(model, tokenizer, cfg.algo, cfg.optim, credit=cfg.credit, schedule=cfg.schedule,
                      device=device, seed=cfg.trainer.seed, top_k=cfg.engine.top_k, top_p=cfg.engine.top_p)
    engine = get_engine(cfg.engine.name, model, tokenizer, batch_size=cfg.engine.batch_size, seed=cfg.engine.seed,
                        gpu_memory_utilization=cfg.engine.gpu_memory_utilization, dtype=cfg.model.dtype)
    sampler = TaskSampler(cfg.env.id, cfg.env.sampler, env_kwargs=cfg.env_kwargs, seed=cfg.trainer.seed)
    total, start = cfg.trainer.total_steps, 1

    # Resume: model, optimizer, scheduler, RNG states (restored by load_checkpoint), step and data position.
    ckpt = resume_path(cfg, out, latest_checkpoint)
    if ckpt is not None:
        extra = load_checkpoint(ckpt, model, learner)
        start = int(extra["step"]) + 1
        sampler.load_state_dict(extra["sampler"])
        engine.sync_weights(model)
        print(f"resumed from {ckpt} at step {start}", file=sys.stderr)
        if start > total:
            print(f"nothing to train: the checkpoint is at step {start - 1} and trainer.total_steps={total}; "
                  "raise trainer.total_steps to train further", file=sys.stderr)
            return {}
    logger = MetricsLogger(out, total_steps=total, start_step=start, tensorboard=cfg.trainer.tensorboard,
                           progress=cfg.trainer.progress)
    record: dict[str, Any] = {}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        async with open_env_pool(cfg, out) as pool:
            rollout = RolloutOrchestrator(pool, engine, get_prompt(cfg.env.prompt), cfg.rollout,
                                          max_new_tokens=cfg.engine.max_new_tokens, top_p=cfg.engine.top_p,
                                          top_k=cfg.engine.top_k, seed=cfg.engine.seed,
                                          high_repetition_penalty=cfg.algo.high_repetition_penalty)
            try:
                for step in range(start, total + 1):
                    # 1. Rollout: tasks_per_step groups of G episodes (TGRL: 1 at T0 + 3 at T1; warm-up all at T1).
                    result = await rollout.collect(sampler.sample, cfg.trainer.tasks_per_step, cfg.algo, step,
                                                   filter_groups=cfg.algo.dapo_dynamic_sampling,
                                                   max_extra_rounds=cfg.algo.dapo_max_extra_rounds)
                    metrics: dict[str, Any] = dict(result.metrics)
                    if result.failures:  # say why: a broken env (bad env.kwargs, no data) would fail silently
                        print(f"warning: step {step}: {len(result.failures)} group(s) dropped; first reason: "
                              f"{result.failures[0]}", file=sys.stderr)
                        if step == start and not result.episodes and not result.filtered_groups:
                            raise RuntimeError(f"every episode of step {step} failed, nothing to train on; "
                                               f"first reason: {result.failures[0]}")
                    if step < total:  # next step's env resets (seconds on ALFWorld) run during this update
                        rollout.prefetch(sampler.sample(cfg.trainer.tasks_per_step), cfg.algo.group_size)
                    # 2-3. Rows -> one learner update in a worker thread, so the event loop keeps serving env calls
                    # (skipped when every group was dropped or filtered out).
                    if result.episodes:
                        batch = build_rollout_batch(result.episodes, pad_token_id=pad_id, mode=cfg.rollout.mode)
                        metrics.update(await asyncio.to_thread(learner.update, batch, step=step, total_steps=total))
                        engine.sync_weights(model)
                        metrics["batch/rows"] = batch.num_rows
                    # 4. Log and checkpoint (the data position excludes prefetched tasks: a resume replays them).
                    record = logger.log(step, metrics)
                    if step % cfg.trainer.save_every == 0 or step == total:
                        position = {"position": sampler.position - rollout.num_prefetched_tasks}
                        save_checkpoint(out / "checkpoints" / f"step_{step}", model, tokenizer, learner,
                                        {"step": step, "sampler": position})
                        prune_checkpoints(out / "checkpoints", cfg.trainer.keep_checkpoints)
            finally:
                await rollout.aclose()
    finally:
        logger.close()
    return record


def main(overrides: list[str] | None = None) -> dict[str, Any]:
    """CLI/test entry point: compose the config from ``overrides`` (default ``sys.argv[1:]``), print and save it as
    ``DIR/config.yaml``, train. Returns the last step's metrics record."""
    overrides = sys.argv[1:] if overrides is None else overrides
    if any(arg in ("-h", "--help") for arg in overrides):
        print(usage())
        return {}
    cfg = load_config(overrides)
    out = Path(cfg.trainer.output_dir or Path("runs") / cfg.run_name).resolve()
    if not cfg.trainer.resume and (any((out / "checkpoints").glob("step_*")) or
                                   (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size):
        raise ConfigError(f"trainer.output_dir={out} already holds a run (metrics.jsonl / checkpoints); add "
                          "trainer.resume=auto to continue it, or choose a new trainer.output_dir")
    out.mkdir(parents=True, exist_ok=True)
    cfg.trainer.output_dir = str(out)
    if cfg.data.root:  # the one data root, for envs in this process too (local mode; see envs.data.data_root)
        os.environ["AGENT_RL_DATA"] = cfg.data.root
    text = to_yaml(cfg)
    print(text, file=sys.stderr)
    (out / "config.yaml").write_text(text, encoding="utf-8")
    if cfg.trainer.backend == "ray":  # learners, rollout workers, env servers as Ray actors (docs/scaling.md)
        from agent_rl.distributed.trainer import train_ray

        return train_ray(cfg, out)
    return asyncio.run(train_loop(cfg, out))


# ------------------------------------------------------------------------------------------------ helpers
def usage() -> str:
    """``--help`` text: the module docstring, the config groups and their options."""
    from agent_rl.config import CONFIG_DIR

    groups = sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir())
    lines = [__doc__ or "", "Config groups (group=option):"]
    lines += [f"  {g.name}: {', '.join(sorted(f.stem for f in g.glob('*.yaml')))}" for g in groups]
    lines.append("Any other key: dotted key=value (e.g. trainer.total_steps=2); see agent_rl/config.py.")
    return "\n".join(lines)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> str:
    """``auto`` -> ``cuda`` when available else ``cpu``."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resume_path(cfg: Config, out: Path, latest: Any) -> Path | None:
    """Checkpoint to resume from: none for ``trainer.resume=""``, the latest under ``DIR/checkpoints`` for ``auto``
    (None when there is none yet: a fresh start), else the given path (``FileNotFoundError`` if missing)."""
    if not cfg.trainer.resume:
        return None
    if cfg.trainer.resume == "auto":
        found = latest(out / "checkpoints")
        return Path(found) if found else None
    path = Path(cfg.trainer.resume)
    if not path.exists():
        raise FileNotFoundError(f"trainer.resume={path} does not exist")
    return path


def prune_checkpoints(folder: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest ``step_N`` checkpoints (keep=0: keep all)."""
    import shutil

    if keep <= 0 or not folder.is_dir():
        return
    steps = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_")
                    and p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def env_server(cfg: Config, log_path: Path) -> Iterator[str]:
    """Start ``python -m servers.serve --env <env.id>`` on a free 127.0.0.1 port, wait for ``/health``, yield its URL,
    stop it at exit (SIGTERM, then SIGKILL after 15 s). ``RuntimeError`` with the server log's tail if it exits or
    is not healthy within ``env_server.startup_timeout_s``."""
    import httpx

    es = cfg.env_server
    port = free_port()
    cmd = [sys.executable, "-m", "servers.serve", "--env", cfg.env.id, "--host", "127.0.0.1", "--port", str(port)]
    cmd += [arg for mod in es.imports for arg in ("--import", mod)]
    cmd += ["--workers", str(es.workers)] if es.workers > 0 else []
    cmd += ["--max-sessions", str(es.max_sessions)] if es.max_sessions > 0 else []
    cmd += ["--token", es.token] if es.token else []
    env = dict(os.environ)
    if cfg.data.root:
        env["AGENT_RL_DATA"] = cfg.data.root
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo)
    try:
        deadline = time.monotonic() + es.startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"env server exited with code {proc.returncode}: {cmd}\n{_tail(log_path)}")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"env server not healthy after {es.startup_timeout_s} s: {cmd}\n{_tail(log_path)}")
            time.sleep(0.25)
        print(f"env server {cfg.env.id} at {url} (log: {log_path})", file=sys.stderr)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextlib.asynccontextmanager
async def open_env_pool(cfg: Config, out: Path) -> AsyncIterator[Any]:
    """The env client of the run: ``LocalEnvPool`` (``env_server.mode=local``) or ``HTTPEnvPool`` over
    ``env_server.urls`` (a server started for the run when empty); closed (and the server stopped) at exit."""
    from agent_rl.envclient import HTTPEnvPool, LocalEnvPool

    es = cfg.env_server
    with contextlib.ExitStack() as stack:
        if es.mode == "local":
            kwargs: dict[str, Any] = {"mode": es.local_kind, "imports": list(es.imports)}
            if es.local_workers > 0:
                kwargs["max_workers"] = es.local_workers
            pool = LocalEnvPool(**kwargs)
        else:
            urls = list(es.urls) or [stack.enter_context(env_server(cfg, out / "env_server.log"))]
            pool = HTTPEnvPool(urls, token=es.token)
        try:
            yield pool
        finally:
            await pool.aclose()


def cli() -> None:
    """``python -m agent_rl.train``: :func:`main`, with a config error printed as one message (exit code 2)."""
    try:
        main()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
