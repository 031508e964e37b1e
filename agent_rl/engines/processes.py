"""Process and signal plumbing shared by the engines that own processes (``vllm``: vLLM's engine processes;
``vllm_server``: the ``vllm serve`` processes the run starts).

- Sync folders: each such engine owns ``<engine.sync_dir>/agent_rl-vllm-<pid>-<n>/`` (:func:`new_sync_folder`), with
  ``owner.json`` naming this process and the processes the engine owns; each start sweeps the folders (and
  still-living processes) of dead owners (:func:`sweep_sync_dir`).
- Watchdog (:func:`start_watchdog`): a small child process that kills the engine's processes and removes its folder
  when this process dies without closing the engine (SIGKILL); a normal close stops it (:func:`stop_watchdog`).
- Live engines (:func:`track`/:func:`untrack`): closed at interpreter exit and on SIGTERM/SIGINT (:func:`close_all`;
  handlers installed from the main thread, chaining to the previous ones; a signal the process ignores, e.g. SIGINT
  of a job a non-interactive shell started in the background, stays ignored).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SYNC_PREFIX = "agent_rl-vllm-"
"""The name prefix of an engine's sync folder (``agent_rl-vllm-<pid>-<n>-<random>``)."""


def proc_start(pid: int) -> float | None:
    """Start time of process ``pid`` (psutil), None when it does not exist."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def alive(pid: int, start: float | None) -> bool:
    now = proc_start(pid)
    return now is not None and (start is None or abs(now - start) < 1e-3)


def kill_tree(procs: list[tuple[int, float | None]], timeout: float = 10.0) -> int:
    """SIGTERM the processes (pid, start time) still alive, and their descendants, then SIGKILL what is left after
    ``timeout`` s. Returns how many were alive."""
    import psutil

    targets = []
    for pid, start in procs:
        if not alive(pid, start):
            continue
        try:
            p = psutil.Process(pid)
            targets += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for p in targets:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(targets, timeout=timeout)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return len(targets)


def sweep_sync_dir(sync_dir: str | os.PathLike[str]) -> int:
    """Remove what engines of dead processes left in ``sync_dir``: their ``agent_rl-vllm-*`` folders, after killing
    the vLLM engine processes their ``owner.json`` names that still live (a SIGKILLed run whose watchdog died too).
    Folders of living owners are kept. Returns how many folders were removed."""
    root = Path(sync_dir)
    if not root.is_dir():
        return 0
    removed = 0
    for folder in root.glob(f"{SYNC_PREFIX}*"):
        if not folder.is_dir():
            continue
        try:
            owner = json.loads((folder / "owner.json").read_text())
        except (OSError, ValueError):
            owner = None
        if owner is None:  # no owner file: an engine that died while starting; its name carries the pid
            try:
                pid = int(folder.name[len(SYNC_PREFIX):].split("-")[0])
            except ValueError:
                continue
            if alive(pid, None):
                continue
        else:
            if alive(int(owner["pid"]), owner.get("start")):
                continue
            kill_tree([(int(p), s) for p, s in owner.get("engine_procs", [])])
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


# The watchdog: a child of the engine's process that waits for it to go away. A normal close writes "stop" (the
# watchdog leaves); end of input without it, or a new parent (re-parented when the owner died), means the owner was
# killed: then it terminates vLLM's engine processes (argv: "pid:start" pairs) and their children, and removes the
# sync folder (argv[1]).
WATCHDOG_SCRIPT = r"""
import os, select, shutil, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent = os.getppid()
folder, procs = sys.argv[1], [(int(a), float(b)) for a, b in (x.split(":") for x in sys.argv[2:])]
stopped = False
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.5)
    if ready:
        line = sys.stdin.readline()
        if line.strip() == "stop":
            stopped = True
            break
        if not line:
            break
    if os.getppid() != parent:
        break
