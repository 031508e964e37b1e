"""``vllm`` engine (GPU only; ``vllm`` is imported when the engine is built, never at package import).

- One ``SamplingParams`` per request: ``temperature`` of the row, ``top_p``, ``top_k`` (-1 = off),
  ``max_tokens``, ``stop``, ``logprobs=0`` (the sampled token's log-prob only), per-request ``seed``: ``row_seeds[i]``
  when given (the orchestrator's per-row key, so a row samples the same tokens whatever its batch, as with ``hf``;
  vLLM gives a seeded request its own generator), else ``seed + i``. Same seeds do not mean the same tokens as the
  ``hf`` engine (each has its own sampler).
- Prompts go in as token ids (``TokensPrompt``) and the sampled ids come back untouched (token-in/token-out).
- Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"`` so vLLM reports log-probs after the
  temperature is applied, i.e. log softmax(z / T_row), matching the learner (with top-p/top-k on, vLLM's processed
  log-probs are also truncated, as the learner's are: agent_rl.algos.truncate_logits). Older vLLM versions without
  ``logprobs_mode`` return raw log-probs (T = 1): the engine then warns, and the learner's recomputed old log-probs
  are what trains anyway (engine log-probs only feed the mismatch metric).
- Weights sync (``sync_weights(model)``): after each learner step the policy's state dict is streamed into the vLLM
  model with its ``load_weights`` (``LLM.apply_model`` where available, else the driver worker's model runner), then
  the prefix cache is reset. The vLLM instance lives in the trainer process and shares the GPU with the learner
  (``gpu_memory_utilization`` bounds its KV cache); for multi-GPU / separate-process setups use vLLM's own
  weight-update RPC (``collective_rpc``) instead.
"""

from __future__ import annotations

import logging
from typing import Any

from agent_rl.engines.base import register_engine
from agent_rl.types import Generation

log = logging.getLogger(__name__)


class VLLMEngine:
    """vLLM-backed engine (see module docstring).

    Args:
        model: the learner's policy module (its weights are pushed on ``sync_weights``).
        tokenizer: the policy tokenizer.
        model_path: what vLLM loads at start (a hub name or a folder, e.g. the converted SmolLM2 folder).
        gpu_memory_utilization: vLLM's share of GPU memory.
        dtype: vLLM weights dtype.
    Raises:
        RuntimeError: no CUDA device or vllm not installed.
    """

    def __init__(self, model: Any, tokenizer: Any, *, model_path: str, gpu_memory_utilization: float = 0.4,
                 dtype: str = "bfloat16", seed: int = 0, **_: Any) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("engine=vllm needs a CUDA device; use engine=hf on CPU")
        try:
            import vllm
        except ImportError as e:
            raise RuntimeError("engine=vllm needs `pip install agent_rl[vllm]`") from e
        self.tokenizer = tokenizer
        self._vllm = vllm
        kwargs: dict[str, Any] = dict(model=model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                                      seed=seed, enable_prefix_caching=True)
        try:
            self.llm = vllm.LLM(logprobs_mode="processed_logprobs", **kwargs)
        except TypeError:
            log.warning("this vLLM has no logprobs_mode: engine log-probs are at T=1 (metrics only)")
            self.llm = vllm.LLM(**kwargs)
        self.sync_weights(model)

    def generate(self, prompts: list[list[int]], temperatures: list[float], *, max_new_tokens: int,
                 top_p: float = 1.0, top_k: int = 0, stop: list[str] | None = None, seed: int | None = None,
                 repetition_penalties: list[float] | None = None,
                 row_seeds: list[int] | None = None) -> list[Generation]:
        """See ``agent_rl.engines.base.Engine`` (``repetition_penalties``: per-row vLLM ``repetition_penalty``;
        ``row_seeds``: per-request ``seed``, module docstring)."""
        if row_seeds is not None and len(row_seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(row_seeds)} row seeds")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(temperature=float(t), top_p=top_p, top_k=top_k if top_k > 0 else -1,
                           max_tokens=max_new_tokens, stop=stop or None, logprobs=0,
                           seed=int(row_seeds[i]) if row_seeds is not None else None if seed is None else seed + i,
                           include_stop_str_in_output=True,
                           repetition_penalty=1.0 if repetition_penalties is None else repetition_penalties[i])
            for i, t in enumerate(temperatures)
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        gens = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs or [], ids)]
            gens.append(Generation(token_ids=ids, logprobs=lps, text=c.text,
                                   finish_reason="length" if c.finish_reason == "length" else "stop"))
        return gens

    def sync_weights(self, model: Any) -> None:
        """Push the learner's current weights into vLLM (see module docstring)."""
        state = {k: v.detach() for k, v in model.state_dict().items()}

        def load(vllm_model: Any) -> None:
            vllm_model.load_weights(weights=state.items())

        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(load)
        else:  # older vLLM (V0 engine)
            load(self.llm.llm_engine.model_executor.driver_worker.model_runner.model)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()


@register_engine("vllm")
def _make_vllm(model: Any, tokenizer: Any, **kwargs: Any) -> VLLMEngine:
    if "model_path" not in kwargs:
        kwargs["model_path"] = getattr(model, "name_or_path", None) or model.config._name_or_path
    return VLLMEngine(model, tokenizer, **kwargs)
