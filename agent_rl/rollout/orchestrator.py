"""Multi-turn rollout orchestrator: groups of episodes played concurrently, generation batched across episodes.

Every episode is an asyncio task that alternates env calls (through the env client: HTTP or in-process, it never
knows which) and generation requests. Generation requests go to one :class:`GenerationBatcher`, which takes every
prompt waiting, calls ``engine.generate`` in a worker thread (``asyncio.to_thread``) so env calls keep running, and
hands each episode its own :class:`~agent_rl.types.Generation` back. Token-in/token-out: the ids an episode stores
are the ids the engine sampled; generated text is only parsed, never re-tokenised.

Determinism: which prompts share an engine call depends on env timing, so sampling randomness is keyed by the row,
not by the call: the turn ``k`` of the episode in slot ``s`` of group ``g`` samples with
``row_seed(rollout_seed, g, s, k)`` (``agent_rl.engines.row_seed``; ``rollout_seed`` is drawn from the orchestrator's
seed and :meth:`RolloutOrchestrator.run_groups`'s ``seed_key``, the step and round in training). With the same seed,
the same groups give the same episodes whatever the env latencies, batch sizes, worker count or arrival order
(group ids must be distinct within one ``run_groups`` call, as ``TaskSampler``'s are). An episode re-run after an env
failure samples as its first attempt did.

Failures: an env call that raises or times out (after the client's own retries) fails the episode attempt; the
episode is re-run from the same task up to ``rollout.episode_retries`` times; a group with an episode that still
fails is dropped whole and counted (``rollout/dropped_groups``). That includes an env that could not judge
(``envs.errors.EnvInfraError``: HTTP 500 ``env_infra_error``, ``EnvServerError`` in-process), which is never a
reward (``docs/env_errors.md``), and a reward a batch cannot hold (NaN, inf, beyond float32: each step's and the
episode's sum, :func:`envs.numbers.checked_reward`). Engine errors propagate (they are bugs).

Tools (``action_format="tools"``, docs/tools.md): the env declares its tools at reset (``info["tools"]``); the
prompt passes them to the chat template (:class:`agent_rl.rollout.prompts.tools.ToolPrompt`,
:func:`agent_rl.rollout.tools.tool_messages`), the model's native call is parsed by its tool-call format
(``model.tool_call_format``) into the env action, and the env's answer comes back as a ``tool`` message (in
trajectory mode: the template's render of that message, spliced after the sampled ids). Generation stops at the
format's stop strings instead of ``rollout.stop``. A call that cannot be read, an unknown tool or wrong arguments is
an invalid turn (the env gives the reason in its observation); the episode goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np
import torch

from agent_rl.aio import gather_all
from agent_rl.algos import dapo_keep_groups
from agent_rl.engines.base import caps_of, row_seed
from agent_rl.rollout.config import RolloutConfig
from agent_rl.rollout.fork import (FORK_COUNTS, ForkSource, ReplayMismatch, SiblingStart, base_count, budget_order,
                                   check_replayed_prompt, check_replayed_step, fork_turns, generated_turns,
                                   sibling_slot, spare_slots, turn_budget_jobs)
from agent_rl.rollout.parsing import parse_action
from agent_rl.rollout.prompts import PromptFormat, TurnContext, render, render_followup
from agent_rl.rollout.prompts.tools import ToolPrompt
from agent_rl.rollout.tools import (TemplateTools, decode_for_parsing, get_tool_call_format, prompt_opens_reasoning,
                                    reasoning_markers, reasoning_open, strip_reasoning, tool_messages)
from agent_rl.types import Episode, ForkOrigin, Generation, Task, Turn
from envs.numbers import RewardError
from envs.numbers import checked_reward as _checked_reward

T = TypeVar("T")
log = logging.getLogger(__name__)
_EPISODE_IDS = itertools.count()  # episode attempt ids, unique in the process (engines key caches by them)
#: per-step token counts of generation (summed over rounds and workers): prompt tokens computed, tokens sampled,
#: prompt tokens whose keys/values came from the engine's cache (``engine.kv_reuse``, vLLM's prefix cache).
MAX_REASONING_RESUMES = 8
"""How many times one tools-mode reply resumes after a stop string fired inside a reasoning block."""
_PROMPT_TAIL_TOKENS = 64  # the prompt tokens read to see whether the generation prompt opened a reasoning block

TOKEN_COUNTS = ("throughput/prefill_tokens", "throughput/decode_tokens", "throughput/kv_reuse_tokens")
GATEWAY_COUNTS = ("gateway/requests", "gateway/prefix_breaks", "gateway/segments", "gateway/attempts",
                  "gateway/history_rewrites", "gateway/generated_tokens", "gateway/prefix_breaks/tools_changed",
                  "gateway/prefix_breaks/history_truncated", "gateway/prefix_breaks/reply_rewritten",
                  "gateway/prefix_breaks/history_edited", "gateway/prefix_breaks/text_edited")
"""The gateway's per-step counters (``env=external``, :class:`agent_rl.gateway.ExternalRollout`): model calls served,
requests that did not extend their episode's segment (and by cause, ``agent_rl.gateway.recorder.BREAK_CAUSES``),
segments, episode attempts (failed ones included), requests that extended a segment under a history normalisation,
tokens generated."""
EVENT_COUNTS = FORK_COUNTS + GATEWAY_COUNTS
"""Counters an orchestrator keeps only when its runs have them (:meth:`RolloutOrchestrator.event_counts`: forks,
the gateway): summed over rounds, Ray workers' chunks and streams like :data:`TOKEN_COUNTS`, the asynchronous
producer logging each cycle's difference."""


class EnvCallFailed(RuntimeError):
    """An env call (reset/step) raised or ran past ``rollout.env_timeout_s``, or gave a reward a batch cannot hold
    (:func:`checked_reward`)."""


def checked_reward(value: Any, source: str) -> float:
    """:func:`envs.numbers.checked_reward` for the rollout: a reward that breaks the rule (NaN, inf, beyond float32)
    fails the episode attempt (:class:`EnvCallFailed`: re-run, then the group dropped), never reaches a batch."""
    try:
        return _checked_reward(value, source)
    except RewardError as exc:
        raise EnvCallFailed(str(exc)) from None


class ToolEnvError(ValueError):
    """``action_format="tools"`` with an env whose reset declares no tools (``info["tools"]``): a config mistake,
    raised out of the rollout (never retried)."""


@dataclass
class GroupSpec:
    """One group: a task and the (temperature, is_high) of each of its G episodes."""

    task: Task
    temperatures: list[tuple[float, bool]]


@dataclass
class RolloutResult:
    """Kept episodes (complete groups only, in group order) and rollout metrics (algorithms.md section 6 names).

    ``versions``: the policy version that sampled each kept group, in group order (the number of updates behind
    the engine's weights; set by the training backends). ``batch``: rows a collector built itself (behaviour
    cloning's expert rows); None: the training loop builds them from ``episodes``.
    """

    episodes: list[Episode]
    metrics: dict[str, float] = field(default_factory=dict)
    dropped_groups: int = 0
    filtered_groups: int = 0
    failures: list[str] = field(default_factory=list)  # one reason per dropped group (its first failed episode)
    versions: list[int] = field(default_factory=list)
    batch: Any = None
    outcomes: list[tuple[Task, list[bool]]] = field(default_factory=list)
    """Every group played to its end in this collect, kept or DAPO-filtered: (its task, each episode's ``won``);
    what the task sampler observes (``agent_rl.rollout.tasks.TaskSampler.observe``, the curriculum)."""


def splice_followup(prompt_ids: Sequence[int], response_ids: Sequence[int], followup: Sequence[int],
                    eos_ids: set[int] | frozenset[int]) -> list[int]:
    """The next prompt of a spliced conversation: the previous prompt, the sampled response as sampled, then what
    the template writes for the new messages (:func:`~agent_rl.rollout.prompts.encoding.followup_ids`), minus its
    first id when that is the EOS the response already ended with (the sampled EOS closes the assistant turn). The
    one splice rule of full-trajectory rows and the gateway's episodes (``agent_rl.gateway``)."""
    response, obs_ids = list(response_ids), list(followup)
    if response and response[-1] in eos_ids and obs_ids[:1] == response[-1:]:
        obs_ids = obs_ids[1:]
    return list(prompt_ids) + response + obs_ids


