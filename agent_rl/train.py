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
import json
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

from agent_rl.config import (
    Config,
    ConfigError,
    compare_for_resume,
    config_dict,
    fit_prompt_budget,
    load_config,
    to_yaml,
)


class FirstStepFailed(RuntimeError):
    """Every episode of the run's first step failed (bad env options or kwargs, an unreachable env server): nothing
    can train. The CLI prints it as one line."""


# ------------------------------------------------------------------------------------------------ the loop
async def train_loop(cfg: Config, out: Path, config_file: Path | None = None) -> dict[str, Any]:
    """Run steps ``start..trainer.total_steps``; returns the last step's logged record. ``config_file`` (the YAML
    :func:`main` saved) is rewritten if the loaded model's context caps the prompt budget further."""
    from agent_rl.engines import engine_kwargs, get_engine, set_torch_threads
    from agent_rl.episodes import save_step_episodes
    from agent_rl.eval.runner import PolicyOrchestrator
    from agent_rl.eval.training import TrainingEval
    from agent_rl.learner import Learner
    from agent_rl.learner.checkpoint import (latest_checkpoint, load_checkpoint, recover_checkpoints,
                                             save_checkpoint)
    from agent_rl.logging import MetricsLogger
    from agent_rl.progress import Progress
    from agent_rl.rollout import TaskSampler, build_rollout_batch, get_prompt, group_temperatures

    for module in cfg.trainer.imports:  # a user's registry entries (estimators, losses, credit rules, schedules)
        importlib.import_module(module)
    seed_everything(cfg.trainer.seed)
    set_torch_threads(cfg.engine.num_threads)
    device = resolve_device(cfg.trainer.device)
    progress = Progress(enabled=cfg.trainer.progress)  # phases: model, env server, rollout, update, checkpoint, eval
    model, tokenizer = load_run_policy(cfg, progress, config_file)
    learner = Learner(model, tokenizer, cfg.algo, cfg.optim, credit=cfg.credit, schedule=cfg.schedule,
                      device=device, seed=cfg.trainer.seed, top_k=cfg.engine.top_k, top_p=cfg.engine.top_p)
    engine = get_engine(cfg.engine.name, model, tokenizer, **engine_kwargs(cfg))  # closed in the last `finally`
    sampler = TaskSampler(cfg.env.id, cfg.env.sampler, env_kwargs=cfg.env_kwargs, seed=cfg.trainer.seed)
    total, start = cfg.trainer.total_steps, 1

    # Resume: model, optimizer, scheduler, RNG states (restored by load_checkpoint), step and data position
    # (main has compared the checkpoint's config with this one).
    if cfg.trainer.resume:  # a save interrupted by a crash: undo a half-done replace, drop its temporary folder
        for line in recover_checkpoints(out / "checkpoints"):
            print(f"checkpoints: {line}", file=sys.stderr)
    ckpt = resume_path(cfg, out, latest_checkpoint)
    if ckpt is not None:  # the optimiser hyper-parameters and LR schedule are this config's (RESUME_APPLIED)
        extra = load_checkpoint(ckpt, model, learner, weights_only=cfg.trainer.resume_weights_only)
        start = int(extra["step"]) + 1
        sampler.load_state_dict(extra["sampler"])
        engine.sync_weights(model)
        print(f"resumed from {ckpt} at step {start} (actor/lr {learner.lr:.6g})", file=sys.stderr)
        if start > total:
            print(f"nothing to train: the checkpoint is at step {start - 1} and trainer.total_steps={total}; "
                  "raise trainer.total_steps to train further", file=sys.stderr)
            getattr(engine, "close", lambda: None)()
            return {}
    evaluator = TrainingEval(cfg, out, progress)
    logger = MetricsLogger(out, total_steps=total, start_step=start, tensorboard=cfg.trainer.tensorboard,
                           progress=False)  # one line per step; the live display is `progress`
    record: dict[str, Any] = {}
    idle_steps = 0  # steps that trained on nothing (every group dropped or filtered)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        if cfg.env_server.mode != "local" and not cfg.env_server.urls:
            progress.note(f"starting the {cfg.env.id} env server (log: {out / 'env_server.log'})")
        async with open_env_pool(cfg, out) as pool:
            rollout = PolicyOrchestrator(pool, engine, get_prompt(cfg.env.prompt), cfg.rollout,
                                         max_new_tokens=cfg.engine.max_new_tokens, top_p=cfg.engine.top_p,
                                         top_k=cfg.engine.top_k, seed=cfg.engine.seed,
                                         high_repetition_penalty=cfg.algo.high_repetition_penalty,
                                         action_format=cfg.env.action_format,
                                         tool_call_format=cfg.model.tool_call_format,
                                         on_turn=lambda gen: progress.turn(len(gen.token_ids)),
                                         on_episode=lambda ep: progress.episode(ep.won))
            try:
                if start == 1 and evaluator.due(0, total):  # the panel before training, logged as step 0
                    record = logger.log(0, await evaluator.run(0, pool, engine), kind="eval")
                for step in range(start, total + 1):
                    progress.phase(f"step {step}/{total} rollout",
                                   total=cfg.trainer.tasks_per_step * len(group_temperatures(cfg.algo, step)))
                    # 1. Rollout: tasks_per_step groups of G episodes (TGRL: 1 at T0 + 3 at T1; warm-up all at T1).
                    result = await rollout.collect(sampler.sample, cfg.trainer.tasks_per_step, cfg.algo, step,
                                                   filter_groups=cfg.algo.dapo_dynamic_sampling,
                                                   max_extra_rounds=cfg.algo.dapo_max_extra_rounds)
                    metrics: dict[str, Any] = dict(result.metrics)
                    check_dropped_groups(step, start, result.failures, bool(result.episodes),
                                         result.filtered_groups)
                    if step < total:  # next step's env resets (seconds on ALFWorld) run during this update
                        rollout.prefetch(sampler.sample(cfg.trainer.tasks_per_step), cfg.algo.group_size)
                    # 2-3. Rows -> one learner update in a worker thread, so the event loop keeps serving env calls
                    # (skipped when every group was dropped or filtered out).
                    if result.episodes:
                        progress.phase(f"step {step}/{total} update")
                        batch = build_rollout_batch(result.episodes, pad_token_id=pad_id, mode=cfg.rollout.mode)
                        if hasattr(engine, "sleep"):  # vllm with engine.sleep_mode: its GPU memory to the learner
                            engine.sleep()
                        metrics.update(await asyncio.to_thread(learner.update, batch, step=step, total_steps=total))
                        await asyncio.to_thread(save_step_episodes, out, step, result.episodes,  # DIR/episodes
                                                cfg.trainer.save_episodes, tokenizer=tokenizer, batch=batch,
                                                token_stats=learner.last_token_stats, seed=cfg.trainer.seed)
                        engine.sync_weights(model)
                        metrics["batch/rows"] = batch.num_rows
                    else:  # loud: a run that never trains must not look like one that did
                        idle_steps += 1
                        metrics["batch/rows"] = 0
                        warn_idle_step(step, result.dropped_groups, result.filtered_groups)
                    if evaluator.due(step, total):
                        metrics.update(await evaluator.run(step, pool, engine))
                    # 4. Log and checkpoint (the data position excludes prefetched tasks: a resume replays them).
                    progress.end()
                    record = logger.log(step, metrics)
                    if step % cfg.trainer.save_every == 0 or step == total:
                        progress.phase(f"step {step}/{total} checkpoint")
                        save_checkpoint(out / "checkpoints" / f"step_{step}", model, tokenizer, learner,
                                        checkpoint_extra(cfg, step, sampler.position - rollout.num_prefetched_tasks))
                        prune_checkpoints(out / "checkpoints", cfg.trainer.keep_checkpoints)
            finally:
                await rollout.aclose()
    finally:
        progress.end()
        logger.close()
        getattr(engine, "close", lambda: None)()  # vllm: its engine processes and sync files (hf: nothing)
    warn_idle_run(idle_steps, total - start + 1)
    return record


