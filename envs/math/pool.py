"""A small pool of verifier processes with a per-check outer deadline.

Each worker is a fresh ``python`` subprocess that imports math-verify once and answers ``(reference, answer)``
requests over its stdin/stdout (JSON lines); plain ``subprocess`` rather than ``multiprocessing`` so that it also
works inside daemonic processes (the env server's per-session workers). A caller takes an idle worker, sends one
request and waits at most ``timeout_s``; if no reply comes the
worker is killed (SIGKILL) and replaced, and the caller gets ``None`` (the env then uses the string fallback). Other
callers hold other workers, so one stuck check never stalls them. Thread-safe; workers start lazily.

"Could not judge the answer" (it timed out, math-verify raised on it) is the answer's; "could not judge at all"
(a worker cannot start or cannot answer ``1 == 1`` in time) is the verifier's: :class:`envs.errors.EnvInfraError`,
never a reward (``docs/env_errors.md``).

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot kill a single stuck worker; a timeout there leaves the
worker busy forever, and terminating the executor breaks every other pending check.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import resource
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from envs.errors import EnvInfraError
from envs.procgroup import kill_group

_REPO_ROOT = Path(__file__).resolve().parent.parent.parent
_CHECK_CPU_BUDGET_S = 60


def _worker_main(inner_timeout_s: int) -> None:
    """Worker loop over stdin/stdout, one JSON line each way: ``[reference, answer, nouns]`` -> ``[verdict, error]``
    (``nouns``: the question's nouns, :func:`envs.math.grader.question_nouns`; may be left out)."""
    from envs.math.grader import math_verify_equal

    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray prints (sympy, logging) must not corrupt the protocol
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    for line in sys.stdin:
        reference, answer, *rest = json.loads(line)
        nouns = frozenset(rest[0]) if rest else frozenset()
        # CPU budget per check (SIGXCPU ends the process even inside C code): an orphaned worker, whose parent died
        # while it was stuck, does not spin forever
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime) + 1 + _CHECK_CPU_BUDGET_S
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        try:
            reply = [math_verify_equal(reference, answer, timeout_s=inner_timeout_s, nouns=nouns), None]
        except Exception as exc:  # any parser failure is a non-verdict, the caller falls back
            reply = [None, f"{type(exc).__name__}: {exc}"[:200]]
        out.write(json.dumps(reply) + "\n")
        out.flush()