if not stopped:
    import psutil
    targets = []
    for pid, start in procs:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - start) < 1e-3:
                targets += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in targets:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(targets, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    shutil.rmtree(folder, ignore_errors=True)
"""


def start_watchdog(folder: Path, procs: list[tuple[int, float]]) -> subprocess.Popen[str] | None:
    """Write ``folder/owner.json`` (this process and ``procs``, the (pid, start time) of the processes it owns: the
    sweep of dead runs reads it) and start the watchdog (:data:`WATCHDOG_SCRIPT`) that kills ``procs`` and their
    children and removes ``folder`` when this process dies without :func:`stop_watchdog` (SIGKILL). None without
    ``procs``."""
    (folder / "owner.json").write_text(json.dumps(
        {"pid": os.getpid(), "start": proc_start(os.getpid()), "engine_procs": procs}))
    if not procs:
        return None
    return subprocess.Popen([sys.executable, "-c", WATCHDOG_SCRIPT, str(folder), *(f"{p}:{s!r}" for p, s in procs)],
                            stdin=subprocess.PIPE, text=True, start_new_session=True)


def stop_watchdog(dog: subprocess.Popen[str]) -> None:
    """A normal close: the watchdog leaves without killing anything."""
    try:
        dog.stdin.write("stop\n")  # type: ignore[union-attr]
        dog.stdin.close()  # type: ignore[union-attr]
    except (BrokenPipeError, OSError, ValueError):
        pass
    try:
        dog.wait(timeout=10)
    except subprocess.TimeoutExpired:
        dog.kill()
        dog.wait()


_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()
PREVIOUS_HANDLERS: dict[int, Any] = {}
"""signal number -> the handler :func:`install_handlers` replaced (chained to by :func:`on_signal`)."""
_COUNTER = [0]
_LOCK = threading.Lock()


def close_all() -> None:
    """Close every tracked engine of this process (:func:`track`; atexit and the SIGTERM/SIGINT handlers call
    it)."""
    for engine in list(_LIVE):
        engine.close()


def on_signal(signum: int, frame: Any) -> None:
    """The SIGTERM/SIGINT handler: close the tracked engines, then run the handler it replaced (the default one:
    the signal is raised again with it)."""
    close_all()
    previous = PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_handlers() -> None:
    """Install :func:`on_signal` for SIGTERM and SIGINT once, from the main thread; a signal this process ignores
    stays ignored (:data:`PREVIOUS_HANDLERS`: the handlers replaced)."""
    if PREVIOUS_HANDLERS or threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN:
            continue
        PREVIOUS_HANDLERS[signum] = previous
        signal.signal(signum, on_signal)


atexit.register(close_all)


def new_children(before: set[int]) -> list[tuple[int, float]]:
    """Children of this process started since ``before`` (pids), multiprocessing's resource tracker excepted (it
    leaves by itself and cleans vLLM's shared memory when it does)."""
    import psutil

    out = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
            out.append((child.pid, child.create_time()))
        except psutil.NoSuchProcess:
            continue
    return out


def track(engine: Any) -> None:
    """Close ``engine`` (its ``close``) at interpreter exit and on SIGTERM/SIGINT (:func:`close_all`); installs the
    signal handlers once, from the main thread. Held weakly: a collected engine is forgotten."""
    _LIVE.add(engine)
    install_handlers()


def untrack(engine: Any) -> None:
    """Forget ``engine`` (its close ran)."""
    _LIVE.discard(engine)


def new_sync_folder(sync_dir: str, who: str) -> Path:
    """A new sync folder ``<sync_dir>/agent_rl-vllm-<pid>-<n>-*`` (``sync_dir`` "" = the system temp folder), after
    sweeping what dead runs left there (:func:`sweep_sync_dir`, logged under ``who``, e.g. ``"vllm engine"``)."""
    root = Path(sync_dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    swept = sweep_sync_dir(root)
    if swept:
        log.warning("%s: removed %d sync folder(s) of dead runs from %s", who, swept, root)
    with _LOCK:
        _COUNTER[0] += 1
        n = _COUNTER[0]
    return Path(tempfile.mkdtemp(prefix=f"{SYNC_PREFIX}{os.getpid()}-{n}-", dir=root))