# ------------------------------------------------------------------------------------------------ shared steps
# Pieces of the loop that the Ray backend (agent_rl.distributed.trainer) runs too: one implementation for both.
def load_run_policy(cfg: Config, progress: Any, config_file: Path | None = None) -> tuple[Any, Any]:
    """Load the run's policy and tokenizer (``load_policy(cfg.model)``), saying so on ``progress``; cap the prompt
    budget by the loaded model's context (``fit_prompt_budget``: ``cfg`` is changed in place, and ``config_file``
    rewritten, when it does).

    Raises:
        ConfigError: the model cannot be loaded (not found, not downloadable, an option transformers rejects).
    """
    from agent_rl.models import load_policy

    progress.note(f"loading model {cfg.model.path or cfg.model.name} (SmolLM2 is converted on first use, ~30 s)")
    try:
        model, tokenizer = load_policy(cfg.model)
    except (OSError, ValueError) as exc:  # not found / not downloadable / an option transformers rejects
        where = f"model.name={cfg.model.name}" + (f" model.path={cfg.model.path}" if cfg.model.path else "")
        raise ConfigError(f"{where} could not be loaded: {' '.join(str(exc).split())[:400]}") from exc
    note = fit_prompt_budget(cfg, getattr(model.config, "max_position_embeddings", None),
                             "max_position_embeddings of the loaded model")
    if note:  # a hub model whose config was not available offline at load time
        print(f"config: {note}", file=sys.stderr)
        if config_file is not None:
            config_file.write_text(to_yaml(cfg), encoding="utf-8")
    return model, tokenizer


