"""``trainer.backend=local``: the run in one process (:class:`LocalBackend`, driven by :func:`agent_rl.loop.run`).

The policy is one module shared by the learner and the engine (hf: the same weights; vllm: synced after each
update). With ``trainer.max_staleness`` >= 1 (asynchronous rollouts, :mod:`agent_rl.rollout.producer`) the hf engine
samples with its own copy of the policy instead (loaded after each update; vllm is its own process), wrapped in a
:class:`~agent_rl.rollout.producer.VersionedEngine`, and an :class:`~agent_rl.rollout.producer.AsyncProducer` plays
groups while the update runs in its worker thread (no env-reset prefetch: the producer runs ahead itself). The orchestrator plays the step's groups on the run's env pool (in-process envs, or env servers over HTTP,
one started for the run when no URL is given); the update runs in a worker thread, so the event loop keeps serving
env calls, and the next step's env resets (seconds on ALFWorld) are started before it (``prefetch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from agent_rl.config import BACKENDS, Config
from agent_rl.engines import set_torch_threads
from agent_rl.eval.training import TrainingEval
from agent_rl.learner import Learner
from agent_rl.learner.checkpoint import load_checkpoint, save_checkpoint
from agent_rl.lora import base_module
from agent_rl.rollout import RolloutResult, group_temperatures
from agent_rl.rollout.producer import AsyncProducer, VersionedEngine, warmup_horizon
from agent_rl.runtime import (build_engine, build_orchestrator, close_engine, import_modules, load_run_policy,
                              open_env_pool, resolve_device, seed_everything)
from agent_rl.types import RolloutBatch, Task


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
    capabilities = BACKENDS["local"]

    def __init__(self, cfg: Config, out: Path, progress: Any, config_file: Path | None = None) -> None:
        self.cfg, self.out, self.progress = cfg, out, progress
        import_modules(cfg.trainer.imports)  # a user's registry entries (estimators, losses, credit rules, schedules)
        seed_everything(cfg.trainer.seed)
        set_torch_threads(cfg.engine.num_threads)
        device = resolve_device(cfg.trainer.device)
        self.model, self.tokenizer = load_run_policy(cfg, progress, config_file, train=True)
        self.learner = Learner(self.model, self.tokenizer, cfg.algo, cfg.optim, credit=cfg.credit,
                               schedule=cfg.schedule, device=device, seed=cfg.trainer.seed, top_k=cfg.engine.top_k,
                               top_p=cfg.engine.top_p, max_staleness=cfg.trainer.max_staleness)
        # the engine runs the transformers model itself (LoRA: the one inside the peft model, adapter live)
        self.max_staleness = cfg.trainer.max_staleness
        self.engine_model: Any = None
        if self.max_staleness == 0:
            self.engine = build_engine(cfg, base_module(self.model), self.tokenizer)  # closed by close()
        else:  # asynchronous rollouts: the engine samples with weights the update does not touch
            if cfg.engine.name != "vllm":  # hf: its own copy of the policy, loaded after each update
                self.engine_model = copy.deepcopy(base_module(self.model)).requires_grad_(False)
            self.engine = VersionedEngine(build_engine(cfg, self.engine_model if self.engine_model is not None
                                                       else base_module(self.model), self.tokenizer))
            self.capabilities = dataclasses.replace(BACKENDS["local"], prefetch=False)  # the producer runs ahead
        self.producer: AsyncProducer | None = None
        self._t_high: float | None = None
        self.total_steps = cfg.trainer.total_steps
        self.version = 0  # updates behind the engine's weights
        self._stack = contextlib.AsyncExitStack()
        self.pool: Any = None
        self.rollout: Any = None

    @property
    def lr(self) -> float:
        return self.learner.lr

    @property
    def pending_tasks(self) -> int:
        if self.producer is not None:
            return self.producer.pending_tasks
        return self.rollout.num_prefetched_tasks if self.rollout is not None else 0

    @property
    def groups_in_flight(self) -> int:
        """Groups started and not trained (asynchronous rollouts; a checkpoint counts them: a resume replays them)."""
        return self.producer.groups_in_flight if self.producer is not None else 0

    def _load_engine(self) -> None:
        """The learner's weights into the engine (hf with its own copy: copied into it first)."""
        if self.engine_model is not None:
            self.engine_model.load_state_dict(base_module(self.model).state_dict())
            self.engine.engine.sync_weights(self.engine_model)
        else:
            getattr(self.engine, "engine", self.engine).sync_weights(base_module(self.model))

    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        """Model, optimizer, scheduler and RNG states from ``ckpt`` (``load_checkpoint``), then the engine."""
        if ckpt is None:
            return None
        extra = load_checkpoint(ckpt, self.model, self.learner, weights_only=self.cfg.trainer.resume_weights_only)
        self.version = int(extra.get("policy_version", extra["step"]))
        if self.max_staleness == 0:
            self.engine.sync_weights(base_module(self.model))
        else:
            self.engine.sync(self._load_engine, self.version)
        return extra

    async def open(self) -> None:
        cfg, progress = self.cfg, self.progress
        if cfg.env_server.mode != "local" and not cfg.env_server.urls:
            progress.note(f"starting the {cfg.env.id} env server (log: {self.out / 'env_server.log'})")
        self.pool = await self._stack.enter_async_context(open_env_pool(cfg, self.out))
        self.rollout = build_orchestrator(cfg, self.pool, self.engine,
                                          on_turn=lambda gen: progress.turn(len(gen.token_ids)),
                                          on_episode=lambda ep: progress.episode(ep.won))
        self._stack.push_async_callback(self.rollout.aclose)
        if self.max_staleness > 0:
            t, algo = cfg.trainer, cfg.algo
            await self.rollout.open_stream(seed_key=10**9 + self.version)
            self._stack.push_async_callback(self.rollout.close_stream)

            async def load(version: int) -> None:
                await asyncio.to_thread(self.engine.sync, self._load_engine, version)

            self.producer = AsyncProducer(
                self.rollout.play_group, load, self.rollout.stream_counters,
                lambda step: group_temperatures(algo, step, self._t_high), max_staleness=self.max_staleness,
                tasks_per_step=t.tasks_per_step, total_steps=self.total_steps,
                max_replays=cfg.rollout.max_stale_replays, partial=cfg.rollout.partial,
                filter_groups=algo.dapo_dynamic_sampling, max_extra_rounds=algo.dapo_max_extra_rounds,
                version=self.version, horizon=lambda step: warmup_horizon(algo, step, self.total_steps))
            self._stack.push_async_callback(self.producer.aclose)  # before the stream and the pool close

    async def collect(self, step: int, sample_tasks: Callable[[int], list[Task]],
                      t_high: float | None = None) -> RolloutResult:
        cfg = self.cfg
        self.rollout.policy_version = self.version  # each turn records it (algorithms.md section 7, Versions)
        self.progress.phase(f"step {step}/{self.total_steps} rollout",
                            total=cfg.trainer.tasks_per_step * len(group_temperatures(cfg.algo, step, t_high)))
        if self.producer is not None:  # asynchronous: the step's groups from the producer (rollout/producer.py)
            self._t_high = t_high  # the T1 of groups started from now on (section 7: fixed at a group's start)
            return await self.producer.collect(step, sample_tasks)
        result = await self.rollout.collect(sample_tasks, cfg.trainer.tasks_per_step, cfg.algo, step,
                                            filter_groups=cfg.algo.dapo_dynamic_sampling,
                                            max_extra_rounds=cfg.algo.dapo_max_extra_rounds, t_high=t_high)
        result.versions = [self.version] * (len(result.episodes) // max(cfg.algo.group_size, 1))
        return result

    def prefetch(self, tasks: list[Task]) -> None:
        self.rollout.prefetch(tasks, self.cfg.algo.group_size)

    def cannot_update(self, batch: RolloutBatch) -> str | None:
        return None

    async def update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if self.producer is not None:  # the producer keeps playing during the update: time/overlap_s
            t0, a0 = time.perf_counter(), self.producer.active_seconds()
            metrics = await asyncio.to_thread(self.learner.update, batch, step=step, total_steps=self.total_steps)
            metrics["time/overlap_s"] = min(self.producer.active_seconds() - a0, time.perf_counter() - t0)
            return metrics
        if hasattr(self.engine, "sleep"):  # vllm with engine.sleep_mode: its GPU memory to the learner
            self.engine.sleep()
        return await asyncio.to_thread(self.learner.update, batch, step=step, total_steps=self.total_steps)

    async def token_stats(self) -> dict[str, Any] | None:
        return self.learner.last_token_stats

    async def sync(self, version: int) -> None:
        if self.producer is not None:  # rollout.partial=false: after the episodes in flight (producer.sync)
            await self.producer.sync(version)
        else:
            self.engine.sync_weights(base_module(self.model))
        self.version = version

    async def evaluate(self, step: int, evaluator: TrainingEval) -> list[dict[str, Any]]:
        return await evaluator.results(step, self.pool, self.engine)

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        save_checkpoint(path, self.model, self.tokenizer, self.learner, extra)

    async def close(self) -> None:
        try:
            await self._stack.aclose()  # the orchestrator's prefetched resets, the env pool and its server
        finally:
            close_engine(self.engine)
