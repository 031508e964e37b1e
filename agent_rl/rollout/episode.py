"""One episode of a kind: an :class:`EpisodeRunner` plays it with :meth:`~EpisodeRunner.run`; the group player
(:class:`agent_rl.rollout.groups.GroupPlayer`) runs any of them, concurrently, with retries and forks.

- :class:`EnvEpisode`: turns against an env session (through the env client: HTTP or in-process, it never knows
  which), each turn's prompt rendered from the env's text (:meth:`EnvEpisode.next_prompt`), the engine's reply
  generated through the run's batcher and parsed into the env action (:meth:`EnvEpisode.parse`). Token-in/token-out:
  the ids an episode stores are the ids the engine sampled; generated text is only parsed, never re-tokenised.
- :class:`ScriptedEpisode`: the same turns answered by a scripted policy (:mod:`agent_rl.rollout.policies`: the
  expert, the random lower bound) instead of the engine.
- The gateway's agent programs: ``agent_rl.gateway.external.ProgramEpisode``.

A new kind of episode is a new runner beside these (docs/architecture.md, "Rollout").

Tools (``action_format="tools"``, docs/tools.md): the env declares its tools at reset (``info["tools"]``); the
prompt passes them to the chat template (:class:`agent_rl.rollout.prompts.tool_prompt.ToolPrompt`,
:func:`agent_rl.rollout.tool_calls.tool_messages`), the model's native call is parsed by its tool-call format
(``model.tool_call_format``) into the env action, and the env's answer comes back as a ``tool`` message (in
trajectory mode: the template's render of that message, spliced after the sampled ids). Generation stops at the
format's stop strings instead of ``rollout.stop``. A call that cannot be read, an unknown tool or wrong arguments is
an invalid turn (the env gives the reason in its observation); the episode goes on.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from agent_rl.engines.base import caps_of
from agent_rl.rollout.config import RolloutConfig
from agent_rl.rollout.fork import EpisodeStart, ForkSource, SiblingStart, check_replayed_prompt, check_replayed_step
from agent_rl.rollout.generation import Generator
from agent_rl.rollout.parsing import parse_action
from agent_rl.rollout.prompts import PromptFormat, TurnContext, render, render_followup
from agent_rl.rollout.prompts.tool_prompt import ToolPrompt
from agent_rl.rollout.replies import ReplyReader, eos_ids_of, splice_followup
from agent_rl.rollout.sessions import EnvSessions, checked_reward
from agent_rl.rollout.tool_calls import TemplateTools, get_tool_call_format, tool_messages
from agent_rl.types import Episode, ForkOrigin, Generation, Task, Turn

_EPISODE_IDS = itertools.count()  # episode attempt ids, unique in the process (engines key caches by them)


class ToolEnvError(ValueError):
    """``action_format="tools"`` with an env whose reset declares no tools (``info["tools"]``): a config mistake,
    raised out of the rollout (never retried)."""


@dataclass(frozen=True)
class Sampling:
    """How one episode samples: its ``temperature`` and whether it is a high-temperature (TGRL T1) episode."""

    temperature: float
    is_high: bool


class EpisodeRunner(abc.ABC):
    """Plays one episode of a kind (:meth:`run`). The group player gives it the task, the sampling, the slot and,
    for a forked group, where the episode starts (``start``); everything else (concurrency, retries, forks, the
    batcher's life, metrics) is the player's.

    Attributes:
        can_fork: whether its episodes can be forked (``rollout.fork``): a sibling replays or restores a base's
            prefix through ``start``. The group player refuses forks for a runner that declares False.
        kind: how a refusal names this kind of episode.
        env: the env calls of its episodes (the player prefetches resets and reads the env time through it).
        generator: the engine side (sampling settings, the run's batcher, the policy version, ``on_turn``).
    """

    can_fork: ClassVar[bool] = False
    kind: ClassVar[str] = "this episode kind"

    def __init__(self, env: EnvSessions, generator: Generator) -> None:
        self.env, self.generator = env, generator

    @abc.abstractmethod
    async def run(self, task: Task, sampling: Sampling, slot: int, start: EpisodeStart | None = None) -> Episode:
        """One attempt at an episode of ``task`` in group slot ``slot``; raises
        :class:`~agent_rl.rollout.sessions.EnvCallFailed` on an env failure (the player re-runs it)."""

    def prefetch(self, tasks: Sequence[Task], episodes_per_task: int) -> None:
        """Start the env resets of the next step's episodes (:meth:`EnvSessions.prefetch`)."""
        self.env.prefetch(tasks, episodes_per_task)

    def event_counts(self) -> dict[str, float]:
        """Counters of this kind of episode since :meth:`reset_counts` (``results.EVENT_COUNTS``); none here."""
        return {}

    def reset_counts(self) -> None:
        """Zero :meth:`event_counts` (the start of a run or a stream)."""

    async def aclose(self) -> None:
        """Release what the runner holds (the player's ``aclose`` calls it); nothing here."""


class EnvEpisode(EpisodeRunner):
    """Turns against an env session, the engine answering (module docstring).

    Args:
        env: the env calls (:class:`EnvSessions` over the run's env pool).
        generator: the engine side (:class:`Generator`; its ``tokenizer``).
        prompt: the env family's :class:`PromptFormat`.
        cfg: :class:`RolloutConfig` (turns, prompt budget, mode, action length).
        action_format: ``text`` (``<action>`` tags, :func:`parse_action`) or ``tools`` (native tool calls).
        tool_call_format: how the model writes calls (``model.tool_call_format``), used in tools mode.
        task_type_key: the reset ``info`` key of an episode's task type (the env family's, ``envs.families``).
    """

    can_fork = True
    kind = "an env episode"

    def __init__(self, env: EnvSessions, generator: Generator, prompt: PromptFormat, cfg: RolloutConfig, *,
                 action_format: str = "text", tool_call_format: str = "hermes",
                 task_type_key: str = "task_type") -> None:
        super().__init__(env, generator)
        if action_format not in ("text", "tools"):
            raise ValueError(f"action_format must be text or tools, got {action_format!r}")
        self.action_format = action_format
        self.tool_format = get_tool_call_format(tool_call_format) if action_format == "tools" else None
        if self.tool_format is not None:
            prompt = ToolPrompt(prompt, self.tool_format)
        self.prompt, self.cfg, self.task_type_key = prompt, cfg, task_type_key
        self.engine, self.tokenizer = generator.engine, generator.tokenizer
        self.eos_ids = eos_ids_of(self.engine)
        self.replies = ReplyReader(self.tokenizer, self.tool_format, self.eos_ids)
        if cfg.mode == "trajectory":
            render_followup(self.tokenizer, "probe")  # a template that cannot be spliced is refused here, by name
            if self.tool_format is not None:
                render_followup(self.tokenizer, "probe", role=self.tool_role)

    @staticmethod
    def stop_strings(cfg: RolloutConfig, action_format: str, tool_call_format: str) -> list[str]:
        """The stop strings of every turn: the tool-call format's in tools mode, else ``rollout.stop``."""
        if action_format == "tools":
            return list(get_tool_call_format(tool_call_format).stop)
        return list(cfg.stop)

    # ------------------------------------------------------------------ prompts and replies
    def next_prompt(self, ctx: TurnContext, k: int, prev: list[int], prev_turn: Turn | None) -> list[int]:
        """The token ids of turn ``k``'s prompt (the one prompt builder of RL rows and behaviour cloning).

        Per-turn (``rollout.mode=turn``, or the first turn): the env's messages for ``ctx`` rendered with the chat
        template. Trajectory: ``prev`` (the previous prompt) + ``prev_turn.response_ids`` + what the template writes
        after an assistant message for the new user turn (its end-of-turn, minus a sampled EOS that already closes the
        response, the user turn, the generation prompt), so the row's tokens are exactly the tokens sampled. Env text
        and earlier actions are encoded as data, never as control tokens (``agent_rl.rollout.prompts.encoding``).
        """
        if self.cfg.mode == "turn" or prev_turn is None:
            messages = self.prompt.messages(ctx)
            if not ctx.tools or self.tool_format is None:
                return render(self.tokenizer, messages)
            messages, tools = tool_messages(messages, ctx.tools, self.tokenizer, self.tool_format)
            return render(self.tokenizer, messages, tools=tools)
        response = list(prev_turn.response_ids)
        if ctx.tools and self.tool_format is not None:  # the env's answer to the call is a tool message
            caps = TemplateTools.of(self.tokenizer)
            obs_ids = render_followup(self.tokenizer, self.prompt.followup(ctx), role=self.tool_role,
                                      tools=ctx.tools if caps.tools else None)
        else:
            obs_ids = render_followup(self.tokenizer, self.prompt.followup(ctx))
        return splice_followup(prev, response, obs_ids, self.eos_ids)

    @property
    def tool_role(self) -> str:
        """The role of the env's answer to a call: ``tool``, or ``user`` for a template without that role."""
        return "tool" if TemplateTools.of(self.tokenizer).tool_role else "user"

    def parse(self, text: str, ctx: TurnContext, reasoning_open_at_start: bool = False) -> tuple[str, bool]:
        """``(env action, well_formed)`` of a reply: in tools mode (the env declared tools) the tool-call format's
        reading (:attr:`agent_rl.rollout.tool_calls.ToolCallParse.action`; not well formed when a call cannot be read) of
        the reply without its reasoning blocks (:func:`agent_rl.rollout.tool_calls.strip_reasoning`: a call drafted while
        thinking is never played; ``reasoning_open_at_start``: the prompt opened a block), else
        :func:`parse_action` (math/code: the whole answer, lines kept)."""
        raw = bool(getattr(self.prompt, "raw_actions", False))  # a prompt format may declare raw actions
        if self.tool_format is not None and ctx.tools:
            parsed = self.replies.parse_calls(text, reasoning_open_at_start)
            action = parsed.action
            if not parsed.calls and parsed.error is None and not raw:  # a text reply: cut as text actions are
                action = " ".join(action.split())[:self.cfg.max_action_chars]
            return action, parsed.well_formed
        parsed_text = parse_action(text, max_chars=self.cfg.max_action_chars, normalize_whitespace=not raw)
        return parsed_text.action, parsed_text.well_formed or raw

    async def respond(self, ctx: TurnContext, task: Task, slot: int, prompt_ids: list[int], sampling: Sampling,
                      episode_id: str | None = None) -> tuple[Generation, str, bool]:
        """One turn's ``(response, env action, well formed)``: the engine's generation through the run's batcher,
        parsed (:meth:`parse`)."""
        gen_side = self.generator
        version = gen_side.policy_version
        batcher = gen_side.batcher
        assert batcher is not None
        penalty = gen_side.penalty(sampling.is_high)
        key = (task.group_id, slot, ctx.step)
        if self.tool_format is not None and ctx.tools:
            gen, opened = await self.replies.generate_tool_turn(batcher, prompt_ids, sampling.temperature, penalty,
                                                                key, episode_id)
            action, well_formed = self.parse(gen.text, ctx, opened)
        else:
            gen = await batcher.generate(prompt_ids, sampling.temperature, penalty, key=key, episode_id=episode_id)
            action, well_formed = self.parse(gen.text, ctx)
        return gen_side.finish_turn(gen, version), action, well_formed

    # ------------------------------------------------------------------ one episode
    async def run(self, task: Task, sampling: Sampling, slot: int, start: EpisodeStart | None = None) -> Episode:
        """One attempt at an episode; raises :class:`EnvCallFailed` on env failure. ``start.sibling``: a forked
        sibling (``rollout.fork``): turns 0..t-1 (t = ``sibling.turn``) are copies of the base's turns, sampling
        starts at turn t. Without ``sibling.snapshot`` they replay the base's actions on a fresh session, each
        checked equal to the base's (:class:`agent_rl.rollout.fork.ReplayMismatch` otherwise); with it the session
        is opened in the snapshot of the base's state before turn t (``pool.restore``) and only the prompts are
        rebuilt (and checked) from the base's reset and turns. ``sibling.cache``: the base's kept engine cache,
        which the sibling's starts from (``engine.fork_episode``). ``start.source``: a base episode's
        :class:`ForkSource`: its finished engine cache is kept there (the fork plan ends it) instead of dropped,
        and, with ``source.snapshot``, its env state is snapshotted after every turn but the last."""
        replay = start.sibling if start is not None else None
        source = start.source if start is not None else None
        restored = replay is not None and replay.snapshot is not None
        t_replay = time.perf_counter()
        early = self.env.take_prefetched(task, slot) if replay is None else None
        if restored:
            snapshot_id = replay.snapshot  # type: ignore[union-attr]
            reset = await self.env.call(lambda: self.env.pool.restore(snapshot_id))
        else:
            reset = await self.env.open(early, task)
        sid = reset.session_id
        episode_id = f"ep{next(_EPISODE_IDS)}"  # the engine's key for this attempt's kept keys/values
        if replay is not None and replay.cache is not None and caps_of(self.engine).fork_cache:
            self.engine.fork_episode(replay.cache, episode_id)
        kept = False
        try:
            obs, info = replay.reset if restored else (reset.observation, reset.info)  # type: ignore[union-attr,misc]
            info = dict(info or {})
            if source is not None and replay is None:
                source.reset = (obs, dict(info))
            ep = Episode(task=task, temperature=sampling.temperature, is_high=sampling.is_high,
                         task_type=info.get(self.task_type_key),
                         fork=ForkOrigin(replay.base_slot, replay.turn) if replay is not None else None)
            await self._play_turns(ep, sid, obs, info, slot, sampling, episode_id, replay, source, t_replay)
            if source is not None and source.keep_cache and ep.failure is None:
                source.cache.append(episode_id)
                kept = True
            return ep
        finally:
            if caps_of(self.engine).kv_reuse and not kept:  # the engine drops what it kept (hf: engine.kv_reuse)
                self.engine.end_episode(episode_id)
            await self.env.close(sid)

    async def _play_turns(self, ep: Episode, sid: str, obs: Any, info: dict[str, Any], slot: int,
                          sampling: Sampling, episode_id: str, replay: SiblingStart | None,
                          source: ForkSource | None, t_replay: float) -> None:
        """The turns of ``ep`` on session ``sid`` from the reset ``(obs, info)``: a sibling's prefix replayed or
        restored (:meth:`_replayed_turn`), then sampled turns until the episode ends or ``rollout.max_turns``; its
        reward and ``won`` set at the end. ``t_replay``: when the attempt started (a sibling's prefix time)."""
        cfg, task = self.cfg, ep.task
        fork_at = replay.turn if replay is not None else 0
        task_text = self.prompt.task_text(obs, info)
        tools = info.get("tools")
        if self.tool_format is not None and tools is None:
            raise ToolEnvError(f"action_format=tools, but {task.env_id} declared no tools at reset (info['tools']); "
                               "make the env with action_format='tools' (docs/tools.md) or use env.action_format=text")
        tools = list(tools) if self.tool_format is not None and tools else None
        history: list[tuple[str, str]] = []
        prompt_ids: list[int] = []
        for k in range(cfg.max_turns):
            admissible = info.get("admissible_actions") or info.get("admissible_commands")
            ctx = TurnContext(task=task_text, observation=obs, admissible=list(admissible) if admissible else None,
                              history=history[-cfg.history_length:] if cfg.history_length else [], step=k,
                              info=info, tools=tools)
            prompt_ids = self.next_prompt(ctx, k, prompt_ids, ep.turns[-1] if ep.turns else None)
            if len(prompt_ids) > cfg.max_prompt_tokens:
                if not ep.turns:
                    ep.failure = f"prompt_too_long ({len(prompt_ids)} > {cfg.max_prompt_tokens} tokens)"
                break  # the episode ends here: recorded as truncated (its last turn is not terminated)
            if replay is not None and k < fork_at:  # a replayed turn: the base's, checked
                obs, info = await self._replayed_turn(ep, sid, k, prompt_ids, replay, history, obs)
                if k == fork_at - 1:
                    replay.replay_s += time.perf_counter() - t_replay
                    replay.replayed_turns += fork_at
                continue
            gen, action, well_formed = await self.respond(ctx, task, slot, prompt_ids, sampling, episode_id)
            step = await self.env.call(lambda: self.env.pool.step(sid, action))
            reward = checked_reward(step.reward, "the env's reward")
            step_info = dict(step.info or {})
            inadmissible = step_info.get("invalid_action")
            if inadmissible is None:  # the env does not say: judge by its admissible list, when it has one
                inadmissible = not tools and ctx.admissible is not None and action not in ctx.admissible
            ep.turns.append(Turn(
                prompt_ids=list(prompt_ids), response_ids=list(gen.token_ids),
                response_logprobs=list(gen.logprobs), action=action, observation=step.observation,
                reward=reward, terminated=bool(step.terminated), truncated=bool(step.truncated),
                info=step_info, invalid=(not well_formed) or bool(inadmissible),
                response_truncated=gen.finish_reason == "length", policy_version=int(gen.policy_version or 0)))
            history.append((obs, action))
            obs, info = step.observation, step_info
            if step.terminated or step.truncated:
                break
            if source is not None and source.snapshot and replay is None and k + 1 < cfg.max_turns:
                await source.take_snapshot(task.env_id, sid, k + 1)
        # a sum of rewards that each fit float32 may not: checked again
        env_reward = checked_reward(sum(t.reward for t in ep.turns), "the episode's reward (its turns' sum)")
        ep.reward = env_reward  # an invalid-action penalty is already in it (envs.wrappers, rollout.invalid_penalty)
        ep.won = bool(info.get("won", env_reward > 0)) if ep.turns else False

    async def _replayed_turn(self, ep: Episode, sid: str, k: int, prompt_ids: list[int], replay: SiblingStart,
                             history: list[tuple[str, str]], obs: Any) -> tuple[Any, dict[str, Any]]:
        """A sibling's turn ``k`` before its fork: the base's turn, its prompt checked; restored (the session is
        already past it: no env step) or replayed on the env (the step checked). Returns the next ``(obs, info)``."""
        check_replayed_prompt(k, prompt_ids, replay.base.turns[k])
        old = replay.base.turns[k]
        if replay.snapshot is not None:  # the session is already in the state after this turn: no env step
            ep.turns.append(dataclasses.replace(old))
            history.append((obs, old.action))
            return old.observation, dict(old.info or {})
        step = await self.env.call(lambda: self.env.pool.step(sid, old.action))
        check_replayed_step(k, step.observation, step.reward, step.terminated, step.truncated, old)
        ep.turns.append(dataclasses.replace(old, info=dict(step.info or {})))
        history.append((obs, old.action))
        return step.observation, dict(step.info or {})


class ScriptedEpisode(EnvEpisode):
    """Env turns answered by a scripted ``policy`` (:class:`agent_rl.rollout.policies.ScriptedPolicy`: reference
    rows, expert demonstrations) instead of the engine; its actions go to the env as given (never parsed). Prompts
    are still rendered, so the prompt budget applies as in training. Scripted episodes are not forked.

    Args:
        policy: the scripted policy; other arguments as :class:`EnvEpisode`.
    """

    can_fork = False
    kind = "a scripted episode"

    def __init__(self, env: EnvSessions, generator: Generator, prompt: PromptFormat, cfg: RolloutConfig, *,
                 policy: Any, **kwargs: Any) -> None:
        super().__init__(env, generator, prompt, cfg, **kwargs)
        self.policy = policy

    async def respond(self, ctx: TurnContext, task: Task, slot: int, prompt_ids: list[int], sampling: Sampling,
                      episode_id: str | None = None) -> tuple[Generation, str, bool]:
        """The policy's ``(response, action, True)`` for the turn."""
        version = self.generator.policy_version
        action, gen = self.policy.respond(ctx, task, slot)
        return self.generator.finish_turn(gen, version), action, True
