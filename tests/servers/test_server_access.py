"""Who may call the env server and what each caller reaches (``servers/access.py``, issue 32's trust floor): two
clients of one ``--token-file`` server on every surface (session API, OpenEnv WebSocket with openenv-core's client,
MCP with the mcp SDK's client): A's sessions cannot be stepped, reset, read, closed or listed by B; an
``/envs/<X>/...`` surface reaches only env X's sessions; empty tokens are refused at start and as credentials; the
docs pages need the token; a server without a token refuses foreign ``Host`` and ``Origin`` headers (HTTP and
WebSocket); a launched server's token is in no process's argv and in no env worker's environment."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from time import monotonic as time_now
from time import sleep

import httpx2
import pytest
import websockets.exceptions
import websockets.sync.client
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from openenv import GenericEnvClient

from served_envs import ROOT, start_server
from servers.openenv import openenv_path
from servers_helpers import CALC, ECHO, free_port, make_app, serve_asgi, uvicorn_in_thread, wait_healthy
from waiting import HANG_S, http

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

TOKEN_ENV = "AGENT_RL_SERVER_TOKEN"  # servers.launch.TOKEN_ENV
TOKENS = {"alice": "tok-alice-5b1e", "bob": "tok-bob-77c2"}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def mcp_client(url: str, env_id: str, name: str) -> Client:
    return Client(streamable_http_client(url + openenv_path(env_id) + "/mcp",
                                         http_client=httpx2.AsyncClient(headers=auth(name), timeout=HANG_S)))


def listed(url: str, name: str) -> list[dict]:
    r = http.get(url + "/sessions", headers=auth(name), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["sessions"]


@pytest.fixture(scope="module")
def two_clients(tmp_path_factory):
    """``python -m servers.serve --token-file`` with clients alice and bob, serving the calculator and Echo."""
    folder = tmp_path_factory.mktemp("access")
    token_file = folder / "tokens.txt"
    token_file.write_text("# clients\n" + "".join(f"{n}: {t}\n" for n, t in TOKENS.items()))
    proc, url = start_server([CALC, ECHO], ["--token-file", str(token_file), "--import", "user_env_module",
                                            "--workers", "2", "--max-sessions", "8"], folder / "server.log",
                             token=None)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_session_api_session_is_untouchable_by_another_client(two_clients):
    url = two_clients
    r = http.post(url + "/sessions", json={"env_id": CALC, "options": {"index": 0}}, headers=auth("alice"))
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    for method, path, body in [("POST", f"/sessions/{sid}/step", {"action": "calc[6*7]"}),
                               ("POST", f"/sessions/{sid}/reset", {}), ("DELETE", f"/sessions/{sid}", None)]:
        r = http.request(method, url + path, json=body, headers=auth("bob"))
        assert (r.status_code, r.json()["code"]) == (404, "session_not_found"), (path, r.text)
    assert sid not in [s["session_id"] for s in listed(url, "bob")]
    mine = {s["session_id"]: s for s in listed(url, "alice")}
    assert mine[sid]["steps"] == 0 and mine[sid]["episodes"] == 1  # untouched by bob's tries
    assert all("worker_pid" not in s for s in mine.values())
    # bob cannot take the id either, and an empty or a wrong credential is no client
    for headers in [{"Authorization": "Bearer"}, {"Authorization": "Basic " + base64.b64encode(b"alice:").decode()},
                    {"Authorization": "Bearer tok-alice"}, {}]:
        r = http.post(url + f"/sessions/{sid}/step", json={"action": "x"}, headers=headers)
        assert (r.status_code, r.json()["code"]) == (401, "unauthorized"), headers
    r = http.post(url + f"/sessions/{sid}/step", json={"action": "calc[6*7]"}, headers=auth("alice"))
    assert (r.status_code, r.json()["observation"]) == (200, "Result: 42")
    assert http.delete(url + f"/sessions/{sid}", headers=auth("alice")).status_code == 204


def test_a_websocket_session_is_untouchable_by_another_client(two_clients):
    url = two_clients
    base = url.replace("://", f"://alice:{TOKENS['alice']}@", 1) + openenv_path(CALC)
    with GenericEnvClient(base_url=base).sync() as env:  # openenv-core's client: Basic auth with alice's token
        sid = env.reset(index=0).observation["session_id"]
        assert sid in [s["session_id"] for s in listed(url, "alice")]
        assert sid not in [s["session_id"] for s in listed(url, "bob")]
        r = http.post(url + f"/sessions/{sid}/step", json={"action": "answer[0]"}, headers=auth("bob"))
        assert (r.status_code, r.json()["code"]) == (404, "session_not_found")
        assert http.delete(url + f"/sessions/{sid}", headers=auth("bob")).status_code == 404
        r = env.step({"action": "calc[17 * 13 - 6]"})  # the episode goes on, untouched
        assert (r.observation["text"], r.done) == ("Result: 215", False)


def test_an_mcp_session_is_untouchable_by_another_client_and_another_env(two_clients):
    url = two_clients

    async def main() -> None:
        async with mcp_client(url, CALC, "alice") as alice:
            r = await alice.call_tool("reset", {"index": 0})
            sid = r.structured_content["session_id"]
            async with mcp_client(url, CALC, "bob") as bob:
                for tool, args in [("calc", {"expression": "6*7", "session_id": sid}),
                                   ("close", {"session_id": sid})]:
                    r = await bob.call_tool(tool, args)
                    assert r.is_error and r.structured_content["error_code"] == "session_not_found", tool
                    assert r.structured_content["status"] == 404
                r = await bob.call_tool("reset", {"index": 0, "session_id": sid})  # a new session of bob's
                assert r.structured_content["session_id"] != sid
                assert not (await bob.call_tool("close", {"session_id": r.structured_content["session_id"]})).is_error
            # the same client, through another env's MCP endpoint: Echo's cannot play a calculator session
            async with mcp_client(url, ECHO, "alice") as echo:
                r = await echo.call_tool("act", {"command": "calc[6*7]", "session_id": sid})
                assert r.is_error and r.structured_content["error_code"] == "session_not_found"
                r = await echo.call_tool("close", {"session_id": sid})
                assert r.is_error and r.structured_content["error_code"] == "session_not_found"
            r = await alice.call_tool("calc", {"expression": "17 * 13 - 6", "session_id": sid})  # untouched
            assert (r.structured_content["observation"], r.structured_content["reward"]) == ("Result: 215", 0.0)
            assert [s["steps"] for s in listed(url, "alice") if s["session_id"] == sid] == [1]
            assert not (await alice.call_tool("close", {"session_id": sid})).is_error

    asyncio.run(main())


def test_an_mcp_session_id_answers_only_its_client(two_clients):
    """The MCP session (``Mcp-Session-Id``) itself: bob's request or DELETE with alice's id is a 404, as for an
    unknown id (the mcp SDK's own session ownership), and alice's episode stays."""
    url = two_clients
    mcp = url + openenv_path(CALC) + "/mcp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    r = http.post(mcp, json=init, headers={**accept, **auth("alice")})
    assert r.status_code == 200, r.text
    session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    http.post(mcp, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
               headers={**accept, **auth("alice"), **session})
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "reset", "arguments": {"index": 0}}}
    r = http.post(mcp, json=call, headers={**accept, **auth("alice"), **session})
    sid = r.json()["result"]["structuredContent"]["session_id"]
    step = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "calc", "arguments": {"expression": "6*7"}}}
    assert http.post(mcp, json=step, headers={**accept, **auth("bob"), **session}).status_code == 404
    assert http.delete(mcp, headers={**auth("bob"), **session}).status_code == 404
    assert sid in [s["session_id"] for s in listed(url, "alice")]
    r = http.post(mcp, json=step, headers={**accept, **auth("alice"), **session})
    assert r.json()["result"]["structuredContent"]["observation"] == "Result: 42"
    assert http.delete(mcp, headers={**auth("alice"), **session}).status_code == 200
    assert sid not in [s["session_id"] for s in listed(url, "alice")]  # the MCP session's end closed it


def test_docs_and_schema_pages_need_the_token(two_clients):
    for path in ("/docs", "/redoc", "/openapi.json"):
        r = http.get(two_clients + path)
        assert (r.status_code, r.json()["code"]) == (401, "unauthorized"), path
        assert r.headers["www-authenticate"].startswith("Basic")  # a browser asks for it
        assert http.get(two_clients + path, headers={"Authorization": "Bearer"}).status_code == 401
        assert http.get(two_clients + path, headers=auth("bob")).status_code == 200, path
    # the health checks stay open but tell an unauthenticated caller nothing else: no pids, env ids or load
    open_health = http.get(two_clients + "/health")
    assert (open_health.status_code, open_health.json()) == (200, {"status": "ok"})
    keyed = http.get(two_clients + "/health", headers=auth("bob")).json()
    assert keyed["status"] == "ok" and keyed["worker_pids"] and keyed["env_ids"]


def test_one_token_server_keeps_envs_apart_and_hides_pids_and_docs():
    """The issue's inputs on a single ``--token`` server (one client): the Echo env's MCP endpoint cannot play a
    calculator session opened over the session API (today: ``Result: 42``) nor close it; ``GET /sessions`` names no
    worker pid; the docs pages and an empty credential get 401."""
    app = make_app(token="s3cret")
    port = free_port()
    with uvicorn_in_thread(app, port):
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        ok = {"Authorization": "Bearer s3cret"}
        sid = http.post(url + "/sessions", json={"env_id": CALC, "options": {"index": 0}}, headers=ok).json()[
            "session_id"]

        async def main() -> None:
            client = Client(streamable_http_client(url + openenv_path(ECHO) + "/mcp",
                                                   http_client=httpx2.AsyncClient(headers=ok, timeout=HANG_S)))
            async with client:
                for tool, args in [("act", {"command": "calc[6*7]", "session_id": sid}),
                                   ("close", {"session_id": sid})]:
                    r = await client.call_tool(tool, args)
                    assert r.is_error and r.structured_content["error_code"] == "session_not_found", r.content

        asyncio.run(main())
        (listed_session,) = http.get(url + "/sessions", headers=ok).json()["sessions"]
        assert listed_session["session_id"] == sid and listed_session["steps"] == 0
        assert "worker_pid" not in listed_session
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert http.get(url + path).status_code == 401, path
        empty = "Basic " + base64.b64encode(b"agent_rl:").decode()
        assert http.post(url + f"/sessions/{sid}/step", json={"action": "x"},
                          headers={"Authorization": empty}).status_code == 401
        r = http.post(url + f"/sessions/{sid}/step", json={"action": "calc[6*7]"}, headers=ok)
        assert r.json()["observation"] == "Result: 42"


# ------------------------------------------------------------------------------------------- refused at start
def serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m servers.serve`` that is expected to exit at start (without ``$AGENT_RL_SERVER_TOKEN`` unless
    ``env`` sets it)."""
    base = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.run([sys.executable, "-m", "servers.serve", "--env", CALC, "--port", str(free_port()), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.parametrize("args, env, why", [
    (["--token", ""], {}, "empty token"),
    (["--token", "   "], {}, "empty token"),
    ([], {TOKEN_ENV: ""}, "empty token"),
    (["--host", "0.0.0.0"], {}, "without a token"),
    (["--token-file", "{file}"], {}, "the token of 'bob' is empty"),
])
def test_an_empty_token_or_an_open_public_bind_exits_at_start(tmp_path: Path, args, env, why):
    (tmp_path / "tokens").write_text("alice: tok-a\nbob:   \n")
    result = serve(*[a.format(file=tmp_path / "tokens") for a in args], env=env)
    assert result.returncode == 2 and why in result.stderr, result.stderr[-2000:]


def test_the_token_file_is_checked(tmp_path: Path):
    from servers.tokens import read_token_file

    path = tmp_path / "tokens"
    path.write_text("# clients\n\nalice: tok-a\n  bob :tok-b  \n")
    assert read_token_file(path) == {"alice": "tok-a", "bob": "tok-b"}
    for text, why in [("alice tok-a\n", "line 1: not 'name: token'"), ("a: t1\na: t2\n", "line 2: client 'a' appears"),
                      ("a: same\nb: same\n", "'a' and 'b' have the same token"), ("# none\n", "no 'name: token'"),
                      ("a: t 1\n", "whitespace"), ("a b: t1\n", "client name 'a b'"), (": t1\n", "client name ''")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=why):
            read_token_file(path)
    with pytest.raises(ValueError, match="cannot read it"):
        read_token_file(tmp_path / "missing")


# ------------------------------------------------------------------------------------------- Host and Origin
def test_a_server_without_a_token_refuses_foreign_hosts_and_origins():
    async def main() -> None:
        app = make_app()  # no token: loopback clients only
        async with serve_asgi(app) as c:
            for host in ("evil.example", "evil.example:8000", "10.0.0.2:8000"):
                for method, path in [("GET", "/sessions"), ("POST", "/sessions"), ("GET", "/docs"),
                                     ("POST", openenv_path(CALC) + "/mcp"), ("POST", openenv_path(CALC) + "/reset")]:
                    r = await c.request(method, path, headers={"Host": host}, json={"env_id": CALC})
                    assert (r.status_code, r.json()["code"]) == (421, "host_not_allowed"), (host, path)
            for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "127.0.0.2"):
                assert (await c.get("/sessions", headers={"Host": host})).status_code == 200, host
            r = await c.post("/sessions", json={"env_id": CALC}, headers={"Origin": "http://evil.example"})
            assert (r.status_code, r.json()["code"]) == (403, "origin_not_allowed")
            r = await c.get("/sessions", headers={"Host": "localhost:8000", "Origin": "http://localhost:8000"})
            assert r.status_code == 200  # the server's own pages (/docs) are same-origin
            assert (await c.get("/sessions")).json()["sessions"] == []
            # MCP's own DNS-rebinding protection is on (the mcp SDK's transport security, behind the gate)
            (transport,) = app.state.mcp[CALC].transports.values()  # one client: servers.tokens.LOCAL_CLIENT
            security = transport.security_settings
            assert security.enable_dns_rebinding_protection and "localhost:*" in security.allowed_hosts

    asyncio.run(main())


def test_a_repeated_credential_or_origin_header_is_refused():
    """Two ``Authorization`` (or ``Origin``) headers are ambiguous (RFC 9110 allows one): a proxy that checks the
    last one and a server that reads the first would act for different clients. Today the first won: ``Bearer
    <alice>`` then ``Bearer <bob>`` (or a wrong token) was alice, an allowed then a foreign ``Origin`` passed."""
    async def main() -> None:
        app = make_app(tokens={"alice": "a-token-1234", "bob": "b-token-5678"})
        async with serve_asgi(app) as c:
            alice, bob = ("Authorization", "Bearer a-token-1234"), ("Authorization", "Bearer b-token-5678")
            for headers in ([alice, bob], [alice, ("Authorization", "Bearer wrong")], [bob, alice],
                            [alice, ("Origin", "http://127.0.0.1"), ("Origin", "http://evil.example")],
                            [alice, ("authorization", "Bearer a-token-1234")]):
                r = await c.get("/sessions", headers=headers)
                assert (r.status_code, r.json()["code"]) == (400, "duplicate_header"), headers
                assert headers[-1][0].lower() in r.json()["detail"].lower()
            assert (await c.get("/sessions", headers=[alice])).status_code == 200

    asyncio.run(main())


def test_a_websocket_from_a_foreign_origin_is_refused_unless_allowed():
    app = make_app(allowed_origins=["http://localhost:3000"])
    port = free_port()
    with uvicorn_in_thread(app, port):
        wait_healthy(f"http://127.0.0.1:{port}")
        ws = f"ws://127.0.0.1:{port}{openenv_path(CALC)}/ws"
        for origin, host in [("http://evil.example", "127.0.0.1"), (None, "evil.example")]:
            # the handshake names `host` (a DNS-rebinding page's name) over a socket to this server
            with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
                websockets.sync.client.connect(ws.replace("127.0.0.1", host), origin=origin, open_timeout=HANG_S,
                                               sock=socket.create_connection(("127.0.0.1", port)))
            assert refused.value.response.status_code == (403 if origin else 421)
            assert b'"code"' in refused.value.response.body
        for origin in ("http://localhost:3000", None):  # allowed by --allow-origin; a non-browser client
            with websockets.sync.client.connect(ws, origin=origin, open_timeout=HANG_S) as conn:
                conn.send('{"type": "reset", "data": {"index": 0}}')
                assert '"session_id"' in conn.recv(timeout=HANG_S)


# ------------------------------------------------------------------------------------------- the launched child
def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def test_a_launched_server_has_its_token_in_no_argv_and_no_worker_environment(tmp_path: Path):
    """``servers.launch.ServerLaunch`` (the local run server's and the Ray replicas' launch): the token is in the
    child's environment, not in ``/proc/<pid>/cmdline``; the server drops it before its env workers start."""
    from servers.launch import ServerLaunch, new_token

    token = new_token()
    assert len(token) >= 32 and token != new_token()
    launch = ServerLaunch([CALC], free_port(), token, workers=2, pythonpath=str(ROOT))
    with open(tmp_path / "server.log", "wb") as log:
        proc = launch.start(cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{launch.port}"
    try:
        wait_healthy(url, proc=proc)
        assert token.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert http.get(url + "/sessions").status_code == 401
        r = http.post(url + "/sessions", json={"env_id": CALC}, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201
        workers = http.get(url + "/health", headers={"Authorization": f"Bearer {token}"}).json()["worker_pids"]
        assert workers and all(token.encode() not in _environ(pid) for pid in workers)
        children = [int(p) for p in (Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())]
        assert children and all(token.encode() not in Path(f"/proc/{p}/cmdline").read_bytes() for p in children)
        assert all(token.encode() not in _environ(pid) for pid in children)  # the forkserver, resource tracker
    finally:
        proc.terminate()
        proc.wait(60)
    with pytest.raises(ValueError, match="non-empty token"):
        ServerLaunch([CALC], 1, "")


_LAUNCHER = """
import subprocess, sys, time
from servers.launch import ServerLaunch
launch = ServerLaunch([sys.argv[1]], int(sys.argv[2]), "tok-launcher-3f9a", workers=1, pythonpath=sys.argv[3])
with open(sys.argv[4], "wb") as log:
    proc = launch.start(cwd=sys.argv[3], stdout=log, stderr=subprocess.STDOUT)
print(proc.pid, flush=True)
time.sleep(3600)
"""


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # re-parented, exited, not yet reaped
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_launched_server_exits_when_its_launcher_is_killed(tmp_path: Path, sig: str):
    """A trainer killed without cleanup (SIGKILL: the OOM killer; SIGTERM: Python's default action runs no
    ``finally``) left its env server running, port and workers held (measured on the ALFWorld main command). The
    launch passes ``--exit-with-parent``: the server and its env workers are gone soon after the launcher."""
    import signal as signals

    import psutil

    port = free_port()
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, CALC, str(port), str(ROOT), str(tmp_path / "s.log")],
                                cwd=ROOT, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        server_pid = int(launcher.stdout.readline())
        wait_healthy(f"http://127.0.0.1:{port}")
        tree = [server_pid, *(p.pid for p in psutil.Process(server_pid).children(recursive=True))]
        assert len(tree) >= 2  # the server and at least its env worker
        assert f"--exit-with-parent {launcher.pid}" in " ".join(psutil.Process(server_pid).cmdline())
        launcher.send_signal(getattr(signals, sig))
        launcher.wait(30)
        deadline = time_now() + 90
        while time_now() < deadline and not all(_gone(p) for p in tree):
            sleep(0.5)
        assert all(_gone(p) for p in tree), [p for p in tree if not _gone(p)]
        assert "launcher (pid" in (tmp_path / "s.log").read_text()
    finally:
        launcher.kill()
        with contextlib.suppress(ProcessLookupError, UnboundLocalError):
            os.kill(server_pid, 9)


def test_another_clients_session_id_is_answered_as_an_unknown_one(two_clients):
    """A 409 ``session_exists`` told bob that alice's chosen id was live, and let him take an id before her: ids are
    now each client's own, so bob's same id opens his own session, and neither touches the other's."""
    url = two_clients
    chosen = "episode-000000001"
    r = http.post(url + "/sessions", json={"env_id": CALC, "options": {"index": 0}, "session_id": chosen},
                   headers=auth("alice"))
    assert r.status_code == 201 and r.json()["session_id"] == chosen, r.text
    r = http.post(url + "/sessions", json={"env_id": CALC, "options": {"index": 0}, "session_id": chosen},
                   headers=auth("bob"))
    assert r.status_code == 201 and r.json()["session_id"] == chosen, r.text  # not 409: no oracle
    r = http.post(url + "/sessions", json={"env_id": CALC, "session_id": chosen}, headers=auth("alice"))
    assert (r.status_code, r.json()["code"]) == (409, "session_exists")  # her own id, live: told to her only
    assert chosen in r.json()["detail"] and "alice" not in r.json()["detail"]
    r = http.post(url + f"/sessions/{chosen}/step", json={"action": "calc[6*7]"}, headers=auth("bob"))
    assert r.json()["observation"] == "Result: 42"
    assert [s["steps"] for s in listed(url, "alice") if s["session_id"] == chosen] == [0]  # hers untouched
    assert [s["steps"] for s in listed(url, "bob") if s["session_id"] == chosen] == [1]
    for name in ("alice", "bob"):
        assert http.delete(url + f"/sessions/{chosen}", headers=auth(name)).status_code == 204
    r = http.delete(url + f"/sessions/{chosen}", headers=auth("bob"))
    assert (r.status_code, r.json()["code"]) == (404, "session_not_found")
    assert r.json()["detail"] == f"no live session {chosen!r} (closed, expired or broken)"
