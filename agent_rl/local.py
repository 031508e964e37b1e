"""``trainer.backend=local``: the run in one process (:class:`LocalBackend`, driven by :func:`agent_rl.loop.run`).

The orchestrator plays the step's groups on the run's env pool (in-process envs, or env servers over HTTP, one
started for the run when no URL is given); the update runs in a worker thread, so the event loop keeps serving env
calls. *When* groups are played is the schedule's (:mod:`agent_rl.rollout.schedule`); this backend is *where*
(:class:`LocalPlayer`: one round, one group, the weights into the engine, the stream's counters, env-reset prefetch).

The policy is one module shared by the learner and the engine (hf: the same weights; vllm: synced after each
update). When the rollouts play ahead of the learner (``trainer.max_staleness`` >= 1,
:func:`agent_rl.rollout.schedule.plays_ahead`) the hf engine samples with its own copy of the policy instead (loaded
after each update; vllm is its own process), wrapped in a :class:`~agent_rl.engines.VersionedEngine`, and the
player offers no env-reset prefetch (the stream runs ahead itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from pathlib import Path
from typing import Any

from agent_rl.config.schema import Config
from agent_rl.engines import VersionedEngine, caps_of, engine_caps, set_torch_threads
from agent_rl.engines.config import sampler_rounds
from agent_rl.eval.training import TrainingEval
from agent_rl.learner import Learner
from agent_rl.learner.checkpoint import load_checkpoint, save_checkpoint
from agent_rl.lora import base_module
from agent_rl.rollout import GroupSpec, RolloutResult, group_temperatures
from agent_rl.rollout.schedule import plays_ahead
from agent_rl.runtime import (build_engine, build_orchestrator, close_engine, import_modules, load_run_policy,
                              open_env_pool, resolve_device, seed_everything)
from agent_rl.types import Episode, RolloutBatch, Task


class LocalPlayer:
    """Where the local backend plays groups (:class:`agent_rl.rollout.schedule.Player`): its orchestrator, with the
    engine it samples with; ``load_weights`` copies the learner's weights into that engine."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend, self.rollout = backend, backend.rollout
        # the next step's env resets during this update (a stream runs ahead itself)
        self.prefetch = None if plays_ahead(backend.cfg) else self.rollout.prefetch

    async def play_round(self, tasks: list[Task], step: int, seed_key: int, t_high: float | None) -> RolloutResult:
        temps = group_temperatures(self.backend.cfg.algo, step, t_high)
        self.rollout.policy_version = self.backend.version  # each turn records it (algorithms.md section 7)
        return await self.rollout.run_groups([GroupSpec(task, temps) for task in tasks], seed_key=seed_key)

    async def play_group(self, spec: GroupSpec) -> list[Episode]:
        return await self.rollout.play_group(spec)

    async def play_specs(self, specs: list[GroupSpec], seed_key: int) -> RolloutResult:
        """Groups at the temperatures their specs give (the calibration probe, algorithms.md 3b)."""
        self.rollout.policy_version = self.backend.version
        return await self.rollout.run_groups(specs, seed_key=seed_key)

    async def load_weights(self, version: int) -> None:
        await asyncio.to_thread(self.backend.load_engine, version)

    def counters(self) -> dict[str, float]:
        return self.rollout.stream_counters()

    def collected(self, step: int, result: RolloutResult) -> None:
        """Nothing to add: the step's metrics are the orchestrator's (its event counters included)."""