def checkpoint_extra(cfg: Config, step: int, position: int) -> dict[str, Any]:
    """The ``extra.json`` of a training checkpoint, one format for both backends: the ``step`` it ends, the task
    sampler's ``position`` (tasks drawn before the next step) and the run's resolved ``config``, which a resume
    compares with its own (:func:`agent_rl.config.compare_for_resume`)."""
    return {"step": int(step), "sampler": {"position": int(position)}, "config": config_dict(cfg)}


def check_resume_state(cfg: Config, ckpt: Path) -> list[str]:
    """Check that checkpoint ``ckpt`` holds the state a resume restores (``checkpoint.STATE_FILES``) before anything
    starts; returns the lines to print: with ``trainer.resume_weights_only=true``, what restarts and what is kept.

    Raises:
        ConfigError: no ``extra.json`` (no step to continue from), or no ``learner.pt`` / ``rng.pt`` without
            ``trainer.resume_weights_only=true`` (the message names each file and what it restores).
    """
    from agent_rl.learner.checkpoint import STATE_FILES, incomplete_message, missing_state

    missing = missing_state(ckpt)
    if "extra.json" in missing:
        raise ConfigError(f"checkpoint {ckpt} has no extra.json ({STATE_FILES['extra.json']}): it cannot be resumed; "
                          f"start a new run from its weights with model.path={ckpt}")
    if missing and not cfg.trainer.resume_weights_only:
        raise ConfigError(incomplete_message(ckpt, missing))
    if not cfg.trainer.resume_weights_only:
        return []
    o = cfg.optim
    restarted = ["the optimizer (AdamW moments and step count from 0)",
                 f"the LR warm-up (optim.warmup={o.warmup} optimiser steps up to optim.lr={o.lr:g})" if o.warmup > 0
                 else f"the LR schedule (constant optim.lr={o.lr:g}, optim.warmup=0)",
                 "the mini-batch shuffling generator (trainer.seed)"]
    if cfg.algo.uses_critic:
        restarted.append("the value head (zeros)")
    if "rng.pt" in missing:
        restarted.append("the RNG states (rng.pt is missing: seeded from trainer.seed)")
    kept = "the policy weights, the step, the task sampler's position" + ("" if "rng.pt" in missing else
                                                                           ", the RNG states")
    why = "learner.pt is missing" if "learner.pt" in missing else "learner.pt is not loaded"
    return [f"resume: trainer.resume_weights_only=true ({why}): restarting {'; '.join(restarted)}; kept from "
            f"{ckpt}: {kept}"]


def check_dropped_groups(step: int, start: int, failures: list[Any], has_episodes: bool, filtered_groups: int) -> None:
    """Warn about the step's dropped groups (a broken env, bad env.kwargs or missing data would otherwise fail
    silently).

    Raises:
        FirstStepFailed: every episode of the run's first step failed (none kept, none filtered by DAPO).
    """
    if not failures:
        return
    print(f"warning: step {step}: {len(failures)} group(s) dropped; first reason: {failures[0]}", file=sys.stderr)
    if step == start and not has_episodes and not filtered_groups:
        raise FirstStepFailed(f"every episode of step {step} failed, nothing to train on; "
                              f"first reason: {failures[0]}")


