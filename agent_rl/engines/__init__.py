"""Generation engines (registry ``engine.name``): ``hf`` runs anywhere, ``vllm`` on GPU (imported lazily)."""

from agent_rl.engines import hf as _hf  # noqa: F401  (registers "hf")
from agent_rl.engines import vllm as _vllm  # noqa: F401  (registers "vllm"; vllm itself is imported on use)
from agent_rl.engines.base import (Engine, engine_names, get_engine, register_engine, row_seed,
                                   set_torch_threads)
from agent_rl.engines.config import EngineConfig
from agent_rl.engines.hf import HFEngine

__all__ = ["Engine", "EngineConfig", "HFEngine", "engine_names", "get_engine", "register_engine",
           "row_seed", "set_torch_threads"]
