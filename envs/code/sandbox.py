"""Run untrusted Python against trusted tests: two sandboxed processes, a value-only pipe between them.

Design (details and threat model in ``docs/math_code_envs.md``):

- **Worker** (runs the program) and **checker** (runs the test code) are two fresh ``python -I`` interpreters, each
  started through :func:`launcher_argv`: a new network namespace (no interfaces but a down loopback), a new mount
  namespace with fresh small tmpfs mounts over ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock`` (the only
  world-writable places; the tmpfs ``/tmp`` is the program's own temporary directory and its cwd), a new PID
  namespace (the program sees only its own processes; when its init dies the kernel kills every process in it, so
  nothing outlives the run, not even a child that called ``setsid``), and a fresh unprivileged uid per run
  (``setpriv --reuid``, no capabilities, ``no_new_privs``), so ``RLIMIT_NPROC`` counts this run's processes only.
  rlimits: CPU seconds, address space, file size (also caps what it can print), processes, open files, no core.
  The environment is rebuilt from scratch: no variable of the parent leaks.
- **Why two processes**: a program running in the same interpreter as its tests can rewrite them (patch ``print``,
  ``sys.exit``, the harness, ``__eq__``). Here the checker never executes program code: each test call goes over a
  pipe to the worker, and only plain data (see ``_codec``: exact builtin types, rebuilt by the checker) comes back.
  The verdict goes to the checker's stdout file, which the worker has no descriptor for; the two run as different
  uids so the worker cannot signal or ptrace the checker. So a program cannot fake a pass; it can only return values.
- **Isolation levels** (:func:`isolation_level`, detected once): ``full`` as root (or with CAP_SYS_ADMIN);
  ``userns`` when unprivileged user namespaces are allowed (same namespaces, but the program keeps the caller's uid:
  no per-run uid, so NPROC is shared with the caller); ``none`` otherwise (process group + rlimits only; a program can
  then reach the network and the caller's files: do not train on untrusted code like that).
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.code import _codec
from envs.errors import EnvInfraError

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
        checker_memory_mb: RLIMIT_AS of the checker (it holds the test inputs).
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


def _source(name: str) -> str:
    """Self-contained source: _codec.py + the harness, minus the lines marked ``# sandbox: strip``."""
    parts = []
    for filename in ("_codec.py", name):
        text = (_HERE / filename).read_text(encoding="utf-8")
        parts.append("\n".join(line for line in text.splitlines() if not line.endswith("# sandbox: strip")))
    return "\n\n".join(parts)


WORKER_SOURCE = _source("_worker.py")
CHECKER_SOURCE = _source("_checker.py")

# Runs as root inside the new namespaces, then drops to the run's uid. "exit $?" keeps sh as the PID-namespace
# init (no exec): the program is never PID 1, so its rlimit signals are delivered normally.
_INNER_SCRIPT = (
    "for d in /tmp /var/tmp /dev/shm /run/lock; do "
    "[ -d $d ] && { mount -t tmpfs -o size=64m,mode=1777,nosuid,nodev tmpfs $d || exit 125; }; done; "
    "cd /tmp || exit 125; u=$1; shift; "
    'if [ -n "$u" ]; then setpriv --reuid=$u --regid=$u --clear-groups --no-new-privs --inh-caps=-all '
    '--bounding-set=-all -- "$@"; else setpriv --no-new-privs --inh-caps=-all --bounding-set=-all -- "$@"; fi; '
    "exit $?"
)
_NS_FLAGS = ["--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"]


def launcher_argv(level: str, uid: int | None, argv: list[str]) -> list[str]:
    """Command that runs ``argv`` in the sandbox of ``level`` (``full``/``userns``/``none``) as ``uid``."""
    if level == "none":
        return list(argv)
    prefix = ["unshare", *(_NS_FLAGS if level == "full" else ["--user", "--map-root-user", *_NS_FLAGS])]
    return [*prefix, "--", "sh", "-c", _INNER_SCRIPT, "sh", str(uid) if level == "full" else "", *argv]


# Directories the sandbox hides behind fresh tmpfs mounts (levels full and userns).
MASKED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


@functools.lru_cache(maxsize=1)
def sandbox_python() -> str:
    """The interpreter that runs sandboxed programs: the real (base) interpreter behind ``sys.executable``.

    A virtual environment's ``bin/python`` is only a link to it, and the venv may live under ``/tmp`` (a CI clone),
    which the sandbox hides behind its own tmpfs; the base interpreter with ``-I`` also keeps the program away from
    the project's installed packages.

    Raises:
        RuntimeError: if even the base interpreter lies under a masked directory (the sandbox could not start it).
    """
    path = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if isolation_level() != "none" and any(path == d or path.startswith(d + "/") for d in MASKED_DIRS):
        raise RuntimeError(f"the Python interpreter {path} lies under {MASKED_DIRS}, which the code sandbox masks; "
                           "install Python elsewhere or set AGENT_RL_SANDBOX=none (weaker isolation)")
    return path


