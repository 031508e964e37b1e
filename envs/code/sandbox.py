"""Run untrusted Python against trusted tests: two sandboxed processes, a value-only pipe between them.

Design (details and threat model in ``docs/math_code_envs.md``):

- **Worker** (runs the program) and **checker** (runs the test code) are two sandboxes, each started through
  :func:`launcher_argv`: ``unshare`` gives new network (no interfaces but a down loopback), mount, PID and IPC
  namespaces; the launcher (``_launcher.py``, the namespace's PID 1) builds a minimal read-only root filesystem
  (:func:`sandbox_layout`: the interpreter, its standard library and the shared libraries it loads, bound
  read-only at their own paths; ``/dev/null`` & co; a fresh ``/proc``; fresh tmpfs ``/tmp`` (cwd, ``$HOME``) and
  ``/dev/shm``), ``pivot_root``s into it and detaches the host's root, so no data root, checkout, cache or any
  other host file is left to see. It then forks the program's process: a fresh unprivileged uid per run (level
  full), no capabilities, ``no_new_privs``, running the source as ``python -I -S -c``. When PID 1 exits the kernel
  kills every process of the namespace, so nothing outlives the run, not even a child that called ``setsid``.
  ``RLIMIT_NPROC`` counts this run's processes only. rlimits: CPU seconds, address space, file size (also caps
  what it can print), processes, open files, no core. The environment is rebuilt from scratch (no variable of the
  parent leaks); stdin, stdout and stderr are files without a name.
- **Why two processes**: a program running in the same interpreter as its tests can rewrite them (patch ``print``,
  ``sys.exit``, the harness, ``__eq__``). Here the checker never executes program code: each test call goes over a
  pipe to the worker, and only plain data (see ``_codec``: exact builtin types, rebuilt by the checker) comes back.
  The verdict goes to the checker's stdout file, which the worker has no descriptor for; the two run as different
  uids so the worker cannot signal or ptrace the checker. So a program cannot fake a pass; it can only return values.
- **Isolation levels** (:func:`isolation_level`, probed once inside a candidate sandbox: the host's files must be
  gone): ``full`` as root (or with CAP_SYS_ADMIN); ``userns`` when unprivileged user namespaces are allowed (same
  namespaces and root filesystem, but the program keeps the caller's uid: no per-run uid, so NPROC is shared with
  the caller); ``none`` otherwise (process group + rlimits only; a program can then reach the network and the
  caller's files: do not train on untrusted code like that). ``RunResult.isolation`` / ``info["isolation"]``
  report the level of each run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.code import _codec
from envs.code.run_limits import POLL_S, RunAccount, RunCgroup
from envs.errors import EnvInfraError
from envs import procgroup
from envs.procgroup import kill_group

_HERE = Path(__file__).resolve().parent
_UID_RANGE = (1_000_000, 2_000_000_000)  # fresh uids, never in /etc/passwd


@dataclass
class SandboxLimits:
    """Resource limits of one run (per process unless noted).

    Attributes:
        wall_s: whole run, wall clock (the checker and worker are killed after it).
        cpu_s: RLIMIT_CPU of the worker (seconds of CPU time).
        memory_mb: RLIMIT_AS of the worker (MiB of address space).
        file_size_mb: RLIMIT_FSIZE (MiB): largest file, and the most stdout/stderr kept.
        nproc: RLIMIT_NPROC (processes + threads of the run's uid).
        nofile: RLIMIT_NOFILE.
        call_timeout_s: one test call (the worker raises TimeoutError; the checker gives up 1 s later).
        load_timeout_s: running the program's top level.
        checker_memory_mb: RLIMIT_AS of each checker process (it holds the test inputs); the checker's processes
            (the task's test code: ``setup``, ``test``) count against the run's per-run memory and processes with
            the program's (:mod:`envs.code.run_limits`).
    """

    wall_s: float = 20.0
    cpu_s: int = 10
    memory_mb: int = 1024
    file_size_mb: int = 4
    nproc: int = 32
    nofile: int = 64
    call_timeout_s: float = 4.0
    load_timeout_s: float = 4.0
    checker_memory_mb: int = 4096

    def for_worker(self) -> dict[str, Any]:
        return {"cpu_s": self.cpu_s, "memory_bytes": self.memory_mb << 20, "file_size_bytes": self.file_size_mb << 20,
                "nproc": self.nproc, "nofile": self.nofile, "call_timeout_s": self.call_timeout_s,
                "load_timeout_s": self.load_timeout_s}

    def for_checker(self) -> dict[str, Any]:
        return {**self.for_worker(), "checker": {"cpu_s": int(self.wall_s) + 5,
                "memory_bytes": self.checker_memory_mb << 20, "file_size_bytes": 256 << 20, "nproc": self.nproc,
                "nofile": self.nofile}}


LIMIT_FLOORS = {"nproc": 2, "nofile": 4, "checker_memory_mb": 64}
"""Least values of :class:`SandboxLimits` fields with which the sandbox still starts a run (measured with a full
isolation run of HumanEval/0: ``nproc=1``, ``nofile=1`` or ``checker_memory_mb=1`` fail every run as "could not judge",
an infra error; 2, 4 and 64 judge). :func:`capped_limits` refuses a client's value below one."""

SANDBOX_LIMITS_ENV = "AGENT_RL_SANDBOX_LIMITS"
"""Environment variable holding the caps (a JSON object of :class:`SandboxLimits` fields, and ``plus_wall_s``);
``python -m servers.serve --sandbox-limits`` sets it for the server and its env workers."""

PLUS_WALL_S = 60.0
"""Default wall-clock budget (and cap) of a HumanEval+ run (hundreds of inputs), seconds."""


def sandbox_caps() -> dict[str, float]:
    """The largest value each limit may be given (``{field: cap}``): :class:`SandboxLimits`' defaults and
    ``plus_wall_s`` = :data:`PLUS_WALL_S`, each replaced by what ``$AGENT_RL_SANDBOX_LIMITS`` says. The caps are the
    machine's (the server's), never a client's: env kwargs can only tighten a limit below them.

    Raises:
        ValueError: ``$AGENT_RL_SANDBOX_LIMITS`` is not a JSON object of known fields with positive numbers.
    """
    caps: dict[str, float] = {**asdict(SandboxLimits()), "plus_wall_s": PLUS_WALL_S}
    text = os.environ.get(SANDBOX_LIMITS_ENV, "").strip()
    if not text:
        return caps
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"${SANDBOX_LIMITS_ENV} is not JSON: {exc}") from None
    if not isinstance(given, dict):
        raise ValueError(f"${SANDBOX_LIMITS_ENV} must be a JSON object of limits, got {text[:80]!r}")
    for key, value in given.items():
        if key not in caps:
            raise ValueError(f"${SANDBOX_LIMITS_ENV}: unknown limit {key!r}; known: {', '.join(caps)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"${SANDBOX_LIMITS_ENV}: {key} must be a positive number, got {value!r}")
        caps[key] = value
    return caps


def parse_sandbox_limits(text: str) -> dict[str, float]:
    """``"memory_mb=512,nproc=16"`` (or a JSON object) -> ``{"memory_mb": 512, "nproc": 16}``, checked as
    :func:`sandbox_caps` checks them (what ``--sandbox-limits`` takes).

    Raises:
        ValueError: an unknown field, or a value that is not a positive number.
    """
    text = text.strip()
    if text.startswith("{"):
        given = json.loads(text)
    else:
        given = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"--sandbox-limits takes key=value pairs, got {part!r}")
            try:
                given[key.strip()] = float(value) if "." in value else int(value)
            except ValueError:
                raise ValueError(f"--sandbox-limits: {key.strip()} must be a number, got {value!r}") from None
    old = os.environ.get(SANDBOX_LIMITS_ENV)
    os.environ[SANDBOX_LIMITS_ENV] = json.dumps(given)
    try:
        sandbox_caps()  # the same checks
    except ValueError as exc:
        raise ValueError(str(exc).replace(f"${SANDBOX_LIMITS_ENV}", "--sandbox-limits")) from None
    finally:
        if old is None:
            os.environ.pop(SANDBOX_LIMITS_ENV)
        else:
            os.environ[SANDBOX_LIMITS_ENV] = old
    return given


def capped_limits(limits: SandboxLimits | dict[str, Any] | None, where: str = "limits") -> SandboxLimits:
    """``limits`` as a :class:`SandboxLimits`: a dict of some of its fields (or None: the defaults) checked against
    :func:`sandbox_caps`, so a client may tighten any limit, never loosen one past its cap. A :class:`SandboxLimits`
    instance is returned as it is: only code builds one (JSON from a client, the session API's, OpenEnv's or MCP's
    ``env_kwargs``, can only hold a dict), so it is the caller's own, trusted choice.

    Raises:
        ValueError: a value above its cap or below its floor (:data:`LIMIT_FLOORS`), not a positive number, or a
            fraction for a whole-number field (names ``where.<field>``, the value and the cap); TypeError: an unknown field, or ``limits`` of another type.
    """
    if isinstance(limits, SandboxLimits):
        return limits
    if limits is not None and not isinstance(limits, dict):
        raise TypeError(f"{where} must be an object of sandbox limits, got {type(limits).__name__}")
    caps = sandbox_caps()
    given = dict(limits or {})
    unknown = sorted(set(given) - set(asdict(SandboxLimits())))
    if unknown:
        raise TypeError(f"{where}: unknown sandbox limits {unknown}; known: {', '.join(asdict(SandboxLimits()))}")
    bad = []
    fields = asdict(SandboxLimits())
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            bad.append(f"{where}.{key}={value!r} (a positive number)")
        elif isinstance(fields[key], int) and not isinstance(value, int):
            bad.append(f"{where}.{key}={value!r} (a whole number)")  # setrlimit takes ints: else every run fails
        elif value > caps[key]:
            bad.append(f"{where}.{key}={value!r} is above the server's cap {caps[key]!r}")
        elif value < LIMIT_FLOORS.get(key, 0):
            bad.append(f"{where}.{key}={value!r} is below the sandbox's floor {LIMIT_FLOORS[key]} (it could not "
                       "start a run)")
    if bad:
        raise ValueError("sandbox limits refused: " + "; ".join(bad) + " (clients can tighten limits, not loosen "
                         f"them; the caps are the server's: --sandbox-limits / ${SANDBOX_LIMITS_ENV})")
    defaults = {k: min(v, caps[k]) for k, v in asdict(SandboxLimits()).items()}
    return SandboxLimits(**{**defaults, **given})


def _source(name: str) -> str:
    """Self-contained source: _codec.py + the harness, minus the lines marked ``# sandbox: strip``."""
    parts = []
    for filename in ("_codec.py", name):
        text = (_HERE / filename).read_text(encoding="utf-8")
        parts.append("\n".join(line for line in text.splitlines() if not line.endswith("# sandbox: strip")))
    return "\n\n".join(parts)


WORKER_SOURCE = _source("_worker.py")
CHECKER_SOURCE = _source("_checker.py")
LAUNCHER_SOURCE = (_HERE / "_launcher.py").read_text(encoding="utf-8")

# unshare forks the launcher as PID 1 of the new PID namespace (--kill-child: killing unshare kills it, and with it
# every process of the namespace); the launcher builds the minimal root, pivots into it and starts the program.
_NS_FLAGS = ["--net", "--mount", "--pid", "--ipc", "--fork", "--kill-child", "--propagation", "private"]

# Paths the sandbox owns: fresh in every run (tmpfs /tmp and /dev/shm, bound device nodes, a new /proc), so nothing
# of the host there is visible; the interpreter cannot live under them.
SANDBOX_DIRS = ("/tmp", "/dev", "/proc")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
TMPFS = (("/tmp", "size=64m,mode=1777"), ("/dev/shm", "size=64m,mode=1777"))
TMPFS_BYTES = 128 << 20
"""What the run's tmpfs can hold together (``TMPFS``): charged to its cgroup beside its processes' memory."""

# Run by the sandbox interpreter itself (-I -S, as the sandbox runs it): where its standard library is.
_PATHS_PROBE = ("import json, sys, sysconfig\n"
                "print(json.dumps({'path': sys.path, 'site': sorted({sysconfig.get_path('purelib'), "
                "sysconfig.get_path('platlib')})}))")
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-fA-F]+\)")
_FALLBACK_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")


