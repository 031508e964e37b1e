"""The Ray actors of the ``ray`` backend: learner ranks, rollout workers, env-server replicas.

Plain classes here; :class:`agent_rl.distributed.backend.RayBackend` turns them into actors with
``ray.remote(...)`` and the resources of each role, so this module imports without Ray.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agent_rl.distributed.data_parallel import DataParallel, init_process_group
from agent_rl.engines import VersionedEngine, caps_of, set_torch_threads
from agent_rl.engines.config import sampler_rounds
from agent_rl.eval.training import TrainingEval
from agent_rl.learner import Learner
from agent_rl.distributed.fsdp import FullyShardedDataParallel, learner_memory
from agent_rl.learner.checkpoint import (load_checkpoint, load_sharded_checkpoint, save_checkpoint,
                                         save_sharded_checkpoint)
from agent_rl.learner.config import AlgoConfig, CreditConfig, ModelConfig, OptimConfig, ScheduleConfig
from agent_rl.lora import merge_lora_state_dict, merged_state_dict
from agent_rl.memory import peak_rss_bytes, rss_bytes
from agent_rl.models import load_policy
from agent_rl.progress import Progress
from agent_rl.rollout import GroupSpec, RolloutResult, group_temperatures
from agent_rl.rollout.schedule import plays_ahead
from agent_rl.runtime import (build_engine, build_orchestrator, close_engine, free_port, import_modules,
                              make_env_pool, seed_everything)
from agent_rl.types import Task
from servers.launch import ServerLaunch
from servers.wait import ServerExited, wait_healthy


def node_ip() -> str:
    """This node's IP as Ray sees it (127.0.0.1 outside Ray)."""
    try:
        import ray  # deferred: optional, heavy (this module imports without Ray)

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 (no ray / not connected: a single machine)
        return "127.0.0.1"


@dataclass
class LearnerSpec:
    """What a learner rank needs to build its :class:`agent_rl.learner.Learner` (the ``Learner`` kwargs)."""

    model: ModelConfig
    algo: AlgoConfig
    optim: OptimConfig
    credit: CreditConfig | None = None
    schedule: ScheduleConfig | None = None
    device: str = "cpu"
    seed: int = 0
    top_k: int = 0
    top_p: float = 1.0
    num_threads: int = 1
    imports: list[str] = field(default_factory=list)
    max_staleness: int = 0
    """``trainer.max_staleness`` (the learner's behaviour correction under ``algo.behaviour_correction=auto``)."""
    sampler_rounds: bool = False
    """``engine.dtype`` other than ``model.dtype`` (the same: ``auto`` resolves to ``tis``)."""
    strategy: str = "ddp"
    """``trainer.learner_strategy``: ddp (``DataParallel``) | fsdp (``FullyShardedDataParallel``)."""
    fsdp_offload: bool = False
    fsdp_sync_every_micro_batch: bool = True
    """``FullyShardedDataParallel(sync_every_micro_batch=)`` (no config key: the default is the memory-saving one)."""

    @classmethod
    def from_config(cls, cfg: Any, device: str) -> "LearnerSpec":
        return cls(model=cfg.model, algo=cfg.algo, optim=cfg.optim, credit=cfg.credit, schedule=cfg.schedule,
                   device=device, seed=cfg.trainer.seed, top_k=cfg.engine.top_k, top_p=cfg.engine.top_p,
                   num_threads=cfg.trainer.learner_cpus, imports=list(cfg.trainer.imports),
                   max_staleness=cfg.trainer.max_staleness,
                   sampler_rounds=sampler_rounds(cfg),
                   strategy=cfg.trainer.learner_strategy, fsdp_offload=cfg.trainer.fsdp_offload)