class _Worker:
    """One verifier subprocess (a plain ``subprocess``, so it also works inside daemonic server workers)."""

    def __init__(self, inner_timeout_s: int, python: str = sys.executable) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [python, "-c", f"from envs.math.pool import _worker_main; _worker_main({int(inner_timeout_s)})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True,  # kill() ends its group: a check that started a process takes it along
        )
        self._buf = b""

    def send(self, reference: str, answer: str, nouns: frozenset[str] = frozenset()) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps([reference, answer, sorted(nouns)]) + "\n").encode())
        self.process.stdin.flush()

    def recv(self, timeout_s: float) -> list | None:
        """The next reply, or None if none arrived within ``timeout_s``. Raises EOFError if the worker died."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("verifier worker exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """End the verifier with its process group (:func:`envs.procgroup.kill_group`)."""
        kill_group(self.process.pid)
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except (OSError, AttributeError):
                pass


class VerifierPool:
    """``n_workers`` math-verify processes; :meth:`check` returns ``(verdict, reason)`` within ``timeout_s``.

    Args:
        n_workers: processes (each ~150 MB resident with sympy loaded).
        timeout_s: outer deadline per check in seconds, measured after a worker is acquired. The first check also
            waits for the worker to import math-verify (about 1-2 s); that start-up is not counted.
        inner_timeout_s: math-verify's own ``signal.alarm`` budget inside the worker (integer seconds).
        python: interpreter of the workers (tests point it at a broken one to simulate a verifier failure).
    """

    def __init__(self, n_workers: int = 2, timeout_s: float = 5.0, inner_timeout_s: int = 3,
                 python: str = sys.executable) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.n_workers = n_workers
        self.timeout_s = timeout_s
        self.inner_timeout_s = inner_timeout_s
        self.python = python
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._lock = threading.Lock()
        self._all: list[_Worker] = []
        self._started = False
        self._pid = os.getpid()
        self.n_killed = 0

    def _start(self) -> None:
        if self._pid != os.getpid():  # forked (e.g. a server's per-session worker): never share the parent's pipes
            self._lock = threading.Lock()
            self._idle = queue.Queue()
            self._all, self._started, self._pid = [], False, os.getpid()
        with self._lock:
            if self._started:
                return
            for _ in range(self.n_workers):
                self._idle.put(None)  # placeholder: started on first use, in the caller's thread
            self._started = True

    def _spawn(self) -> _Worker:
        worker = _Worker(self.inner_timeout_s, self.python)
        with self._lock:
            self._all.append(worker)
        return worker

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def _fresh(self) -> _Worker:
        """A new worker that has answered a trivial check: the import within 120 s (not charged to any check's
        deadline), then ``1 == 1`` within ``timeout_s``.

        Raises:
            EnvInfraError: the verifier cannot start or cannot answer a trivial check (it could not judge anything).
        """
        worker = None
        try:
            worker = self._spawn()
            worker.send("1", "1")  # warm-up: the import of math-verify and sympy
            if worker.recv(120.0) is None:
                raise TimeoutError("no answer to the warm-up check within 120 s")
            worker.send("1", "1")
            reply = worker.recv(self.timeout_s)
            if reply != [True, None]:
                raise TimeoutError(f"trivial check 1 == 1 answered {reply!r} within {self.timeout_s} s")
            return worker
        except (OSError, EOFError, ValueError, TimeoutError) as exc:
            if worker is not None:
                self._forget(worker)
                worker.kill()
            raise EnvInfraError(f"the math verifier ({self.python} -c 'envs.math.pool._worker_main') could not "
                                f"judge: {type(exc).__name__}: {exc}", component="verifier") from exc

    def _healthy(self) -> _Worker | None:
        """Make sure the verifier itself still works after a check timed out: an idle live worker (if one is free
        right now: no start-up cost) or else a fresh one must answer ``1 == 1`` within ``timeout_s``.

        Returns:
            the fresh worker when one had to be started (the caller keeps it), else None.

        Raises:
            EnvInfraError: no worker answers the trivial check (see :meth:`_fresh`).
        """
        try:
            other = self._idle.get_nowait()
        except queue.Empty:
            return self._fresh()
        if other is not None and other.is_alive():
            try:
                other.send("1", "1")
                if other.recv(self.timeout_s) == [True, None]:
                    self._idle.put(other)
                    return None
            except (EOFError, OSError, ValueError):
                pass
            self._forget(other)
            other.kill()
            other = None
        self._idle.put(other)
        return self._fresh()

    def check(self, reference: str, answer: str, nouns: frozenset[str] = frozenset()) -> tuple[bool | None, str]:
        """Verdict of math-verify for two bare answers, or ``(None, reason)`` when the ANSWER could not be judged.
        ``nouns``: the question's nouns (:func:`envs.math.grader.question_nouns`), words that may follow a number.

        Reasons: ``"math_verify"`` (a verdict came back), ``"timeout"`` (this answer ran past ``timeout_s``),
        ``"error: ..."`` (math-verify raised on it, or a worker died twice on it). After a timeout or a dead worker a
        fresh worker must answer ``1 == 1`` in time, else the verifier itself is at fault.

        Raises:
            EnvInfraError: the verifier itself failed: it cannot start, or cannot answer a trivial check
                (``docs/env_errors.md``: never turned into a reward).
        """
        self._start()
        worker = self._idle.get()
        try:
            if worker is None or not worker.is_alive():
                if worker is not None:
                    self._forget(worker)
                    worker.kill()
                worker = None
                worker = self._fresh()
            for attempt in range(2):
                try:
                    worker.send(reference, answer, nouns)
                    reply = worker.recv(self.timeout_s)
                except (EOFError, OSError, ValueError) as exc:  # the worker died under this answer
                    self._forget(worker)
                    worker.kill()
                    worker = None
                    worker = self._fresh()  # the verifier still works (else EnvInfraError): retry once
                    if attempt == 1:
                        return None, f"error: a verifier worker died twice on this answer ({type(exc).__name__})"
                    continue
                if reply is None:  # deadline passed: kill only this worker; the verifier must still answer 1 == 1
                    self._forget(worker)
                    worker.kill()
                    self.n_killed += 1
                    worker = None
                    worker = self._healthy()
                    return None, "timeout"
                verdict, error = reply
                return (verdict, "math_verify") if error is None else (None, f"error: {error}")
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._idle.put(worker)  # None: a fresh one is started lazily by the next caller

    def close(self) -> None:
        """Kill every worker (idempotent; in a forked child, only the child's own workers)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            workers, self._all = list(self._all), []
        for worker in workers:
            worker.kill()


_DEFAULT: dict[tuple[int, float], VerifierPool] = {}
_DEFAULT_LOCK = threading.Lock()


def default_pool(n_workers: int = 2, timeout_s: float = 5.0) -> VerifierPool:
    """One shared pool per ``(n_workers, timeout_s)`` in this process (envs of a server share it)."""
    with _DEFAULT_LOCK:
        key = (n_workers, float(timeout_s))  # a forked child re-initialises the pool on first use (see _start)
        if key not in _DEFAULT:
            _DEFAULT[key] = VerifierPool(n_workers=n_workers, timeout_s=timeout_s)
        return _DEFAULT[key]


@atexit.register
def _close_defaults() -> None:
    for pool in _DEFAULT.values():
        pool.close()
