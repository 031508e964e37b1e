"""Process groups of the subprocesses the project starts (env workers, the math verifier, the code sandbox at
isolation ``none``, the run's env server, the ``vllm_server`` engine's server): each starts in a session of its own
(``subprocess.Popen(start_new_session=True)``, or :func:`own_session` first thing in a ``multiprocessing`` child),
so its process group holds it and every process it starts that did not leave the group; ending it ends the group,
so a helper it started in the background does not outlive it (a helper that called ``setsid`` itself left the
group: only a PID namespace catches that one, as the code sandbox's other levels do).

A group's id is its leader's pid, and the kernel does not hand that number to a new process while any member of the
group lives, so signalling the group after the leader has exited reaches the leader's children, never a stranger.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = ["end_group", "kill_group", "own_session", "run"]


def own_session() -> None:
    """Make the calling process the leader of a new session and process group (a ``multiprocessing`` child's first
    call; a process that already leads its group keeps the one it has)."""
    with contextlib.suppress(OSError):
        os.setsid()


def kill_group(pid: int | None, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process group ``pid`` leads (a process started in its own session); False when there is
    no such group (none of its processes is left, or the process never became a group leader)."""
    if pid is None or pid <= 1:
        return False
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def end_group(proc: subprocess.Popen, grace_s: float) -> None:
    """End ``proc`` (started with ``start_new_session=True``) and its group: SIGTERM to the group while ``proc``
    runs, SIGKILL to what is left after ``grace_s`` seconds (and to what ``proc`` left behind if it had exited);
    ``proc`` reaped."""
    if proc.poll() is None:
        kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def run(argv: Sequence[str], *, timeout: float, capture_output: bool = False, text: bool = False,
        **popen: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, timeout=..., capture_output=..., text=..., **popen)`` in a session of its own: when
    the command exits, or on timeout (then ``subprocess.TimeoutExpired``), its whole group is killed. The output
    goes through unnamed files, not pipes: a helper the command left running holds a pipe open, and
    ``subprocess.run`` waits for that pipe's end (kills only the process it started on timeout, then waits too)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if capture_output:
            popen["stdout"], popen["stderr"] = out, err
        with subprocess.Popen(list(argv), start_new_session=True, **popen) as proc:
            try:
                proc.wait(timeout)
            finally:
                kill_group(proc.pid)
                proc.wait()

        def read(f: Any) -> Any:
            if not capture_output:
                return None
            f.seek(0)
            data = f.read()
            return data.decode(errors="replace") if text else data

        return subprocess.CompletedProcess(list(argv), proc.returncode, read(out), read(err))
