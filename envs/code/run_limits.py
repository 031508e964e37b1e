"""Limits per RUN of the code sandbox (all of a program's processes together, and the checker's that runs the task's
test code: one account for everything a task makes run), on top of the per-process rlimits.

Two ways, the strongest the machine allows (:func:`cgroup_mode`, probed once):

- **a cgroup per run** (``v2``: one directory with ``memory.max``, ``memory.swap.max=0``, ``pids.max``; ``v1``: one
  in the ``memory`` hierarchy with ``memory.limit_in_bytes`` = ``memory.memsw.limit_in_bytes``, one in ``pids``): the
  kernel holds the whole run to ``memory_mb`` of RAM (the OOM killer ends a process of the run past it) and to
  ``nproc`` processes. Needs root (level ``full``) and a writable hierarchy under this process's own cgroup; the
  sandbox launcher moves itself into it before it forks the program, so every process of the run is inside (the
  checker's launcher too: ``pids.max`` is ``nproc`` plus the checker's own process).
- **an accounted cap** otherwise: the run's processes (its fresh uid at level ``full``, its process tree below) are
  read from ``/proc`` every :data:`POLL_S` seconds; their summed resident memory above ``memory_mb`` or their count
  above ``nproc`` kills the run. Between two reads a run can overshoot (a ~20 ms window).

CPU time of the run (all processes, ``cpu_s``) is accounted from ``/proc`` in both cases (the CPU seconds of live
processes plus those their parents reaped), and wall time is the run's own deadline (``run_tests``).

``$AGENT_RL_SANDBOX_CGROUP=none`` turns the cgroup off (the accounted cap only).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["POLL_S", "RunAccount", "RunCgroup", "cgroup_mode"]

POLL_S = 0.02
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")
_MOUNT = Path("/sys/fs/cgroup")


def _own_cgroups() -> dict[str, str]:
    """``{controller or "": path}`` of this process (``/proc/self/cgroup``; ``""`` is the v2 hierarchy)."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                found[name] = path
    return found


def _base(mount: Path, path: str) -> Path | None:
    """Where this process's cgroup ``path`` is under ``mount`` (the path itself, or the mount's root when a cgroup
    namespace shows this cgroup as ``/``)."""
    for candidate in (mount / path.lstrip("/"), mount):
        if candidate.is_dir() and os.access(candidate, os.W_OK):
            return candidate
    return None


def _bases() -> tuple[str, list[Path]]:
    if os.environ.get("AGENT_RL_SANDBOX_CGROUP") == "none" or os.geteuid() != 0:
        return "none", []
    own = _own_cgroups()
    if "memory" in own and "pids" in own and (_MOUNT / "memory").is_dir() and (_MOUNT / "pids").is_dir():
        memory, pids = _base(_MOUNT / "memory", own["memory"]), _base(_MOUNT / "pids", own["pids"])
        if memory is not None and pids is not None:
            return "v1", [memory, pids]
    if set(own) == {""} and (_MOUNT / "cgroup.controllers").exists():
        base = _base(_MOUNT, own[""])
        if base is not None:
            return "v2", [base]
    return "none", []


@functools.lru_cache(maxsize=1)
def cgroup_mode() -> str:
    """``v2``, ``v1`` or ``none``: whether a run can get its own cgroup here (probed once by creating, limiting
    and removing one)."""
    mode, bases = _bases()
    if mode == "none":
        return "none"
    try:
        probe = RunCgroup._make(mode, bases, memory_bytes=64 << 20, pids=4)
    except OSError:
        return "none"
    probe.destroy()
    return mode


