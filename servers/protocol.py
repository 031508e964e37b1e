"""uvicorn's HTTP/1.1 protocol (h11) with a header timeout and a body timeout: a connection that has not sent a whole
request head (request line and headers) within ``header_timeout_s`` of connecting, or of starting its next request,
is closed; so is one that has not sent the whole body within ``body_timeout_s`` of the end of its head (the app then
reads ``http.disconnect``).

uvicorn has neither timeout: its keep-alive timer runs only between requests and stops at the first byte, so a
client that sends half a request line and then nothing held its connection (and a file descriptor, before any
auth) forever, and an authenticated one that stops mid-body held its connection and the request's task.
``tests/servers/test_server_bounds.py`` opens 1000 such connections of each kind and sees every one closed.
WebSocket upgrades leave this protocol at the end of their head, so an open WebSocket is not affected.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["BODY_TIMEOUT_S", "HEADER_TIMEOUT_S", "header_timeout_protocol"]

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0


class _HeaderTimeoutH11(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_state: Any = None  # the h11 state the deadline is armed for (IDLE: head, SEND_BODY: body)
        self._watch()

    def _watch(self) -> None:
        """Arm the deadline while the client is sending a request head (IDLE) or body (SEND_BODY), re-armed when it
        moves from one to the other; disarm it once the request is in."""
        state = self.conn.their_state if not self.transport.is_closing() else None
        if state not in (h11.IDLE, h11.SEND_BODY):
            state = None
        if state is self._deadline_state:
            return
        self._disarm()
        if state is not None:
            timeout = self.header_timeout_s if state is h11.IDLE else self.body_timeout_s
            self._deadline = self.loop.call_later(timeout, self._expired, state)
            self._deadline_state = state

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
        self._deadline, self._deadline_state = None, None

    def _expired(self, state: Any) -> None:
        self._deadline, self._deadline_state = None, None
        if self.conn.their_state is state and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.transport.is_closing():
            self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # between requests uvicorn's keep-alive timer takes over

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def header_timeout_protocol(timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S
                            ) -> type[Any]:
    """uvicorn's h11 protocol class closing connections whose request head takes longer than ``timeout_s``, or
    whose body takes longer than ``body_timeout_s`` after the head
    (``uvicorn.Config(app, http=header_timeout_protocol(10.0, 30.0))``)."""
    for name, value in (("header", timeout_s), ("body", body_timeout_s)):
        if not value > 0:
            raise ValueError(f"{name} timeout must be > 0 seconds, got {value!r}")
    return type("HeaderTimeoutH11Protocol", (_HeaderTimeoutH11,),
                {"header_timeout_s": float(timeout_s), "body_timeout_s": float(body_timeout_s)})
