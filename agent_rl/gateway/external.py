"""``env=external``: train any agent program through the gateway (docs/gateway.md).

:class:`ProgramEpisode` is an episode runner of its own kind (:class:`agent_rl.rollout.episode.EpisodeRunner`): an
episode is not played turn by turn against an env, it is an *agent program* run once per episode, which calls the
gateway (an OpenAI-compatible ``base_url``) for every model call. :func:`external_player` gives it to a
:class:`~agent_rl.rollout.groups.GroupPlayer`, which does the rest as for every kind: groups of G episodes at the
group's temperatures (TGRL's T0/T1 slots, TAMPO's T), row seeds keyed by (group, slot, call), one generation batcher
across all running programs (``engine.generate`` in a worker thread), re-runs of a failed episode and dropped groups
(``rollout.episode_retries``, ``rollout/dropped_groups``), the env-reset prefetch, the metrics. The calls become the
episode's turns (:mod:`agent_rl.gateway.recorder`), and the batch is built from them by ``build_rollout_batch``. A
program cannot be replayed, so :class:`ProgramEpisode` declares ``can_fork = False`` (the group player refuses
``rollout.fork``).

The program: ``env.external.program=MODULE:FUNCTION`` is called as ``function(task, gateway)`` in a thread of its
own pool (``env.external.concurrency`` at once: a synchronous client blocks its thread, never the event loop that
serves it); ``env.external.command`` runs a process instead (:mod:`agent_rl.gateway.command`: in a process group of
its own ended with its attempt, from a scrubbed environment that holds the episode's key and task, never argv).
``gateway`` is ``{"base_url": ".../v1", "api_key",
"session_id", "headers": {"X-Session-ID": ...}}``; the key is the episode's own token. Task source
``env.external.tasks=ENV_ID``: each task dict is ``{"env_id", "options", "seed", "observation", "info", "env":
{"base_url", "session_id", "headers"}}``, the env session live on the run's env server; the program steps it with the
env server's route ``POST {env.base_url}/sessions/{session_id}/step`` (``{"action": str}``), served by the gateway
through the run's env client, so the program never holds the env server's token and the trainer sees every step.

Reward: what the program returns (a float, or a dict with ``reward`` and optional ``info``, ``won``), else the one it
posted (``POST /sessions/<id>/reward``), else the env's (the sum of its steps' rewards, ``won`` from its info). A
program that raises, runs past ``env.external.timeout_s``, gives no reward, makes no model call, or whose env step
failed is an env failure of the episode (``docs/env_errors.md``): re-run from the same task, then the group is
dropped; never a reward 0. A command program still running at the timeout is killed with its group; the reward it
printed or posted before counts, else the attempt failed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import itertools
import json
import logging
import secrets
import sys
import time
from typing import Any, Callable, ClassVar

from agent_rl.engines.base import caps_of
from agent_rl.gateway.app import Gateway, GatewayLimits
from agent_rl.gateway.command import command_argv, last_json_line, program_environment, run_command
from agent_rl.gateway.config import ExternalConfig
from agent_rl.gateway.recorder import BREAK_CAUSES, GatewaySession, PromptBuilder, RequestError
from agent_rl.gateway.server import GatewayServer
from agent_rl.rollout.config import RolloutConfig
from agent_rl.rollout.episode import EpisodeRunner, Sampling
from agent_rl.rollout.fork import EpisodeStart
from agent_rl.rollout.generation import Generator
from agent_rl.rollout.groups import GroupPlayer
from agent_rl.rollout.prompts import render_followup
from agent_rl.rollout.replies import ReplyReader, eos_ids_of
from agent_rl.rollout.results import GATEWAY_COUNTS
from agent_rl.rollout.sessions import EnvCallFailed, EnvSessions, checked_reward
from agent_rl.rollout.tool_calls import TemplateTools, get_tool_call_format
from agent_rl.task_files import load_tasks
from agent_rl.types import Episode, Generation, Task
from envs.numbers import RewardError
from envs.numbers import checked_reward as _checked_reward
from servers.launch import new_token

_EPISODE_IDS = itertools.count()
log = logging.getLogger(__name__)
assert all(f"gateway/prefix_breaks/{c}" in GATEWAY_COUNTS for c in BREAK_CAUSES)  # one list of causes
PROGRESS_EVERY_S = 30.0
"""Seconds between the run log's progress lines while programs run."""


