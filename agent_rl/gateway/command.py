"""Command programs (``env.external.command``): their argv, their scrubbed environment, and one run of one in a
process group of its own, ended with its attempt (docs/gateway.md, "Command programs").

- argv: the template split with ``shlex`` (no shell), then ``{base_url}`` and ``{session_id}`` substituted in each
  argument (neither is a secret). The episode key and the task (whose ``env`` entry carries the key too) are never on
  argv, where every local user reads them (``/proc/<pid>/cmdline``): :func:`command_argv` refuses ``{api_key}``,
  ``{task_json}`` and any other field.
- Environment (:func:`program_environment`): built from nothing but the allow-list :data:`PROGRAM_ENV_KEEP` (and
  ``LC_*``) plus the names ``env.external.env_pass`` lists, taken from the trainer's environment; then the episode's
  own values, under the names OpenAI-compatible clients read without being told (``OPENAI_BASE_URL``,
  ``OPENAI_API_KEY``) and :data:`SESSION_ENV`, :data:`TASK_ENV`; ``PYTHONUNBUFFERED=1`` (a Python program's prints
  reach the pipe at once, so a reward printed before the timeout is there to read). The trainer's secrets
  (``AGENT_RL_SERVER_TOKEN``, ``VLLM_API_KEY``, cloud and tracker keys...) are not passed unless named.
- Task: one line of JSON on the program's stdin (then EOF), and in :data:`TASK_ENV` when it is at most
  :data:`TASK_ENV_MAX_BYTES` (an environment string is bounded by the kernel: 128 KiB on Linux).
- One run (:func:`run_command`): the program starts in a new session (its own process group, ``setsid``). The
  attempt ends when the program's own process exits, or at ``timeout_s``: then the whole group is killed (SIGKILL:
  helpers it left in the background, or all of it at the timeout; the run returns once none of them runs, read
  from ``/proc``), and the output printed before is read to its end (a pipe a helper held is closed by its death). asyncio's ``Process.wait`` waits for the pipes too, which a
  helper may hold: the exit is taken from the process itself (:class:`_ExitWatch`). A process that left the group
  on purpose (``setsid`` again) escapes it; its pipe is then abandoned after :data:`DRAIN_S` seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROGRAM_ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
                    "PYTHONPATH", "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR")
"""Names a command program gets from the trainer's environment (and every ``LC_*``); nothing else unless
``env.external.env_pass`` names it."""
BASE_URL_ENV, API_KEY_ENV = "OPENAI_BASE_URL", "OPENAI_API_KEY"
SESSION_ENV = "AGENT_RL_SESSION_ID"
"""The episode's gateway session id (also ``X-Session-ID``; the key alone names it too)."""
TASK_ENV = "AGENT_RL_TASK"
"""The task dict as JSON (also the program's stdin)."""
TASK_ENV_MAX_BYTES = 64 * 1024
"""The largest task put in :data:`TASK_ENV` (a larger one is on stdin only)."""
TEMPLATE_FIELDS = ("base_url", "session_id")
"""The fields a command template may name; the key and the task never go on argv."""
SECRET_FIELDS = {"api_key": API_KEY_ENV, "task_json": TASK_ENV}
MAX_OUTPUT_BYTES = 1 << 20
"""A command program's stdout kept (its tail: the last line is its reward)."""
MAX_STDERR_BYTES = 4096
DRAIN_S = 5.0
"""Seconds the output is read after the group is killed (a pipe held by a process that left the group)."""


def command_argv(template: str, *, base_url: str, session_id: str) -> list[str]:
    """The program's argv: ``template`` split with ``shlex``, ``{base_url}`` and ``{session_id}`` substituted in each
    argument (``{{``/``}}`` for literal braces).

    Raises:
        ValueError: an empty template, unbalanced quotes or braces, or a field other than those two (``{api_key}``
            and ``{task_json}`` name the environment variables that replace them).
    """
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"env.external.command={template!r}: {exc}") from None
    if not parts:
        raise ValueError("env.external.command is empty")
    values = {"base_url": base_url, "session_id": session_id}
    out = []
    for part in parts:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(part) if f is not None]
        except ValueError as exc:
            raise ValueError(f"env.external.command argument {part!r}: {exc} (literal braces: {{{{ }}}})") from None
        for field in fields:
            if field in SECRET_FIELDS:
                raise ValueError(
                    f"env.external.command: {{{field}}} would put the episode's key on the program's argv, which "
                    f"every local user can read (/proc/<pid>/cmdline): the program finds it in its environment, "
                    f"{SECRET_FIELDS[field]} (docs/gateway.md)")
            if field not in TEMPLATE_FIELDS:
                raise ValueError(f"env.external.command: unknown field {{{field}}}; valid: "
                                 f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} (literal braces: {{{{ }}}})")
        out.append(part.format(**values))
    return out


