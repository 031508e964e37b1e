"""The learner side: configs, the ``Learner`` (one RL update from a ``RolloutBatch``), atomic checkpoints."""

from agent_rl.learner.checkpoint import latest_checkpoint, load_checkpoint, recover_checkpoints, save_checkpoint
from agent_rl.learner.config import AlgoConfig, CreditConfig, ModelConfig, OptimConfig, ScheduleConfig
from agent_rl.learner.learner import Learner

__all__ = ["AlgoConfig", "CreditConfig", "Learner", "ModelConfig", "OptimConfig", "ScheduleConfig",
           "latest_checkpoint", "load_checkpoint", "recover_checkpoints", "save_checkpoint"]