class RunCgroup:
    """One run's cgroup (:func:`cgroup_mode` must not be ``none``). ``procs``: the ``cgroup.procs`` files the
    launcher writes ``0`` to (joins with every process it then forks)."""

    def __init__(self, mode: str, dirs: list[Path]) -> None:
        self.mode, self.dirs = mode, dirs
        self.procs = [str(d / "cgroup.procs") for d in dirs]

    @classmethod
    def _make(cls, mode: str, bases: list[Path], memory_bytes: int, pids: int) -> RunCgroup:
        name = f"agent_rl_sbx_{os.getpid()}_{secrets.token_hex(4)}"
        dirs = []
        try:
            for base in bases:
                (base / name).mkdir()
                dirs.append(base / name)
            group = cls(mode, dirs)
            if mode == "v2":
                group._write("memory.max", memory_bytes)
                group._write("memory.swap.max", 0, optional=True)
                group._write("pids.max", pids)
            else:
                group._write("memory.limit_in_bytes", memory_bytes, where=dirs[0])
                group._write("memory.memsw.limit_in_bytes", memory_bytes, where=dirs[0], optional=True)
                group._write("pids.max", pids, where=dirs[1])
        except OSError:
            for d in reversed(dirs):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        return group

    @classmethod
    def create(cls, memory_bytes: int, pids: int) -> RunCgroup | None:
        """A fresh cgroup holding a run to ``memory_bytes`` of RAM (no swap) and ``pids`` processes; ``None`` where
        the machine gives none (:func:`cgroup_mode`) or creating one failed."""
        if cgroup_mode() == "none":
            return None
        try:
            return cls._make(*_bases(), memory_bytes=memory_bytes, pids=pids)
        except OSError:
            return None

    def _write(self, name: str, value: int, where: Path | None = None, optional: bool = False) -> None:
        path = (where or self.dirs[0]) / name
        if optional and not path.exists():
            return
        path.write_text(str(value))

    def _read(self, name: str, where: Path | None = None) -> str:
        try:
            return ((where or self.dirs[0]) / name).read_text()
        except OSError:
            return ""

    @staticmethod
    def _field(text: str, key: str) -> int:
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                return int(parts[1])
        return 0

    def peak_memory_bytes(self) -> int | None:
        """Highest memory of the run so far (``memory.peak`` / ``memory.max_usage_in_bytes``), None if unknown."""
        text = self._read("memory.peak" if self.mode == "v2" else "memory.max_usage_in_bytes").strip()
        return int(text) if text.isdigit() else None

    def oom_kills(self) -> int:
        """Processes of the run the kernel killed for memory."""
        return self._field(self._read("memory.events" if self.mode == "v2" else "memory.oom_control"), "oom_kill")

    def forks_refused(self) -> int:
        """Forks refused at ``pids.max``."""
        return self._field(self._read("pids.events", self.dirs[-1]), "max")

    def pids(self) -> list[int]:
        return [int(p) for d in self.dirs for p in self._read("cgroup.procs", d).split() if p.isdigit()]

    def destroy(self) -> None:
        """Kill whatever is left in it and remove it."""
        for _ in range(50):
            left = self.pids()
            if not left:
                break
            if self.mode == "v2" and (self.dirs[0] / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    self._write("cgroup.kill", 1)
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


class RunAccount:
    """The accounted per-run caps: the run's processes, read from ``/proc`` (:meth:`over` once per poll).
    ``uid``: the run's own uid (level ``full``), else ``root_pid``: the run's first process (its tree is the run).
    ``others``: more parts of the same run, each a ``(uid or None, root pid)`` (the checker, which runs the task's
    test code): their memory, processes and CPU time count against the same caps (``nproc`` plus one for each
    part's own first process): a task whose test code spins is held to ``cpu_s`` as a program that spins is.
    """

    def __init__(self, memory_bytes: int, nproc: int, cpu_s: float, uid: int | None, root_pid: int,
                 count_memory: bool = True, others: Sequence[tuple[int | None, int]] = ()) -> None:
        self.memory_bytes, self.nproc, self.cpu_s = memory_bytes, nproc, cpu_s
        self.uid, self.root_pid, self.count_memory = uid, root_pid, count_memory
        self.parts: list[tuple[int | None, int]] = [(uid, root_pid), *others]
        self.peak_memory_bytes = 0
        self.peak_processes = 0

    def _processes(self) -> dict[int, list[str]]:
        """``{pid: stat fields after the command name}`` of every process of the run (all its parts)."""
        stats: dict[int, list[str]] = {}
        uids: dict[int, int] = {}
        by_uid = any(uid is not None for uid, _ in self.parts)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                text = Path(entry.path, "stat").read_text()
                if by_uid:
                    uids[int(entry.name)] = entry.stat().st_uid
            except OSError:
                continue
            stats[int(entry.name)] = text[text.rfind(")") + 2:].split()
        children: dict[int, list[int]] = {}
        for pid, fields in stats.items():
            children.setdefault(int(fields[1]), []).append(pid)
        found: dict[int, list[str]] = {}
        for uid, root_pid in self.parts:
            if uid is not None:
                found.update((pid, fields) for pid, fields in stats.items() if uids.get(pid) == uid)
                continue
            stack = [root_pid]
            while stack:
                pid = stack.pop()
                if pid in stats:
                    found[pid] = stats[pid]
                stack.extend(children.get(pid, []))
        return found

    def over(self) -> str | None:
        """``"memory"``, ``"processes"`` or ``"cpu"`` when the run is past that cap (the caller kills it)."""
        procs = self._processes()
        rss = 0
        cpu_ticks = 0
        for pid, fields in procs.items():
            cpu_ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
            if self.count_memory:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        self.peak_memory_bytes = max(self.peak_memory_bytes, rss)
        self.peak_processes = max(self.peak_processes, len(procs) - (len(self.parts) - 1))
        if self.count_memory and rss > self.memory_bytes:
            return "memory"
        if self.count_memory and len(procs) > self.nproc + len(self.parts) - 1:
            return "processes"
        if cpu_ticks / _TICKS > self.cpu_s:
            return "cpu"
        return None
