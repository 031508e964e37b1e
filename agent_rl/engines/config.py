"""Engine config (``engine=...``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """Generation engine settings; ``name`` selects an entry of the engine registry (``hf`` | ``vllm``)."""

    name: str = "hf"
    """hf (transformers, runs anywhere, shares the learner's module) | vllm (GPU, separate weights, synced)."""
    max_new_tokens: int = 128
    """Response budget per turn (tokens); a response that hits it finishes with reason ``length``."""
    top_p: float = 1.0
    """Nucleus sampling (1 = off; TGRL uses 1). The learner computes old and new log-probs under the same truncated
    distribution (``agent_rl.algos.truncate_logits``), so what is sampled is what is learned."""
    top_k: int = 0
    """Top-k sampling (0 = off; TGRL uses off); truncation shared with the learner like ``top_p``."""
    batch_size: int = 32
    """hf: prompts per forward batch (prompts are sorted by length and cut into batches of this size)."""
    num_threads: int = 0
    """torch intra-op threads of the trainer process (0 = leave torch's default). With the engine and the learner
    in one process and env servers on the same cores, 1-2 threads avoid OpenMP stalls in tiny ops."""
    gpu_memory_utilization: float = 0.4
    """vllm: fraction of GPU memory for its KV cache (the learner shares the GPU)."""
    seed: int = 0
    """Base sampling seed: turn k of slot s of group g samples with ``row_seed(rollout seed, g, s, k)``, the rollout
    seed drawn from this and the step (``agent_rl.rollout.orchestrator``), whatever batch the turn lands in."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.batch_size < 1 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("engine: max_new_tokens, batch_size >= 1, 0 < top_p <= 1, top_k >= 0")
