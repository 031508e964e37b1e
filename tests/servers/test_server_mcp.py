"""The MCP surface (``servers/mcp.py``) with the ``mcp`` SDK's own client: tools/list maps the env's declared tools
(plus reset and close), tools/call plays them and answers observation, reward and done; a whole WebShop episode is
won with the expert's actions, through the stateful (initialize handshake) and the stateless (2026) protocol; errors,
faults and the token as on every surface."""

from __future__ import annotations

import asyncio
import re

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import tool_env_module  # noqa: F401  (registers user/ToolEcho-v0 here)
import user_env_module  # noqa: F401  (registers user/Echo-v0 here)
from served_envs import TOKEN
from servers.app import create_app
from servers.openenv import openenv_path
from servers_helpers import CALC, ECHO, free_port, uvicorn_in_thread
from waiting import HANG_S, http, wait_until

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

TOOL = "user/ToolEcho-v0"
WEBSHOP = "agent_rl/WebShop-v0"


def mcp_client(url: str, env_id: str, token: str | None = None, mode: str = "legacy") -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(url + openenv_path(env_id) + "/mcp",
                                         http_client=httpx2.AsyncClient(headers=headers, timeout=HANG_S)), mode=mode)


def as_call(expert_action: str) -> tuple[str, dict]:
    """WebShop's expert action text as the tool call that plays it: ``search[q]`` -> ``search(query=q)``,
    ``click[t]`` -> ``click(target=t)``."""
    name, arg = re.fullmatch(r"(search|click)\[(.*)\]", expert_action, re.S).groups()
    return name, {"query" if name == "search" else "target": arg}


def live(url: str, token: str | None = None) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return [s["session_id"] for s in http.get(url + "/sessions", headers=headers, timeout=30).json()["sessions"]]


@pytest.fixture(scope="module")
def local():
    # env timeout 8 s: every op of an Echo env (a worker's start with its imports included) takes far less, even on
    # a busy machine; the timeout case's step sleeps far longer (it is ended at this limit)
    app = create_app([CALC, ECHO, TOOL], imports=["user_env_module", "tool_env_module"], max_sessions=4,
                     prestart_workers=0, env_timeout_s=8.0)
    port = free_port()
    with uvicorn_in_thread(app, port):
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), "the server answers /health")
        yield url


async def play_webshop(client: Client, goal: int, *, pass_session: bool) -> tuple[list[str], dict]:
    """One expert episode of goal ``goal`` through MCP tools; ``(actions, last structured result)``."""
    r = await client.call_tool("reset", {"options": {"goal_idx": goal}, "env_kwargs": {"expert": True}})
    assert not r.is_error, r.content
    result, actions = r.structured_content, []
    assert result["reward"] is None and result["done"] is False
    sid = result["session_id"]
    while not result["done"]:
        actions.append(result["info"]["expert_action"])
        name, arguments = as_call(actions[-1])
        r = await client.call_tool(name, {**arguments, **({"session_id": sid} if pass_session else {})})
        assert not r.is_error, r.content
        result = r.structured_content
        assert result["session_id"] == sid and r.content[0].text == result["observation"]
    return actions, result


def test_mcp_client_lists_the_tools_and_wins_a_webshop_episode(webshop_url):
    async def main():
        async with mcp_client(webshop_url, WEBSHOP, TOKEN) as client:  # initialize handshake: an MCP session
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert list(listed) == ["reset", "search", "click", "close"]
            assert listed["search"].input_schema["required"] == ["query"]
            assert set(listed["click"].input_schema["properties"]) == {"target", "session_id"}
            assert {"split", "index", "seed", "options", "env_kwargs"} <= set(listed["reset"].input_schema[
                "properties"])
            actions, last = await play_webshop(client, 0, pass_session=False)  # the MCP session's episode
            assert actions[1:] == ["click[b0743jkhbv]", 'click[28" x 28"]', "click[buy now]"]
            assert (last["reward"], last["done"], last["terminated"], last["info"]["won"]) == (1.0, True, True, True)
            sid = last["session_id"]
            assert sid in live(webshop_url, TOKEN)
            over = await client.call_tool("click", {"target": "buy now"})  # the episode is over: a tool error
            assert over.is_error and over.structured_content["error_code"] == "episode_over"
            assert over.structured_content["status"] == 409
        return sid

    sid = asyncio.run(main())
    wait_until(lambda: sid not in live(webshop_url, TOKEN))  # the MCP session ended (DELETE): so did the episode