def load_program(spec: str) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    """The callable ``MODULE:FUNCTION`` names (``env.external.program``).

    Raises:
        ValueError: not ``MODULE:FUNCTION``, the module cannot be imported, or the attribute is not callable.
    """
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"env.external.program={spec!r} must be MODULE:FUNCTION")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"env.external.program={spec!r}: cannot import {module!r} ({exc})") from None
    for part in name.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise ValueError(f"env.external.program={spec!r}: {name!r} is not a callable of {module!r}")
    return obj


def read_reward(result: Any) -> tuple[float | None, dict[str, Any], bool | None]:
    """``(reward, info, won)`` of what a program returned (None: it gave none).

    Raises:
        ValueError: a result that is not a number, a dict with a number ``reward``, or None; a reward that is not
            finite or beyond float32 (:class:`envs.numbers.RewardError`; a command's printed ``NaN``, ``Infinity``,
            ``1e400`` or ``1e308`` included).
    """
    if result is None:
        return None, {}, None
    info: dict[str, Any] = {}
    won = None
    if isinstance(result, dict):
        if "reward" not in result:
            raise ValueError(f"the program returned a dict without 'reward' (keys {sorted(result)[:8]})")
        info = dict(result.get("info") or {})
        won = result.get("won")
        result = result["reward"]
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise ValueError(f"the program's reward must be a number, got {type(result).__name__}")
    return checked_reward(result, "the program's reward"), info, None if won is None else bool(won)