def group_temperatures(algo: Any, step: int, t_high: float | None = None) -> list[tuple[float, bool]]:
    """(temperature, is_high) of the G episodes of a group at 1-based ``step``: ``algo.group_temperatures(step,
    t_high)`` (``AlgoConfig``, the one home of the TGRL sampling and warm-up rule; algorithms.md, TGRL). ``t_high``:
    the step's T1 (``algo.t_high=auto``: the pick of ``agent_rl.algos.AdaptiveHighTemperature``); None = the fixed
    ``algo.t_high`` (``agent_rl.learner.config.t_high_value``)."""
    return algo.group_temperatures(step, t_high)


class GenerationBatcher:
    """Collects prompts from concurrent episodes and generates them in batches in a worker thread.

    Batching rule: once a prompt waits, the batch is sent when every live episode (``active``, kept by the
    orchestrator) is waiting for generation, or when no new prompt arrived for ``wait_s`` seconds (so episodes that
    are a step behind join, but a slow env reset never holds the others up for long).

    ``busy_s`` accumulates the time the engine spent generating; the orchestrator reports the rest of the rollout's
    wall time as the time generation waited on envs (``time/env_wait_frac`` = 1 - busy / wall: env resets and steps
    on the critical path, plus the short batching waits).
    """

    def __init__(self, engine: Any, *, max_new_tokens: int, top_p: float = 1.0, top_k: int = 0,
                 stop: list[str] | None = None, batch_size: int = 0, seed: int | None = None,
                 wait_s: float = 0.02) -> None:
        self.engine = engine
        self.kwargs = dict(max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, stop=stop)
        self.batch_size, self.seed = batch_size, seed
        self._pending: list[tuple[list[int], float, asyncio.Future, float, tuple[int, ...] | None,
                                  tuple[int | None, tuple[str, ...]]]] = []
        self._wakeup = asyncio.Event()
        self._arrived = asyncio.Event()
        self.wait_s = wait_s
        self.active = 0
        self._closed = False
        self._calls = 0
        self.busy_s = 0.0
        self.batch_sizes: list[int] = []
        self.first_start: float | None = None
        self.generated_tokens = 0
        self.prefill_tokens = self.kv_reuse_tokens = 0  # prompt tokens computed / taken from the engine's caches
        self._episode_ids: dict[asyncio.Future, str] = {}  # pending row -> its episode (engine.kv_reuse)

    async def generate(self, prompt_ids: list[int], temperature: float,
                       repetition_penalty: float = 1.0, key: tuple[int, ...] | None = None,
                       episode_id: str | None = None, max_new_tokens: int | None = None,
                       stop: Sequence[str] = ()) -> Generation:
        """Queue one prompt; resolves to its Generation. ``repetition_penalty`` (1.0 = off) is per row: TGRL's
        ``algo.high_repetition_penalty`` on high-temperature episodes (algorithms.md section 3, optional).
        ``key`` (ints, e.g. (group id, slot, turn)) names the row: with a batcher ``seed`` the row
        samples with ``row_seed(seed, *key)`` whatever batch it lands in (module docstring); a batch with a row
        without key falls back to one seed per engine call (``seed`` + call index). ``episode_id`` names the row's
        episode for engines that keep its keys/values between turns (those with ``end_episode``: hf's
        ``engine.kv_reuse``). ``max_new_tokens`` (at most the batcher's) and ``stop`` (added to the batcher's stop
        strings) are the row's own generation cap and stop strings (the gateway's clients): rows are batched only
        with rows of the same ones, so the engine stops each where it was asked to."""
        fut = asyncio.get_running_loop().create_future()
        if episode_id is not None:
            self._episode_ids[fut] = episode_id
        cap = None if max_new_tokens is None or max_new_tokens >= self.kwargs["max_new_tokens"] else int(max_new_tokens)
        self._pending.append((prompt_ids, temperature, fut, float(repetition_penalty),
                              None if key is None else tuple(int(k) for k in key), (cap, tuple(stop))))
        self._wakeup.set()
        self._arrived.set()
        return await fut

    def episode_started(self) -> None:
        self.active += 1

    def episode_finished(self) -> None:
        self.active -= 1
        self._arrived.set()

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()

    async def run(self) -> None:
        """Serve requests until :meth:`close`; an engine exception is passed to every waiting episode."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending:
                if self._closed:
                    return
                continue
            while len(self._pending) < self.active and not self._closed:  # let episodes a step behind join
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), self.wait_s)
                except asyncio.TimeoutError:
                    break
            for row in [r for r in self._pending if r[2].done()]:  # its episode was cancelled: not generated
                self._pending.remove(row)
                self._episode_ids.pop(row[2], None)
            if not self._pending:
                self._wakeup.set()
                continue
            opts = self._pending[0][5]  # one engine call per (cap, stop strings): the rows asking the same
            same = [r for r in self._pending if r[5] == opts]
            batch = same if self.batch_size <= 0 else same[:self.batch_size]
            self._pending = [r for r in self._pending if not any(r is b for b in batch)]
            call_kwargs = dict(self.kwargs)
            if opts[0] is not None:
                call_kwargs["max_new_tokens"] = opts[0]
            if opts[1]:
                base_stop = list(self.kwargs["stop"] or [])
                call_kwargs["stop"] = base_stop + [s for s in opts[1] if s not in base_stop]
            seed = None if self.seed is None else self.seed + self._calls
            self._calls += 1
            t0 = time.perf_counter()
            self.batch_sizes.append(len(batch))
            if self.first_start is None:
                self.first_start = t0
            extra: dict[str, Any] = {}
            if any(b[3] != 1.0 for b in batch):  # only engines asked for a penalty need to support it
                extra["repetition_penalties"] = [b[3] for b in batch]
            if self.seed is not None and all(b[4] is not None for b in batch):  # per-row randomness
                extra["row_seeds"] = [row_seed(self.seed, *b[4]) for b in batch]
            episode_ids = [self._episode_ids.pop(b[2], None) for b in batch]
            if caps_of(self.engine).kv_reuse and any(e is not None for e in episode_ids):
                extra["episode_ids"] = episode_ids
            try:
                gens = await asyncio.to_thread(self.engine.generate, [b[0] for b in batch], [b[1] for b in batch],
                                               seed=seed, **call_kwargs, **extra)
            except Exception as exc:  # noqa: BLE001 (re-raised in every waiting episode)
                for _, _, fut, _, _, _ in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                gens = None
            self.busy_s += time.perf_counter() - t0
            if gens is not None:
                for (prompt, _, fut, _, _, _), gen in zip(batch, gens):
                    self.generated_tokens += len(gen.token_ids)
                    cached = min(int(getattr(gen, "cached_tokens", 0) or 0), len(prompt))
                    self.kv_reuse_tokens += cached
                    self.prefill_tokens += len(prompt) - cached
                    if not fut.done():
                        fut.set_result(gen)
            if self._pending or self._closed:
                self._wakeup.set()


class RolloutOrchestrator:
    """Plays groups of episodes against an env pool with one engine, or with a scripted reference ``policy``: the
    one episode path of training, evaluation and behaviour cloning.

    Args:
        pool: env client (``agent_rl.envclient.HTTPEnvPool`` or ``LocalEnvPool``; anything with async
            ``reset/step/close``).
        engine: ``agent_rl.engines`` Engine (``tokenizer`` attribute, ``generate``).
        prompt: the env family's :class:`PromptFormat`.
        cfg: :class:`RolloutConfig`.
        max_new_tokens, top_p, top_k: sampling settings of every turn (the temperature is per episode).
        high_repetition_penalty: repetition penalty of high-temperature episodes (TGRL, 1.0 = off).
        seed: base seed of generation calls (None: engine default).
        action_format: ``text`` (``<action>`` tags, :func:`parse_action`) or ``tools`` (native tool calls, module
            docstring; ``env.action_format``).
        tool_call_format: how the model writes calls (``model.tool_call_format``: hermes | llama3_json | a
            registered one), used in tools mode.
        task_type_key: the reset ``info`` key of an episode's task type (the env family's, ``envs.families``).
        policy: a :class:`agent_rl.rollout.policies.ScriptedPolicy` that answers every turn instead of the engine
            (reference rows, expert demonstrations); its actions go to the env as given. None: the engine.
        on_turn, on_episode: called with every turn's :class:`Generation` and every finished (or failed) episode
            (progress displays, the evaluation's per-task records).
        deterministic: the env family's declaration (``envs.families.EnvFamily.deterministic`` of the run's env
            kwargs): False refuses ``rollout.fork`` up front under ``restore=replay``; True or None: forks are made,
            every replay checked (``restore=state`` does not read it).
    """

    def __init__(self, pool: Any, engine: Any, prompt: PromptFormat, cfg: RolloutConfig, *, max_new_tokens: int,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 high_repetition_penalty: float = 1.0, action_format: str = "text",
                 tool_call_format: str = "hermes", task_type_key: str = "task_type", policy: Any = None,
                 deterministic: bool | None = None, fork_js_temperatures: tuple[float, float] | None = None,
                 on_turn: Callable[[Generation], None] | None = None,
                 on_episode: Callable[[Episode], None] | None = None) -> None:
        if action_format not in ("text", "tools"):
            raise ValueError(f"action_format must be text or tools, got {action_format!r}")
        self.action_format = action_format
        self.tool_format = get_tool_call_format(tool_call_format) if action_format == "tools" else None
        if self.tool_format is not None:
            prompt = ToolPrompt(prompt, self.tool_format)
        self.pool, self.engine, self.prompt, self.cfg = pool, engine, prompt, cfg
        self.task_type_key = task_type_key
        self.policy, self.on_turn, self.on_episode = policy, on_turn, on_episode
        self.high_repetition_penalty = float(high_repetition_penalty)
        self.tokenizer = engine.tokenizer
        self._reasoning = reasoning_markers(self.tokenizer)
        markup = tuple(self.tool_format.markup) if self.tool_format is not None else ()
        self._call_markup = (markup[0], markup[1]) if len(markup) == 2 else None  # a call block: its text is data
        self._keep = tuple(self.tool_format.markup if self.tool_format is not None else ()) + tuple(
            m for pair in self._reasoning for m in pair)
        self._eos_ids = set(getattr(engine, "eos_token_ids", None) or [self.tokenizer.eos_token_id])
        stop = list(self.tool_format.stop) if self.tool_format is not None else list(cfg.stop)
        self.gen_kwargs = dict(max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, stop=stop or None,
                               batch_size=cfg.gen_batch_size, seed=seed, wait_s=cfg.gen_wait_s)
        self._batcher: GenerationBatcher | None = None
        self.last_batcher: GenerationBatcher | None = None
        self._env_s = 0.0
        self._retries = 0  # episode re-runs after an env failure, in the current run_groups call
        self._prefetched: dict[tuple[int, int], asyncio.Future] = {}  # (group_id, slot) -> reset in flight
        self._prefetched_tasks: list[Task] = []
        self._runs = 0
        self.fork = cfg.fork if policy is None else type(cfg.fork)()  # forks of scripted policies: none
        self.fork_refused: dict[str, str] = {}
        """env id -> why forking is refused for it (the first replay mismatch, ``rollout/fork.py``)."""
        self.deterministic = deterministic
        self.fork_js_temperatures = fork_js_temperatures
        if self.fork.enabled and self.fork.restore == "state" and not all(
                hasattr(pool, m) for m in ("snapshot", "restore", "drop_snapshot")):
            raise ValueError(f"rollout.fork.restore=state needs an env pool with snapshot/restore/drop_snapshot "
                             f"({type(pool).__name__} has none; LocalEnvPool and HTTPEnvPool have them)")
        if self.fork.enabled and self.fork.select == "js":
            if fork_js_temperatures is None or not caps_of(engine).token_js:
                raise ValueError("rollout.fork.select=js needs the engine's token JS (engine=hf) and the JS "
                                 "temperatures (algo.t_low, T1)")
        self.reset_counts()
        self.policy_version = 0
        """The version of the engine's weights (algorithms.md section 7): set by the backend at each weight sync; a
        turn records it when its generation is requested, unless the engine stamps its own
        (``Generation.policy_version``, :class:`agent_rl.engines.VersionedEngine`)."""
        if cfg.mode == "trajectory":
            render_followup(self.tokenizer, "probe")  # a template that cannot be spliced is refused here, by name
            if self.tool_format is not None:
                render_followup(self.tokenizer, "probe", role=self._tool_role)

    def event_counts(self) -> dict[str, float]:
        """Counters of :data:`EVENT_COUNTS` this orchestrator keeps, since :meth:`reset_counts` (the start of a
        :meth:`run_groups` call or of a stream): the fork counters with ``rollout.fork`` on, else none; a subclass
        adds its own (the gateway's, :class:`agent_rl.gateway.ExternalRollout`). They reach a round's metrics and
        :meth:`stream_counters`, so every backend and schedule logs them the same way."""
        return dict(self._fork_counts) if self.fork.enabled else {}

    def reset_counts(self) -> None:
        """Zero the counters of :meth:`event_counts`."""
        self._fork_counts = dict.fromkeys(FORK_COUNTS, 0.0)

    # ------------------------------------------------------------------ env calls
    async def _env(self, make_call: Callable[[], Awaitable[T]]) -> T:
        t0 = time.perf_counter()
        try:
            return await asyncio.wait_for(make_call(), self.cfg.env_timeout_s)
        except Exception as exc:  # noqa: BLE001 (any env-side failure: client error, timeout, broken server)
            raise EnvCallFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._env_s += time.perf_counter() - t0

    async def _reset(self, task: Task) -> Any:
        return await self._env(lambda: self.pool.reset(task.env_id, seed=task.seed, options=task.options,
                                                       env_kwargs=task.env_kwargs))

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, tasks: Sequence[Task], episodes_per_task: int) -> None:
        """Start the env resets of the next step's episodes now (the trainer calls this before the learner update,
        which it runs in a worker thread): ALFWorld resets cost seconds, and this hides them behind the update.
        The next :meth:`collect` plays these tasks first (its first round) and uses the open sessions."""
        self._prefetched_tasks = list(tasks)
        for task in tasks:
            for slot in range(episodes_per_task):
                self._prefetched[(task.group_id, slot)] = asyncio.ensure_future(self._reset(task))

    @property
    def num_prefetched_tasks(self) -> int:
        """Tasks drawn by :meth:`prefetch` and not yet played (a checkpoint's data position excludes them)."""
        return len(self._prefetched_tasks)

    async def aclose(self) -> None:
        """Cancel prefetched resets and close their sessions."""
        futures, self._prefetched, self._prefetched_tasks = list(self._prefetched.values()), {}, []
        await self._close_resets(futures)

    async def _release_prefetched(self, group_ids: set[int]) -> None:
        """Close the prefetched sessions of ``group_ids`` that no episode took: a group that played fewer than its
        G slots as plain episodes (forks under ``rollout.fork.budget=episodes|turns`` play 1..G bases and fill
        the rest only as far as the budget goes) left them open, and each step's leftovers held the env's capacity
        until none was free (measured: 8 tasks x 4 slots a step with forks, ``EnvUnavailable: all 8 workers hold 8
        sessions`` and 2-3 of 8 groups dropped at every 4th step)."""
        stale = [key for key in self._prefetched if key[0] in group_ids]
        await self._close_resets([self._prefetched.pop(key) for key in stale], cancel=False)

    async def _close_resets(self, futures: list[asyncio.Future], cancel: bool = True) -> None:
        """Close the sessions of reset futures (cancelled first with ``cancel``; best effort)."""
        if cancel:
            for fut in futures:
                fut.cancel()
        for fut in futures:
            try:
                reset = await fut
                await asyncio.wait_for(self.pool.close(reset.session_id), 30.0)
            except BaseException:  # noqa: BLE001 (cancelled or failed: nothing to close)
                pass

    # ------------------------------------------------------------------ one episode
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
            obs_ids = render_followup(self.tokenizer, self.prompt.followup(ctx), role=self._tool_role,
                                      tools=ctx.tools if caps.tools else None)
        else:
            obs_ids = render_followup(self.tokenizer, self.prompt.followup(ctx))
        return splice_followup(prev, response, obs_ids, self._eos_ids)

    @property
    def _tool_role(self) -> str:
        """The role of the env's answer to a call: ``tool``, or ``user`` for a template without that role."""
        return "tool" if TemplateTools.of(self.tokenizer).tool_role else "user"

    def parse(self, text: str, ctx: TurnContext, reasoning_open_at_start: bool = False) -> tuple[str, bool]:
        """``(env action, well_formed)`` of a reply: in tools mode (the env declared tools) the tool-call format's
        reading (:attr:`agent_rl.rollout.tools.ToolCallParse.action`; not well formed when a call cannot be read) of
        the reply without its reasoning blocks (:func:`agent_rl.rollout.tools.strip_reasoning`: a call drafted while
        thinking is never played; ``reasoning_open_at_start``: the prompt opened a block), else
        :func:`parse_action` (math/code: the whole answer, lines kept)."""
        raw = bool(getattr(self.prompt, "raw_actions", False))
        if self.tool_format is not None and ctx.tools:
            parsed = self.tool_format.parse(strip_reasoning(text, self._reasoning, reasoning_open_at_start,
                                                              self._call_markup))
            action = parsed.action
            if not parsed.calls and parsed.error is None and not raw:  # a text reply: cut as text actions are
                action = " ".join(action.split())[:self.cfg.max_action_chars]
            return action, parsed.well_formed
        parsed_text = parse_action(text, max_chars=self.cfg.max_action_chars, normalize_whitespace=not raw)
        return parsed_text.action, parsed_text.well_formed or raw

    async def _respond(self, ctx: TurnContext, task: Task, slot: int, prompt_ids: list[int], temperature: float,
                       is_high: bool, episode_id: str | None = None) -> tuple[Generation, str, bool]:
        """One turn's ``(response, env action, well formed)``: the scripted ``policy``'s answer (its action as given),
        else the engine's generation through the batcher, parsed (:meth:`parse`)."""
        version = self.policy_version
        if self.policy is not None:
            action, gen = self.policy.respond(ctx, task, slot)
            well_formed = True
        else:
            assert self._batcher is not None
            penalty = self.high_repetition_penalty if is_high else 1.0
            key = (task.group_id, slot, ctx.step)
            if self.tool_format is not None and ctx.tools:
                gen, opened = await self._generate_tool_turn(prompt_ids, temperature, penalty, key, episode_id)
                action, well_formed = self.parse(gen.text, ctx, opened)
            else:
                gen = await self._batcher.generate(prompt_ids, temperature, penalty, key=key, episode_id=episode_id)
                action, well_formed = self.parse(gen.text, ctx)
        if gen.policy_version is None:
            gen.policy_version = version
        if self.on_turn is not None:
            self.on_turn(gen)
        return gen, action, well_formed

    async def _generate_tool_turn(self, prompt_ids: list[int], temperature: float, penalty: float,
                                  key: tuple[int, ...], episode_id: str | None, max_new_tokens: int | None = None,
                                  stop: Sequence[str] = ()) -> tuple[Generation, bool]:
        """One tools-mode reply: ``(generation, whether the prompt opened a reasoning block)``.

        The text is decoded from the sampled ids with the format's markup and the reasoning markers kept
        (:func:`agent_rl.rollout.tools.decode_for_parsing`: a tokenizer may hold ``<tool_call>`` as a special token,
        which the engine's text drops). A stop string that fired inside an open reasoning block (a call drafted while
        thinking) does not end the reply: generation resumes from the prompt plus the ids so far (key
        ``key + (resume,)``, same episode, so kept caches serve it), at most :data:`MAX_REASONING_RESUMES` times,
        and the pieces are one generation of at most ``max_new_tokens`` ids (cut there: ``"length"``). The check
        is the orchestrator's, on the ids, so it is the same for every engine. ``max_new_tokens`` and ``stop``: the
        call's own cap (at most the engine's) and extra stop strings (:meth:`GenerationBatcher.generate`).
        """
        assert self._batcher is not None
        max_new = int(self.gen_kwargs["max_new_tokens"])
        if max_new_tokens is not None:
            max_new = min(max_new, int(max_new_tokens))
        row = dict(max_new_tokens=max_new_tokens, stop=tuple(stop))
        stops = [s for s in self.tool_format.stop] if self.tool_format is not None else []
        tail = decode_for_parsing(self.tokenizer, prompt_ids[-_PROMPT_TAIL_TOKENS:], self._keep)
        opened = prompt_opens_reasoning(tail, self._reasoning)
        first = gen = await self._batcher.generate(prompt_ids, temperature, penalty, key=key, episode_id=episode_id,
                                                   **row)
        ids, logprobs = list(gen.token_ids), list(gen.logprobs)
        text = decode_for_parsing(self.tokenizer, ids, self._keep)
        for resume in range(1, MAX_REASONING_RESUMES + 1):
            stopped_by_string = gen.finish_reason == "stop" and not (ids and ids[-1] in self._eos_ids) and any(
                s in text[-(len(s) + 16):] for s in stops)
            thinking = reasoning_open(text, self._reasoning, opened, self._call_markup)
            if not stopped_by_string or len(ids) >= max_new or not thinking:
                break
            gen = await self._batcher.generate(prompt_ids + ids, temperature, penalty, key=key + (resume,),
                                               episode_id=episode_id, **row)
            ids += gen.token_ids
            logprobs += gen.logprobs
            text = decode_for_parsing(self.tokenizer, ids, self._keep)
        finish = gen.finish_reason
        if len(ids) > max_new:  # a prefix of a sample is a sample: cut at the turn's budget
            ids, logprobs, finish = ids[:max_new], logprobs[:max_new], "length"
            text = decode_for_parsing(self.tokenizer, ids, self._keep)
        return Generation(token_ids=ids, logprobs=logprobs, text=text, finish_reason=finish,
                          cached_tokens=first.cached_tokens, policy_version=first.policy_version), opened

    async def _play(self, task: Task, temperature: float, is_high: bool, slot: int = 0,
                    replay: SiblingStart | None = None, source: ForkSource | None = None) -> Episode:
        """One attempt at an episode; raises :class:`EnvCallFailed` on env failure. ``replay``: a forked sibling
        (``rollout.fork``): turns 0..t-1 (t = ``replay.turn``) are copies of the base's turns, sampling starts at
        turn t. Without ``replay.snapshot`` they replay the base's actions on a fresh session, each checked equal to
        the base's (:class:`agent_rl.rollout.fork.ReplayMismatch` otherwise); with it the session is opened in the
        snapshot of the base's state before turn t (``pool.restore``) and only the prompts are rebuilt (and
        checked) from the base's reset and turns. ``replay.cache``: the base's kept engine cache, which the
        sibling's starts from (``engine.fork_episode``: the shared prefix is prefilled once). ``source``: a base
        episode's :class:`ForkSource`: its finished engine cache is kept there (the caller ends it) instead of
        dropped, and, with ``source.snapshot``, its env state is snapshotted after every turn but the last."""
        cfg = self.cfg
        base, fork_at = (replay.base, replay.turn) if replay is not None else (None, 0)
        restored = replay is not None and replay.snapshot is not None
        t_replay = time.perf_counter()
        early = self._prefetched.pop((task.group_id, slot), None) if replay is None else None
        if restored:
            snapshot_id = replay.snapshot  # type: ignore[union-attr]
            reset = await self._env(lambda: self.pool.restore(snapshot_id))
        else:
            reset = await early if early is not None else await self._reset(task)
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
            ep = Episode(task=task, temperature=temperature, is_high=is_high, task_type=info.get(self.task_type_key),
                         fork=ForkOrigin(replay.base_slot, fork_at) if replay is not None else None)
            task_text = self.prompt.task_text(obs, info)
            tools = info.get("tools")
            if self.tool_format is not None and tools is None:
                raise ToolEnvError(f"action_format=tools, but {task.env_id} declared no tools at reset (info['tools']"
                                   "); make the env with action_format='tools' (docs/tools.md) or use "
                                   "env.action_format=text")
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
                if base is not None and k < fork_at:  # a replayed turn: the base's, checked
                    check_replayed_prompt(k, prompt_ids, base.turns[k])
                    old = base.turns[k]
                    if restored:  # the session is already in the state after this turn: no env step
                        ep.turns.append(dataclasses.replace(old))
                        history.append((obs, old.action))
                        obs, info = old.observation, dict(old.info or {})
                    else:
                        step = await self._env(lambda: self.pool.step(sid, old.action))
                        check_replayed_step(k, step.observation, step.reward, step.terminated, step.truncated, old)
                        ep.turns.append(dataclasses.replace(old, info=dict(step.info or {})))
                        history.append((obs, old.action))
                        obs, info = step.observation, dict(step.info or {})
                    if k == fork_at - 1:
                        self._fork_counts["fork/replay_s"] += time.perf_counter() - t_replay
                        self._fork_counts["fork/replayed_turns"] += fork_at
                    continue
                gen, action, well_formed = await self._respond(ctx, task, slot, prompt_ids, temperature, is_high,
                                                               episode_id)
                step = await self._env(lambda: self.pool.step(sid, action))
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
                    await self._snapshot(task.env_id, sid, k + 1, source)
            # a sum of rewards that each fit float32 may not: checked again
            env_reward = checked_reward(sum(t.reward for t in ep.turns), "the episode's reward (its turns' sum)")
            ep.reward = env_reward  # an invalid-action penalty is already in it (envs.wrappers, rollout.invalid_penalty)
            ep.won = bool(info.get("won", env_reward > 0)) if ep.turns else False
            if source is not None and source.keep_cache and ep.failure is None:
                source.cache.append(episode_id)
                kept = True
            return ep
        finally:
            if caps_of(self.engine).kv_reuse and not kept:  # the engine drops what it kept (hf: engine.kv_reuse)
                self.engine.end_episode(episode_id)
            try:
                await asyncio.wait_for(self.pool.close(sid), 30.0)
            except Exception:  # noqa: BLE001 (closing is best effort; the server's TTL reaps leftovers)
                pass

    def _refuse_fork(self, env_id: str, reason: str) -> None:
        """Refuse forking for ``env_id`` for the rest of the run (``fork_refused``), logged once with the reason."""
        if env_id not in self.fork_refused:
            self.fork_refused[env_id] = reason
            log.warning("rollout.fork refused for %s for the rest of the run: %s", env_id, reason)

    async def _snapshot(self, env_id: str, session_id: str, turn: int, source: ForkSource) -> None:
        """Snapshot a base's env state before its turn ``turn`` into ``source.snapshots`` (``restore=state``). An env
        without ``clone_state``/``set_state`` (the pool's 422 ``invalid_request``) refuses forking for ``env_id``
        (``fork_refused``) and the base plays on; any other failure fails the attempt (:class:`EnvCallFailed`)."""
        if env_id in self.fork_refused:
            source.snapshot = False
            return
        t0 = time.perf_counter()
        try:
            source.snapshots[turn] = await asyncio.wait_for(self.pool.snapshot(session_id), self.cfg.env_timeout_s)
        except Exception as exc:  # noqa: BLE001 (a client error, a timeout, a broken server)
            code = getattr(exc, "code", None)
            if code in ("at_capacity", "quota_exceeded"):  # max_snapshots (or the client's): no fork from this turn
                self._fork_counts["fork/snapshots_refused"] += 1
                return
            if code != "invalid_request":  # the env failed: so did the attempt
                raise EnvCallFailed(f"snapshot: {type(exc).__name__}: {exc}") from exc
            self._refuse_fork(env_id, f"rollout.fork.restore=state: {exc}")
            source.snapshot = False
            return
        finally:
            self._fork_counts["fork/snapshot_s"] += time.perf_counter() - t0
        self._fork_counts["fork/snapshots"] += 1

    async def _episode(self, task: Task, temperature: float, is_high: bool, slot: int = 0,
                       replay: SiblingStart | None = None, source: ForkSource | None = None) -> Episode:
        """An episode with re-runs from the same task; a final failure is returned as ``Episode.failure``
        (``replay``: a forked sibling, :meth:`_play`; its :class:`ReplayMismatch` is raised, never re-run)."""
        reason = ""
        ep: Episode | None = None
        for attempt in range(self.cfg.episode_retries + 1):
            if attempt:
                self._retries += 1
                await asyncio.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            try:
                if source is not None:  # a re-run takes its base's snapshots afresh
                    await self._free_source(source)
                ep = await self._play(task, temperature, is_high, slot, replay, source)
                break
            except EnvCallFailed as exc:
                reason = str(exc)
        if ep is None:
            ep = Episode(task=task, temperature=temperature, is_high=is_high, failure=f"env: {reason}")
        if self.on_episode is not None:
            self.on_episode(ep)
        return ep

    # ------------------------------------------------------------------ groups
    async def _group(self, spec: GroupSpec, one: Callable[..., Awaitable[Episode]]) -> list[Episode]:
        """One group's episodes: its base episodes (every slot, or the first ``base_count`` with
        ``rollout.fork.budget=episodes``) concurrently, then, with ``rollout.fork`` on, the forked siblings of each
        (:mod:`agent_rl.rollout.fork`) concurrently, in (base, fork point, sibling) order after the bases. ``one(task,
        temperature, is_high, slot, replay)`` plays one episode. A sibling whose replay mismatched is discarded and
        forking refused for the env id (``fork_refused``, ``fork/replay_mismatch``); a sibling that failed is
        discarded (``fork/failed_siblings``): neither drops the group. Forks only start once every base finished
        without failure (a failed group is dropped whole anyway). Under ``budget=episodes|turns`` the budget the
        siblings leave unspent is played as plain episodes of the next slots (:func:`agent_rl.rollout.fork.spare_slots`,
        ``fork/filled_episodes``), concurrently with the siblings; the order is bases, those, then siblings."""
        g_size = len(spec.temperatures)
        n_base = base_count(self.fork, g_size,
                            first_high=next((i for i, (_, high) in enumerate(spec.temperatures) if high), None))
        env_id = spec.task.env_id
        by_state = self.fork.restore == "state"
        if self.fork.enabled and self.deterministic is False and not by_state:
            self._refuse_fork(env_id, "the env family declares that its episodes do not replay exactly "
                                      "(envs.families.EnvFamily.deterministic); rollout.fork.restore=state forks an "
                                      "env that has clone_state/set_state")
        forking = self.fork.enabled and env_id not in self.fork_refused
        # each base's kept engine cache (its siblings' prefix) and, with restore=state, its env-state snapshots
        sources = [ForkSource(keep_cache=forking and caps_of(self.engine).fork_cache,
                              snapshot=forking and by_state) for _ in range(n_base)]
        try:
            bases = list(await gather_all(*(one(spec.task, t, h, slot, None, sources[slot] if forking else None)
                                            for slot, (t, h) in enumerate(spec.temperatures[:n_base]))))
            if not self.fork.enabled:
                return bases
            if any(ep.failure is not None for ep in bases):
                return bases  # the group is dropped whole: no forks, no fill
            jobs = await self._sibling_jobs(spec, bases) if env_id not in self.fork_refused else []
            if by_state:  # a sibling needs its fork turn's snapshot (none where snapshots were refused)
                jobs = [(b, t, slot) for b, t, slot in jobs if t in sources[b].snapshots]
                # the snapshots no sibling uses are dropped now, not when the group ends
                await gather_all(*(self._free_source(src, keep={t for b2, t, _ in jobs if b2 == b})
                                   for b, src in enumerate(sources)))
            n_fill = spare_slots(self.fork, bases, jobs, g_size)
            fill_slots = enumerate(spec.temperatures[n_base:n_base + n_fill], start=n_base)
            sibs, fill = await gather_all(
                self._siblings(spec, bases, jobs, sources, one),
                gather_all(*(one(spec.task, t, h, slot) for slot, (t, h) in fill_slots)))
            self._fork_counts["fork/filled_episodes"] += len(fill)
            eps = bases + list(fill) + sibs
            self._fork_counts["fork/generated_turns"] += generated_turns(eps)
            return eps
        finally:
            if caps_of(self.engine).kv_reuse:
                for eid in (e for src in sources for e in src.cache):
                    self.engine.end_episode(eid)
            await gather_all(*(self._free_source(src) for src in sources))

    async def _free_source(self, source: ForkSource, keep: set[int] | frozenset[int] = frozenset()) -> None:
        """Drop a base's env-state snapshots but those of the fork turns in ``keep`` (best effort, bounded by
        ``rollout.env_timeout_s``: a server that cannot be reached drops them at its TTL)."""
        snapshots = [sid for t, sid in source.snapshots.items() if t not in keep]
        source.snapshots = {t: sid for t, sid in source.snapshots.items() if t in keep}
        for snapshot_id in snapshots:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pool.drop_snapshot(snapshot_id), self.cfg.env_timeout_s)

    async def _fork_js(self, spec: GroupSpec, bases: list[Episode]) -> list[list[list[float]]]:
        """Each base's per-turn token JS (``rollout.fork.select=js``, ``HFEngine.token_js``) between T0 =
        ``fork_js_temperatures[0]`` and T1 = the group's high temperature (its first high slot's: the step's T1 under
        ``algo.t_high=auto``; ``fork_js_temperatures[1]`` when the group has no high slot), one scoring forward per
        base in a worker thread; the time is counted in ``fork/select_s``."""
        t_low, t_high = self.fork_js_temperatures  # type: ignore[misc]  (checked in __init__)
        t_high = next((t for t, high in spec.temperatures if high), t_high)
        t0 = time.perf_counter()
        out = []
        for ep in bases:
            turns = [(t.prompt_ids, t.response_ids) for t in ep.turns]
            out.append(await asyncio.to_thread(self.engine.token_js, turns, t_low, t_high) if turns else [])
        self._fork_counts["fork/select_s"] += time.perf_counter() - t0
        return out

    async def _sibling_jobs(self, spec: GroupSpec, bases: list[Episode]) -> list[tuple[int, int, int]]:
        """The siblings to play for a group's finished ``bases``: ``(base, fork turn, slot)``, after the budget."""
        g_size, n_base = len(spec.temperatures), len(bases)
        seed = self._batcher.seed if self._batcher is not None and self._batcher.seed is not None else 0
        token_js = await self._fork_js(spec, bases) if self.fork.select == "js" else None
        points = fork_turns(self.fork, bases, seed=seed, group_id=spec.task.group_id, token_js=token_js)
        jobs = [(b, t, sibling_slot(g_size, b, p, j, self.fork)) for b, turns in enumerate(points)
                for p, t in enumerate(turns) for j in range(self.fork.siblings)]
        if self.fork.budget != "extra":
            jobs = budget_order(jobs, bases)  # a T1 base's siblings first: TGRL trains only T1 rows
        if self.fork.budget == "episodes":
            jobs = jobs[:max(0, g_size - n_base)]
        elif self.fork.budget == "turns":
            jobs = turn_budget_jobs(jobs, bases, g_size)
        return jobs

    async def _siblings(self, spec: GroupSpec, bases: list[Episode], jobs: list[tuple[int, int, int]],
                        sources: list[ForkSource], one: Callable[..., Awaitable[Episode]]) -> list[Episode]:
        """Play the forked sibling ``jobs`` (:meth:`_sibling_jobs`) of a group's finished ``bases``
        (:meth:`_group`); ``sources``: what each base kept (:class:`ForkSource`: engine cache, snapshots)."""
        env_id = spec.task.env_id

        async def sibling(b: int, t: int, slot: int) -> Episode | None:
            base = bases[b]
            try:
                src = sources[b]
                start = SiblingStart(base, b, t, cache=src.cache[0] if src.cache else None,
                                     snapshot=src.snapshots.get(t),  # none unless restore=state
                                     reset=src.reset)
                return await one(spec.task, base.temperature, base.is_high, slot, start)
            except ReplayMismatch as exc:
                self._fork_counts["fork/replay_mismatch"] += 1
                self._refuse_fork(env_id, str(exc))
                return None

        played = await gather_all(*(sibling(*job) for job in jobs))
        kept = [ep for ep in played if ep is not None and ep.failure is None]
        self._fork_counts["fork/failed_siblings"] += sum(ep is not None and ep.failure is not None for ep in played)
        self._fork_counts["fork/extra_episodes"] += len(kept)
        self._fork_counts["fork/groups"] += float(bool(kept))
        return kept

    async def run_groups(self, groups: Sequence[GroupSpec], *, seed_key: int | None = None) -> RolloutResult:
        """Play every episode of ``groups`` concurrently; drop groups with a failed episode.

        The rollout seed is ``default_rng([seed, seed_key]).integers(2**31)`` (``seed_key``: :meth:`collect` passes
        the step and round, so steps never reuse random streams and a resumed run samples as the uninterrupted one
        would have; default: a per-orchestrator counter); turn k of slot s of group g samples with
        ``row_seed(rollout seed, g, s, k)`` (module docstring: independent of batching and env timing).

        Returns:
            RolloutResult whose ``episodes`` hold only complete groups (order: group, then episode) and whose
            metrics are computed over them (plus ``rollout/dropped_groups``, ``rollout/episode_retries``: episode
            re-runs after an env failure, ``rollout/failed_episodes``: episodes that failed every attempt).
        """
        t0 = time.perf_counter()
        self._env_s = 0.0
        self._retries = 0
        kwargs = dict(self.gen_kwargs)
        if kwargs["seed"] is not None:
            key = self._runs if seed_key is None else seed_key
            kwargs["seed"] = int(np.random.default_rng([int(kwargs["seed"]), key]).integers(2**31))
        self._runs += 1
        batcher = self._batcher = GenerationBatcher(self.engine, **kwargs)
        server = asyncio.create_task(batcher.run())
        sem = asyncio.Semaphore(self.cfg.max_concurrent_episodes) if self.cfg.max_concurrent_episodes > 0 else None

        async def one(task: Task, temp: float, high: bool, slot: int, replay: SiblingStart | None = None,
                      source: ForkSource | None = None) -> Episode:
            async with sem if sem is not None else contextlib.nullcontext():
                batcher.episode_started()
                try:
                    return await self._episode(task, temp, high, slot, replay, source)
                finally:
                    batcher.episode_finished()

        self.reset_counts()
        try:  # structured: cancelled or failed, every episode is cancelled and has finished before this returns
            results = await gather_all(*(self._group(g, one) for g in groups))
        except BaseException:
            server.cancel()  # no episode is left to wait for a generation
            raise
        finally:
            batcher.close()
            with contextlib.suppress(asyncio.CancelledError):
                await server
            self._batcher = None
            await self._release_prefetched({g.task.group_id for g in groups})
        kept: list[Episode] = []
        dropped = 0
        failures: list[str] = []
        for eps in results:
            failed = [ep.failure for ep in eps if ep.failure is not None]
            if failed:
                dropped += 1
                failures.append(failed[0])
            else:
                kept.extend(eps)
        wall = time.perf_counter() - t0
        metrics = rollout_metrics(kept)
        metrics.update({
            "rollout/dropped_groups": float(dropped),
            "rollout/episode_retries": float(self._retries),
            "rollout/failed_episodes": float(sum(ep.failure is not None for eps in results for ep in eps)),
            "time/rollout_s": wall,
            "time/env_wait_frac": max(0.0, 1.0 - batcher.busy_s / wall) if wall > 0 else 0.0,
            "time/generate_s": batcher.busy_s,
            "time/env_calls_s": self._env_s,  # summed over concurrent episodes
            "throughput/tokens_per_s": batcher.generated_tokens / wall if wall > 0 else 0.0,
            "throughput/prefill_tokens": float(batcher.prefill_tokens),
            "throughput/decode_tokens": float(batcher.generated_tokens),
            "throughput/kv_reuse_tokens": float(batcher.kv_reuse_tokens),
        })
        metrics.update(self.event_counts())
        self.last_batcher = batcher  # generation statistics of the last run (benchmarks)
        return RolloutResult(episodes=kept, metrics=metrics, dropped_groups=dropped, failures=failures)

    # ------------------------------------------------------------------ a stream of groups (asynchronous rollouts)
    async def open_stream(self, seed_key: int) -> None:
        """Start one long-lived :class:`GenerationBatcher` for :meth:`play_group` calls that come and go (the
        asynchronous producer, :mod:`agent_rl.rollout.producer`). Its rollout seed is drawn as in :meth:`run_groups`
        from ``seed_key``; rows keep their (group id, slot, turn) keys, so group ids must stay distinct for the
        stream's life. Counters (``stream_counters``) add up until :meth:`close_stream`."""
        if self._batcher is not None:
            raise RuntimeError("a stream or run_groups call is already open on this orchestrator")
        kwargs = dict(self.gen_kwargs)
        if kwargs["seed"] is not None:
            kwargs["seed"] = int(np.random.default_rng([int(kwargs["seed"]), int(seed_key)]).integers(2**31))
        self._env_s, self._retries, self._failed_episodes = 0.0, 0, 0
        self.reset_counts()
        self._batcher = GenerationBatcher(self.engine, **kwargs)
        self._stream_server = asyncio.create_task(self._batcher.run())
        n = self.cfg.max_concurrent_episodes
        self._stream_sem = asyncio.Semaphore(n) if n > 0 else None

    async def play_group(self, spec: GroupSpec) -> list[Episode]:
        """Play the G episodes of ``spec`` concurrently on the open stream (:meth:`open_stream`); returns them in slot
        order, failed ones with ``Episode.failure`` set (the caller drops such a group, as :meth:`run_groups`
        does)."""
        batcher = self._batcher
        if batcher is None or getattr(self, "_stream_server", None) is None:
            raise RuntimeError("play_group needs open_stream() first")
        sem = self._stream_sem

        async def one(task: Task, temp: float, high: bool, slot: int, replay: SiblingStart | None = None,
                      source: ForkSource | None = None) -> Episode:
            async with sem if sem is not None else contextlib.nullcontext():
                batcher.episode_started()
                try:
                    return await self._episode(task, temp, high, slot, replay, source)
                finally:
                    batcher.episode_finished()

        eps = await self._group(spec, one)
        self._failed_episodes += sum(ep.failure is not None for ep in eps)
        return eps

    def stream_counters(self) -> dict[str, float]:
        """Totals of the open stream: ``generate_s`` (engine busy), ``tokens`` generated, ``prefill_tokens`` and
        ``kv_reuse_tokens`` (prompt tokens computed / taken from the engine's cache), ``episode_retries``,
        ``failed_episodes``, ``env_calls_s`` (summed over concurrent episodes), and :meth:`event_counts`."""
        b = self._batcher
        return {"generate_s": b.busy_s if b is not None else 0.0,
                "tokens": float(b.generated_tokens) if b is not None else 0.0,
                "prefill_tokens": float(b.prefill_tokens) if b is not None else 0.0,
                "kv_reuse_tokens": float(b.kv_reuse_tokens) if b is not None else 0.0,
                "episode_retries": float(self._retries), "failed_episodes": float(getattr(self, "_failed_episodes", 0)),
                "env_calls_s": self._env_s, **self.event_counts()}

    async def close_stream(self) -> None:
        """Stop the stream's batcher (episodes still waiting for generation get no answer: cancel them first)."""
        server = getattr(self, "_stream_server", None)
        if self._batcher is not None and server is not None:
            self._batcher.close()
            try:
                await server
            finally:
                self.last_batcher, self._batcher, self._stream_server = self._batcher, None, None

    async def collect(self, sample_tasks: Callable[[int], list[Task]], num_groups: int, algo: Any, step: int, *,
                      filter_groups: bool = False, max_extra_rounds: int = 0,
                      t_high: float | None = None) -> RolloutResult:
        """Rollout of one training step: ``num_groups`` tasks, G episodes each (:func:`group_temperatures`, T1 =
        ``t_high`` when given: the step's pick under ``algo.t_high=auto``), in rounds of :meth:`run_groups`
        (:func:`collect_groups`: DAPO's dynamic sampling and its extra rounds). Tasks given to :meth:`prefetch` are
        played first."""
        temps = group_temperatures(algo, step, t_high)

        def take(n: int) -> list[Task]:
            tasks, self._prefetched_tasks = self._prefetched_tasks[:n], self._prefetched_tasks[n:]
            return tasks + sample_tasks(n - len(tasks))

        async def play(tasks: list[Task], seed_key: int) -> RolloutResult:
            return await self.run_groups([GroupSpec(t, temps) for t in tasks], seed_key=seed_key)

        return await collect_groups(play, take, num_groups, len(temps), step, filter_groups=filter_groups,
                                    max_extra_rounds=max_extra_rounds)


