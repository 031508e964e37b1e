"""Compatibility names of the rollout's former one module: the group player (:mod:`agent_rl.rollout.groups`), the
episode runners (:mod:`agent_rl.rollout.episode`), generation (:mod:`agent_rl.rollout.generation`), env calls
(:mod:`agent_rl.rollout.sessions`) and results (:mod:`agent_rl.rollout.results`). ``RolloutOrchestrator(...)`` builds
the :class:`GroupPlayer` of env episodes (:func:`agent_rl.rollout.players.env_player`)."""

from agent_rl.rollout.episode import EnvEpisode, EpisodeRunner, Sampling, ScriptedEpisode, ToolEnvError
from agent_rl.rollout.generation import GenerationBatcher, Generator
from agent_rl.rollout.groups import GroupPlayer
from agent_rl.rollout.players import env_player
from agent_rl.rollout.replies import MAX_REASONING_RESUMES, splice_followup
from agent_rl.rollout.results import (EVENT_COUNTS, GATEWAY_COUNTS, TOKEN_COUNTS, GroupSpec, RolloutResult, all_equal,
                                      collect_groups, group_temperatures, merge_parallel_results, present,
                                      rollout_metrics, split_groups, sum_counters)
from agent_rl.rollout.sessions import EnvCallFailed, checked_reward

RolloutOrchestrator = env_player

__all__ = [
    "EVENT_COUNTS", "GATEWAY_COUNTS", "MAX_REASONING_RESUMES", "TOKEN_COUNTS", "EnvCallFailed", "EnvEpisode",
    "EpisodeRunner", "GenerationBatcher", "Generator", "GroupPlayer", "GroupSpec", "RolloutOrchestrator",
    "RolloutResult", "Sampling", "ScriptedEpisode", "ToolEnvError", "all_equal", "checked_reward", "collect_groups",
    "env_player", "group_temperatures", "merge_parallel_results", "present", "rollout_metrics", "splice_followup",
    "split_groups", "sum_counters",
]