class LearnerRank:
    """One data-parallel learner rank (a Ray actor): policy + :class:`Learner` + torch DDP over the process group.

    Call order: :meth:`address` (rank 0: where the group meets), :meth:`setup` on every rank at once, then
    :meth:`update` on every rank at once with its shard (:func:`agent_rl.distributed.data_parallel.shard_batch`).
    """

    def __init__(self, rank: int, world_size: int, spec: LearnerSpec) -> None:
        self.rank, self.world_size, self.spec = rank, world_size, spec
        self.learner: Any = None

    def address(self) -> tuple[str, int]:
        """(IP, free port) of this node: the rendezvous of the process group when this is rank 0."""
        return node_ip(), free_port("")

    def setup(self, master_addr: str, master_port: int) -> str:
        """Seed, build policy and learner, join the process group (world size > 1: gloo / NCCL + DDP, which
        broadcasts rank 0's parameters). Returns the backend ("none" for one rank)."""
        s = self.spec
        import_modules(s.imports)
        torch.set_num_threads(max(1, int(s.num_threads)))
        seed_everything(s.seed)
        device = s.device
        if device.startswith("cuda") and torch.cuda.is_available() and device == "cuda":
            device = "cuda:0"  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
        self.model, self.tokenizer = load_policy(s.model, train=True)  # LoRA: the peft model (seeded adapter)
        self.learner = Learner(self.model, self.tokenizer, s.algo, s.optim, credit=s.credit, schedule=s.schedule,
                               device=device, seed=s.seed, top_k=s.top_k, top_p=s.top_p,
                               max_staleness=s.max_staleness, sampler_rounds=s.sampler_rounds)
        backend = "none"
        if s.strategy == "fsdp":  # a process group even for one rank (FSDP's mesh; CPU offload on one GPU)
            backend = init_process_group(self.rank, self.world_size, master_addr, master_port)
            self.learner.data_parallel = FullyShardedDataParallel(
                self.learner, offload=s.fsdp_offload, sync_every_micro_batch=s.fsdp_sync_every_micro_batch)
        elif self.world_size > 1:
            backend = init_process_group(self.rank, self.world_size, master_addr, master_port)
            self.learner.data_parallel = DataParallel(self.learner)
        return backend

    @property
    def sharded(self) -> bool:
        """Whether the ranks shard the model (fsdp): then :meth:`get_weights`, :meth:`save` and :meth:`load` are
        collective (every rank calls them)."""
        return isinstance(getattr(self.learner, "data_parallel", None), FullyShardedDataParallel)

    def memory(self) -> dict[str, int]:
        """Tensor bytes of this rank's learner (``agent_rl.distributed.fsdp.learner_memory``: parameters, gradients,
        optimizer state, local shards) and ``rss`` (this process's resident set), bytes; ``sync_*``: the last weight
        gather of a sharded rank (largest transient full tensor, rank 0's CPU copy)."""
        out = learner_memory(self.learner)
        out["rss"] = rss_bytes()
        out["peak_rss"] = peak_rss_bytes()
        if self.sharded:
            out.update({f"sync_{k}": v for k, v in self.learner.data_parallel.last_gather.items()})
        return out

    def set_temperatures(self, t_low: float, t_high: float) -> None:
        """The run's calibrated (T0, T1) (algorithms.md 3b): the temperatures of this rank's JS."""
        self.learner.algo.t_low, self.learner.algo.t_high = float(t_low), float(t_high)

    def update(self, shard: Any, step: int, total_steps: int) -> dict[str, float]:
        """``Learner.update`` on this rank's shard (the ranks agree on the step's mini-batch count themselves:
        ``DataParallel.global_min`` of each rank's min(``algo.num_mini_batches``, its groups))."""
        metrics = self.learner.update(shard, step=step, total_steps=total_steps)
        metrics["batch/response_tokens"] = float(shard.response_mask.sum())
        return metrics

    def last_token_stats(self) -> dict[str, torch.Tensor] | None:
        """``Learner.last_token_stats`` of the last :meth:`update`: (b, L) float32 CPU tensors aligned with this
        rank's shard (the episode store's per-token numbers)."""
        return self.learner.last_token_stats

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The policy's state dict on CPU (what rollout workers load; LoRA: merged, plain transformers names,
        ``agent_rl.lora.merged_state_dict``)."""
        if self.sharded:  # gathered parameter by parameter; rank 0 returns them, the other ranks None
            full = self.learner.data_parallel.full_state_dict()
            return merge_lora_state_dict(full, self.model) if full is not None else None  # LoRA: merged
        return {k: v.detach().to("cpu", copy=True) for k, v in merged_state_dict(self.model).items()}

    def save(self, directory: str, extra: dict[str, Any]) -> None:
        """Checkpoint (model, tokenizer, learner state, RNG, ``extra``) to ``directory`` (called on rank 0)."""
        if self.sharded:  # every rank: DCP shards + rank 0's gathered HF folder
            full = self.learner.data_parallel.full_state_dict()
            save_sharded_checkpoint(directory, self.model, self.tokenizer, self.learner, extra, full)
            return
        save_checkpoint(directory, self.model, self.tokenizer, self.learner, extra)

    def load(self, directory: str, weights_only: bool = False) -> dict[str, Any]:
        """Load a checkpoint written by any number of ranks (every rank loads the same state; ``weights_only``:
        ``trainer.resume_weights_only``, see ``load_checkpoint``). Returns its ``extra`` dict."""
        if self.sharded:
            return load_sharded_checkpoint(directory, self.model, self.learner, weights_only=weights_only)
        return load_checkpoint(directory, self.model, self.learner, weights_only=weights_only)

    def lr(self) -> float:
        """The learning rate of this rank's next optimiser step (``Learner.lr``)."""
        return self.learner.lr

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class RolloutWorker:
    """One rollout worker (a Ray actor): a policy copy, an engine replica, an env client and an orchestrator.

    Args:
        cfg: the run's :class:`agent_rl.config.schema.Config`.
        index: worker index (0..M-1). Every worker samples with the local backend's seed (``engine.seed``): the
            randomness of a turn is keyed by its step, group id, slot and turn (``agent_rl.rollout.orchestrator``),
            so a group samples the same episodes on any worker, with any M, and as the local backend does.
        env_urls: env-server URLs (``env_server.mode=http``); ignored in local mode.
        env_token: the servers' token (the run's replicas' own; ``None``: ``env_server.token``).
    """

    def __init__(self, cfg: Any, index: int, env_urls: list[str], env_token: str | None = None) -> None:
        self.cfg, self.index, self.env_urls, self.env_token = cfg, index, list(env_urls), env_token
        self.version = -1
        # the orchestrator's event loop, in its own thread (Ray may run actor methods where a loop is running)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="rollout-loop").start()
        self._ready = False
        self._evaluator: Any = None
        self._build_lock = threading.Lock()  # asynchronous rollouts: a threaded actor, calls may overlap
        self._stream: Any = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _build(self) -> None:
        with self._build_lock:
            if not self._ready:
                self._build_once()

    def _build_once(self) -> None:
        cfg = self.cfg
        import_modules(list(cfg.trainer.imports) + list(cfg.env_server.imports))
        if cfg.data.root:
            os.environ["AGENT_RL_DATA"] = cfg.data.root
        set_torch_threads(cfg.engine.num_threads)
        self.model, self.tokenizer = load_policy(cfg.model)
        if torch.cuda.is_available() and cfg.rollout.worker_gpus > 0:
            self.model.to("cuda:0")
        self.engine = build_engine(cfg, self.model, self.tokenizer)
        # weights swapped between two engine calls, generations stamped (an engine that carries versions stamps its
        # own: vllm_server's servers' weight version; a sync waits for the requests in flight)
        if plays_ahead(cfg) and not caps_of(self.engine).carries_versions:
            self.engine = VersionedEngine(self.engine, self.version)
        self.pool = self._run(self._make_pool())  # made on the orchestrator's event loop, which uses it
        self.orchestrator = build_orchestrator(cfg, self.pool, self.engine)
        self._ready = True

    async def _make_pool(self) -> Any:
        return make_env_pool(self.cfg, self.env_urls, self.env_token)

    def set_weights(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        """Load the policy weights of learner version ``version`` (the number of updates behind them) into the
        engine. Returns the version now loaded."""
        if not self._ready:
            self._build()

        def load() -> None:
            self.model.load_state_dict(weights)
            self.engine.sync_weights(self.model, int(version))  # a VersionedEngine's: the wrapped engine's as is

        if isinstance(self.engine, VersionedEngine):  # asynchronous: between two engine calls of the stream
            self.engine.sync(load, int(version))
        else:
            load()
        self.version = int(version)
        self.orchestrator.policy_version = self.version  # each turn records it (algorithms.md section 7)
        return self.version

    def play_group(self, task: Task, temperatures: list[tuple[float, bool]], min_version: int) -> dict[str, Any]:
        """Asynchronous rollouts (``trainer.max_staleness`` >= 1; the actor is threaded, so several calls play at
        once on the orchestrator's stream, :meth:`RolloutOrchestrator.play_group`): one group of ``task`` at
        ``temperatures``. Returns ``{"episodes", "counters" (the stream's totals), "worker", "weight_version"}``.

        Raises:
            RuntimeError: the worker's weights are older than ``min_version`` (the driver's bound: never sampled).
        """
        if not self._ready:
            self._build()
        if self.version < min_version:
            raise RuntimeError(f"rollout worker {self.index} holds weight version {self.version} < {min_version}, "
                               "older than trainer.max_staleness allows")
        episodes = self._run(self._play_stream(GroupSpec(task, list(temperatures))))
        return {"episodes": episodes, "counters": self.orchestrator.stream_counters(), "worker": self.index,
                "weight_version": self.version}

    async def _play_stream(self, spec: GroupSpec) -> Any:
        if self._stream is None:  # one stream per worker (on its event loop), opened by the first group
            self._stream = asyncio.ensure_future(self.orchestrator.open_stream(seed_key=10**9))
        await asyncio.shield(self._stream)
        return await self.orchestrator.play_group(spec)

    def play(self, tasks: list[Task], step: int, seed_key: int, expected_version: int,
             t_high: float | None = None) -> dict[str, Any]:
        """Play one group per task of ``tasks`` (:meth:`RolloutOrchestrator.run_groups` with the rollout seed key
        ``seed_key``: the step and round, as the local backend's). Returns ``{"result": RolloutResult,
        "weight_version", "worker"}``; a version other than ``expected_version`` is said on stderr (stale weights
        are never silent) and reported in the driver's metrics. ``t_high``: the step's T1 the driver picked
        (``algo.t_high=auto``), None = the fixed ``algo.t_high``."""
        if not self._ready:
            self._build()
        if self.version != expected_version:
            print(f"warning: rollout worker {self.index} samples step {step} with weight version {self.version}, "
                  f"expected {expected_version}", file=sys.stderr)
        temps = group_temperatures(self.cfg.algo, step, t_high)
        result: RolloutResult = self._run(self.orchestrator.run_groups([GroupSpec(t, temps) for t in tasks],
                                                                       seed_key=seed_key))
        return {"result": result, "weight_version": self.version, "worker": self.index}

    def play_specs(self, specs: list[GroupSpec], seed_key: int, expected_version: int) -> dict[str, Any]:
        """Play groups at the temperatures their specs give (the calibration probe, algorithms.md 3b), rollout seed
        key ``seed_key``; returns what :meth:`play` returns."""
        if not self._ready:
            self._build()
        if self.version != expected_version:
            print(f"warning: rollout worker {self.index} plays the calibration probe with weight version "
                  f"{self.version}, expected {expected_version}", file=sys.stderr)
        result: RolloutResult = self._run(self.orchestrator.run_groups(list(specs), seed_key=seed_key))
        return {"result": result, "weight_version": self.version, "worker": self.index}

    def set_temperatures(self, t_low: float, t_high: float) -> None:
        """The run's calibrated (T0, T1) (algorithms.md 3b): every later group samples at them."""
        self.cfg.algo.t_low, self.cfg.algo.t_high = float(t_low), float(t_high)

    def evaluate(self, step: int, out_dir: str) -> list[dict[str, Any]]:
        """The training eval panel (:class:`agent_rl.eval.training.TrainingEval`, ``trainer.eval_*``) with this
        worker's engine, env client and weights (the driver calls it on worker 0 after the step's weights are
        loaded). Writes ``out_dir/eval/step_<step>/<panel>.json|.png`` (``out_dir`` must be reachable from this node,
        as for checkpoints); returns the per-panel results, which the driver turns into ``eval/...`` metrics."""
        if not self._ready:
            self._build()
        if self._evaluator is None:
            self._evaluator = TrainingEval(self.cfg, Path(out_dir), Progress(enabled=False))
        return self._run(self._evaluator.results(step, self.pool, self.engine))

    def engine_metrics(self) -> dict[str, float]:
        """This worker's engine metrics of the step (``vllm_server``: ``step_metrics``; others: none)."""
        return self.engine.step_metrics() if self._ready and caps_of(self.engine).step_metrics else {}

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        """Close the orchestrator, the env client and the engine (vllm: its engine processes and sync files)."""
        if self._ready:
            self._ready = False
            try:
                if self._stream is not None:
                    self._run(self.orchestrator.close_stream())
                self._run(self.orchestrator.aclose())
                self._run(self.pool.aclose())
            finally:
                close_engine(self.engine)


def _die_with_parent() -> None:
    """In a child before exec: ask Linux to SIGKILL it when its parent (the actor) dies (``prctl(PR_SET_PDEATHSIG)``)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


class EnvServerReplica:
    """One env-server replica (a Ray actor): ``python -m servers.serve`` as a child process of this actor, launched
    as the local backend's run server is (``servers.launch.ServerLaunch``: the token in the child's environment,
    never on its command line); :meth:`url` announces ``http://<host>:<port>``. The child is started with
    ``PR_SET_PDEATHSIG`` = SIGKILL, so killing the actor kills its server too (the server is a process, as the
    local backend's auto-started one; only ``servers.launch`` and ``servers.wait``, standard library, are imported
    here).

    Binding: ``loopback`` is chosen by the backend (``RayBackend.open``) from the topology: ``127.0.0.1`` when the
    Ray cluster has one node (every rollout worker is on this machine), else this node's IP (the address other
    nodes reach it at; never ``0.0.0.0``). Either way the replica has a token, the run's (``env_server.token``, else one
    the run made with ``servers.launch.new_token``), which the rollout workers send.
    """

    def __init__(self, env_ids: list[str], imports: list[str], token: str, max_sessions: int, workers: int,
                 data_root: str = "", loopback: bool = True) -> None:
        bind = "127.0.0.1" if loopback else node_ip()
        self.port = free_port(bind)
        self.launch = ServerLaunch(env_ids, self.port, token, host=bind, imports=imports, workers=workers,
                                   max_sessions=max_sessions, log_level="warning", data_root=data_root)
        self.proc = self.launch.start(preexec_fn=_die_with_parent)  # noqa: PLW1509 (Linux prctl only)
        self._url = f"http://{bind}:{self.port}"

    def url(self, timeout_s: float = 120.0) -> str:
        """The replica's base URL once ``/health`` answers (``servers.wait.wait_healthy``; ``RuntimeError`` when the
        server exits first or after ``timeout_s``)."""
        try:
            wait_healthy([self._url], timeout_s=timeout_s, interval_s=0.2, request_timeout_s=2.0, process=self.proc)
        except ServerExited as exc:
            raise RuntimeError(f"env-server replica on port {self.port} exited with code {exc.returncode} before "
                               "serving (its output is in this actor's log)") from None
        except TimeoutError:
            raise RuntimeError(f"env-server replica {self._url} not healthy after {timeout_s} s") from None
        return self._url

    def pid(self) -> int:
        return os.getpid()
