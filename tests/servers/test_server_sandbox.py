"""The sandbox is the server's, on every surface (issue 32): a client's ``env_kwargs`` can tighten the code sandbox's
limits, never loosen them past the server's caps, and cannot name host paths; the session API, OpenEnv's reset and
MCP's reset all reach the same checks (4xx naming the key, no session left). Before, ``POST /sessions
{"env_id": "agent_rl/Code-v0", "env_kwargs": {"limits": {"nproc": 1000, ...}}}`` was a 201 and ``root`` was the
client's."""

from __future__ import annotations

import asyncio
import inspect
import json

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.data import PATH_KWARGS
from servers.app import create_app
from servers_helpers import serve_asgi

CODE = "agent_rl/Code-v0"
LOOSER = {"nproc": 1000, "memory_mb": 65536, "cpu_s": 3600, "wall_s": 3600}
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "reset"}


def code_app():
    # the refusals happen in the env's constructor, before any data is read: no startup check needed
    return create_app([CODE], max_sessions=4, prestart_workers=0, check_envs=False)


async def mcp_reset(client, env_kwargs):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "reset", "arguments": {"env_kwargs": env_kwargs},
                       "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                 "io.modelcontextprotocol/clientCapabilities": {}}}}
    r = await client.post(f"/envs/{CODE}/mcp", content=json.dumps(body).encode(), headers=MCP_HEADERS)
    assert r.status_code == 200, r.text
    text = r.text if r.headers["content-type"].startswith("application/json") else r.text.split("data: ", 1)[1]
    return json.loads(text)["result"]


@pytest.mark.parametrize("env_kwargs,named", [
    ({"limits": LOOSER}, ["limits.nproc=1000", "limits.memory_mb=65536", "limits.cpu_s=3600", "limits.wall_s=3600"]),
    ({"limits": {"memory_mb": 2048}}, ["limits.memory_mb=2048 is above the server's cap 1024"]),
    ({"plus_wall_s": 1e9}, ["plus_wall_s=1000000000.0"]),
    # whole-number limits given as fractions: accepted before, then every step was a 500 env_infra_error
    # (setrlimit refuses a float); below the floors the sandbox cannot start (nproc 1, nofile 1,
    # checker_memory_mb 1: 500 env_infra_error on every step; nproc 2, nofile 4, checker_memory_mb 64 judge)
    ({"limits": {"nproc": 3.5, "cpu_s": 1.5, "memory_mb": 1e-9}},
     ["limits.nproc=3.5 (a whole number)", "limits.cpu_s=1.5 (a whole number)", "limits.memory_mb=1e-09"]),
    ({"limits": {"nproc": 1, "nofile": 1, "checker_memory_mb": 1}},
     ["limits.nproc=1 is below the sandbox's floor 2", "limits.nofile=1 is below the sandbox's floor 4",
      "limits.checker_memory_mb=1 is below the sandbox's floor 64"]),
    ({"root": "/etc"}, ["env_kwargs root name host paths"]),
    ({"data_root": "/"}, ["env_kwargs data_root name host paths"]),
])
def test_looser_limits_and_host_paths_are_refused_on_every_surface(env_kwargs, named):
    async def main():
        async with serve_asgi(code_app()) as c:
            answers = [await c.post("/sessions", json={"env_id": CODE, "env_kwargs": env_kwargs}),
                       await c.post(f"/envs/{CODE}/reset", json={"env_kwargs": env_kwargs})]
            for r in answers:
                assert (r.status_code, r.json()["code"]) == (422, "invalid_request"), r.text
                for key in named:
                    assert key in r.json()["detail"], r.json()["detail"]
            result = await mcp_reset(c, env_kwargs)
            assert result["isError"] is True
            assert result["structuredContent"]["error_code"] == "invalid_request", result
            for key in named:
                assert key in result["content"][0]["text"]
            assert (await c.get("/sessions")).json()["sessions"] == []
    asyncio.run(main())


def test_every_path_kwarg_of_a_registered_env_is_refused():
    """The kind, not the instance: every constructor argument of a built-in env that names a host path is in
    ``PATH_KWARGS`` (so a new env's ``cache_dir`` cannot slip past the server)."""
    found = set()
    for env_id, spec in gymnasium.registry.items():
        if not env_id.startswith("agent_rl/") or not isinstance(spec.entry_point, str):
            continue
        module, _, name = spec.entry_point.partition(":")
        cls = getattr(__import__(module, fromlist=[name]), name)
        for param in inspect.signature(cls).parameters:
            if any(word in param for word in ("root", "dir", "path", "file", "folder")):
                found.add(param)
    assert found and found <= set(PATH_KWARGS), sorted(found - set(PATH_KWARGS))


def test_host_path_reset_options_are_refused_on_every_surface():
    """``options={"gamefile": "/any/folder"}`` made a served ALFWorld load any ``game.tw-pddl`` on the host and told a
    client which folders exist ("does not exist"): reset options naming host paths (``envs.data.PATH_OPTIONS``) are
    refused like the path kwargs, on open and on reset of a live session, on every surface (422 naming the key; the
    live session stays)."""
    bad = {"gamefile": "/etc"}

    async def main():
        async with serve_asgi(code_app()) as c:
            for r in [await c.post("/sessions", json={"env_id": CODE, "options": bad}),
                      await c.post(f"/envs/{CODE}/reset", json={"options": bad}),
                      await c.post(f"/envs/{CODE}/reset", json=bad)]:  # OpenEnv: extra keys are options
                assert (r.status_code, r.json()["code"]) == (422, "invalid_request"), r.text
                assert "reset options gamefile name host paths" in r.json()["detail"]
            assert (await c.get("/sessions")).json()["sessions"] == []
            opened = await c.post("/sessions", json={"env_id": CODE})
            assert opened.status_code == 201, opened.text
            sid = opened.json()["session_id"]
            r = await c.post(f"/sessions/{sid}/reset", json={"options": bad})
            assert r.status_code == 422 and "gamefile" in r.json()["detail"], r.text
            assert [s["session_id"] for s in (await c.get("/sessions")).json()["sessions"]] == [sid]
    asyncio.run(main())


def test_every_path_reset_option_of_a_built_in_env_is_refused():
    """The kind: every reset option a built-in env reads (``options["key"]`` / ``options.get("key")`` in ``envs/``)
    whose name says it is a host path is in ``PATH_OPTIONS``."""
    import re
    from pathlib import Path

    from envs.data import PATH_OPTIONS

    keys = set()
    for path in (Path(__file__).resolve().parents[2] / "envs").rglob("*.py"):
        keys |= set(re.findall(r"options(?:\.get\(|\[)\s*[\"'](\w+)[\"']", path.read_text()))
    found = {k for k in keys if any(word in k for word in ("root", "dir", "path", "file", "folder"))}
    assert "gamefile" in found and found <= set(PATH_OPTIONS), sorted(found - set(PATH_OPTIONS))