async def collect_groups(play: Callable[[list[Task], int], Awaitable[RolloutResult]],
                         take_tasks: Callable[[int], list[Task]], num_groups: int, group_size: int, step: int, *,
                         filter_groups: bool = False, max_extra_rounds: int = 0) -> RolloutResult:
    """One training step's groups, in rounds: ``play(tasks, seed_key)`` plays one group of ``group_size`` episodes
    per task (one orchestrator's :meth:`RolloutOrchestrator.run_groups`, or the Ray workers' chunks of it merged by
    :func:`merge_parallel_results`) with the rollout seed key ``step * 1000 + round``; ``take_tasks(n)`` draws the
    round's tasks. The one implementation of a step's collection for every backend.

    With ``filter_groups`` (DAPO dynamic sampling, algorithms.md section 1) groups whose episode rewards are all
    equal are dropped and more tasks are drawn, at most ``max_extra_rounds`` extra rounds; the batch keeps at most
    ``num_groups`` groups (fewer when the rounds run out); failed groups count as missing there too. Without it,
    failed groups are dropped and counted and the batch is smaller. Metrics are over the kept episodes; times and
    counters add up over rounds.
    """
    kept: list[list[Episode]] = []
    total = RolloutResult(episodes=[])
    wall = env_wait = tokens = generate = retries = failed = 0.0
    counts: dict[str, float] = {}
    need, rounds = num_groups, 0
    while True:
        res = await play(take_tasks(need), step * 1000 + rounds)
        total.dropped_groups += res.dropped_groups
        total.failures += res.failures
        wall += res.metrics["time/rollout_s"]
        env_wait += res.metrics["time/env_wait_frac"] * res.metrics["time/rollout_s"]
        tokens += res.metrics["throughput/tokens_per_s"] * res.metrics["time/rollout_s"]
        counts = sum_counters([counts, res.metrics], TOKEN_COUNTS + present(EVENT_COUNTS, [res.metrics]))
        generate += res.metrics["time/generate_s"]
        retries += res.metrics["rollout/episode_retries"]
        failed += res.metrics["rollout/failed_episodes"]
        for group in split_groups(res.episodes):
            # the curriculum observes the group's base episodes (a forked sibling replays a base's start)
            total.outcomes.append((group[0].task, [ep.won for ep in group if ep.fork is None]))
            if filter_groups and all_equal([ep.reward for ep in group]):
                total.filtered_groups += 1
            else:
                kept.append(group)
        if len(kept) >= num_groups or not filter_groups or rounds >= max_extra_rounds:
            break
        rounds += 1
        need = num_groups - len(kept)
    total.episodes = [ep for group in kept[:num_groups] for ep in group]
    total.metrics = rollout_metrics(total.episodes)
    total.metrics.update({
        "rollout/dropped_groups": float(total.dropped_groups),
        "rollout/episode_retries": retries,
        "rollout/failed_episodes": failed,
        "rollout/filtered_groups": float(total.filtered_groups),
        "rollout/extra_rounds": float(rounds),
        "time/rollout_s": wall,
        "time/env_wait_frac": env_wait / wall if wall > 0 else 0.0,
        "time/generate_s": generate,
        "throughput/tokens_per_s": tokens / wall if wall > 0 else 0.0,
        **counts,
    })
    return total


