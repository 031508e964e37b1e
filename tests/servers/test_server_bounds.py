"""Bounded input on every surface (issue 32): JSON nested deeper than ``max_json_depth`` is refused before parsing
with a JSON code (HTTP 400 ``json_too_deep``, a WebSocket error message), a body that is not JSON is 400
``invalid_json``, a tool call nested 1500 deep is an invalid action (200, the session lives), and half-sent requests
are closed after the header timeout. Each input failed before: a RecursionError 500 (pickling to the worker, the 422
handler), a dropped WebSocket, a 400 coded ``invalid_task``, connections held open forever. Authenticated
connections that stop mid-body are closed after the body timeout (before, never)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from servers_helpers import CALC, ECHO, free_port, make_app, serve_asgi, uvicorn_in_thread, wait_healthy
from waiting import closed_by_server

OPENENV = f"/envs/{CALC}"


def deep(n: int) -> str:
    return "[" * n + "]" * n


def post_raw(client, path: str, body: str, **headers):
    return client.post(path, content=body.encode(), headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize("depth", [500, 900, 2000])
def test_deep_json_is_a_400_with_a_code_on_every_http_surface(depth):
    async def main():
        async with serve_asgi(make_app()) as c:
            sid = (await c.post("/sessions", json={"env_id": ECHO})).json()["session_id"]
            mcp_headers = {"accept": "application/json, text/event-stream"}
            cases = [
                ("/sessions", f'{{"env_id": "{CALC}", "options": {{"a": {deep(depth)}}}}}', {}),
                ("/sessions", f'{{"env_id": "{CALC}", "env_kwargs": {{"a": {deep(depth)}}}}}', {}),
                (f"/sessions/{sid}/step", f'{{"action": {deep(depth)}}}', {}),
                (f"/sessions/{sid}/reset", f'{{"options": {{"a": {deep(depth)}}}}}', {}),
                (f"{OPENENV}/reset", f'{{"options": {{"a": {deep(depth)}}}}}', {}),
                (f"{OPENENV}/step", f'{{"action": {{"action": "x", "metadata": {{"a": {deep(depth)}}}}}}}', {}),
                (f"{OPENENV}/mcp", '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
                                   f'"reset", "arguments": {{"options": {deep(depth)}}}}}}}', mcp_headers),
                ("/sessions", f'{{"env_id": "{CALC}", "options": ' + "[" * depth, {}),  # unterminated
            ]
            for path, body, headers in cases:
                r = await post_raw(c, path, body, **headers)
                assert (r.status_code, r.json()["code"]) == (400, "json_too_deep"), (path, r.text[:200])
                assert "nested deeper than 64 levels" in r.json()["detail"]
            # the session and the server are untouched
            r = await c.post(f"/sessions/{sid}/step", json={"action": "ping"})
            assert (r.status_code, r.json()["observation"]) == (200, "echo: ping")
            # 64 levels in all is still fine (Echo ignores unknown options)
            r = await c.post(f"/sessions/{sid}/reset", content=f'{{"options": {{"a": {deep(62)}}}}}'.encode(),
                             headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
    asyncio.run(main())


def test_a_body_that_does_not_parse_is_400_invalid_json():
    async def main():
        async with serve_asgi(make_app()) as c:
            for path in ("/sessions", f"{OPENENV}/reset", f"{OPENENV}/tasks"):
                for body in ('{"env_id": ', "xx", "{'a': 1}", '{"a": 1} trailing'):
                    r = await post_raw(c, path, body)
                    assert (r.status_code, r.json()["code"]) == (400, "invalid_json"), (path, body, r.text)
                    assert r.json()["detail"].startswith("request body is not JSON: ")
    asyncio.run(main())


def test_a_tool_call_nested_1500_deep_is_an_invalid_action_and_the_session_lives():
    """The issue's acceptance input: before, a 500 env_error that closed the session (RecursionError in the env)."""
    async def main():
        async with serve_asgi(make_app()) as c:
            r = await c.post("/sessions", json={"env_id": CALC, "env_kwargs": {"action_format": "tools"},
                                                "options": {"index": 0}})
            sid = r.json()["session_id"]
            for action in ('{"name": "calc", "arguments": ' + "[" * 1500,
                           '{"name": "calc", "arguments": {"expression": ' + deep(1500) + "}}"):
                r = await c.post(f"/sessions/{sid}/step", json={"action": action})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["info"]["invalid_action"] is True and body["terminated"] is False
                assert body["observation"].startswith("Invalid tool call: the tool call nested deeper than 64")
            r = await c.post(f"/sessions/{sid}/step", json={"action": '{"name": "calc", "arguments": '
                                                                        '{"expression": "17 * 13 - 6"}}'})
            assert (r.status_code, r.json()["observation"]) == (200, "Result: 215")
    asyncio.run(main())


