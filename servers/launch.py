"""One launch of the env server as a child process (``python -m servers.serve``), for every launcher: the local
backend's run server (``agent_rl.runtime.EnvServerProcess``) and the Ray backend's replicas
(``agent_rl.distributed.actors.EnvServerReplica``) build their command and environment here.

The token reaches the child one way only: the environment variable :data:`TOKEN_ENV`, never the command line
(``ps`` shows every process's argv to every user of the machine; ``/proc/<pid>/environ`` is readable only by the
process's own user and root), and ``servers.serve`` removes it from its environment before any env worker starts.
A launched server always has a token: the caller's, or one made for the run (:func:`new_token`), so no launched
server is open to whoever else can reach its port.

A launched server dies with its launcher: the command carries ``--exit-with-parent <launcher pid>`` and the server
watches its parent (:func:`watch_parent`), shutting itself down when the launcher is gone, however it went (SIGTERM
without cleanup, the kernel's OOM killer, SIGKILL). ``prctl(PR_SET_PDEATHSIG)`` is not used for this: it fires when
the launching *thread* exits, and the run's supervisor restarts a dead server from a worker thread. Standard library
only (the Ray actor imports nothing heavier).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TOKEN_ENV", "ServerLaunch", "free_port", "new_token", "watch_parent"]

#: The environment variable ``servers.serve`` reads its token from.
TOKEN_ENV = "AGENT_RL_SERVER_TOKEN"


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` ("" = every interface of this node): the env servers' and the vLLM servers' a run
    starts (``agent_rl.runtime`` re-exports it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def new_token() -> str:
    """A fresh token for one run's servers: 32 random bytes, URL-safe base64 (``secrets.token_urlsafe``)."""
    return secrets.token_urlsafe(32)


@dataclass
class ServerLaunch:
    """``python -m servers.serve`` serving ``env_ids`` on ``host:port`` with ``token`` (from the environment).

    Attributes:
        env_ids: gymnasium ids to serve (``--env`` each).
        port: the port to bind.
        token: the server's token (non-empty; :func:`new_token` for a run's own).
        host: bind address (loopback unless other machines must reach it).
        imports: ``--import`` modules; ``workers``, ``max_sessions``: the flags when > 0.
        log_level: ``--log-level`` when set.
        data_root: ``$AGENT_RL_DATA`` of the child when set.
        pythonpath: prepended to the child's ``$PYTHONPATH`` when set (the repository, for a run's server).
        parent_pid: the launcher's pid, passed as ``--exit-with-parent`` (default: this process); ``None``: the
            server outlives its launcher (a server meant to run on its own).
    """

    env_ids: Sequence[str]
    port: int
    token: str
    host: str = "127.0.0.1"
    imports: Sequence[str] = field(default_factory=list)
    workers: int = 0
    max_sessions: int = 0
    log_level: str | None = None
    data_root: str = ""
    pythonpath: str | None = None
    parent_pid: int | None = field(default_factory=os.getpid)

    def __post_init__(self) -> None:
        if not self.token or not self.token.strip():
            raise ValueError("ServerLaunch needs a non-empty token (new_token() makes one for a run)")

    @property
    def command(self) -> list[str]:
        """The child's argv: no secret in it."""
        cmd = [sys.executable, "-m", "servers.serve", "--host", self.host, "--port", str(self.port)]
        cmd += [a for env_id in self.env_ids for a in ("--env", env_id)]
        cmd += [a for name in self.imports for a in ("--import", name)]
        cmd += ["--workers", str(self.workers)] if self.workers > 0 else []
        cmd += ["--max-sessions", str(self.max_sessions)] if self.max_sessions > 0 else []
        cmd += ["--log-level", self.log_level] if self.log_level else []
        cmd += ["--exit-with-parent", str(self.parent_pid)] if self.parent_pid is not None else []
        return cmd

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The child's environment: ``base`` (default ``os.environ``) with the token, data root and path set."""
        env = dict(os.environ if base is None else base)
        env[TOKEN_ENV] = self.token
        if self.data_root:
            env["AGENT_RL_DATA"] = self.data_root
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def start(self, **popen: Any) -> subprocess.Popen[bytes]:
        """Start the child (``subprocess.Popen(self.command, env=self.environment(), **popen)``)."""
        return subprocess.Popen(self.command, env=self.environment(), **popen)


def watch_parent(parent_pid: int, on_gone: Callable[[], None], *, interval_s: float = 0.5) -> threading.Thread:
    """Call ``on_gone()`` once, from a daemon thread, as soon as this process's parent is no longer ``parent_pid``
    (the launcher died and the process was re-parented to init or a subreaper; also at once when the parent is
    already another process at the call). Polls ``os.getppid()`` every ``interval_s`` seconds (Linux and macOS alike).
    Returns the started thread."""

    def run() -> None:
        while os.getppid() == parent_pid:
            threading.Event().wait(interval_s)
        on_gone()

    thread = threading.Thread(target=run, name="watch-parent", daemon=True)
    thread.start()
    return thread