def sum_counters(parts: Iterable[Mapping[str, float]], keys: Iterable[str] | None = None) -> dict[str, float]:
    """Key-wise totals of counter dicts (rounds, Ray workers' chunks or streams): ``keys`` (default: every key seen),
    a key missing from a part counting 0. The one place counters such as :data:`TOKEN_COUNTS` add up."""
    parts = list(parts)
    names = list(keys) if keys is not None else list(dict.fromkeys(k for part in parts for k in part))
    return {name: sum(part.get(name, 0.0) for part in parts) for name in names}


def merge_parallel_results(results: Sequence[RolloutResult], *, wall_s: float) -> RolloutResult:
    """Several orchestrators' :meth:`RolloutOrchestrator.run_groups` results of one round played in parallel (the
    Ray workers' chunks) as one result: episodes and failures in the given order, counters and generation time
    summed, ``time/rollout_s`` the round's wall time ``wall_s``, the env-wait fraction weighted by each part's
    rollout time, throughput = all generated tokens / ``wall_s``."""
    parts = [r.metrics for r in results]
    busy = [m.get("time/rollout_s", 0.0) for m in parts]
    out = RolloutResult(episodes=[ep for r in results for ep in r.episodes],
                        dropped_groups=sum(r.dropped_groups for r in results),
                        failures=[f for r in results for f in r.failures])
    out.metrics = rollout_metrics(out.episodes)
    out.metrics.update({
        "rollout/dropped_groups": float(out.dropped_groups),
        "rollout/episode_retries": sum(m.get("rollout/episode_retries", 0.0) for m in parts),
        "rollout/failed_episodes": sum(m.get("rollout/failed_episodes", 0.0) for m in parts),
        "time/rollout_s": wall_s,
        "time/env_wait_frac": sum(m.get("time/env_wait_frac", 0.0) * b for m, b in zip(parts, busy)) /
        max(sum(busy), 1e-9),
        "time/generate_s": sum(m.get("time/generate_s", 0.0) for m in parts),
        "time/env_calls_s": sum(m.get("time/env_calls_s", 0.0) for m in parts),
        "throughput/tokens_per_s": sum(m.get("throughput/tokens_per_s", 0.0) * b for m, b in zip(parts, busy)) /
        max(wall_s, 1e-9),
        **sum_counters(parts, TOKEN_COUNTS + present(EVENT_COUNTS, parts)),
    })
    return out


