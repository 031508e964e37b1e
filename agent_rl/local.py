"""``trainer.backend=local``: the run in one process (:class:`LocalBackend`, driven by :func:`agent_rl.loop.run`).

The policy is one module shared by the learner and the engine (hf: the same weights; vllm: synced after each
update). The orchestrator plays the step's groups on the run's env pool (in-process envs, or env servers over HTTP,
one started for the run when no URL is given); the update runs in a worker thread, so the event loop keeps serving
env calls, and the next step's env resets (seconds on ALFWorld) are started before it (``prefetch``).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Callable

from agent_rl.config import BACKENDS, Config
from agent_rl.engines import set_torch_threads
from agent_rl.eval.training import TrainingEval
from agent_rl.learner import Learner
from agent_rl.learner.checkpoint import load_checkpoint, save_checkpoint
from agent_rl.rollout import RolloutResult, group_temperatures
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
        self.model, self.tokenizer = load_run_policy(cfg, progress, config_file)
        self.learner = Learner(self.model, self.tokenizer, cfg.algo, cfg.optim, credit=cfg.credit,
                               schedule=cfg.schedule, device=device, seed=cfg.trainer.seed, top_k=cfg.engine.top_k,
                               top_p=cfg.engine.top_p)
        self.engine = build_engine(cfg, self.model, self.tokenizer)  # closed by close()
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
        return self.rollout.num_prefetched_tasks if self.rollout is not None else 0

    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        """Model, optimizer, scheduler and RNG states from ``ckpt`` (``load_checkpoint``), then the engine."""
        if ckpt is None:
            return None
        extra = load_checkpoint(ckpt, self.model, self.learner, weights_only=self.cfg.trainer.resume_weights_only)
        self.version = int(extra["step"])
        self.engine.sync_weights(self.model)
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

    async def collect(self, step: int, sample_tasks: Callable[[int], list[Task]],
                      t_high: float | None = None) -> RolloutResult:
        cfg = self.cfg
        self.rollout.policy_version = self.version  # each turn records it (algorithms.md section 7, Versions)
        self.progress.phase(f"step {step}/{self.total_steps} rollout",
                            total=cfg.trainer.tasks_per_step * len(group_temperatures(cfg.algo, step, t_high)))
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
        if hasattr(self.engine, "sleep"):  # vllm with engine.sleep_mode: its GPU memory to the learner
            self.engine.sleep()
        return await asyncio.to_thread(self.learner.update, batch, step=step, total_steps=self.total_steps)

    async def token_stats(self) -> dict[str, Any] | None:
        return self.learner.last_token_stats

    async def sync(self, version: int) -> None:
        self.engine.sync_weights(self.model)
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