def program_environment(*, base_url: str, api_key: str, session_id: str, task_json: str,
                        env_pass: list[str] | tuple[str, ...] = (),
                        parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """A command program's environment (module docstring): the allow-list and ``env_pass`` names found in
    ``parent`` (default ``os.environ``), then ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, :data:`SESSION_ENV`,
    :data:`TASK_ENV` (when ``task_json`` is at most :data:`TASK_ENV_MAX_BYTES`) and ``PYTHONUNBUFFERED=1``."""
    parent = os.environ if parent is None else parent
    keep = set(PROGRAM_ENV_KEEP) | set(env_pass)
    env = {k: v for k, v in parent.items() if k in keep or k.startswith("LC_")}
    env.update({BASE_URL_ENV: base_url, API_KEY_ENV: api_key, SESSION_ENV: session_id, "PYTHONUNBUFFERED": "1"})
    if len(task_json.encode()) <= TASK_ENV_MAX_BYTES:
        env[TASK_ENV] = task_json
    return env


@dataclass
class CommandResult:
    """One run of a command program: ``returncode`` of its own process (None: still running at the timeout),
    ``timed_out``, the tail of its ``stdout`` and ``stderr`` (decoded, bounded)."""

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str


class _ExitWatch(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, plus ``exited``: a future done when the process itself exits (asyncio's
    ``Process.wait`` also waits for its pipes to close, which a helper holding them delays)."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _tail(stream: asyncio.StreamReader, limit: int, kept: bytearray) -> None:
    """Read ``stream`` until EOF into ``kept``, of which the last ``limit`` bytes stay (what was read before a
    cancellation is there too)."""
    while chunk := await stream.read(1 << 16):
        kept += chunk
        if len(kept) > limit:
            del kept[:len(kept) - limit]


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    """``data`` into the program's stdin, then EOF; a program that does not read it (or is gone) is fine."""
    try:
        stdin.write(data)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (none left: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` still running (zombies excluded: a dead helper re-parented to a PID 1
    that does not reap stays one), read from ``/proc/<pid>/stat`` (state and pgid follow the command's ``)``)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


async def _end_group(pgid: int, timeout_s: float) -> None:
    """SIGKILL group ``pgid`` and wait (up to ``timeout_s``) until none of its processes runs."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    kill_group(pgid)
    while group_members(pgid) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
        kill_group(pgid)  # a member forked while the signal was delivered


async def run_command(argv: list[str], env: dict[str, str], *, timeout_s: float, stdin: bytes = b"",
                      cwd: str | None = None) -> CommandResult:
    """Run ``argv`` with environment ``env`` (exactly: nothing inherited) in a process group of its own, ``stdin``
    written to it, until its own process exits or ``timeout_s`` passes; then its group is killed and its output
    read (module docstring). Cancelled: the group is killed and the cancellation goes on.

    Raises:
        OSError: the program could not be started (not found, not executable, argv or environment too large).
    """
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitWatch(1 << 16, loop), *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    pgid = proc.pid  # start_new_session: the program leads a new session and group of its own id
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    tasks = [asyncio.ensure_future(_tail(proc.stdout, MAX_OUTPUT_BYTES, out)),
             asyncio.ensure_future(_tail(proc.stderr, MAX_STDERR_BYTES, err)),
             asyncio.ensure_future(_feed(proc.stdin, stdin))]
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(protocol.exited), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
    except BaseException:
        kill_group(pgid)
        for t in tasks:
            t.cancel()
        transport.close()
        raise
    await _end_group(pgid, DRAIN_S)  # what it left behind; at the timeout, all of it
    if timed_out:  # its exit, reaped by asyncio's watcher (closing the transport first would reap it elsewhere)
        await asyncio.wait([protocol.exited], timeout=DRAIN_S)
    _, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
    for t in pending:  # a pipe still held by a process that left the group: what was read is kept
        t.cancel()
    returncode = None if timed_out else transport.get_returncode()
    transport.close()
    return CommandResult(returncode=returncode, timed_out=timed_out, stdout=bytes(out).decode(errors="replace"),
                         stderr=bytes(err).decode(errors="replace"))


def last_json_line(text: str) -> Any:
    """The last non-empty line of ``text`` as JSON (None: no line, or the last is not JSON)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        return json.loads(lines[-1])
    except ValueError:
        return None
