"""How the tests wait: on what they mean (an answer, a condition, a process's exit), each wait under one ceiling
that only catches a hang. No clock here decides an outcome on a slow machine: a test on a busy 2-core machine
(``scripts/test_under_load.sh``) takes longer and passes.

- :data:`HANG_S`: the ceiling of one wait (one HTTP request, one WebSocket message, one condition). Far above what a
  loaded machine needs (seconds); it only turns a hang into a failure instead of a stuck suite.
- :func:`wait_until` / :func:`wait_until_async`: poll a condition until it holds, failing with ``what`` after
  :data:`HANG_S`.
- :func:`closed_by_server`: how many of some sockets the server closed, each waited for under :data:`HANG_S` (a
  connection the server should end by its deadline: the test waits for the close, not for a guessed time).
- :data:`http`: httpx's top-level ``get``/``post``/``put``/``patch``/``delete``/``request`` with :data:`HANG_S` as
  the default timeout in place of httpx's 5 s (a request to a server that is busy, not hung, must not fail).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import httpx

__all__ = ["HANG_S", "closed_by_server", "http", "wait_until", "wait_until_async"]

HANG_S = 300.0
"""Seconds one wait may take before the test fails as hung: one request, one message, one condition."""


def wait_until(predicate: Callable[[], Any], what: str = "condition", ceiling_s: float = HANG_S,
               interval_s: float = 0.05) -> Any:
    """Call ``predicate`` every ``interval_s`` seconds until it returns something true, and return that.

    Raises:
        AssertionError: naming ``what``, when it still did not hold after ``ceiling_s`` seconds (a hang, not a slow
            machine: the ceiling is far above what a loaded machine needs).
    """
    deadline = time.monotonic() + ceiling_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: still not so after {ceiling_s:.0f} s (hung?)"
        time.sleep(interval_s)


async def wait_until_async(predicate: Callable[[], Awaitable[Any]], what: str = "condition",
                           ceiling_s: float = HANG_S, interval_s: float = 0.05) -> Any:
    """:func:`wait_until` for a coroutine function ``predicate``, sleeping with ``asyncio.sleep`` (the loop runs)."""
    deadline = time.monotonic() + ceiling_s
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: still not so after {ceiling_s:.0f} s (hung?)"
        await asyncio.sleep(interval_s)


def _patient(request: Callable[..., httpx.Response]) -> Callable[..., httpx.Response]:
    @functools.wraps(request)
    def call(*args: Any, timeout: Any = HANG_S, **kwargs: Any) -> httpx.Response:
        return request(*args, timeout=timeout, **kwargs)

    return call


http = SimpleNamespace(get=_patient(httpx.get), post=_patient(httpx.post), put=_patient(httpx.put),
                       patch=_patient(httpx.patch), delete=_patient(httpx.delete), request=_patient(httpx.request))
"""httpx's top-level request functions with :data:`HANG_S` as the default timeout (``timeout=`` still overrides)."""


def closed_by_server(socks: list[Any], ceiling_s: float = HANG_S) -> int:
    """How many of ``socks`` (connected ``socket.socket``s) the server closed: each read waits for the close (EOF or
    a reset) under ``ceiling_s``; one still open then counts as not closed (a hang the caller's assert names)."""
    closed = 0
    for s in socks:
        s.settimeout(ceiling_s)
        try:
            closed += s.recv(1024) == b""
        except ConnectionResetError:
            closed += 1
        except TimeoutError:
            pass
    return closed
