"""Rollout: tasks -> groups of episodes (per-episode temperature) -> turns -> rows (``build_rollout_batch``)."""

from agent_rl.rollout.batch import build_rollout_batch
from agent_rl.rollout.config import RolloutConfig, TaskSamplerConfig
from agent_rl.rollout.episode import EnvEpisode, EpisodeRunner, Sampling, ScriptedEpisode
from agent_rl.rollout.generation import GenerationBatcher, Generator
from agent_rl.rollout.groups import GroupPlayer
from agent_rl.rollout.parsing import ParsedAction, parse_action
from agent_rl.rollout.players import env_player
from agent_rl.rollout.prompts import PromptFormat, TurnContext, get_prompt, register_prompt
from agent_rl.rollout.results import (GroupSpec, RolloutResult, collect_groups, group_temperatures,
                                      merge_parallel_results, rollout_metrics)
from agent_rl.rollout.sessions import EnvCallFailed
from agent_rl.rollout.samplers import TaskSampler

RolloutOrchestrator = env_player  # the former name of the env episodes' group player

__all__ = [
    "EnvCallFailed", "EnvEpisode", "EpisodeRunner", "GenerationBatcher", "Generator", "GroupPlayer", "GroupSpec",
    "ParsedAction", "PromptFormat", "RolloutConfig", "RolloutOrchestrator", "RolloutResult", "Sampling",
    "ScriptedEpisode", "TaskSampler", "TaskSamplerConfig", "TurnContext", "build_rollout_batch", "collect_groups",
    "env_player", "get_prompt", "group_temperatures", "merge_parallel_results", "parse_action", "register_prompt",
    "rollout_metrics",
]
