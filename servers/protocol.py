"""uvicorn's HTTP/1.1 protocol (h11) with a header timeout: a connection that has not sent a whole request head
(request line and headers) within ``timeout_s`` of connecting, or of starting its next request, is closed.

uvicorn has no such timeout: its keep-alive timer runs only between requests and stops at the first byte, so a
client that sends half a request line and then nothing held its connection (and a file descriptor, before any
auth) forever. ``tests/servers/test_server_bounds.py`` opens 1000 such connections and sees every one closed.
WebSocket upgrades leave this protocol at the end of their head, so an open WebSocket is not affected.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEADER_TIMEOUT_S", "header_timeout_protocol"]

HEADER_TIMEOUT_S = 10.0


class _HeaderTimeoutH11(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._watch_head()

    def _watch_head(self) -> None:
        """Arm the timer while the client is still sending a request head; disarm it once the head is in."""
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)
        elif not waiting and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.transport.is_closing():
            self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._head_timer is not None:  # between requests uvicorn's keep-alive timer takes over
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


def header_timeout_protocol(timeout_s: float = HEADER_TIMEOUT_S) -> type[Any]:
    """uvicorn's h11 protocol class closing connections whose request head takes longer than ``timeout_s``
    (``uvicorn.Config(app, http=header_timeout_protocol(10.0))``)."""
    if not timeout_s > 0:
        raise ValueError(f"header timeout must be > 0 seconds, got {timeout_s!r}")
    return type("HeaderTimeoutH11Protocol", (_HeaderTimeoutH11,), {"header_timeout_s": float(timeout_s)})
