"""Rollout: tasks -> groups of episodes (per-episode temperature) -> turns -> rows (``build_rollout_batch``)."""

from agent_rl.rollout.batch import build_rollout_batch
from agent_rl.rollout.config import RolloutConfig, TaskSamplerConfig
from agent_rl.rollout.orchestrator import (
    EnvCallFailed,
    GenerationBatcher,
    GroupSpec,
    RolloutOrchestrator,
    RolloutResult,
    collect_groups,
    group_temperatures,
    merge_parallel_results,
    rollout_metrics,
)
from agent_rl.rollout.parsing import ParsedAction, parse_action
from agent_rl.rollout.prompts import PromptFormat, TurnContext, get_prompt, register_prompt
from agent_rl.rollout.tasks import TaskSampler

__all__ = [
    "EnvCallFailed", "GenerationBatcher", "GroupSpec", "ParsedAction", "PromptFormat", "RolloutConfig",
    "RolloutOrchestrator", "RolloutResult", "TaskSampler", "TaskSamplerConfig", "TurnContext", "build_rollout_batch",
    "collect_groups", "get_prompt", "group_temperatures", "merge_parallel_results", "parse_action", "register_prompt",
    "rollout_metrics",
]
