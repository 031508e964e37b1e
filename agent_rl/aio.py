"""Structured concurrency for the project's async code: children never outlive the call that started them.

``asyncio.gather`` without ``return_exceptions`` leaves its other children running when one fails, and a caller
cancelled while awaiting a list of ``ensure_future`` tasks in turn cancels only the one awaited: the rest keep
running, touch state the caller has torn down and die with "Task exception was never retrieved" (vllm PR #35506's
kind; the orchestrator's ``run_groups`` did this). :func:`gather_all` is the replacement: an ``asyncio.TaskGroup``
(Python >= 3.11) that, when one child fails or the caller is cancelled, cancels every other child and waits for
them to finish (their ``finally`` blocks run: env sessions closed, engine caches released) before it returns.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    """The results of ``aws`` run concurrently, in order (``asyncio.gather``'s contract), inside an
    ``asyncio.TaskGroup``: if one raises, the others are cancelled and awaited, then that first exception is raised
    as it is (not as an ``ExceptionGroup``: callers catch the error types they did before); if the caller is
    cancelled, every child is cancelled and awaited, then ``CancelledError`` propagates. No child is left running
    and no child's exception is left unretrieved.

    Raises:
        the first exception a child raised (the others' are dropped after they finish), or ``CancelledError``.
    """
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(_as_coroutine(a)) for a in aws]
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return [t.result() for t in tasks]


async def _as_coroutine(aw: Awaitable[T]) -> T:
    return await aw