def present(keys: Sequence[str], parts: Sequence[Mapping[str, float]]) -> tuple[str, ...]:
    """The ``keys`` some part has (:data:`EVENT_COUNTS` exist only in runs that have them: forks, the gateway)."""
    return tuple(k for k in keys if any(k in part for part in parts))


def split_groups(episodes: Sequence[Episode]) -> list[list[Episode]]:
    """A result's episodes cut into its groups: runs of consecutive episodes sharing ``task.group_id`` (the
    orchestrator's order). Groups need not have G episodes: a forked group (``rollout.fork``) also holds its
    siblings."""
    out: list[list[Episode]] = []
    for ep in episodes:
        if out and out[-1][0].task.group_id == ep.task.group_id:
            out[-1].append(ep)
        else:
            out.append([ep])
    return out


def all_equal(rewards: Sequence[float]) -> bool:
    """DAPO filter of one group: its rewards are all equal within the estimators' tolerance (``dapo_keep_groups``:
    range <= 1e-6 * max(1, max |R|)), so float rounding does not keep a group whose advantages are all 0."""
    r = torch.tensor(rewards, dtype=torch.float64)
    return not bool(dapo_keep_groups(r, torch.zeros(len(rewards), dtype=torch.long)).any())


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Rollout metrics of algorithms.md section 6 over finished episodes (NaN-free: 0.0 when there are none).

    ``reward/mean`` mean episode reward; ``success/rate`` and ``success/<task_type>`` fraction won;
    ``response/length_mean`` mean response tokens per turn; ``response/truncated_frac`` turns cut by the token budget;
    ``episode/turns_mean``; ``episode/truncated_frac`` episodes that ended without termination (turn/prompt budget or
    the env's time limit); ``episode/invalid_action_frac`` invalid turns / turns (``..._high``: of the T1 episodes'
    turns, when there are any); ``rollout/groups`` the groups
    (``Task.group_id``) and ``rollout/groups_equal_frac`` the fraction whose episodes' rewards are all equal (a
    group of zero reward variance: every group advantage 0; 1.0 = the step has no learning signal);
    ``rollout/groups_mixed_success_frac`` the fraction with both won and lost episodes (a signal of success itself,
    where unequal rewards can also come from shaping such as ``rollout.invalid_penalty``).
    """
    turns = [t for ep in episodes for t in ep.turns]
    n_ep, n_turns = max(len(episodes), 1), max(len(turns), 1)
    metrics = {
        "reward/mean": sum(ep.reward for ep in episodes) / n_ep,
        "success/rate": sum(ep.won for ep in episodes) / n_ep,
        "response/length_mean": sum(len(t.response_ids) for t in turns) / n_turns,
        "response/truncated_frac": sum(t.response_truncated for t in turns) / n_turns,
        "episode/turns_mean": len(turns) / n_ep,
        "episode/truncated_frac": sum(not (ep.turns and ep.turns[-1].terminated) for ep in episodes) / n_ep,
        "episode/invalid_action_frac": sum(t.invalid for t in turns) / n_turns,
        "rollout/episodes": float(len(episodes)),
    }
    high = [t for ep in episodes if ep.is_high for t in ep.turns]
    if high:  # TGRL's T1 episodes alone (the temperature a calibration probe chooses)
        metrics["episode/invalid_action_frac_high"] = sum(t.invalid for t in high) / len(high)
    groups: dict[Any, list[float]] = {}
    wins: dict[Any, set[bool]] = {}
    for ep in episodes:
        groups.setdefault(ep.task.group_id, []).append(ep.reward)
        wins.setdefault(ep.task.group_id, set()).add(bool(ep.won))
    metrics["rollout/groups"] = float(len(groups))
    metrics["rollout/groups_equal_frac"] = sum(map(all_equal, groups.values())) / max(len(groups), 1)
    # groups with both won and lost episodes: the signal of success itself (unequal rewards may come from shaping
    # alone, e.g. rollout.invalid_penalty)
    metrics["rollout/groups_mixed_success_frac"] = sum(len(w) == 2 for w in wins.values()) / max(len(wins), 1)
    by_type: dict[str, list[bool]] = {}
    for ep in episodes:
        if ep.task_type:
            by_type.setdefault(str(ep.task_type), []).append(ep.won)
    for name, wins in sorted(by_type.items()):
        metrics[f"success/{name}"] = sum(wins) / len(wins)
    return metrics