def clean_env(home: str = "/tmp") -> dict[str, str]:
    """The whole environment of a sandboxed process (nothing inherited from the parent)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@functools.lru_cache(maxsize=1)
def isolation_level() -> str:
    """Strongest level that works here: ``full``, ``userns`` or ``none`` (probed once by running ``true``).

    ``$AGENT_RL_SANDBOX`` (full/userns/none) forces a level (e.g. ``none`` on a machine without util-linux).
    """
    forced = os.environ.get("AGENT_RL_SANDBOX")
    if forced:
        if forced not in ("full", "userns", "none"):
            raise ValueError(f"AGENT_RL_SANDBOX must be full, userns or none, got {forced!r}")
        return forced
    if shutil.which("unshare") and shutil.which("setpriv"):
        candidates = ["full", "userns"] if os.geteuid() == 0 else ["userns"]
        for level in candidates:
            argv = launcher_argv(level, _UID_RANGE[0], ["true"])
            try:
                done = subprocess.run(argv, env=clean_env(), capture_output=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0:
                return level
    return "none"


def _fresh_uid_pair() -> tuple[int, int]:
    base = secrets.randbelow((_UID_RANGE[1] - _UID_RANGE[0]) // 2) * 2 + _UID_RANGE[0]
    return base, base + 1  # (checker, worker)


def _kill(proc: subprocess.Popen, level: str) -> None:
    """Kill a sandbox: ``unshare --kill-child`` takes the PID namespace (and everything in it) down with it."""
    if proc.poll() is None:
        try:
            if level == "none":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        pass


def _read_capped(path: Path, limit: int) -> tuple[str, int]:
    size = path.stat().st_size if path.exists() else 0
    with open(path, "rb") as f:
        data = f.read(limit)
    return data.decode("utf-8", errors="replace"), size


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
    level = isolation_level()
    checker_uid, worker_uid = _fresh_uid_pair()
    started = time.monotonic()
    result = RunResult(isolation=level, uids=[checker_uid, worker_uid] if level == "full" else [])
    with tempfile.TemporaryDirectory(prefix="agent_rl_sbx_") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "program.py").write_text(program, encoding="utf-8", errors="surrogatepass")
        (tmpdir / "spec.json").write_text(_codec.dumps(spec), encoding="utf-8")
        work = tmpdir / "work"
        work.mkdir()
        home = "/tmp" if level != "none" else str(work)
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        pipe_fds = [req_r, req_w, resp_r, resp_w]
        procs: list[tuple[subprocess.Popen, int]] = []
        files = []
        try:
            def start(source: str, fds: tuple[int, int], uid: int, stdin: Path, out: Path, err: Path,
                      cfg: dict[str, Any]) -> subprocess.Popen:
                try:
                    python = sandbox_python()
                except RuntimeError as exc:
                    raise EnvInfraError(str(exc), component="sandbox") from exc
                argv = [python, "-I", "-c", source, str(fds[0]), str(fds[1]), json.dumps(cfg)]
                fin, fout, ferr = open(stdin, "rb"), open(out, "wb"), open(err, "wb")
                files.extend([fin, fout, ferr])
                launch = launcher_argv(level, uid, argv)
                try:
                    proc = subprocess.Popen(launch, stdin=fin, stdout=fout, stderr=ferr, pass_fds=fds,
                                            env=clean_env(home), cwd=str(work), start_new_session=True)
                except OSError as exc:  # no such interpreter / unshare: the sandbox cannot start
                    raise EnvInfraError(f"cannot start the sandbox ({launch[0]}): {exc}",
                                        component="sandbox") from exc
                procs.append((proc, uid))
                return proc

            worker = start(WORKER_SOURCE, (req_r, resp_w), worker_uid, tmpdir / "program.py",
                           tmpdir / "w.out", tmpdir / "w.err", limits.for_worker())
            checker = start(CHECKER_SOURCE, (req_w, resp_r), checker_uid, tmpdir / "spec.json",
                            tmpdir / "c.out", tmpdir / "c.err", limits.for_checker())
            # the parent's copies must go now: a dead worker is then an immediate EOF for the checker
            while pipe_fds:
                os.close(pipe_fds.pop())
            try:
                checker.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                result.timed_out = True
        finally:  # whatever happened (even KeyboardInterrupt, or a failed start), nothing may outlive the run
            while pipe_fds:
                os.close(pipe_fds.pop())
            for proc, uid in procs:
                _kill(proc, level)
                if level == "full":
                    _kill_uid(uid)
            for f in files:
                f.close()
        result.worker_exit = worker.returncode
        result.stdout, result.stdout_bytes = _read_capped(tmpdir / "w.out", excerpt_bytes)
        result.stderr, result.stderr_bytes = _read_capped(tmpdir / "w.err", excerpt_bytes)
        verdict_text, _ = _read_capped(tmpdir / "c.out", 256 << 20)
        if not result.timed_out:
            try:
                verdict = json.loads(verdict_text)
                result.tests = verdict["tests"]
                result.load_error = verdict["load_error"]
                result.outputs = verdict["outputs"]
                result.worker_state = verdict.get("worker")
                if verdict.get("infra"):
                    err, _ = _read_capped(tmpdir / "w.err", 2000)
                    result.infra_error = (f"{verdict['infra']}; worker exit {worker.returncode}, "
                                          f"stderr: {err[-1000:]!r}")
            except (ValueError, KeyError, TypeError):
                err, _ = _read_capped(tmpdir / "c.err", 2000)
                result.checker_error = f"checker exit {checker.returncode}: {err[-1000:]}"
    result.wall_s = time.monotonic() - started
    return result


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
