"""What every entry point needs, once: seeding, device, loading the run's policy, the output folder and resume (the
checkpoint, its saved config, its state files), checkpoint pruning, the run's env server process and its
supervision, free ports, opening the env pool, building the engine and the orchestrator.

``agent_rl.train``, ``agent_rl.sft``, ``agent_rl.eval``, the backends (``agent_rl.local``,
``agent_rl.distributed``), scripts and benchmarks import it; it imports no entry point, no backend and nothing of
``agent_rl.eval`` (data flows one way: tests/test_layout.py). Waiting for an env server's ``/health`` is
``servers.wait.wait_healthy``, the project's one such wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import numpy as np
import torch
import yaml

from agent_rl.config.compose import config_dict, to_yaml

from agent_rl.config.schema import CONFIG_DIR, Config, ConfigError

from agent_rl.config.trainable import fit_prompt_budget
from agent_rl.engines import EngineBase, engine_kwargs, get_engine
from agent_rl.gateway import external_player
from agent_rl.envclient import HTTPEnvPool, LocalEnvPool
from agent_rl.learner.checkpoint import STATE_FILES, incomplete_message, latest_checkpoint, missing_state
from agent_rl.learner.config import t_high_value
from agent_rl.lora import apply_lora, check_targets
from agent_rl.models import load_policy
from agent_rl.rollout import GroupPlayer, RolloutConfig, env_player, get_prompt
from agent_rl.types import Episode, Generation
from envs.families import describe
from envs.procgroup import end_group, kill_group
from servers.launch import ServerLaunch, free_port, new_token  # free_port: re-exported
from servers.wait import ServerExited, wait_healthy

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------ process setup
def import_modules(modules: list[str]) -> None:
    """Import a user's modules (``trainer.imports``: registry entries; ``env_server.imports``: gymnasium ids)."""
    for module in modules:
        importlib.import_module(module)


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


def set_data_root(cfg: Config) -> None:
    """``data.root`` for envs made in this process too (local mode; ``envs.data.data_root`` reads the variable)."""
    if cfg.data.root:
        os.environ["AGENT_RL_DATA"] = cfg.data.root