def test_stateless_mcp_clients_name_the_episode_and_play_two_at_once(webshop_url):
    async def main():
        async with mcp_client(webshop_url, WEBSHOP, TOKEN, mode="auto") as client:  # 2026 protocol: no session
            assert client.protocol_version == "2026-07-28"
            with pytest.raises(MCPError, match="no episode"):
                await client.call_tool("search", {"query": "shoes"})
            (a1, r1), (a2, r2) = await asyncio.gather(play_webshop(client, 1, pass_session=True),
                                                      play_webshop(client, 2, pass_session=True))
            assert r1["session_id"] != r2["session_id"] and a1 != a2
            assert (r1["reward"], r2["reward"]) == (1.0, 1.0)
            for r in (r1, r2):
                closed = await client.call_tool("close", {"session_id": r["session_id"]})
                assert closed.structured_content == {"session_id": r["session_id"], "closed": True}
            gone = await client.call_tool("search", {"query": "x", "session_id": r1["session_id"]})
            assert gone.is_error and gone.structured_content["error_code"] == "session_not_found"
        return r1["session_id"], r2["session_id"]

    sids = asyncio.run(main())
    assert not set(sids) & set(live(webshop_url, TOKEN))


def test_mcp_tools_of_every_kind_of_env_and_protocol_errors(local):
    async def main():
        async with mcp_client(local, CALC) as client:  # a built-in env: its action_format="tools" tools
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["reset", "calc", "answer", "close"]
            r = await client.call_tool("reset", {"index": 0})
            first = r.structured_content["session_id"]
            assert r.structured_content["observation"].startswith("Tom saves 17 dollars")
            r = await client.call_tool("calc", {"expression": "17 * 13 - 6"})
            assert (r.structured_content["observation"], r.structured_content["reward"]) == ("Result: 215", 0.0)
            r = await client.call_tool("answer", {"answer": 215})
            assert (r.structured_content["reward"], r.structured_content["done"]) == (1.0, True)
            r = await client.call_tool("reset", {"index": 0})  # the same task: the same session, reset in place
            assert r.structured_content["session_id"] == first
            moved = await client.call_tool("reset", {"index": 1})  # another task: a new session, the old one closed
            assert moved.structured_content["session_id"] != first and first not in live(local)
            r = await client.call_tool("reset", {"index": 0})
            again = await client.call_tool("answer", {"answer": "not a number"})  # the env judges the arguments
            assert again.structured_content["info"]["invalid_action"] is True and not again.is_error
            for name, arguments, message in [("teleport", {}, "unknown tool 'teleport'"),
                                             ("reset", {"index": "3"}, "index must be an integer"),
                                             ("reset", {"bogus": 1}, "unknown arguments of reset: bogus"),
                                             ("calc", {"expression": "1", "session_id": 5}, "must be a string")]:
                with pytest.raises(MCPError, match=message):
                    await client.call_tool(name, arguments)
            rejected = await client.call_tool("reset", {"index": -1})  # the env refuses the option: a tool error
            assert rejected.is_error and rejected.structured_content["error_code"] == "invalid_request"
            # one set of sessions: MCP plays a session our API opened, but never resets it away
            other = http.post(local + "/sessions", json={"env_id": CALC, "options": {"index": 0},
                                                          "env_kwargs": {"action_format": "tools"}}).json()
            played = await client.call_tool("answer", {"answer": 215, "session_id": other["session_id"]})
            assert played.structured_content["reward"] == 1.0
            with pytest.raises(MCPError, match="was not opened by this MCP server"):
                await client.call_tool("reset", {"session_id": other["session_id"]})
            assert http.delete(f"{local}/sessions/{other['session_id']}").status_code == 204
        async with mcp_client(local, TOOL) as client:  # a user's env that declares tools (no action_format)
            assert [t.name for t in (await client.list_tools()).tools] == ["reset", "say", "finish", "close"]
            await client.call_tool("reset", {})
            assert (await client.call_tool("say", {"text": "hi"})).structured_content["observation"] == "you said hi"
            r = await client.call_tool("finish", {"answer": "42"})
            assert (r.structured_content["observation"], r.structured_content["reward"]) == ("right", 1.0)
        async with mcp_client(local, ECHO) as client:  # an env without tools: act(command) plays the text
            assert [t.name for t in (await client.list_tools()).tools] == ["reset", "act", "close"]
            await client.call_tool("reset", {})
            r = await client.call_tool("act", {"command": "stop"})
            assert (r.structured_content["observation"], r.structured_content["reward"]) == ("echo: stop", 1.0)

    asyncio.run(main())
    wait_until(lambda: live(local) == [])


