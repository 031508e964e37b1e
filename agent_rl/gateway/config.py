"""``env.external.*``: the agent program trained through the gateway (``env=external``, docs/gateway.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent_rl.gateway.command import command_argv

from agent_rl.task_files import FILE_BUILDERS


@dataclass
class ExternalConfig:
    """The agent program and its task source (read only when ``env.external.program`` or ``command`` is set)."""

    program: str = ""
    """``MODULE:FUNCTION``, called as ``function(task: dict, gateway: dict)`` in a thread; returns the reward (a float,
    a dict with ``reward`` and optional ``info``/``won``) or None (the env's reward, or the one posted to
    ``POST /sessions/<id>/reward``)."""
    command: str = ""
    """Instead of ``program``: a command template run as a process in a group of its own (no shell; split with
    ``shlex``, then ``{base_url}`` and ``{session_id}`` substituted in each argument; never the key or the task: the
    program reads ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``AGENT_RL_SESSION_ID``, ``AGENT_RL_TASK`` and the task
    on stdin from a scrubbed environment, ``agent_rl.gateway.command``); its reward is the last stdout line as JSON
    (a number or ``{"reward": ...}``) or the one posted."""
    env_pass: list[str] = field(default_factory=list)
    """Names of the trainer's environment variables a command program also gets (beyond the allow-list
    ``agent_rl.gateway.command.PROGRAM_ENV_KEEP``, docs/gateway.md)."""
    tasks: str = ""
    """The task source: a registered env id (the run's env server serves it; each task dict carries the reset
    observation, info and an ``env`` entry of a live session the program steps through the gateway), or a dataset
    file or folder (``agent_rl.task_files.load_tasks``: JSONL, JSON, parquet, CSV, ``save_to_disk``): each row is the
    task dict, rows taken in order (task p of the run is row p mod rows), no env session."""
    concurrency: int = 8
    """Programs running at once (threads or processes); G programs per task."""
    timeout_s: float = 600.0
    """A program running longer is an env failure of its episode (re-run, never a reward)."""
    max_requests: int = 64
    """Model calls per episode (more: HTTP 429 ``turn_budget_exhausted``)."""
    max_messages: int = 512
    max_tools: int = 64
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.program and self.command:
            raise ValueError("env.external.program and env.external.command are exclusive: set one")
        if self.program and ":" not in self.program:
            raise ValueError(f"env.external.program={self.program!r} must be MODULE:FUNCTION")
        if self.command:
            command_argv(self.command, base_url="http://127.0.0.1:1/v1", session_id="s")  # refuses secrets on argv
        bad = [n for n in self.env_pass if not n or "=" in n or "\0" in n]
        if bad:
            raise ValueError(f"env.external.env_pass: {bad} are not environment variable names")
        if self.concurrency < 1 or self.timeout_s <= 0 or self.max_requests < 1 or self.max_messages < 1 or \
                self.max_tools < 0 or self.max_body_bytes < 1024:
            raise ValueError("env.external: concurrency, max_requests, max_messages >= 1, timeout_s > 0, "
                             "max_tools >= 0, max_body_bytes >= 1024 required")

    @property
    def enabled(self) -> bool:
        return bool(self.program or self.command)

    @property
    def from_file(self) -> bool:
        """The task source is a dataset file or folder (not an env id)."""
        return is_task_file(self.tasks)


def is_task_file(source: str) -> bool:
    """``source`` names a dataset file or folder (an existing path, or a file name ending in a suffix
    ``load_tasks`` reads), not an env id."""
    return bool(source) and (Path(source).exists() or Path(source).suffix.lower() in FILE_BUILDERS)
