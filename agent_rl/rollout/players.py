"""Group players of the env episodes: :func:`env_player` builds the :class:`~agent_rl.rollout.groups.GroupPlayer`
of an env family's episodes, answered by the engine (:class:`~agent_rl.rollout.episode.EnvEpisode`) or by a scripted
policy (:class:`~agent_rl.rollout.episode.ScriptedEpisode`)."""

from __future__ import annotations

from typing import Any, Callable

from agent_rl.rollout.config import ForkConfig, RolloutConfig
from agent_rl.rollout.episode import EnvEpisode, ScriptedEpisode
from agent_rl.rollout.generation import Generator
from agent_rl.rollout.groups import GroupPlayer
from agent_rl.rollout.prompts import PromptFormat
from agent_rl.rollout.sessions import EnvSessions
from agent_rl.types import Episode, Generation


def env_player(pool: Any, engine: Any, prompt: PromptFormat, cfg: RolloutConfig, *, max_new_tokens: int,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None, high_repetition_penalty: float = 1.0,
               action_format: str = "text", tool_call_format: str = "hermes", task_type_key: str = "task_type",
               policy: Any = None, deterministic: bool | None = None,
               fork_js_temperatures: tuple[float, float] | None = None,
               on_turn: Callable[[Generation], None] | None = None,
               on_episode: Callable[[Episode], None] | None = None) -> GroupPlayer:
    """The group player of env episodes on ``pool`` (``agent_rl.envclient``) with ``engine``: the env family's
    ``prompt``, ``cfg`` (:class:`RolloutConfig`), the sampling settings of every turn (``max_new_tokens``, ``top_p``,
    ``top_k``, ``seed``; TGRL's ``high_repetition_penalty``), ``action_format`` (``text`` | ``tools``) and
    ``tool_call_format``, the env family's ``task_type_key``, and the hooks. ``policy``: a scripted policy
    (:class:`ScriptedEpisode`, never forked) instead of the engine. ``deterministic``, ``fork_js_temperatures``: as
    :class:`~agent_rl.rollout.fork.ForkPlan`."""
    stop = EnvEpisode.stop_strings(cfg, action_format, tool_call_format)
    generator = Generator(engine, max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, stop=stop, seed=seed,
                          batch_size=cfg.gen_batch_size, wait_s=cfg.gen_wait_s,
                          high_repetition_penalty=high_repetition_penalty, on_turn=on_turn)
    env = EnvSessions(pool, cfg.env_timeout_s)
    kinds: dict[str, Any] = dict(action_format=action_format, tool_call_format=tool_call_format,
                                 task_type_key=task_type_key)
    runner = (EnvEpisode(env, generator, prompt, cfg, **kinds) if policy is None else
              ScriptedEpisode(env, generator, prompt, cfg, policy=policy, **kinds))
    return GroupPlayer(runner, cfg, fork=cfg.fork if runner.can_fork else ForkConfig(), deterministic=deterministic,
                       fork_js_temperatures=fork_js_temperatures, on_episode=on_episode)