class LocalBackend:
    """One process: policy, :class:`~agent_rl.learner.Learner`, engine, env pool and orchestrator
    (:class:`agent_rl.loop.Backend`).

    Args:
        cfg: the run's config (its prompt budget is capped in place by the loaded model's context).
        out: the run directory (the auto-started env server's log goes there).
        progress: the run's :class:`agent_rl.progress.Progress`.
        config_file: the saved config, rewritten if the model's context caps the prompt budget.
    """

    kind = "train"

    def __init__(self, cfg: Config, out: Path, progress: Any, config_file: Path | None = None) -> None:
        self.cfg, self.out, self.progress = cfg, out, progress
        import_modules(cfg.trainer.imports)  # a user's registry entries (estimators, losses, credit rules, schedules)
        seed_everything(cfg.trainer.seed)
        set_torch_threads(cfg.engine.num_threads)
        device = resolve_device(cfg.trainer.device)
        self.model, self.tokenizer = load_run_policy(cfg, progress, config_file, train=True)
        self.learner = Learner(self.model, self.tokenizer, cfg.algo, cfg.optim, credit=cfg.credit,
                               schedule=cfg.schedule, device=device, seed=cfg.trainer.seed, top_k=cfg.engine.top_k,
                               top_p=cfg.engine.top_p, max_staleness=cfg.trainer.max_staleness,
                               sampler_rounds=sampler_rounds(cfg))
        # the engine runs the transformers model itself (LoRA: the one inside the peft model, adapter live)
        self.engine_model: Any = None
        if not plays_ahead(cfg):
            self.engine = build_engine(cfg, base_module(self.model), self.tokenizer)  # closed by close()
        else:  # asynchronous rollouts: the engine samples with weights the update does not touch
            # hf: its own copy, loaded after each update; none where the engine keeps weights of its own already
            # (another process, or engine.dtype other than model.dtype: the engine's cast copy, EngineConfig.dtype)
            if not engine_caps(cfg.engine.name).own_process and not sampler_rounds(cfg):
                self.engine_model = copy.deepcopy(base_module(self.model)).requires_grad_(False)
            engine = build_engine(cfg, self.engine_model if self.engine_model is not None
                                  else base_module(self.model), self.tokenizer)
            # an engine that labels its generations with its weights' version itself (vllm_server: a sync waits
            # for the requests in flight) goes unwrapped: the wrapper's lock lets one call in flight at a time
            self.engine = engine if caps_of(engine).carries_versions else VersionedEngine(engine)
        self.total_steps = cfg.trainer.total_steps
        self.version = 0  # updates behind the engine's weights
        self._stack = contextlib.AsyncExitStack()
        self.pool: Any = None
        self.rollout: Any = None

    @property
    def lr(self) -> float:
        return self.learner.lr

    def load_engine(self, version: int) -> None:
        """The learner's weights (after ``version`` updates) into the engine (hf with its own copy: copied into it
        first; a versioned engine swaps them between two of its calls). Blocking: run it in a worker thread."""
        if not isinstance(self.engine, VersionedEngine):
            self.engine.sync_weights(base_module(self.model), version)
        elif self.engine_model is not None:
            self.engine.sync(lambda: (self.engine_model.load_state_dict(base_module(self.model).state_dict()),
                                      self.engine.engine.sync_weights(self.engine_model)), version)
        else:
            self.engine.sync(lambda: self.engine.engine.sync_weights(base_module(self.model)), version)
        self.version = version

    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        """Model, optimizer, scheduler and RNG states from ``ckpt`` (``load_checkpoint``), then the engine."""
        if ckpt is None:
            return None
        extra = await asyncio.to_thread(load_checkpoint, ckpt, self.model, self.learner,
                                        weights_only=self.cfg.trainer.resume_weights_only)
        await asyncio.to_thread(self.load_engine, int(extra.get("policy_version", extra["step"])))
        return extra

    async def open(self) -> LocalPlayer:
        cfg, progress = self.cfg, self.progress
        if cfg.env_server.mode != "local" and not cfg.env_server.urls:
            progress.note(f"starting the {cfg.env.id} env server (log: {self.out / 'env_server.log'})")
        self.pool = await self._stack.enter_async_context(open_env_pool(cfg, self.out))
        self.rollout = build_orchestrator(cfg, self.pool, self.engine,
                                          on_turn=lambda gen: progress.turn(len(gen.token_ids)),
                                          on_episode=lambda ep: progress.episode(ep.won))
        self._stack.push_async_callback(self.rollout.aclose)
        if plays_ahead(cfg):  # one stream of groups for the run (its counters add up until it closes)
            await self.rollout.open_stream(seed_key=10**9 + self.version)
            self._stack.push_async_callback(self.rollout.close_stream)
        return LocalPlayer(self)

    async def set_temperatures(self, t_low: float, t_high: float) -> None:
        """The calibrated (T0, T1): the run's config, which the orchestrator samples from, and the learner's JS."""
        for algo in (self.cfg.algo, self.learner.algo):
            algo.t_low, algo.t_high = float(t_low), float(t_high)

    async def update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if not isinstance(self.engine, VersionedEngine) and caps_of(self.engine).sleep:
            self.engine.sleep()  # vllm with engine.sleep_mode (refused with a stream): its GPU memory to the learner
        return await asyncio.to_thread(self.learner.update, batch, step=step, total_steps=self.total_steps)

    async def token_stats(self) -> dict[str, Any] | None:
        return self.learner.last_token_stats

    async def engine_metrics(self) -> dict[str, float]:
        if not caps_of(self.engine).step_metrics:
            return {}
        return await asyncio.to_thread(self.engine.step_metrics)  # vllm_server: the servers' /metrics over HTTP

    async def evaluate(self, step: int, evaluator: TrainingEval) -> list[dict[str, Any]]:
        return await evaluator.results(step, self.pool, self.engine)

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        await asyncio.to_thread(save_checkpoint, path, self.model, self.tokenizer, self.learner, extra)

    async def close(self) -> None:
        try:
            await self._stack.aclose()  # the orchestrator's prefetched resets, the env pool and its server
        finally:
            close_engine(self.engine)
