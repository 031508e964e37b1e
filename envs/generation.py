"""Tasks an env generates on demand (TextWorld: a game compiled from its seed on the first reset that selects it,
1-90 CPU-seconds and ~0.5 MB of cache each), counted and bounded per request by whoever hosts the env.

The host (:class:`envs.hosting.child.EnvHost`) runs each ``make``/``reset`` inside :func:`generating` with whether
this request may generate a new task (its client's quota, ``SessionSettings.client_max_new_tasks``); the env calls
:func:`check_new_task` before it generates one (:class:`NewTaskRefused` when it may not: the request is refused
before any work, HTTP 503 ``quota_exceeded``) and :func:`note_new_task` after. The host reports the count back, so
the quota counts generated tasks, not resets of cached ones. Outside any host (a script, a test) every generation
is allowed. A context variable, so threads of ``ThreadEnvPool`` keep their own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["TEXTWORLD_MAX_INDEX_ENV", "NewTaskRefused", "check_new_task", "generating", "note_new_task"]

#: TextWorld games of index at or beyond this variable's value are not generated on demand
#: (:func:`envs.textworld.games.max_generated_index`; the env server's ``--textworld-max-index``).
TEXTWORLD_MAX_INDEX_ENV = "AGENT_RL_TEXTWORLD_MAX_INDEX"


class NewTaskRefused(RuntimeError):
    """This request may not generate a new task (its client used its quota of new tasks): nothing was generated."""


_state: contextvars.ContextVar[list | None] = contextvars.ContextVar("agent_rl_generation", default=None)


@contextlib.contextmanager
def generating(allowed: bool) -> Iterator[list[int]]:
    """Run one request's env code; yields a one-element list holding, once the block ends, how many tasks it
    generated."""
    box = [allowed, 0]
    token = _state.set(box)
    count = [0]
    try:
        yield count
    finally:
        _state.reset(token)
        count[0] = box[1]


def check_new_task(what: str) -> None:
    """Call before generating ``what`` (a task's name): ``NewTaskRefused`` when this request may not."""
    box = _state.get()
    if box is not None and not box[0]:
        raise NewTaskRefused(f"{what} is not generated yet and this client may generate no new task now "
                             "(client_max_new_tasks); play tasks already generated, or retry later")


def note_new_task() -> None:
    """Call after generating one task."""
    box = _state.get()
    if box is not None:
        box[1] += 1