def test_mcp_faults_are_tool_errors_and_the_server_keeps_serving(local):
    async def main():
        async with mcp_client(local, ECHO) as client, mcp_client(local, ECHO) as bystander:
            await bystander.call_tool("reset", {"options": {"k": 1}})
            await client.call_tool("reset", {"options": {"k": 2}})
            for command, code, status in [("raise", "env_error", 500), ("infra", "env_infra_error", 500),
                                          ("exit", "env_error", 500), ("sleep:600", "env_timeout", 504)]:
                r = await client.call_tool("act", {"command": command})
                assert r.is_error and (r.structured_content["error_code"], r.structured_content["status"]) == (
                    code, status), command
                assert r.structured_content["detail"].endswith("the session was closed")
                ok = await bystander.call_tool("act", {"command": "still"})
                assert ok.structured_content["observation"] == "echo: still"
                gone = await client.call_tool("act", {"command": "x"})  # the failed episode is gone: reset first
                assert gone.is_error and gone.structured_content["error_code"] == "session_not_found"
                await client.call_tool("reset", {"options": {"k": 2}})

    asyncio.run(main())
    wait_until(lambda: live(local) == [])


def test_mcp_needs_the_token():
    app = create_app([CALC], max_sessions=4, prestart_workers=0, token="s3cret")
    port = free_port()
    with uvicorn_in_thread(app, port):
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), "the server answers /health")
        for path in (openenv_path(CALC) + "/mcp", "/mcp"):  # the env's path and the one-env root alias
            r = http.post(url + path, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert (r.status_code, r.json()["code"]) == (401, "unauthorized")

        async def main():
            with pytest.raises(Exception):
                async with mcp_client(url, CALC) as client:
                    await client.list_tools()
            async with mcp_client(url, CALC, "s3cret") as client:
                await client.call_tool("reset", {"index": 0})
                r = await client.call_tool("answer", {"answer": 215})
                return r.structured_content["reward"]

        assert asyncio.run(main()) == 1.0


def _up(url: str) -> bool:
    try:
        return http.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _initialize(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url, headers={"accept": "application/json, text/event-stream", **headers}, timeout=30, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}})


def test_mcp_transport_sessions_are_bounded_and_one_client_leaves_the_other_room():
    """200 initialize handshakes were 200 open MCP sessions: now at most ``max_mcp_sessions`` (default
    ``max_sessions``) per env, each client at most its share (503 ``quota_exceeded``), and another client's
    session still opens with the SDK's client."""
    tokens = {"alice": "tok-alice-5b1e", "bob": "tok-bob-77c2"}
    app = create_app([CALC], max_sessions=4, prestart_workers=0, tokens=tokens)  # 2 MCP sessions per client
    port = free_port()
    with uvicorn_in_thread(app, port):
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), 60)
        mcp_url = url + openenv_path(CALC) + "/mcp"
        answers = [_initialize(mcp_url, {"Authorization": f"Bearer {tokens['alice']}"}) for _ in range(200)]
        assert [r.status_code for r in answers].count(200) == 2
        refused = [r for r in answers if r.status_code != 200]
        assert {(r.status_code, r.json()["code"]) for r in refused} == {(503, "quota_exceeded")}
        assert "client_max_mcp_sessions=2" in refused[0].json()["detail"]

        async def main():
            async with mcp_client(url, CALC, tokens["bob"]) as client:  # bob still gets his
                await client.call_tool("reset", {"index": 0})
                r = await client.call_tool("answer", {"answer": 215})
                return r.structured_content["reward"]

        assert asyncio.run(main()) == 1.0
        # alice ends one of hers: room again
        sid = answers[0].headers["mcp-session-id"]
        r = httpx.delete(mcp_url, headers={"Authorization": f"Bearer {tokens['alice']}", "mcp-session-id": sid})
        assert r.status_code in (200, 204), r.text
        assert _initialize(mcp_url, {"Authorization": f"Bearer {tokens['alice']}"}).status_code == 200
