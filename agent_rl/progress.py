"""Console progress of long phases (env server starting, model loading, rollout, update, checkpoint, eval).

On a terminal: a tqdm bar per phase (episodes finished / total, turns, generated tokens/s). Otherwise (a log file, a
pipe, CI): plain timestamped lines, at most one every ``interval_s`` seconds per phase plus one when it ends, so a
log never fills with carriage returns. A heartbeat thread repeats the current phase's line (or refreshes the bar's
clock) when nothing happened for ``interval_s`` (e.g. while ALFWorld env resets run), so the display never looks
stuck. Everything goes to stderr; stdout keeps the tables and results. :func:`quiet_library_progress` turns the
libraries' own bars (transformers' GGUF conversion and weight loading, huggingface_hub, datasets) off when the
output is not a terminal, so a log holds no carriage return.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Any, TextIO


class Progress:
    """Phase-by-phase progress display.

    Args:
        enabled: False = silent (tests, ``trainer.progress=false`` still gets the plain lines of :meth:`note`).
        stream: where to write (default stderr).
        interval_s: plain-line mode: seconds between two lines of one phase.
        tty: force the bar (True) or the plain lines (False); default: ``stream.isatty()``.
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, interval_s: float = 10.0,
                 tty: bool | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s
        self.t_start = time.monotonic()  # the run's one clock: every phase of the command is stamped from it
        self.stage = ""
        """The part of the run a step belongs to, named in its phases (:func:`step_phase`): "" = RL; the warm
        start sets ``warm start i/n`` (its round i of n)."""
        self._bar: Any = None
        self._name = ""
        self._total: int | None = None
        self._done = 0
        self._turns = 0
        self._tokens = 0
        self._t_phase = self.t_start
        self._last_line = 0.0
        self._lock = threading.RLock()
        self._active = False
        if enabled and interval_s > 0:
            threading.Thread(target=self._heartbeat, name="progress-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        while True:
            time.sleep(min(1.0, self.interval_s))
            with self._lock:
                if self._active and time.monotonic() - self._last_line >= self.interval_s:
                    if self._bar is not None:
                        self._bar.refresh()
                        self._last_line = time.monotonic()
                    else:
                        self._refresh()

    # ------------------------------------------------------------------ output
    def _stamp(self) -> str:
        s = int(time.monotonic() - self.t_start)
        return f"[{s // 60:02d}:{s % 60:02d}]"

    def note(self, message: str) -> None:
        """One line (above the bar on a terminal)."""
        line = f"{self._stamp()} {message}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def phase(self, name: str, total: int | None = None) -> None:
        """Start phase ``name`` (closing the previous one); ``total`` = episodes expected (a bar), else a line."""
        with self._lock:
            self._phase(name, total)

    def _phase(self, name: str, total: int | None) -> None:
        self.end()
        self._active = True
        self._name, self._total, self._done, self._turns, self._tokens = name, total, 0, 0, 0
        self._t_phase = self._last_line = time.monotonic()
        if not self.enabled:
            return
        if total is not None and self.tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=name, unit="ep", file=self.stream, dynamic_ncols=True, leave=False)
        else:
            self.note(f"{name}" + (f": 0/{total} episodes" if total is not None else " ..."))

    def _fields(self) -> str:
        dt = max(time.monotonic() - self._t_phase, 1e-9)
        return f"turns {self._turns}, {self._tokens / dt:.1f} tok/s, {dt:.0f} s"

    def turn(self, tokens: int) -> None:
        """One generated turn of ``tokens`` tokens (0 for a scripted policy)."""
        with self._lock:
            self._turns += 1
            self._tokens += int(tokens)
            self._refresh()

    def episode(self, won: bool = False) -> None:
        """One finished episode."""
        with self._lock:
            self._done += 1
            if self._bar is not None:
                self._bar.update(1)
            self._refresh(force=self._total is not None and self._done >= self._total)

    def _refresh(self, force: bool = False) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(self._fields(), refresh=False)
            return
        now = time.monotonic()
        if force or now - self._last_line >= self.interval_s:
            self._last_line = now
            if self._total is None and not self._done and not self._turns:  # a phase that plays nothing: update
                self.note(f"{self._name}: {time.monotonic() - self._t_phase:.0f} s")
                return
            total = f"/{self._total}" if self._total is not None else ""
            self.note(f"{self._name}: {self._done}{total} episodes, {self._fields()}")

    def end(self) -> None:
        """Close the current phase's bar (the heartbeat stays quiet until the next phase)."""
        self._active = False
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def step_phase(progress: Any, step: int, total: int, what: str) -> str:
    """The name of step ``step``'s phase ``what`` (rollout, update, checkpoint): ``RL step 1/4: rollout``, or in a
    stage of the run (``progress.stage``, the warm start's round) ``warm start 2/3: update 5/8`` (``progress``: any
    display; one without a stage is RL's)."""
    stage = getattr(progress, "stage", "")
    return f"{stage}: {what} {step}/{total}" if stage else f"RL step {step}/{total}: {what}"


#: the environment variables that turn library progress bars off, read by libraries imported later and by child
#: processes (env servers): huggingface_hub, datasets, and tqdm's own default (``disable``)
QUIET_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")


def quiet_library_progress(stream: TextIO | None = None) -> bool:
    """Turn the libraries' progress bars off when ``stream`` (default stderr) is not a terminal (a log file, a
    pipe, CI): a tqdm bar there writes a carriage-return line per refresh. Sets :data:`QUIET_ENV` (unless set), calls
    transformers' and huggingface_hub's switches, and makes ``disable=True`` tqdm's default in this process (tqdm
    reads ``TQDM_DISABLE`` only when imported; a bar that passes ``disable`` itself keeps it: this module's own
    :class:`Progress` draws a bar on a terminal only). Returns whether it quieted them (False on a terminal)."""
    stream = stream or sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return False
    for var in QUIET_ENV:
        os.environ.setdefault(var, "1")
    import tqdm.std  # deferred: the bars' library, imported by transformers anyway

    init = tqdm.std.tqdm.__init__
    if not getattr(init, "quiet", False):
        quiet = functools.partialmethod(init, disable=True)
        quiet.quiet = True  # type: ignore[attr-defined]
        tqdm.std.tqdm.__init__ = quiet  # type: ignore[method-assign]
    try:
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        disable_progress_bars()
        hf_logging.disable_progress_bar()
    except ImportError:  # without them there are no such bars
        pass
    return True
