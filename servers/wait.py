"""Wait until env servers answer ``GET /health`` with 200: ``python -m servers.wait URL [URL ...]``.

The compose file's ``envs`` service runs it (``docker compose run --rm envs`` / ``podman-compose run --rm envs``
returns once every env server serves), because compose's ``depends_on: condition: service_healthy`` and
HEALTHCHECK timers are not honoured by every engine (podman 4.3 ignores both). ``scripts/check_compose.sh`` runs it
on the host against the published ports. Standard library only (it runs in the images and on a bare host).
:func:`wait_healthy` is the project's one "wait until ``/health``": the trainer's own env server
(``agent_rl.runtime.EnvServerProcess``), the Ray backend's replicas, the scripts and benchmarks that start a server
all call it, with the server's process to watch (a server that exits stops the wait at once, naming its exit code).

Exit status: 0 once every URL answered 200; 1 after ``--timeout`` seconds (the message names the URLs still down
and the last error of each).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["ServerExited", "wait_healthy"]


class ServerExited(RuntimeError):
    """The watched server process exited before ``/health`` answered 200 (``returncode``: its exit status)."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


def _healthy(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> tuple[bool, str]:
    """(True, "") when ``url/health`` answers 200 (``headers`` sent), else (False, the reason)."""
    request = urllib.request.Request(url.rstrip("/") + "/health", headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status == 200, f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, reset, DNS not ready, timeout
        return False, f"{type(exc).__name__}: {exc}"


def wait_healthy(urls: list[str], *, timeout_s: float = 600.0, interval_s: float = 1.0,
                 request_timeout_s: float = 4.0, process: Any = None,
                 headers: dict[str, str] | None = None) -> dict[str, float]:
    """Poll every URL's ``/health`` until each answered 200 once.

    Args:
        urls: base URLs (``http://host:port``).
        timeout_s: seconds to wait at most. interval_s: seconds between polls. request_timeout_s: per request.
        process: the server's process (anything with ``poll()`` and ``returncode``, e.g. ``subprocess.Popen``), when
            the caller started it: checked before every poll, so a server that dies is reported at once.
        headers: sent with every poll (a server whose ``/health`` wants a key).

    Returns:
        seconds from the call until each URL was first healthy.

    Raises:
        TimeoutError: some URL was not healthy within ``timeout_s`` seconds (the message names it and its last
            error).
        ServerExited: ``process`` exited first (the message names its exit code and the URLs still down).
    """
    t0 = time.monotonic()
    pending = {u: "not tried" for u in urls}
    ready: dict[str, float] = {}
    while True:
        if process is not None and process.poll() is not None:
            raise ServerExited(f"the server process exited with code {process.returncode} before "
                               f"{', '.join(pending)} answered /health 200", process.returncode)
        for url in list(pending):
            ok, reason = _healthy(url, request_timeout_s, headers)
            if ok:
                ready[url] = time.monotonic() - t0
                del pending[url]
            else:
                pending[url] = reason
        if not pending:
            return ready
        if time.monotonic() - t0 > timeout_s:
            down = "; ".join(f"{u}: {r}" for u, r in pending.items())
            raise TimeoutError(f"not healthy after {timeout_s:.0f} s: {down}")
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servers.wait", description=__doc__.split("\n")[0])
    p.add_argument("urls", nargs="+", help="base URLs, e.g. http://127.0.0.1:8001")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait at most (default 600)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    args = p.parse_args(argv)
    try:
        ready = wait_healthy(args.urls, timeout_s=args.timeout, interval_s=args.interval)
    except TimeoutError as exc:
        print(f"servers.wait: {exc}", file=sys.stderr, flush=True)
        return 1
    print("env servers healthy: " + ", ".join(f"{u} ({s:.1f} s)" for u, s in ready.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