def warn_idle_step(step: int, dropped_groups: int, filtered_groups: int) -> None:
    """The loud line of a step that trains on nothing (a run that never trains must not look like one that did)."""
    print(f"WARNING: step {step} trains on nothing (0 episodes: {dropped_groups} group(s) dropped, {filtered_groups} "
          "filtered as all-equal by DAPO dynamic sampling); no update", file=sys.stderr)


def warn_idle_run(idle_steps: int, steps: int) -> None:
    """The run's closing line when ``idle_steps`` of its ``steps`` steps trained on nothing (silent for 0)."""
    if idle_steps:
        print(f"WARNING: {idle_steps} of {steps} step(s) trained on nothing (see the warnings above)", file=sys.stderr)


def main(overrides: list[str] | None = None, *, notice: str = "") -> dict[str, Any]:
    """CLI/test entry point: compose the config from ``overrides`` (default ``sys.argv[1:]``), print and save it as
    ``DIR/config.yaml``, train. Returns the last step's metrics record. ``notice``: a line printed once the config
    is valid (the CLI's CPU-preset line)."""
    overrides = sys.argv[1:] if overrides is None else overrides
    if any(arg in ("-h", "--help") for arg in overrides):
        print(usage())
        return {}
    cfg = load_config(overrides)
    if notice:
        print(notice, file=sys.stderr)
    out = Path(cfg.trainer.output_dir or Path("runs") / cfg.run_name).resolve()
    if not cfg.trainer.resume and (any((out / "checkpoints").glob("step_*")) or
                                   (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size):
        raise ConfigError(f"trainer.output_dir={out} already holds a run (metrics.jsonl / checkpoints); add "
                          "trainer.resume=auto to continue it, or choose a new trainer.output_dir")
    cfg.trainer.output_dir = str(out)
    config_file = out / "config.yaml"
    from agent_rl.learner.checkpoint import latest_checkpoint

    ckpt = resume_path(cfg, out, latest_checkpoint)
    if ckpt is not None:  # resume: compare with the config the checkpoint was trained under (docs/training.md)
        state_notes = check_resume_state(cfg, ckpt)  # ConfigError: a state file is missing
        extra = json.loads((ckpt / "extra.json").read_text())
        start = int(extra.get("step", 0)) + 1
        saved, source = extra.get("config"), f"{ckpt}/extra.json"
        if saved is None:  # a checkpoint written before configs were saved in it: the run's newest config file
            saved, source = saved_run_config(ckpt.parent.parent, start)
        for line in [*compare_for_resume(saved, cfg, source=source), *state_notes]:
            print(line, file=sys.stderr)
        if start <= cfg.trainer.total_steps:  # each config the run ran under is kept
            config_file = out / f"config.resume-{start}.yaml"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"trainer.output_dir={out} cannot be created: {exc.strerror or exc}") from None
    if cfg.data.root:  # the one data root, for envs in this process too (local mode; see envs.data.data_root)
        os.environ["AGENT_RL_DATA"] = cfg.data.root
    text = to_yaml(cfg)
    print(text, file=sys.stderr)
    config_file.write_text(text, encoding="utf-8")
    if cfg.trainer.backend == "ray":  # learners, rollout workers, env servers as Ray actors (docs/scaling.md)
        from agent_rl.distributed.trainer import train_ray

        record = train_ray(cfg, out, config_file)
    else:
        record = asyncio.run(train_loop(cfg, out, config_file))
    from agent_rl.report import finish_run

    print(finish_run(out), file=sys.stderr)  # DIR/curves.png, DIR/summary.md
    return record


# ------------------------------------------------------------------------------------------------ helpers
def usage() -> str:
    """``--help`` text: the module docstring, the config groups and their options."""
    from agent_rl.config import CONFIG_DIR

    groups = sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir())
    lines = [__doc__ or "", "Config groups (group=option):"]
    lines += [f"  {g.name}: {', '.join(sorted(f.stem for f in g.glob('*.yaml')))}" for g in groups]
    lines.append("Any other key: dotted key=value (e.g. trainer.total_steps=2); see agent_rl/config.py.")
    return "\n".join(lines)


