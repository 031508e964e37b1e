"""Console progress of long phases (env server starting, model loading, rollout, update, checkpoint, eval).

On a terminal: a tqdm bar per phase (episodes finished / total, turns, generated tokens/s). Otherwise (a log file, a
pipe, CI): plain timestamped lines, at most one every ``interval_s`` seconds per phase plus one when it ends, so a
log never fills with carriage returns. A heartbeat thread repeats the current phase's line (or refreshes the bar's
clock) when nothing happened for ``interval_s`` (e.g. while ALFWorld env resets run), so the display never looks
stuck. Everything goes to stderr; stdout keeps the tables and results.
"""

from __future__ import annotations

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
        self.t_start = time.monotonic()
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
            total = f"/{self._total}" if self._total is not None else ""
            self.note(f"{self._name}: {self._done}{total} episodes, {self._fields()}")

    def end(self) -> None:
        """Close the current phase's bar (the heartbeat stays quiet until the next phase)."""
        self._active = False
        if self._bar is not None:
            self._bar.close()
            self._bar = None