def test_websocket_deep_frames_answer_an_error_and_keep_the_connection():
    from websockets.sync.client import connect

    port = free_port()
    with uvicorn_in_thread(make_app(), port):
        wait_healthy(f"http://127.0.0.1:{port}")
        with connect(f"ws://127.0.0.1:{port}/envs/{ECHO}/ws", open_timeout=30) as ws:
            for frame in (deep(2000), '{"type": "reset", "data": {"options": ' + deep(2000) + "}}",
                          "[" * 2000, deep(2000).encode()):
                ws.send(frame)
                answer = json.loads(ws.recv(timeout=30))
                assert answer["type"] == "error" and answer["data"]["error_code"] == "json_too_deep", answer
                assert (answer["data"]["code"], answer["data"]["status"]) == ("VALIDATION_ERROR", 400)
            ws.send("{not json")
            answer = json.loads(ws.recv(timeout=30))
            assert (answer["data"]["code"], answer["data"]["error_code"]) == ("INVALID_JSON", "invalid_json")
            ws.send(json.dumps({"type": "reset", "data": {}}))  # the connection still plays
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            ws.send(json.dumps({"type": "step", "data": {"action": "ping"}}))
            assert json.loads(ws.recv(timeout=30))["data"]["observation"]["text"] == "echo: ping"


def test_half_sent_requests_are_closed_after_the_header_timeout():
    """1000 connections that send half a request head: uvicorn alone kept every one open (its keep-alive timer
    stops at the first byte); with the header timeout each is closed, and whole requests are still answered."""
    import threading

    import uvicorn

    from servers.protocol import header_timeout_protocol

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="warning",
                                           http=header_timeout_protocol(1.0), backlog=2048))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    socks: list[socket.socket] = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: the head never ends
            socks.append(s)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        assert closed_by_server(socks) == 1000  # each closed at its 1 s header deadline
        # a slow but whole request is still served
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\n")
            time.sleep(0.3)
            s.sendall(b"Host: 127.0.0.1\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        for s in socks:
            s.close()
        server.should_exit = True
        thread.join(timeout=30)


def half_sent_bodies(port: int, n: int, headers: str, path: str) -> list[socket.socket]:
    """``n`` connections that send a whole head announcing 100 body bytes, then 10 of them and nothing more."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Type: application/json\r\n"
                  "Content-Length: 100\r\n\r\n{\"env_id\":".encode())
        socks.append(s)
    return socks




def test_authenticated_connections_that_stop_mid_body_are_closed_after_the_body_timeout():
    """50 authenticated connections that stop mid-body: uvicorn (and the header timeout, which ends at the head)
    kept every one open; with the body timeout each is closed, and a slow but whole body is still answered."""
    import threading

    import uvicorn

    from servers.protocol import header_timeout_protocol

    port = free_port()
    app = make_app(token="tok-body-deadline-1234")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           http=header_timeout_protocol(1.0, 1.0)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    socks: list[socket.socket] = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        socks = half_sent_bodies(port, 50, "Authorization: Bearer tok-body-deadline-1234\r\n", "/sessions")
        assert closed_by_server(socks) == 50  # each closed at its 1 s body deadline
        body = json.dumps({"env_id": ECHO}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-body-deadline-1234"
                      b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body[:5])
            time.sleep(0.3)
            s.sendall(body[5:])
            assert s.recv(100).startswith(b"HTTP/1.1 201")
    finally:
        for s in socks:
            s.close()
        server.should_exit = True
        thread.join(timeout=30)
