"""``LocalEnvPool``: the env pool in this process (threads) or in worker processes, no HTTP.

``mode="thread"`` suits light envs (math, code, the calculator); ``mode="process"`` suits CPU-heavy envs (ALFWorld:
a reset holds the GIL for seconds) and uses the very worker pool the server uses (``servers.workers``), so the two
differ only by HTTP (that is what ``benchmarks/bench_env_server.py`` measures).
"""

from __future__ import annotations

import asyncio
import importlib
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from agent_rl.envclient.base import (
    EnvClientError,
    EnvServerError,
    EnvUnavailable,
    EpisodeOver,
    ResetResult,
    SessionBusy,
    SessionNotFound,
    StepResult,
)

__all__ = ["LocalEnvPool"]


class LocalEnvPool:
    """In-process env sessions (implements :class:`agent_rl.envclient.EnvPool`); env work never runs on the event
    loop. Errors are those of ``HTTPEnvPool``: an env that raises closes its session (``EnvServerError``, with
    ``code="env_infra_error"`` when the env could not judge, see ``docs/env_errors.md``); a non-``str`` action is
    refused before the env sees it (``EnvClientError`` with ``code="invalid_request"``, HTTP's 422).

    Args:
        max_workers: threads (``"thread"``) or worker processes (``"process"``, one session per process while
            they last).
        mode: ``"thread"`` or ``"process"``.
        max_sessions: live sessions at most (``EnvUnavailable`` beyond); ``None``: unbounded in thread mode,
            ``8 * max_workers`` in process mode.
        imports: modules to import first (a user's module that calls ``gymnasium.register``).
        preload_envs: process mode: env ids whose modules the workers' forkserver imports once (so each worker
            starts in milliseconds and shares that memory), e.g. ``["agent_rl/ALFWorld-v0"]``.
    """

    def __init__(
        self,
        max_workers: int = 8,
        mode: str = "thread",
        *,
        max_sessions: int | None = None,
        imports: Iterable[str] = (),
        preload_envs: Iterable[str] = (),
    ) -> None:
        if mode not in ("thread", "process"):
            raise ValueError(f"mode must be 'thread' or 'process', got {mode!r}")
        import envs  # noqa: F401  (registers the built-in ids)

        self.imports = list(imports)
        for name in self.imports:
            importlib.import_module(name)
        self.mode = mode
        self.max_sessions = max_sessions
        self._done: dict[str, bool] = {}  # session id -> episode over
        self._busy: set[str] = set()
        self._envs: dict[str, Any] = {}  # thread mode: session id -> env
        self._executor: ThreadPoolExecutor | None = None
        self._workers: Any = None
        if mode == "thread":
            self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="local-env")
        else:
            from servers.workers import WorkerPool, env_module

            preload = [m for e in preload_envs for m in env_module(e)]
            self._workers = WorkerPool(max_workers, imports=self.imports, preload=preload)

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))

    async def reset(
        self,
        env_id: str,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> ResetResult:
        """Open a session: ``envs.wrappers.make_env`` (``gymnasium.make`` + this package's wrappers) + ``reset`` off
        the event loop."""
        import gymnasium

        from envs.errors import ENV_INFRA_ERROR_CODE, EnvInfraError
        from envs.wrappers import make_env
        from servers.workers import AtCapacity, EnvFailed, to_jsonable

        if self.max_sessions is not None and len(self._done) >= self.max_sessions:
            raise EnvUnavailable(f"{len(self._done)} live sessions (max_sessions={self.max_sessions})")
        if env_id not in gymnasium.registry:
            raise EnvServerError(f"unknown env id {env_id!r}", code="unknown_env")
        session_id = uuid.uuid4().hex
        if self.mode == "process":
            try:
                observation, info = await self._workers.open(session_id, env_id, env_kwargs=env_kwargs, seed=seed,
                                                             options=options)
            except AtCapacity as exc:
                raise EnvUnavailable(str(exc)) from exc
            except EnvFailed as exc:
                raise EnvServerError(str(exc), code=_code(exc)) from exc
        else:
            try:
                env = await self._run(make_env, env_id, **(env_kwargs or {}))
                observation, info = await self._run(env.reset, seed=seed, options=options)
            except EnvInfraError as exc:
                raise EnvServerError(f"the env could not judge: {exc}", code=ENV_INFRA_ERROR_CODE) from exc
            except Exception as exc:
                raise EnvServerError(f"the env raised {type(exc).__name__}: {exc}", code="env_error") from exc
            self._envs[session_id] = env
            observation, info = to_jsonable(observation), to_jsonable(info)
        self._done[session_id] = False
        return ResetResult(session_id, observation, info)

    async def step(self, session_id: str, action: str) -> StepResult:
        """``env.step(action)`` off the event loop."""
        from servers.workers import EnvFailed, to_jsonable

        if not isinstance(action, str):  # the HTTP API answers 422 (pydantic): same contract in-process
            raise EnvClientError(f"action must be a str, got {type(action).__name__}", code="invalid_request")
        if session_id not in self._done:
            raise SessionNotFound(f"no live session {session_id!r}")
        if self._done[session_id]:
            raise EpisodeOver(f"episode of session {session_id} is over (terminated or truncated)")
        if session_id in self._busy:
            raise SessionBusy(f"session {session_id} is busy with another request")
        self._busy.add(session_id)
        try:
            if self.mode == "process":
                reply = await self._workers.step(session_id, action)
                result = StepResult(reply.observation, reply.reward, reply.terminated, reply.truncated, reply.info)
            else:
                observation, reward, terminated, truncated, info = await self._run(self._envs[session_id].step,
                                                                                   action)
                result = StepResult(to_jsonable(observation), float(reward), bool(terminated), bool(truncated),
                                    to_jsonable(info))
        except (EnvFailed, Exception) as exc:
            await self.close(session_id)
            raise EnvServerError(f"the env raised {type(exc).__name__}: {exc}", code=_code(exc)) from exc
        finally:
            self._busy.discard(session_id)
        if session_id in self._done:
            self._done[session_id] = result.terminated or result.truncated
        return result

    async def close(self, session_id: str) -> None:
        """Close the session's env (idempotent)."""
        if self._done.pop(session_id, None) is None:
            return
        if self.mode == "process":
            await self._workers.close(session_id)
        else:
            env = self._envs.pop(session_id)
            await self._run(env.close)

    async def aclose(self) -> None:
        """Close every session and stop the threads or worker processes."""
        await asyncio.gather(*(self.close(s) for s in list(self._done)), return_exceptions=True)
        if self._workers is not None:
            await self._workers.aclose()
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def __aenter__(self) -> LocalEnvPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _code(exc: BaseException) -> str:
    """The server's error code of an env failure: ``env_infra_error`` when the env could not judge."""
    from envs.errors import ENV_INFRA_ERROR_CODE, EnvInfraError
    from servers.workers import EnvInfraFailed

    return ENV_INFRA_ERROR_CODE if isinstance(exc, (EnvInfraError, EnvInfraFailed)) else "env_error"
