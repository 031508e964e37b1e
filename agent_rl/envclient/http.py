"""``HTTPEnvPool``: the env pool over one or more ``servers.serve`` servers, through one pooled httpx client."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx

from agent_rl.aio import gather_all
from agent_rl.envclient.base import (
    EnvClientError,
    EnvPoolBase,
    EnvServerError,
    EnvUnavailable,
    PoolCaps,
    ResetResult,
    SessionNotFound,
    SnapshotNotFound,
    StepResult,
    client_error,
)
from envs.hosting.jsonable import lone_surrogate, to_jsonable
from envs.numbers import RewardError, checked_reward
from servers.launch import TOKEN_ENV

__all__ = ["DEFAULT_TIMEOUT", "HTTPEnvPool"]

# Per phase: connecting is quick or the server is down; reading waits for an env call (ALFWorld resets take seconds
# of CPU, more when the server is busy); acquiring a pooled connection waits for other requests of this client.
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=60.0)

# A JSON escape of a UTF-16 surrogate (paired ones too: those decode fine, the scrub below leaves them as they are).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _refuse_invalid_text(**fields: Any) -> None:
    """``EnvClientError(code="invalid_request")`` for a lone UTF-16 surrogate in a request field: it has no UTF-8
    encoding, so it cannot be sent (the server would answer 422; ``LocalEnvPool`` refuses it with the same message)."""
    for name, value in fields.items():
        found = lone_surrogate(value, name)
        if found:
            raise EnvClientError(found, code="invalid_request")


class HTTPEnvPool(EnvPoolBase):
    """Env sessions on remote env servers (implements :class:`agent_rl.envclient.EnvPool`).

    New sessions go to the URL holding the fewest of this pool's live sessions (ties in turn); the pool remembers
    which URL holds each session. Connection errors and 503 (at capacity) are retried ``retries`` times with
    exponential backoff (``backoff_s * 2**attempt``, at most ``max_backoff_s``), honouring ``Retry-After``; a new
    session moves on to the next URL when one fails. A step is retried only when its request never reached the
    server (connect errors), since a step is not idempotent.

    Sessions whose fate is unknown are never left behind: the pool names each new session itself (``session_id`` in
    ``POST /sessions``), so a reset whose answer was lost (timeout, dropped connection, cancelled) and a close that
    failed (server down or stopped) leave an *orphan* that the pool deletes later: in the background at its next
    ``reset`` and, bounded by ``orphan_timeout_s``, in :meth:`aclose` (a server that restarted has none: 404 is fine).

    Args:
        urls: one base URL or several (``"http://127.0.0.1:8001"``).
        token: bearer token of the servers (``--token``); ``None``: ``$AGENT_RL_SERVER_TOKEN`` when set (the
            variable ``servers.serve`` reads, ``servers.launch.TOKEN_ENV``), else none.
        timeout: ``httpx.Timeout`` per phase (see ``DEFAULT_TIMEOUT``).
        max_connections: connection pool size; size it to the rollout concurrency.
        retries: extra attempts after a connect error or a 503.
        backoff_s: first backoff, seconds.
        transport: an httpx transport (tests pass ``httpx.ASGITransport(app)``).
        orphan_timeout_s: deadline of one orphan ``DELETE`` and of the final clean-up in :meth:`aclose`.
    """

    caps = PoolCaps(snapshots=True)

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        token: str | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        max_connections: int = 256,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        orphan_timeout_s: float = 10.0,
    ) -> None:
        self.urls = [urls.rstrip("/")] if isinstance(urls, str) else [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ValueError("HTTPEnvPool needs at least one URL")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers=headers,
            transport=transport,
        )
        self._url_of: dict[str, str] = {}  # session id -> URL of the server that holds it
        self._snapshot_url: dict[str, str] = {}  # snapshot id -> URL of the server that keeps it
        self._load: Counter[str] = Counter({u: 0 for u in self.urls})
        self._turn = 0
        self.orphan_timeout_s = orphan_timeout_s
        self._orphans: dict[str, str] = {}  # session id -> URL: sessions that may exist, to delete when reachable
        self._reaper: asyncio.Task[None] | None = None
        self.orphans_closed = 0  # orphans deleted so far (they existed on the server)

    # ---- plumbing --------------------------------------------------------------------------------------------
    def _backoff(self, attempt: int, response: httpx.Response | None = None) -> float:
        """Seconds to wait before retry ``attempt`` (0-based): ``Retry-After`` if given, else exponential."""
        if response is not None and (value := response.headers.get("Retry-After")):
            try:
                return min(self.max_backoff_s, max(0.0, float(value)))
            except ValueError:
                when = email.utils.parsedate_to_datetime(value)
                if when is not None:
                    return min(self.max_backoff_s, max(0.0, when.timestamp() - time.time()))
        return min(self.max_backoff_s, self.backoff_s * 2**attempt)

    async def _send(self, method: str, url: str, path: str, body: Any = None) -> httpx.Response:
        """One request; connect errors become ``EnvUnavailable`` (retryable), other transport errors
        ``EnvServerError``; a pool timeout is this client's own limit, reported as such."""
        try:
            return await self._client.request(method, url + path, json=body)
        except httpx.PoolTimeout as exc:
            raise EnvUnavailable("timed out waiting for a free connection in the client's pool: raise "
                                 "max_connections or lower the rollout concurrency") from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise EnvUnavailable(f"cannot connect to {url}: {exc!r}") from exc
        except httpx.TimeoutException as exc:
            raise EnvServerError(f"{method} {url}{path} timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise EnvServerError(f"{method} {url}{path} failed: {exc!r}") from exc

    @staticmethod
    def _check(response: httpx.Response) -> Any:
        """The JSON body of a 2xx response, else the matching ``EnvClientError``."""
        if response.is_success:
            if not response.content:
                return None
            payload = response.json()
            # Our servers send valid Unicode; a server that escapes a lone surrogate would hand the trainer text
            # that cannot be tokenized: the same rule as the server's (U+FFFD, docs/servers.md "Text")
            return to_jsonable(payload) if _SURROGATE_ESCAPE.search(response.content) else payload
        try:
            payload = response.json()
        except ValueError:
            payload = {"detail": response.text}
        detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
        code = payload.get("code") if isinstance(payload, dict) else None
        status = response.status_code
        message = f"{response.request.method} {response.request.url.path} -> {status}: {detail}"
        raise client_error(message, status=status, code=code,
                           session_route="/sessions/" in response.request.url.path)

    def _url_for(self, session_id: str) -> str:
        try:
            return self._url_of[session_id]
        except KeyError:
            raise SessionNotFound(f"session {session_id!r} was not opened by this pool (or is closed)") from None

    # ---- EnvPool ---------------------------------------------------------------------------------------------
    async def reset(
        self,
        env_id: str,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> ResetResult:
        """Open a session on the least-loaded server (``POST /sessions``); see the class docstring for retries.
        Text that is not valid Unicode (a lone surrogate in ``env_id``, ``options`` or ``env_kwargs``) is refused
        here (``EnvClientError``, ``code="invalid_request"``), as the server would (422)."""
        _refuse_invalid_text(env_id=env_id, options=options, env_kwargs=env_kwargs)
        self._reap_orphans_soon()
        session_id = uuid.uuid4().hex
        body = {"env_id": env_id, "seed": seed, "options": options, "env_kwargs": env_kwargs,
                "session_id": session_id}
        self._turn += 1
        order = sorted(self.urls, key=lambda u: (self._load[u], (self.urls.index(u) - self._turn) % len(self.urls)))
        error: EnvClientError | None = None
        for attempt in range(self.retries + 1):
            url = order[attempt % len(order)]
            response = None
            try:
                try:
                    response = await self._send("POST", url, "/sessions", body)
                except (EnvServerError, asyncio.CancelledError):
                    # the request may have reached the server (timeout, connection dropped mid-answer,
                    # cancelled by the caller's deadline): the session may exist, delete it later
                    self._orphans[session_id] = url
                    raise
                payload = self._check(response)
            except EnvUnavailable as exc:  # never reached the server, or 503: no session was opened
                error = exc
                if attempt < self.retries:
                    # Move on at once to another server if there is one; back off once all were tried.
                    if (attempt + 1) % len(order) == 0:
                        await asyncio.sleep(self._backoff(attempt // len(order), response))
                    continue
                raise
            self._url_of[payload["session_id"]] = url
            self._load[url] += 1
            return ResetResult(payload["session_id"], payload["observation"], payload.get("info") or {})
        raise error or EnvUnavailable("no server answered")  # pragma: no cover (loop always returns or raises)

    async def step(self, session_id: str, action: str) -> StepResult:
        """``POST /sessions/{id}/step``; retried only on connect errors. A non-``str`` action, or one holding a lone
        UTF-16 surrogate, is refused here (``EnvClientError``, ``code="invalid_request"``), as the server would
        (422) if it could be sent at all. An answer whose reward breaks :func:`envs.numbers.checked_reward` (null,
        NaN, inf, beyond float32) raises ``EnvServerError`` (``code="invalid_reward"``): an env failure."""
        if not isinstance(action, str):
            raise EnvClientError(f"action must be a str, got {type(action).__name__}", code="invalid_request")
        _refuse_invalid_text(action=action)
        url = self._url_for(session_id)
        for attempt in range(self.retries + 1):
            try:
                response = await self._send("POST", url, f"/sessions/{session_id}/step", {"action": action})
                break
            except EnvUnavailable:
                if attempt == self.retries:
                    raise
                await asyncio.sleep(self._backoff(attempt))
        payload = self._check(response)
        try:  # a server that is not this project's may answer null (a NaN in JSON), inf or 1e308
            reward = checked_reward(payload.get("reward"), "the env server's reward")
        except RewardError as exc:
            raise EnvServerError(f"{exc} (POST {url}/sessions/{session_id}/step)", status=response.status_code,
                                 code="invalid_reward") from None
        return StepResult(payload["observation"], reward, bool(payload["terminated"]),
                          bool(payload["truncated"]), payload.get("info") or {})

    async def close(self, session_id: str) -> None:
        """``DELETE /sessions/{id}``; an unknown or expired session is not an error. When the server cannot be
        reached (down, stopped, connection lost) the session becomes an orphan, deleted later (class docstring)."""
        url = self._url_of.pop(session_id, None)
        if url is None:
            return
        self._load[url] -= 1
        try:
            self._check(await self._send("DELETE", url, f"/sessions/{session_id}"))
        except SessionNotFound:
            pass
        except (EnvUnavailable, EnvServerError):
            self._orphans[session_id] = url
        except asyncio.CancelledError:  # e.g. the caller's deadline: the DELETE may not have been applied
            self._orphans[session_id] = url
            raise

    # ---- env-state snapshots (EnvPool's optional methods; the state stays on the server) -----------------------
    async def snapshot(self, session_id: str) -> str:
        """``POST /sessions/{id}/snapshot`` -> the snapshot id (kept on the session's server, owned by this client;
        422 ``EnvClientError`` when the env has no ``clone_state``/``set_state``)."""
        url = self._url_for(session_id)
        payload = self._check(await self._send("POST", url, f"/sessions/{session_id}/snapshot"))
        self._snapshot_url[payload["snapshot_id"]] = url
        return str(payload["snapshot_id"])

    async def restore(self, snapshot_id: str) -> ResetResult:
        """``POST /snapshots/{id}/restore``: a new session in the snapshot's state, on the server that keeps it (an
        answer lost on the way leaves an orphan session, deleted later like a lost reset's)."""
        url = self._snapshot_url.get(snapshot_id)
        if url is None:
            raise SnapshotNotFound(f"snapshot {snapshot_id!r} was not taken by this pool (or is dropped)")
        session_id = uuid.uuid4().hex
        try:
            response = await self._send("POST", url, f"/snapshots/{snapshot_id}/restore", {"session_id": session_id})
        except (EnvServerError, asyncio.CancelledError):
            self._orphans[session_id] = url
            raise
        payload = self._check(response)
        self._url_of[payload["session_id"]] = url
        self._load[url] += 1
        return ResetResult(payload["session_id"], payload["observation"], payload.get("info") or {})

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """``DELETE /snapshots/{id}`` (idempotent; a server that cannot be reached drops it at its TTL)."""
        url = self._snapshot_url.pop(snapshot_id, None)
        if url is None:
            return
        with contextlib.suppress(SnapshotNotFound, EnvUnavailable, EnvServerError):
            self._check(await self._send("DELETE", url, f"/snapshots/{snapshot_id}"))

    # ---- orphans ---------------------------------------------------------------------------------------------
    @property
    def orphans(self) -> dict[str, str]:
        """Sessions this pool could not confirm closed (id -> URL), deleted when their server answers again."""
        return dict(self._orphans)

    async def close_orphans(self, timeout_s: float | None = None) -> int:
        """Try once to delete every orphan (``DELETE``, each bounded by ``timeout_s``, default
        ``orphan_timeout_s``); returns how many are left (server still unreachable)."""
        timeout_s = self.orphan_timeout_s if timeout_s is None else timeout_s

        async def one(session_id: str, url: str) -> None:
            try:
                response = await asyncio.wait_for(self._send("DELETE", url, f"/sessions/{session_id}"), timeout_s)
                self._check(response)
                self.orphans_closed += 1
            except SessionNotFound:
                pass  # never opened, already expired, or the server restarted
            except (EnvClientError, asyncio.TimeoutError):
                return  # still unreachable: keep it for the next try
            self._orphans.pop(session_id, None)

        await gather_all(*(one(s, u) for s, u in list(self._orphans.items())))  # cancelled or failed: none left running
        return len(self._orphans)

    def _reap_orphans_soon(self) -> None:
        """Delete orphans in the background (one clean-up task at a time; never delays the caller)."""
        if self._orphans and (self._reaper is None or self._reaper.done()):
            self._reaper = asyncio.ensure_future(self.close_orphans())

    async def aclose(self) -> None:
        """Close this pool's open sessions and orphans (best effort, bounded), then the HTTP client."""
        await asyncio.gather(*(self.close(s) for s in list(self._url_of)), return_exceptions=True)
        if self._reaper is not None and not self._reaper.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._reaper, self.orphan_timeout_s)
        if self._orphans:
            with contextlib.suppress(Exception):
                await self.close_orphans()
        await self._client.aclose()

    async def health(self) -> list[dict[str, Any]]:
        """``GET /health`` of every server (raises if one is down)."""
        return [self._check(await self._send("GET", u, "/health")) for u in self.urls]

    def url_of(self, session_id: str) -> str:
        """Base URL of the server holding the session (``SessionNotFound`` if this pool did not open it)."""
        return self._url_for(session_id)

    @property
    def sessions_per_url(self) -> dict[str, int]:
        """Live sessions this pool holds on each URL."""
        return dict(self._load)

    async def __aenter__(self) -> HTTPEnvPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