def config_groups_help() -> str:
    """The config groups and their options (the ``--help`` of the entry points)."""
    groups = sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir())
    lines = ["Config groups (group=option):"]
    lines += [f"  {g.name}: {', '.join(sorted(f.stem for f in g.glob('*.yaml')))}" for g in groups]
    lines.append("Any other key: dotted key=value (e.g. trainer.total_steps=2); see agent_rl/config/schema.py.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ policy, engine
def load_run_policy(cfg: Config, progress: Any, config_file: Path | None = None, *, train: bool = False
                    ) -> tuple[Any, Any]:
    """Load the run's policy and tokenizer (``load_policy(cfg.model, train=train)``: ``train`` wraps it with the
    LoRA adapter when ``model.lora.rank > 0``), saying so on ``progress``; cap the prompt budget by the loaded
    model's context (``fit_prompt_budget``: ``cfg`` is changed in place, and ``config_file`` rewritten, when it
    does). ``model.lora.target_modules`` are checked against the loaded model either way.

    Raises:
        ConfigError: the model cannot be loaded (not found, not downloadable, an option transformers rejects), or
            LoRA target modules it does not have (the message lists its linear modules).
    """
    progress.note(f"loading model {cfg.model.path or cfg.model.name} (SmolLM2 is converted on first use, ~30 s)")
    try:
        model, tokenizer = load_policy(cfg.model)
    except (OSError, ValueError) as exc:  # not found / not downloadable / an option transformers rejects
        where = f"model.name={cfg.model.name}" + (f" model.path={cfg.model.path}" if cfg.model.path else "")
        raise ConfigError(f"{where} could not be loaded: {' '.join(str(exc).split())[:400]}") from exc
    if cfg.model.lora.rank > 0:
        try:
            check_targets(model, cfg.model.lora.target_modules)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if train:
            model = apply_lora(model, cfg.model.lora)
    note = fit_prompt_budget(cfg, getattr(model.config, "max_position_embeddings", None),
                             "max_position_embeddings of the loaded model")
    if note:  # a hub model whose config was not available offline at load time
        print(f"config: {note}", file=sys.stderr)
        if config_file is not None:
            config_file.write_text(to_yaml(cfg), encoding="utf-8")
    return model, tokenizer


def pad_token_id(tokenizer: Any) -> int:
    """The id rows are padded with (the tokenizer's pad token, else its EOS)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def build_engine(cfg: Config, model: Any, tokenizer: Any) -> Any:
    """The run's generation engine (``engine.name`` with ``engine_kwargs(cfg)``); close it with
    :func:`close_engine`."""
    return get_engine(cfg.engine.name, model, tokenizer, **engine_kwargs(cfg))


def close_engine(engine: Any) -> None:
    """Release an engine's processes and files (vllm: its engine processes and sync files; hf: nothing): its
    ``close`` (:class:`~agent_rl.engines.EngineBase`'s no-op default where it holds nothing)."""
    if isinstance(engine, EngineBase):
        engine.close()


def build_orchestrator(cfg: Config, pool: Any, engine: Any, *, rollout: RolloutConfig | None = None,
                       max_new_tokens: int | None = None, seed: int | None = None, policy: Any = None,
                       on_turn: Callable[[Generation], None] | None = None,
                       on_episode: Callable[[Episode], None] | None = None) -> GroupPlayer:
    """The run's :class:`~agent_rl.rollout.groups.GroupPlayer` (training, evaluation, Ray workers and behaviour
    cloning play episodes through it): the env's prompt format, ``rollout`` (default ``cfg.rollout``), the engine's
    sampling settings (``max_new_tokens`` default ``engine.max_new_tokens``, ``seed`` default ``engine.seed``),
    TGRL's repetition penalty, the env family's task type key, and an optional reference ``policy``
    (:mod:`agent_rl.rollout.policies`) answering turns in place of the engine. ``env.external`` set (``env=external``):
    the group player of :class:`~agent_rl.gateway.ProgramEpisode`, whose episodes are agent programs run through the
    gateway."""
    if cfg.env.external.enabled and policy is None:
        return external_player(
            pool, engine, rollout or cfg.rollout, cfg.env.external,
            max_new_tokens=cfg.engine.max_new_tokens if max_new_tokens is None else max_new_tokens,
            top_p=cfg.engine.top_p, top_k=cfg.engine.top_k, seed=cfg.engine.seed if seed is None else seed,
            high_repetition_penalty=cfg.algo.high_repetition_penalty, tool_call_format=cfg.model.tool_call_format,
            task_type_key=describe(cfg.env.id, cfg.env.name).task_type_key, model_name=cfg.model.name,
            on_turn=on_turn, on_episode=on_episode)
    return env_player(
        pool, engine, get_prompt(cfg.env.prompt), rollout or cfg.rollout,
        max_new_tokens=cfg.engine.max_new_tokens if max_new_tokens is None else max_new_tokens,
        top_p=cfg.engine.top_p, top_k=cfg.engine.top_k, seed=cfg.engine.seed if seed is None else seed,
        high_repetition_penalty=cfg.algo.high_repetition_penalty,
        action_format=cfg.env.action_format, tool_call_format=cfg.model.tool_call_format,
        task_type_key=describe(cfg.env.id, cfg.env.name).task_type_key,
        policy=policy, on_turn=on_turn, on_episode=on_episode, deterministic=env_deterministic(cfg),
        fork_js_temperatures=(cfg.algo.t_low, t_high_value(cfg.algo)) if cfg.rollout.fork.select == "js" else None)


def env_deterministic(cfg: Config) -> bool | None:
    """The env family's declaration of exact replay (``envs.families.EnvFamily.deterministic``) for the run's env
    kwargs, None when it declares nothing (forked groups, ``rollout.fork``)."""
    declared = describe(cfg.env.id, cfg.env.name).deterministic
    return None if declared is None else bool(declared(cfg.env_kwargs))


# ------------------------------------------------------------------------------------------------ output, resume
def check_output_dir(cfg: Config, out: Path) -> None:
    """Refuse a fresh run (``trainer.resume=""``) into a folder that already holds one (its ``metrics.jsonl`` would
    get a second step 1, its checkpoints mixed).

    Raises:
        ConfigError: ``out`` holds checkpoints or a non-empty ``metrics.jsonl``.
    """
    metrics = out / "metrics.jsonl"
    if not cfg.trainer.resume and (any((out / "checkpoints").glob("step_*")) or
                                   metrics.is_file() and metrics.stat().st_size):
        raise ConfigError(f"trainer.output_dir={out} already holds a run (metrics.jsonl / checkpoints); add "
                          "trainer.resume=auto to continue it, or choose a new trainer.output_dir")


def resume_path(cfg: Config, out: Path, folder: Path | None = None) -> Path | None:
    """Checkpoint to resume from: none for ``trainer.resume=""``, the latest under ``folder`` (default
    ``DIR/checkpoints``; the warm start's: ``DIR/checkpoints/warm_start``) for ``auto`` (None when there is none yet:
    a fresh start), else the given checkpoint folder.

    Raises:
        ConfigError: the given path does not exist or is not a checkpoint folder (``DIR/checkpoints/step_N``).
    """
    if not cfg.trainer.resume:
        return None
    if cfg.trainer.resume == "auto":
        found = latest_checkpoint(folder or out / "checkpoints")
        return Path(found) if found else None
    path = Path(cfg.trainer.resume).expanduser()
    if not path.exists():
        raise ConfigError(f"trainer.resume={cfg.trainer.resume} does not exist; valid: '' (fresh), auto (latest "
                          "checkpoint of trainer.output_dir) or a checkpoint folder DIR/checkpoints/step_N")
    if not (path.is_dir() and any(path.glob("*.safetensors"))):
        inside = latest_checkpoint(path) if path.is_dir() else None
        hint = f"; the newest checkpoint under it is {inside}" if inside else ""
        raise ConfigError(f"trainer.resume={cfg.trainer.resume} is not a checkpoint folder (no *.safetensors; "
                          f"checkpoints are DIR/checkpoints/step_N){hint}")
    return path


def checkpoint_step(ckpt: Path) -> int:
    """The step checkpoint ``ckpt`` ends (its ``extra.json``'s ``step``)."""
    return int(json.loads((ckpt / "extra.json").read_text()).get("step", 0))


#: ``extra.json`` key of the adaptive-T1 state (``algo.t_high=auto``: ``AdaptiveHighTemperature.state_dict()``).
T_HIGH_STATE_KEY = "tgrl_t_high"


def checkpoint_extra(cfg: Config, step: int, position: int, *, t_high_state: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The ``extra.json`` of a checkpoint, one format for every backend: the ``step`` it ends, the task sampler's
    ``position`` (tasks drawn before the next step), the run's resolved ``config``, which a resume compares with
    its own (:func:`agent_rl.resume.compare_for_resume`), and under ``algo.t_high=auto`` the adaptive-T1 state
    (``t_high_state``, key :data:`T_HIGH_STATE_KEY`), so a resumed run picks the T1 an uninterrupted one would."""
    extra = {"step": int(step), "sampler": {"position": int(position)}, "config": config_dict(cfg)}
    if t_high_state is not None:
        extra[T_HIGH_STATE_KEY] = t_high_state
    return extra


def t_high_state(extra: dict[str, Any], ckpt: Path | str) -> dict[str, Any]:
    """The adaptive-T1 state of checkpoint ``ckpt``'s ``extra`` (``algo.t_high=auto``).

    Raises:
        ConfigError: the checkpoint has none (it was not written by an ``algo.t_high=auto`` run).
    """
    state = extra.get(T_HIGH_STATE_KEY)
    if state is None:
        raise ConfigError(f"checkpoint {ckpt} has no adaptive-T1 state (extra.json key {T_HIGH_STATE_KEY!r}): it was "
                          "not written by an algo.t_high=auto run, so the resumed run could not pick the T1 an "
                          "uninterrupted one would; resume with the checkpoint's algo.t_high")
    return state


def check_resume_state(cfg: Config, ckpt: Path) -> list[str]:
    """Check that checkpoint ``ckpt`` holds the state a resume restores (``checkpoint.STATE_FILES``) before anything
    starts; returns the lines to print: with ``trainer.resume_weights_only=true``, what restarts and what is kept.

    Raises:
        ConfigError: no ``extra.json`` (no step to continue from), or no ``learner.pt`` / ``rng.pt`` without
            ``trainer.resume_weights_only=true`` (the message names each file and what it restores).
    """
    missing = missing_state(ckpt)
    if "extra.json" in missing:
        raise ConfigError(f"checkpoint {ckpt} has no extra.json ({STATE_FILES['extra.json']}): it cannot be resumed; "
                          f"start a new run from its weights with model.path={ckpt}")
    if missing and not cfg.trainer.resume_weights_only:
        raise ConfigError(incomplete_message(ckpt, missing))
    if cfg.algo.t_high == "auto":
        t_high_state(json.loads((ckpt / "extra.json").read_text()), ckpt)  # ConfigError when it has none
    if not cfg.trainer.resume_weights_only:
        return []
    o = cfg.optim
    lr_key, lr = ("optim.lora_lr", o.for_lora().lr) if cfg.model.lora.rank > 0 else ("optim.lr", o.lr)  # LoRA's own
    restarted = ["the optimizer (AdamW moments and step count from 0)",
                 f"the LR warm-up (optim.warmup={o.warmup} optimiser steps up to {lr_key}={lr:g})" if o.warmup > 0
                 else f"the LR schedule (constant {lr_key}={lr:g}, optim.warmup=0)",
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


def saved_run_config(run_dir: Path, start: int) -> tuple[dict[str, Any] | None, str]:
    """The config a run's checkpoint before step ``start`` ran under, from the run's files (checkpoints written
    before configs were stored in ``extra.json``): the newest ``config.resume-N.yaml`` with N < start, else
    ``config.yaml``. Returns ``(dict or None, source)``."""
    resumed = sorted((int(p.stem.rsplit("-", 1)[1]), p) for p in run_dir.glob("config.resume-*.yaml")
                     if p.stem.rsplit("-", 1)[1].isdigit() and int(p.stem.rsplit("-", 1)[1]) < start)
    path = resumed[-1][1] if resumed else run_dir / "config.yaml"
    if not path.is_file():
        return None, str(path)
    return yaml.safe_load(path.read_text(encoding="utf-8")), str(path)


def prune_checkpoints(folder: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest ``step_N`` checkpoints (keep=0: keep all)."""
    if keep <= 0 or not folder.is_dir():
        return
    steps = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_")
                    and p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ env servers
class EnvServerProcess:
    """The run's own env server (``env_server.urls`` empty): ``python -m servers.serve --env <env.id>`` on a free
    127.0.0.1 port (``servers.launch.ServerLaunch``, the Ray replicas' launch too), with ``env_server.token`` or a
    token made for the run (:attr:`token`), passed in its environment, never on its command line. :meth:`start` waits for ``/health`` (``servers.wait.wait_healthy``); a server that dies is
    started again on the same port by :func:`supervise_env_server` (the URL the env client holds stays valid), at
    most ``env_server.max_restarts`` times."""

    def __init__(self, cfg: Config, log_path: Path) -> None:
        es = cfg.env_server
        self.cfg, self.log_path = cfg, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # env_server.token, else one made for the run: the server is never open to other users of the machine
        self.token = es.token or new_token()
        self.repo = str(REPO)
        self.launch = ServerLaunch([cfg.env.id], self.port, self.token, imports=list(es.imports),
                                   workers=es.workers, max_sessions=es.max_sessions, data_root=cfg.data.root or "",
                                   pythonpath=self.repo)
        self.cmd = self.launch.command  # no token in it: the token is in the child's environment
        self.env = self.launch.environment()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.starts = 0  # successful starts (healthy)
        self.failure: str | None = None  # set when the supervisor gave up (the run then stops with this message)

    def start(self) -> None:
        """Start the server and wait for ``/health``. ``RuntimeError`` with the log's tail if it exits or is not
        healthy within ``env_server.startup_timeout_s``."""
        timeout_s = self.cfg.env_server.startup_timeout_s
        with open(self.log_path, "ab") as log:
            # its own session: stop() ends the server with its group (its env workers, their children)
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.repo,
                                         start_new_session=True)
        try:
            wait_healthy([self.url], timeout_s=timeout_s, interval_s=0.25, request_timeout_s=2.0, process=self.proc)
        except ServerExited as exc:
            raise RuntimeError(f"env server exited with code {exc.returncode}: {self.cmd}\n"
                               f"{_tail(self.log_path)}") from None
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"env server not healthy after {timeout_s} s: {self.cmd}\n"
                               f"{_tail(self.log_path)}") from None
        self.starts += 1
        print(f"env server {self.cfg.env.id} at {self.url} (log: {self.log_path})", file=sys.stderr)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after 15 s (and to what a server that
        exited by itself left behind: :func:`envs.procgroup.end_group`)."""
        if self.proc is not None:
            end_group(self.proc, 15)


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
        kill_group(proc.pid)  # what the dead server left behind (its env workers, their children)
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


def make_env_pool(cfg: Config, urls: list[str] | None = None, token: str | None = None) -> Any:
    """The env client: ``LocalEnvPool`` (``env_server.mode=local``) or ``HTTPEnvPool`` over ``urls`` (default
    ``env_server.urls``; the Ray workers pass the replicas' URLs) with ``token`` (default ``env_server.token``; the
    run's own server's or replicas' token otherwise). No server is started here (see :func:`open_env_pool`)."""
    es = cfg.env_server
    if es.mode == "local":
        kwargs: dict[str, Any] = {"mode": es.local_kind, "imports": list(es.imports)}
        if es.local_workers > 0:
            kwargs["max_workers"] = es.local_workers
        return LocalEnvPool(**kwargs)
    return HTTPEnvPool(list(es.urls if urls is None else urls), token=token or es.token)


@contextlib.asynccontextmanager
async def open_env_pool(cfg: Config, out: Path) -> AsyncIterator[Any]:
    """The env client of the run: ``LocalEnvPool`` (``env_server.mode=local``) or ``HTTPEnvPool`` over
    ``env_server.urls`` (a server started for the run when empty, restarted when it dies, and the run stopped with
    ``RuntimeError`` naming the cause once it cannot be: :func:`supervise_env_server`); closed (and the server
    stopped) at exit."""
    es = cfg.env_server
    server: EnvServerProcess | None = None
    supervisor: asyncio.Task[None] | None = None
    with contextlib.ExitStack() as stack:
        urls = None
        if es.mode != "local" and not es.urls:
            server = stack.enter_context(env_server(cfg, out / "env_server.log"))
            urls = [server.url]
            main_task = asyncio.current_task()
            assert main_task is not None
            supervisor = asyncio.create_task(supervise_env_server(server, main_task.cancel))
        pool = make_env_pool(cfg, urls, server.token if server is not None else None)
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
    if server is not None and server.failure:  # closed from outside the cancelled body (an exit stack): say why
        raise RuntimeError(server.failure)