def with_device_preset(overrides: list[str]) -> tuple[list[str], str]:
    """The command line's overrides, plus ``trainer=cpu`` (the CPU budget preset) when no ``trainer=`` is given and
    no GPU is visible; and the one line that says so ("" when nothing was added)."""
    if any(ov.split("=", 1)[0].lstrip("+~") == "trainer" for ov in overrides) or torch.cuda.is_available() or \
            any(arg in ("-h", "--help") for arg in overrides):
        return overrides, ""
    return [*overrides, "trainer=cpu"], (
        "no GPU found: using the CPU budget preset trainer=cpu (configs/trainer/cpu.yaml: 4 steps x 4 episodes x "
        "3 turns, a 4-game eval panel before and after); add trainer=default for the full budget")


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
    (None when there is none yet: a fresh start), else the given checkpoint folder.

    Raises:
        ConfigError: the given path does not exist or is not a checkpoint folder (``DIR/checkpoints/step_N``).
    """
    if not cfg.trainer.resume:
        return None
    if cfg.trainer.resume == "auto":
        found = latest(out / "checkpoints")
        return Path(found) if found else None
    path = Path(cfg.trainer.resume).expanduser()
    if not path.exists():
        raise ConfigError(f"trainer.resume={cfg.trainer.resume} does not exist; valid: '' (fresh), auto (latest "
                          "checkpoint of trainer.output_dir) or a checkpoint folder DIR/checkpoints/step_N")
    if not (path.is_dir() and any(path.glob("*.safetensors"))):
        inside = latest(path) if path.is_dir() else None
        hint = f"; the newest checkpoint under it is {inside}" if inside else ""
        raise ConfigError(f"trainer.resume={cfg.trainer.resume} is not a checkpoint folder (no *.safetensors; "
                          f"checkpoints are DIR/checkpoints/step_N){hint}")
    return path


def saved_run_config(run_dir: Path, start: int) -> tuple[dict[str, Any] | None, str]:
    """The config a run's checkpoint before step ``start`` ran under, from the run's files (checkpoints written
    before configs were stored in ``extra.json``): the newest ``config.resume-N.yaml`` with N < start, else
    ``config.yaml``. Returns ``(dict or None, source)``."""
    import yaml

    resumed = sorted((int(p.stem.rsplit("-", 1)[1]), p) for p in run_dir.glob("config.resume-*.yaml")
                     if p.stem.rsplit("-", 1)[1].isdigit() and int(p.stem.rsplit("-", 1)[1]) < start)
    path = resumed[-1][1] if resumed else run_dir / "config.yaml"
    if not path.is_file():
        return None, str(path)
    return yaml.safe_load(path.read_text(encoding="utf-8")), str(path)


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


class EnvServerProcess:
    """The run's own env server (``env_server.urls`` empty): ``python -m servers.serve --env <env.id>`` on a free
    127.0.0.1 port. :meth:`start` waits for ``/health``; a server that dies is started again on the same port by
    :func:`supervise_env_server` (the URL the env client holds stays valid), at most ``env_server.max_restarts``
    times."""

    def __init__(self, cfg: Config, log_path: Path) -> None:
        es = cfg.env_server
        self.cfg, self.log_path = cfg, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "servers.serve", "--env", cfg.env.id, "--host", "127.0.0.1",
               "--port", str(self.port)]
        cmd += [arg for mod in es.imports for arg in ("--import", mod)]
        cmd += ["--workers", str(es.workers)] if es.workers > 0 else []
        cmd += ["--max-sessions", str(es.max_sessions)] if es.max_sessions > 0 else []
        cmd += ["--token", es.token] if es.token else []
        self.cmd = cmd
        env = dict(os.environ)
        if cfg.data.root:
            env["AGENT_RL_DATA"] = cfg.data.root
        self.repo = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = self.repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.starts = 0  # successful starts (healthy)
        self.failure: str | None = None  # set when the supervisor gave up (the run then stops with this message)

    def start(self) -> None:
        """Start the server and wait for ``/health``. ``RuntimeError`` with the log's tail if it exits or is not
        healthy within ``env_server.startup_timeout_s``."""
        import httpx

        timeout_s = self.cfg.env_server.startup_timeout_s
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.repo)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"env server exited with code {self.proc.returncode}: {self.cmd}\n"
                                   f"{_tail(self.log_path)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"env server not healthy after {timeout_s} s: {self.cmd}\n{_tail(self.log_path)}")
            time.sleep(0.25)
        self.starts += 1
        print(f"env server {self.cfg.env.id} at {self.url} (log: {self.log_path})", file=sys.stderr)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def env_server(cfg: Config, log_path: Path) -> Iterator[EnvServerProcess]:
    """Start the run's env server (:class:`EnvServerProcess`), yield it, stop it at exit."""
    server = EnvServerProcess(cfg, log_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


async def supervise_env_server(server: EnvServerProcess, on_failure: Any, *, interval_s: float = 0.5) -> None:
    """Watch the run's env server: when it exits, start it again on the same port (in-flight episodes fail and are
    re-run by the orchestrator); after ``env_server.max_restarts`` restarts, or when a restart fails, set
    ``server.failure`` and call ``on_failure()`` (which stops the run: never a run that hangs or trains on
    nothing)."""
    limit = server.cfg.env_server.max_restarts
    while True:
        await asyncio.sleep(interval_s)
        proc = server.proc
        if proc is None or proc.poll() is None:
            continue
        code = proc.returncode
        if server.restarts >= limit:
            server.failure = (f"the env server ({server.url}) exited with code {code} after {server.restarts} "
                              f"restart(s) (env_server.max_restarts={limit}); stopping the run. Server log "
                              f"{server.log_path}:\n{_tail(server.log_path, 1500)}")
            on_failure()
            return
        server.restarts += 1
        print(f"warning: the env server ({server.url}) exited with code {code}; restarting it "
              f"({server.restarts}/{limit})", file=sys.stderr)
        try:
            await asyncio.to_thread(server.start)
        except RuntimeError as exc:
            server.failure = f"the env server exited with code {code} and could not be restarted: {exc}"
            on_failure()
            return


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextlib.asynccontextmanager
async def open_env_pool(cfg: Config, out: Path) -> AsyncIterator[Any]:
    """The env client of the run: ``LocalEnvPool`` (``env_server.mode=local``) or ``HTTPEnvPool`` over
    ``env_server.urls`` (a server started for the run when empty, restarted when it dies, and the run stopped with
    ``RuntimeError`` naming the cause once it cannot be: :func:`supervise_env_server`); closed (and the server
    stopped) at exit."""
    from agent_rl.envclient import HTTPEnvPool, LocalEnvPool

    es = cfg.env_server
    server: EnvServerProcess | None = None
    supervisor: asyncio.Task[None] | None = None
    with contextlib.ExitStack() as stack:
        if es.mode == "local":
            kwargs: dict[str, Any] = {"mode": es.local_kind, "imports": list(es.imports)}
            if es.local_workers > 0:
                kwargs["max_workers"] = es.local_workers
            pool = LocalEnvPool(**kwargs)
        else:
            if es.urls:
                urls = list(es.urls)
            else:
                server = stack.enter_context(env_server(cfg, out / "env_server.log"))
                urls = [server.url]
                main_task = asyncio.current_task()
                assert main_task is not None
                supervisor = asyncio.create_task(supervise_env_server(server, main_task.cancel))
            pool = HTTPEnvPool(urls, token=es.token)
        try:
            yield pool
        except asyncio.CancelledError:
            if server is not None and server.failure:  # the supervisor stopped the run: say why
                raise RuntimeError(server.failure) from None
            raise
        finally:
            if supervisor is not None:
                supervisor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await supervisor
            await pool.aclose()


def cli() -> None:
    """``python -m agent_rl.train``: :func:`main`, with a config error printed as one line ``config error: what,
    where, the valid choices`` (exit code 2, no traceback). Every check that can run before training raises
    ConfigError (:func:`agent_rl.config.load_config`, the output dir, the resume path and config)."""
    try:
        overrides, notice = with_device_preset(sys.argv[1:])
        main(overrides, notice=notice)
    except ConfigError as exc:
        print(f"config error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, no traceback
        raise SystemExit(2) from None
    except FirstStepFailed as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    cli()