def _under(path: str, dirs: Any) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _expose(path: str, links: dict[str, str], depth: int = 0) -> str:
    """Real path of absolute ``path``; every symlink met on the way (``/lib -> usr/lib``, ``libz.so.1 ->
    libz.so.1.2.13``) is recorded in ``links`` (link path -> target text), so the same lookup works in the sandbox."""
    if depth > 40:
        raise RuntimeError(f"too many levels of symbolic links resolving {path}")
    parts = [p for p in os.path.normpath(path).split("/") if p]
    current = "/"
    for i, part in enumerate(parts):
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            target = os.readlink(candidate)
            links[candidate] = target
            rest = "/".join(parts[i + 1:])
            resolved = os.path.normpath(os.path.join(current, target))
            return _expose(os.path.join(resolved, rest) if rest else resolved, links, depth + 1)
        current = candidate
    return current


def _shared_libraries(binaries: list[str]) -> list[str] | None:
    """Every shared library (and the dynamic loader) that ``binaries`` load, as ``ldd`` resolves them; None
    without ``ldd``."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    found: set[str] = set()
    for i in range(0, len(binaries), 200):
        done = procgroup.run([ldd, *binaries[i:i + 200]], capture_output=True, text=True, timeout=120,
                             env=clean_env())
        found.update(_LDD_PATH.findall(done.stdout))
    return sorted(found)


@functools.lru_cache(maxsize=4)
def sandbox_layout(python: str) -> dict[str, list]:
    """Everything of the host a sandboxed program sees (levels ``full`` and ``userns``), bound read-only at the same
    paths in an otherwise empty root (``docs/math_code_envs.md``, "What a program can see").

    - ``files``: the interpreter ``python`` and each shared library it or a standard-library extension module loads
      (``ldd``; the directories of the system's libraries whole where ``ldd`` is missing);
    - ``dirs``: the directories of the interpreter's own ``sys.path`` under ``-I -S``: its standard library (with
      ``lib-dynload``), nothing else (no task imports anything outside the standard library);
    - ``hide``: the site-packages directories inside those, covered by an empty read-only tmpfs;
    - ``links``: the symlinks on the way to any of those (``/lib64 -> usr/lib64``), as ``[path, target]``;
    - ``devices``: ``/dev/null``, ``/dev/zero``, ``/dev/full``, ``/dev/random``, ``/dev/urandom``;
    - ``tmpfs``: the writable places, fresh and empty per run: ``/tmp`` (cwd, ``$HOME``, ``$TMPDIR``), ``/dev/shm``.

    Computed once per interpreter (one ``ldd`` over the interpreter and its extension modules, under a second).

    Raises:
        RuntimeError: the interpreter cannot be run, or one of those paths lies under :data:`SANDBOX_DIRS`.
    """
    try:
        done = procgroup.run([python, "-I", "-S", "-c", _PATHS_PROBE], capture_output=True, text=True,
                             timeout=60, env=clean_env())
        paths = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise RuntimeError(f"cannot run the sandbox interpreter {python}: {exc}") from exc
    links: dict[str, str] = {}
    dirs: list[str] = []
    for entry in sorted({_expose(p, links) for p in paths["path"] if p and os.path.isdir(p)}):
        if not _under(entry, dirs):
            dirs.append(entry)
    hide = sorted({real for p in paths["site"] if p and os.path.isdir(p)
                   for real in [_expose(p, links)] if _under(real, dirs)})
    modules = [os.path.join(top, name) for d in dirs for top, subdirs, names in os.walk(d)
               if not _under(top, hide) for name in names if ".so" in name]
    libraries = _shared_libraries([python, *modules])
    files = {_expose(python, links)}
    if libraries is None:
        for d in _FALLBACK_LIB_DIRS:
            if os.path.isdir(d):
                real = _expose(d, links)
                if not _under(real, dirs):
                    dirs.append(real)
    else:
        files.update(_expose(lib, links) for lib in libraries)
    files = {f for f in files if not _under(f, dirs)}
    links = {p: t for p, t in links.items() if not _under(p, dirs)}
    for path in [*dirs, *files, *links]:
        if _under(path, SANDBOX_DIRS):
            raise RuntimeError(f"{path} (needed by the sandbox interpreter {python}) lies under {SANDBOX_DIRS}, "
                               "which the code sandbox replaces; install Python elsewhere or set "
                               "AGENT_RL_SANDBOX=none (no isolation)")
    return {"dirs": sorted(dirs), "files": sorted(files), "hide": hide, "links": sorted(map(list, links.items())),
            "devices": [d for d in DEVICES if os.path.exists(d)], "tmpfs": [list(t) for t in TMPFS]}


def _launch(level: str, python: str, uid: int | None, source: str, args: list[str], root: str,
            close_fds: Any, cgroup_procs: Any = ()) -> list[str]:
    layout = {**sandbox_layout(python), "root": root, "uid": uid if level == "full" else None, "cwd": "/tmp",
              "source": source, "args": list(args), "close_fds": list(close_fds),
              "cgroup_procs": list(cgroup_procs)}
    prefix = ["unshare", *(_NS_FLAGS if level == "full" else ["--user", "--map-root-user", *_NS_FLAGS])]
    return [*prefix, "--", python, "-I", "-S", "-c", f"{LAUNCHER_SOURCE}\n_launcher_main({layout!r})\n"]


def launcher_argv(level: str, uid: int | None, source: str, args: list[str], root: str = "",
                  close_fds: Any = (), cgroup_procs: Any = ()) -> list[str]:
    """Command that runs ``python -I -S -c source *args`` in the sandbox of ``level`` (``full``/``userns``/``none``)
    as ``uid``.

    ``root``: an empty directory the launcher mounts the program's root filesystem on (in its own mount namespace;
    the host sees nothing there); ``close_fds``: descriptors only the program keeps (the launcher closes its copies);
    ``cgroup_procs``: ``cgroup.procs`` files the launcher joins before it forks the program (level ``full``: the
    run's cgroup, :class:`envs.code.run_limits.RunCgroup`).

    Raises:
        RuntimeError: from :func:`sandbox_python` or :func:`sandbox_layout` (the interpreter cannot be run, or lives
            where the sandbox cannot show it).
    """
    python = sandbox_python()
    if level == "none":
        return [python, "-I", "-S", "-c", source, *args]
    return _launch(level, python, uid, source, args, root, close_fds, cgroup_procs)


def _base_python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.lru_cache(maxsize=1)
def sandbox_python() -> str:
    """The interpreter that runs sandboxed programs: the real (base) interpreter behind ``sys.executable``.

    A virtual environment's ``bin/python`` is only a link to it, and the venv may live under ``/tmp`` (a CI clone),
    which the sandbox replaces with its own tmpfs; the base interpreter with ``-I -S`` also keeps the program away
    from the project's and the base interpreter's installed packages.

    Raises:
        RuntimeError: if even the base interpreter lies under a directory the sandbox replaces (it could not start).
    """
    path = _base_python()
    if isolation_level() != "none" and _under(path, SANDBOX_DIRS):
        raise RuntimeError(f"the Python interpreter {path} lies under {SANDBOX_DIRS}, which the code sandbox "
                           "replaces; install Python elsewhere or set AGENT_RL_SANDBOX=none (weaker isolation)")
    return path


def clean_env(home: str = "/tmp") -> dict[str, str]:
    """The whole environment of a sandboxed process (nothing inherited from the parent)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# Run in the candidate sandbox: exit 0 only when the host's files are gone (this package's directory, passed as
# argv[1]), the cwd is the fresh /tmp and, at level full, the process runs as the given uid (argv[2]).
_LEVEL_PROBE = ("import os, sys\n"
                "ok = not os.path.exists(sys.argv[1]) and os.getcwd() == '/tmp' and os.access('/tmp', os.W_OK)\n"
                "ok = ok and (sys.argv[2] == '' or os.getuid() == int(sys.argv[2]))\n"
                "sys.exit(0 if ok else 3)")


@functools.lru_cache(maxsize=1)
def isolation_level() -> str:
    """Strongest level that works here: ``full``, ``userns`` or ``none`` (probed once by running a program that
    checks, inside the candidate sandbox, that the host's files are out of its sight). Falling back to ``none``
    warns (``RuntimeWarning``) with what the kernel refused.

    ``$AGENT_RL_SANDBOX`` (full/userns/none) forces a level (e.g. ``none`` on a machine without util-linux).

    Raises:
        ValueError: ``$AGENT_RL_SANDBOX`` holds another value.
        RuntimeError: the namespaces work but the interpreter cannot be shown to a program
            (:func:`sandbox_layout`): an installation problem, never a silent ``none``.
    """
    forced = os.environ.get("AGENT_RL_SANDBOX")
    if forced:
        if forced not in ("full", "userns", "none"):
            raise ValueError(f"AGENT_RL_SANDBOX must be full, userns or none, got {forced!r}")
        return forced
    refused = []
    if not shutil.which("unshare"):
        refused.append("no unshare (util-linux) on PATH")
    else:
        python = _base_python()
        sandbox_layout(python)  # RuntimeError: no level can run this interpreter
        for level in ["full", "userns"] if os.geteuid() == 0 else ["userns"]:
            uid = _UID_RANGE[0] if level == "full" else None
            args = [str(_HERE), "" if uid is None else str(uid)]
            with tempfile.TemporaryDirectory(prefix="agent_rl_sbx_probe_") as tmp:
                os.mkdir(os.path.join(tmp, "root"))
                argv = _launch(level, python, uid, _LEVEL_PROBE, args, os.path.join(tmp, "root"), ())
                try:
                    done = procgroup.run(argv, env=clean_env(), capture_output=True, timeout=30, cwd=tmp)
                except (OSError, subprocess.TimeoutExpired) as exc:
                    refused.append(f"{level}: {exc}")
                    continue
            if done.returncode == 0:
                return level
            refused.append(f"{level}: exit {done.returncode} {done.stderr.decode(errors='replace').strip()[-300:]}")
    warnings.warn("code sandbox: no namespace isolation here (" + "; ".join(refused) + "); programs run with "
                  "isolation 'none' and can read this machine's files, the benchmark included", RuntimeWarning,
                  stacklevel=2)
    return "none"


def _fresh_uid_pair() -> tuple[int, int]:
    base = secrets.randbelow((_UID_RANGE[1] - _UID_RANGE[0]) // 2) * 2 + _UID_RANGE[0]
    return base, base + 1  # (checker, worker)


def _kill(proc: subprocess.Popen, level: str) -> None:
    """Kill a sandbox: ``unshare --kill-child`` takes the PID namespace (and everything in it) down with it; without
    namespaces (``none``) its process group goes, also when the program itself has exited and left a process
    running in the background."""
    if level == "none":
        kill_group(proc.pid)
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    _wait(proc, 10)  # SIGKILL cannot be ignored


def _read_capped(f: Any, limit: int) -> tuple[str, int]:
    """First ``limit`` bytes of the open file ``f`` (decoded, invalid UTF-8 replaced) and its full size."""
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace"), size


def _anonymous_file(tmp: str, data: bytes = b"") -> Any:
    """A file with no name (``O_TMPFILE``): a sandboxed process holding it learns no host path from it."""
    f = tempfile.TemporaryFile(dir=tmp)
    if data:
        f.write(data)
        f.seek(0)
    return f


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``proc`` to exit; False on timeout. Wakes up the moment it exits (a pidfd), not
    at the next tick of ``Popen.wait``'s polling loop (up to 50 ms late: the sandbox runs many short programs)."""
    if proc.poll() is not None:  # reaped: its pid may already name another process
        return True
    try:  # not reaped yet, so the pid is still this process's (a zombie at worst)
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): poll
        pidfd = None
    if pidfd is not None:
        try:
            select.select([pidfd], [], [], timeout)
        finally:
            os.close(pidfd)
    try:
        proc.wait(timeout=0 if pidfd is not None else timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_uid(uid: int) -> None:
    """Belt and braces after the namespace is gone: SIGKILL every process still owned by ``uid`` (root only)."""
    try:
        subprocess.run(["kill", "-KILL", "-1"], user=uid, group=uid, extra_groups=[], env=clean_env(),
                       capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        pass


@dataclass
class RunResult:
    """What one sandboxed run returns (JSON-serialisable via :meth:`to_dict`).

    ``tests``: per-test dicts (name, passed, status in passed/wrong_answer/error/timeout/memory/crashed, time_s,
    error). ``load_error``: ``[exception type, message]`` when the program's top level failed. ``outputs``: encoded
    outputs (record mode only). ``stdout``/``stderr``: the worker's first bytes; ``*_bytes`` their full size.
    ``checker_error`` (the checker wrote no verdict) and ``infra_error`` (the worker never started) mean the run
    could not judge the program: :func:`raise_if_infra` turns them into :class:`envs.errors.EnvInfraError`.
    Per-run limits (:mod:`envs.code.run_limits`): ``run_limits`` is how they were held (``cgroup-v2``,
    ``cgroup-v1`` or ``accounted``); ``limit_hit`` the one the run went past (``memory``: a process of it was
    killed for memory; ``processes``; ``cpu``: CPU seconds of all its processes), ``None`` if none;
    ``peak_memory_mb``/``peak_processes`` what was seen of the worker's run (MiB; None where unknown).
    """

    tests: list[dict[str, Any]] = field(default_factory=list)
    load_error: list[str] | None = None
    outputs: list[Any] | None = None
    timed_out: bool = False
    worker_exit: int | None = None
    worker_state: str | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    checker_error: str | None = None
    infra_error: str | None = None
    isolation: str = ""
    wall_s: float = 0.0
    uids: list[int] = field(default_factory=list)
    run_limits: str = ""
    limit_hit: str | None = None
    peak_memory_mb: float | None = None
    peak_processes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_tests(program: str, spec: dict[str, Any], limits: SandboxLimits | None = None,
              excerpt_bytes: int = 2000) -> RunResult:
    """Run ``program`` in a worker sandbox and ``spec``'s tests in a checker sandbox; return the verdict.

    Args:
        program: Python source of the untrusted program.
        spec: test spec (modes check/asserts/io/record, see ``_checker.py``); plain data only.
        limits: resource limits (default :class:`SandboxLimits`).
        excerpt_bytes: bytes of the worker's stdout/stderr kept in the result.
    """
    limits = limits or SandboxLimits()
    try:
        level = isolation_level()
    except RuntimeError as exc:
        raise EnvInfraError(str(exc), component="sandbox") from exc
    checker_uid, worker_uid = _fresh_uid_pair()
    started = time.monotonic()
    result = RunResult(isolation=level, uids=[checker_uid, worker_uid] if level == "full" else [])
    with tempfile.TemporaryDirectory(prefix="agent_rl_sbx_") as tmp, contextlib.ExitStack() as open_files:
        tmpdir = Path(tmp)
        work = tmpdir / "work"
        work.mkdir()
        root = tmpdir / "root"  # each sandbox mounts its own root filesystem here, in its own mount namespace
        root.mkdir()
        home = "/tmp" if level != "none" else str(work)

        def anonymous(data: bytes = b"") -> Any:
            return open_files.enter_context(_anonymous_file(tmp, data))

        program_in = anonymous(program.encode("utf-8", errors="surrogatepass"))
        spec_in = anonymous(_codec.dumps(spec).encode("utf-8"))
        w_out, w_err, c_out, c_err = anonymous(), anonymous(), anonymous(), anonymous()
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        pipe_fds = [req_r, req_w, resp_r, resp_w]
        procs: list[tuple[subprocess.Popen, int]] = []
        # the worker's run, all its processes together: a cgroup where the machine gives one (root), else accounted
        # (its cgroup holds the processes' memory_mb plus what the tmpfs can hold: a single process still meets its
        # RLIMIT_AS first, as a MemoryError)
        # (the checker runs the task's own test code: it is in the same account, plus its own process)
        group = (RunCgroup.create((limits.memory_mb << 20) + TMPFS_BYTES, limits.nproc + 1) if level == "full"
                 else None)
        result.run_limits = f"cgroup-{group.mode}" if group is not None else "accounted"
        try:
            def start(source: str, fds: tuple[int, int], uid: int, stdin: Any, out: Any, err: Any,
                      cfg: dict[str, Any], cgroup: RunCgroup | None = None) -> subprocess.Popen:
                try:
                    launch = launcher_argv(level, uid, source, [str(fds[0]), str(fds[1]), json.dumps(cfg)],
                                           str(root), fds, cgroup.procs if cgroup is not None else ())
                except RuntimeError as exc:
                    raise EnvInfraError(str(exc), component="sandbox") from exc
                try:
                    proc = subprocess.Popen(launch, stdin=stdin, stdout=out, stderr=err, pass_fds=fds,
                                            env=clean_env(home), cwd=str(work), start_new_session=True)
                except OSError as exc:  # no such interpreter / unshare: the sandbox cannot start
                    raise EnvInfraError(f"cannot start the sandbox ({launch[0]}): {exc}",
                                        component="sandbox") from exc
                procs.append((proc, uid))
                return proc

            worker = start(WORKER_SOURCE, (req_r, resp_w), worker_uid, program_in, w_out, w_err,
                           limits.for_worker(), group)
            checker = start(CHECKER_SOURCE, (req_w, resp_r), checker_uid, spec_in, c_out, c_err,
                            limits.for_checker(), group)
            # the parent's copies must go now: a dead worker is then an immediate EOF for the checker
            while pipe_fds:
                os.close(pipe_fds.pop())
            account = RunAccount(limits.memory_mb << 20, limits.nproc, limits.cpu_s,
                                 uid=worker_uid if level == "full" else None, root_pid=worker.pid,
                                 count_memory=group is None,
                                 others=[(checker_uid if level == "full" else None, checker.pid)])
            result.timed_out = not _wait_accounted(checker, worker, level, limits.wall_s, account, result,
                                                   POLL_S if group is None else 5 * POLL_S)
            result.peak_processes = account.peak_processes
            if group is None:
                result.peak_memory_mb = round(account.peak_memory_bytes / 2**20, 1)
        finally:  # whatever happened (even KeyboardInterrupt, or a failed start), nothing may outlive the run
            while pipe_fds:
                os.close(pipe_fds.pop())
            for proc, uid in procs:
                _kill(proc, level)
                if level == "full":
                    _kill_uid(uid)
            if group is not None:
                peak = group.peak_memory_bytes()
                result.peak_memory_mb = None if peak is None else round(peak / 2**20, 1)
                if group.oom_kills() and result.limit_hit is None:
                    result.limit_hit = "memory"
                group.destroy()
        result.worker_exit = worker.returncode
        result.stdout, result.stdout_bytes = _read_capped(w_out, excerpt_bytes)
        result.stderr, result.stderr_bytes = _read_capped(w_err, excerpt_bytes)
        verdict_text, _ = _read_capped(c_out, 256 << 20)
        if not result.timed_out:
            try:
                verdict = json.loads(verdict_text)
                result.tests = verdict["tests"]
                result.load_error = verdict["load_error"]
                result.outputs = verdict["outputs"]
                result.worker_state = verdict.get("worker")
                if verdict.get("infra"):
                    err, _ = _read_capped(w_err, 2000)
                    result.infra_error = (f"{verdict['infra']}; worker exit {worker.returncode}, "
                                          f"stderr: {err[-1000:]!r}")
            except (ValueError, KeyError, TypeError):
                if result.limit_hit is None:  # else the run's cap ended the checker too: no tests, the cap's reason
                    err, _ = _read_capped(c_err, 2000)
                    result.checker_error = f"checker exit {checker.returncode}: {err[-1000:]}"
    result.wall_s = time.monotonic() - started
    return result


def _wait_accounted(checker: subprocess.Popen, worker: subprocess.Popen, level: str, wall_s: float,
                    account: RunAccount, result: RunResult, poll_s: float) -> bool:
    """Wait up to ``wall_s`` for the checker; every ``poll_s`` read the run (``account``: the program's processes
    and the checker's) and kill both past a per-run cap (``result.limit_hit``). False on timeout."""
    deadline = time.monotonic() + wall_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return checker.poll() is not None
        if _wait(checker, min(poll_s, left)):
            return True
        if result.limit_hit is None:  # the checker may go on past the worker (the task's test code)
            hit = account.over()
            if hit is not None:  # memory, processes and CPU are the checker's too (the task's test code): end both
                result.limit_hit = hit
                _kill(worker, level)
                _kill(checker, level)


def raise_if_infra(result: RunResult) -> None:
    """Raise :class:`envs.errors.EnvInfraError` when ``result`` is not a judgement of the program: the checker
    wrote no verdict (it could not start, or crashed) or the worker never started (``docs/env_errors.md``)."""
    problem = result.infra_error or result.checker_error
    if problem is not None:
        try:
            python = sandbox_python()
        except RuntimeError as exc:
            python = f"unusable: {exc}"
        raise EnvInfraError(f"the code sandbox could not judge the program ({result.isolation} isolation, "
                            f"interpreter {python}): {problem}", component="sandbox")