class ProgramEpisode(EpisodeRunner):
    """Episodes that are agent programs run through the gateway (module docstring); the gateway's sampler
    (:class:`agent_rl.gateway.app.Sampler`).

    Args:
        env: the env calls of the task source's sessions (:class:`EnvSessions`; its pool None for the standalone
            gateway).
        generator: the engine side (:class:`Generator`: the open batcher every call samples through).
        cfg: :class:`RolloutConfig` (``mode=trajectory``: one row per segment of an episode; a prefix break
            starts a segment whose turns do not extend the earlier ones, ``agent_rl.rollout.batch.segments``).
        external: :class:`ExternalConfig`.
        tool_call_format: how the model writes calls (``model.tool_call_format``).
        task_type_key: the reset ``info`` key of an episode's task type.
        model_name, token, auto_sessions, allow_remote: the gateway's (:class:`Gateway`, :class:`GatewayServer`).
        host, port: where the gateway listens (loopback; port 0: a free one).

    Raises:
        ValueError: a program that cannot be loaded; a chat template that cannot be spliced (``mode=trajectory``).
    """

    can_fork: ClassVar[bool] = False  # a sibling replays its base's actions on the env; a program cannot be replayed
    kind: ClassVar[str] = "env=external"

    def __init__(self, env: EnvSessions, generator: Generator, cfg: RolloutConfig, external: ExternalConfig, *,
                 tool_call_format: str = "hermes", task_type_key: str = "task_type", model_name: str = "policy",
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None, auto_sessions: bool = False,
                 allow_remote: bool = False) -> None:
        super().__init__(env, generator)
        self.cfg, self.external, self.task_type_key = cfg, external, task_type_key
        self.engine, self.tokenizer = generator.engine, generator.tokenizer
        self.tool_format = get_tool_call_format(tool_call_format)
        eos_ids = eos_ids_of(self.engine)
        self.replies = ReplyReader(self.tokenizer, self.tool_format, eos_ids)
        if cfg.mode == "trajectory":  # a template that cannot be spliced is refused here, by name
            render_followup(self.tokenizer, "probe")
            render_followup(self.tokenizer, "probe", role="tool" if TemplateTools.of(self.tokenizer).tool_role
                            else "user")
        self.program = load_program(external.program) if external.program else None
        self.rows = load_tasks(external.tasks, optional="*") if external.from_file else None
        """The task file's rows (``env.external.tasks`` a file; rows may have different keys: each keeps its own),
        else None (an env id's sessions)."""
        self.builder = PromptBuilder(self.tokenizer, self.tool_format, eos_ids)
        limits = GatewayLimits(max_body_bytes=external.max_body_bytes, max_messages=external.max_messages,
                               max_tools=external.max_tools, max_requests=external.max_requests,
                               max_prompt_tokens=cfg.max_prompt_tokens,
                               max_new_tokens=int(generator.gen_kwargs["max_new_tokens"]))
        self.gateway = Gateway(self, token=token or new_token(), model_name=model_name, limits=limits,
                               auto_sessions=auto_sessions)
        self._server = GatewayServer(self.gateway.app, host, port, allow_remote=allow_remote)
        self._started = False
        self._threads = concurrent.futures.ThreadPoolExecutor(external.concurrency,
                                                              thread_name_prefix="agent-program")
        self._programs = asyncio.Semaphore(external.concurrency)
        self.progress = {"started": 0, "running": 0, "finished": 0, "failed": 0}
        """Episode attempts of the gateway's life: started, running now, finished with a reward, failed."""
        self._progress_task: asyncio.Task[None] | None = None
        self._gateway_counts = dict.fromkeys(GATEWAY_COUNTS, 0.0)

    # ---------------------------------------------------------------------------------------------- the server
    @property
    def base_url(self) -> str:
        return self._server.url

    async def start(self) -> None:
        """Start the gateway (idempotent; the first episode does it)."""
        if not self._started:
            await self._server.start()
            self._started = True
            self._progress_task = asyncio.create_task(self._report_progress())

    def progress_line(self) -> str:
        """One line of what the programs have done so far: episodes, calls, tokens, failures."""
        p, gw = self.progress, self.gateway
        return (f"gateway: {p['started']} episodes started ({p['running']} running, {p['finished']} finished, "
                f"{p['failed']} failed), {gw.requests} model calls, {gw.generated_tokens} tokens generated, "
                f"{gw.prefix_breaks} prefix breaks")

    async def _report_progress(self) -> None:
        """The progress line on stderr (the run's console log) every :data:`PROGRESS_EVERY_S` while programs run."""
        last = ""
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            line = self.progress_line()
            if self.progress["running"] or line != last:
                print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)  # the run's console log
                last = line

    def prefetch(self, tasks: Any, episodes_per_task: int) -> None:
        """Env resets of the next step's episodes (an env id's tasks only: a file's rows need none)."""
        if self.rows is None:
            super().prefetch(tasks, episodes_per_task)

    async def aclose(self) -> None:
        """Stop the progress line, the gateway and the programs' threads (the group player closed the prefetched
        sessions first)."""
        if self._progress_task is not None:
            self._progress_task.cancel()
            self._progress_task = None
        await self._server.stop()
        self._started = False
        self._threads.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------------------------------------- sampling
    async def sample(self, session: GatewaySession, prompt_ids: list[int], *, tools: bool,
                     max_new_tokens: int | None = None, stop: list[str] | None = None,
                     seed: int | None = None) -> tuple[Generation, bool]:
        """One call of ``session`` through the batcher: its temperature, its row key (group, slot, call index, and
        the client's ``seed`` when given), the call's cap and stop strings (:meth:`GenerationBatcher.generate`)."""
        batcher = self.generator.batcher
        if batcher is None:
            raise RequestError("no rollout is running", "not_running", 503)
        penalty = session.repetition_penalty
        key = tuple(session.key) + (session.requests,) + (() if seed is None else (int(seed),))
        row: dict[str, Any] = dict(max_new_tokens=max_new_tokens, stop=tuple(stop or ()))
        if tools:
            gen, opened = await self.replies.generate_tool_turn(batcher, prompt_ids, session.temperature, penalty,
                                                                key, session.episode_id, **row)
        else:
            gen = await batcher.generate(prompt_ids, session.temperature, penalty, key=key,
                                         episode_id=session.episode_id, **row)
            opened = False
        return self.generator.finish_turn(gen, session.policy_version), opened

    def sampling_rule(self) -> dict[str, Any]:
        """The run's top_p and top_k (every call samples with them, at its episode's temperature)."""
        settings = self.generator.gen_kwargs
        return {"top_p": float(settings["top_p"]), "top_k": int(settings["top_k"])}

    def decode(self, ids: list[int]) -> str:
        """The text of sampled ids with the tool-call markup kept (:meth:`ReplyReader.decode`)."""
        return self.replies.decode(ids)

    def parse_calls(self, text: str, opened: bool) -> Any:
        """The tool-call format's reading of a reply (:meth:`ReplyReader.parse_calls`)."""
        return self.replies.parse_calls(text, opened)

    async def env_step(self, session: GatewaySession, env_session: str, action: str) -> dict[str, Any]:
        """The program's step of its env session, through the run's env client; recorded on the session."""
        if session.env_done:
            raise RequestError("the env episode is over (terminated or truncated)", "episode_over", 409)
        try:
            step = await self.env.call(lambda: self.env.pool.step(env_session, action))
        except EnvCallFailed as exc:
            session.reward_info["env_failure"] = str(exc)
            raise RequestError(f"the env step failed: {exc}", "env_error", 502) from None
        session.env_steps += 1
        try:
            reward = _checked_reward(step.reward, "the env's reward")
        except RewardError as exc:
            session.reward_info["env_failure"] = str(exc)
            raise RequestError(f"the env step failed: {exc}", "env_error", 502) from None
        session.env_reward += reward
        session.env_done = bool(step.terminated or step.truncated)
        info = dict(step.info or {})
        if "won" in info:
            session.env_won = bool(info["won"])
        if session.turns:
            session.turns[-1].reward += reward
            session.turns[-1].terminated = session.turns[-1].terminated or bool(step.terminated)
            session.turns[-1].truncated = session.turns[-1].truncated or bool(step.truncated)
            session.turns[-1].invalid = session.turns[-1].invalid or bool(info.get("invalid_action"))
            session.turns[-1].observation = str(step.observation)  # the next request's new messages replace it
            session.turns[-1].info.update({k: info[k] for k in ("won", "invalid_action") if k in info})
        return {"observation": step.observation, "reward": reward, "terminated": bool(step.terminated),
                "truncated": bool(step.truncated), "info": info}

    # ---------------------------------------------------------------------------------------------- episodes
    def event_counts(self) -> dict[str, float]:
        """The gateway's counters (:data:`~agent_rl.rollout.results.GATEWAY_COUNTS`) since :meth:`reset_counts`:
        ``gateway/requests`` (model calls served), ``gateway/prefix_breaks`` (requests that did not extend their
        episode's segment), ``gateway/segments`` and ``gateway/attempts`` (episode attempts, failed ones included;
        segments per attempt = their ratio). They reach each step's record on every backend and schedule as the fork
        counters do."""
        return dict(self._gateway_counts)

    def reset_counts(self) -> None:
        self._gateway_counts = dict.fromkeys(GATEWAY_COUNTS, 0.0)

    def _task_dict(self, task: Task, reset: Any, session: GatewaySession) -> dict[str, Any]:
        if self.rows is not None:  # a file's row is the task dict
            return {**self.rows[task.group_id % len(self.rows)], "group_id": task.group_id}
        out: dict[str, Any] = {"env_id": task.env_id, "options": dict(task.options), "seed": task.seed,
                               "group_id": task.group_id}
        if reset is not None:
            out.update(observation=reset.observation, info=dict(reset.info or {}),
                       env={"base_url": f"{self.base_url}/env", "session_id": reset.session_id,
                            "headers": {"Authorization": f"Bearer {session.api_key}"}})
        return out

    async def _run(self, task_dict: dict[str, Any], gateway: dict[str, Any], session: GatewaySession) -> Any:
        """Run the program once (a thread, or a process for ``command``) and return what it gave.

        Raises:
            TimeoutError: the program ran past ``env.external.timeout_s`` (a command: without giving a reward
                before).
        """
        if self.program is not None:
            loop = asyncio.get_running_loop()
            return await asyncio.wait_for(loop.run_in_executor(self._threads, self.program, task_dict, gateway),
                                          self.external.timeout_s)
        return await self._run_command(task_dict, gateway, session)

    async def _run_command(self, task_dict: dict[str, Any], gateway: dict[str, Any],
                           session: GatewaySession) -> Any:
        """One run of the command program (:func:`agent_rl.gateway.command.run_command`): its last stdout line as
        JSON (None: none printed, then the posted reward or the env's).

        Raises:
            RuntimeError: a non-zero exit (its stderr's tail).
            TimeoutError: still running at the timeout, and no reward printed or posted before it.
        """
        task_json = json.dumps(task_dict, ensure_ascii=False)
        argv = command_argv(self.external.command, base_url=gateway["base_url"], session_id=gateway["session_id"])
        env = program_environment(base_url=gateway["base_url"], api_key=gateway["api_key"],
                                  session_id=gateway["session_id"], task_json=task_json,
                                  env_pass=self.external.env_pass)
        run = await run_command(argv, env, timeout_s=self.external.timeout_s, stdin=task_json.encode() + b"\n")
        printed = last_json_line(run.stdout)
        if run.timed_out:
            if printed is None and session.reward is None:
                raise TimeoutError(f"program timed out after {self.external.timeout_s:g} s")
            return printed
        if run.returncode != 0:
            raise RuntimeError(f"the command exited with status {run.returncode}: {run.stderr[-400:]}")
        return printed

    async def run(self, task: Task, sampling: Sampling, slot: int, start: EpisodeStart | None = None) -> Episode:
        """One attempt: the env session (task source), the gateway session, the program, the episode from the
        recorded calls; raises :class:`EnvCallFailed` on any failure of the attempt (module docstring). ``start``
        is never given: this kind declares ``can_fork = False``."""
        await self.start()
        reset = None
        if self.rows is None and self.external.tasks:
            reset = await self.env.open(self.env.take_prefetched(task, slot), task)
        episode_id = f"gw{next(_EPISODE_IDS)}"
        session = self.gateway.open_session(
            secrets.token_hex(16), temperature=float(sampling.temperature), is_high=bool(sampling.is_high),
            repetition_penalty=self.generator.penalty(sampling.is_high), key=(task.group_id, slot),
            episode_id=episode_id, env_session=reset.session_id if reset is not None else None,
            policy_version=self.generator.policy_version)
        gateway = {"base_url": f"{self.base_url}/v1", "api_key": session.api_key, "session_id": session.session_id,
                   "headers": {"X-Session-ID": session.session_id}}
        self.progress["started"] += 1
        self.progress["running"] += 1
        t0 = time.monotonic()
        try:
            async with self._programs:
                try:
                    result = await self._run(self._task_dict(task, reset, session), gateway, session)
                except asyncio.TimeoutError:
                    raise EnvCallFailed(f"program timed out after {self.external.timeout_s:g} s "
                                        f"({session.requests} model calls made)") from None
                except Exception as exc:  # noqa: BLE001 (the program's own failure: an env failure, re-run)
                    raise EnvCallFailed(f"program raised {type(exc).__name__}: {exc}") from exc
            episode = self._episode_of(task, sampling, session, reset, result)
            self.progress["finished"] += 1
            return episode
        except EnvCallFailed as exc:
            self.progress["failed"] += 1
            cause = exc.__cause__
            log.warning("gateway: episode attempt (group %d, slot %d) failed after %.1f s, %d model calls: %s",
                        task.group_id, slot, time.monotonic() - t0, session.requests, exc,
                        exc_info=(type(cause), cause, cause.__traceback__) if cause is not None else None)
            raise
        finally:
            self.progress["running"] -= 1
            self.gateway.close_session(session.session_id)
            self._count(session)
            if caps_of(self.engine).kv_reuse:
                self.engine.end_episode(episode_id)
            if reset is not None:
                await self.env.close(reset.session_id)

    def _count(self, session: GatewaySession) -> None:
        """Add an attempt's session to the gateway's counters."""
        c = self._gateway_counts
        c["gateway/requests"] += session.requests
        c["gateway/prefix_breaks"] += session.prefix_breaks
        c["gateway/segments"] += len(session.segments)
        c["gateway/attempts"] += 1
        c["gateway/history_rewrites"] += session.rewrites
        c["gateway/generated_tokens"] += sum(len(t.response_ids) for t in session.turns)
        for why, n in session.breaks.items():
            c[f"gateway/prefix_breaks/{why}"] += n

    def _episode_of(self, task: Task, sampling: Sampling, session: GatewaySession, reset: Any,
                    result: Any) -> Episode:
        """The attempt's episode from the recorded calls and the reward (the program's, posted, or the env's)."""
        if "env_failure" in session.reward_info:
            raise EnvCallFailed(f"env: {session.reward_info['env_failure']}")
        try:
            reward, info, won = read_reward(result)
        except ValueError as exc:
            raise EnvCallFailed(str(exc)) from None
        if reward is None and session.reward is not None:
            reward, info = session.reward, dict(session.reward_info)
            won = info.pop("won", None)
        if reward is None and reset is not None and session.env_steps:
            reward, won = session.env_reward, session.env_won
        if reward is None:
            raise EnvCallFailed("the program gave no reward (returned none, posted none, stepped no env)")
        reward = checked_reward(reward, "the episode's reward")  # the env's steps' sum may overflow float32
        if not session.turns:
            raise EnvCallFailed("the program made no model call (nothing to train on)")
        turns = session.turns
        last = turns[-1]
        if not (last.terminated or last.truncated):
            last.terminated = True  # the program ended its episode
        last.info.update(info)
        task_type = (reset.info or {}).get(self.task_type_key) if reset is not None else None
        return Episode(task=task, temperature=float(sampling.temperature), is_high=bool(sampling.is_high),
                       turns=list(turns),
                       reward=float(reward), won=bool(won) if won is not None else False, task_type=task_type)


def external_player(pool: Any, engine: Any, cfg: RolloutConfig, external: ExternalConfig, *, max_new_tokens: int,
                    top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                    high_repetition_penalty: float = 1.0, tool_call_format: str = "hermes",
                    task_type_key: str = "task_type", model_name: str = "policy", host: str = "127.0.0.1",
                    port: int = 0, on_turn: Callable[[Generation], None] | None = None,
                    on_episode: Callable[[Episode], None] | None = None, token: str | None = None,
                    auto_sessions: bool = False, allow_remote: bool = False) -> GroupPlayer:
    """The group player of ``env=external``: :class:`ProgramEpisode` episodes on ``pool`` (the task source's env
    sessions; None for the standalone gateway) with ``engine``; its runner (``.runner``) is the gateway's
    (``.runner.gateway``, ``.runner.base_url``, ``.runner.start()``). Arguments as :class:`ProgramEpisode` and
    :func:`agent_rl.rollout.players.env_player`.

    Raises:
        ValueError: ``rollout.fork`` on (:attr:`ProgramEpisode.can_fork`); a program that cannot be loaded.
    """
    stop = list(get_tool_call_format(tool_call_format).stop)
    generator = Generator(engine, max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, stop=stop, seed=seed,
                          batch_size=cfg.gen_batch_size, wait_s=cfg.gen_wait_s,
                          high_repetition_penalty=high_repetition_penalty, on_turn=on_turn)
    runner = ProgramEpisode(EnvSessions(pool, cfg.env_timeout_s), generator, cfg, external,
                            tool_call_format=tool_call_format, task_type_key=task_type_key, model_name=model_name,
                            host=host, port=port, token=token, auto_sessions=auto_sessions,
                            allow_remote=allow_remote)
    return GroupPlayer(runner, cfg, on_episode=on_episode)


ExternalRollout = external_player  # the former name of the gateway's group player
