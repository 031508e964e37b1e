"""Fuzz the env server's HTTP API from its own OpenAPI schema (schemathesis + hypothesis), against a real server
(``python -m servers.serve`` under uvicorn on 127.0.0.1) of each env: WebShop, ALFWorld, and the cheap
Calculator/Echo server. Schema-valid and schema-invalid requests to every route; half of the cases that name a
session use a live one (and ``POST /sessions`` a served env id), so env constructors, resets and steps see fuzzed
kwargs, options, seeds and actions.

Strings: schemathesis draws only valid Unicode (it excludes surrogates, which its UTF-8 wire cannot carry), so the
strategy also draws a lone UTF-16 surrogate (U+D800-U+DFFF, legal JSON as ``\\udXXX``) for most cases, put into one
string of the body (a value or a key, at any depth: ``with_surrogate``; a third of the cases at 40 examples, the
others have no body or no string in it); such a case must answer 422.

Every answer must be: below 500, or a documented 500 ``env_error`` / 504 ``env_timeout`` with its JSON body; every
4xx a JSON body with ``detail`` (and a ``code`` unless it is FastAPI's 422 list); valid UTF-8 whose strings are valid
Unicode; conform to the schema's response models and status codes. Afterwards the server is healthy and, once the
sessions the fuzzer opened are deleted, holds none. Case budget per route and mode: ``AGENT_RL_FUZZ_EXAMPLES``
(default 3; the docs report a larger run: ``AGENT_RL_FUZZ_EXAMPLES=100 pytest -q -s tests/servers/test_server_fuzz.py``).
"""

from __future__ import annotations

import copy
import time
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from envs.hosting import lone_surrogate
from servers_helpers import free_port, wait_healthy
from waiting import HANG_S

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("AGENT_RL_FUZZ_EXAMPLES", "3"))
SERVERS = {
    "calculator": (["agent_rl/Calculator-v0", "user/Echo-v0"], ["--import", "user_env_module"]),
    "webshop": (["agent_rl/WebShop-v0"], ["--workers", "2", "--import", "envs.webshop.preload"]),
    "alfworld": (["agent_rl/ALFWorld-v0"], ["--workers", "2"]),
}
DOCUMENTED_5XX = {(500, "env_error"), (504, "env_timeout"), (501, "not_implemented")}  # 501: no task listing


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request, tmp_path_factory):
    env_ids, extra = SERVERS[request.param]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("fuzz") / "server.log"
    cmd = [sys.executable, "-m", "servers.serve", "--host", "127.0.0.1", "--port", str(port), "--max-sessions", "16",
           "--env-timeout", "60", *[a for e in env_ids for a in ("--env", e)], *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, timeout_s=300, proc=proc)
        yield request.param, url, env_ids
    finally:
        proc.terminate()
        proc.wait(30)


def with_surrogate(body, code: int, where: int) -> tuple[object, bool]:
    """``body`` with the lone surrogate ``chr(code)`` inserted into one of its strings (dict keys included, at any
    depth), chosen by ``where``; ``(body, False)`` when it has no string."""
    slots: list[tuple[object, object, bool]] = []  # (container, key or index, is a dict key)

    def walk(value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    slots.append((value, key, True))
                if isinstance(item, str):
                    slots.append((value, key, False))
                walk(item)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    slots.append((value, i, False))
                walk(item)

    if isinstance(body, str):
        at = where % (len(body) + 1)
        return body[:at] + chr(code) + body[at:], True
    walk(body)
    if not slots:
        return body, False
    container, key, is_key = slots[where % len(slots)]
    text = key if is_key else container[key]
    at = (where // len(slots)) % (len(text) + 1)
    bad = text[:at] + chr(code) + text[at:]
    if is_key:
        container[bad] = container.pop(key)
    else:
        container[key] = bad
    return body, True


def check_answer(case, response, problems: list[str], sent: object = None) -> None:
    """The answer rules of the module docstring; a broken rule is appended to ``problems``. ``sent``: the body
    actually sent when a lone surrogate was put into it (``None``: the case's own body)."""
    status = response.status_code
    body_sent = getattr(case, "body", None) if sent is None else sent
    where = f"{case.method} {case.formatted_path} body={str(body_sent)[:200]!r} -> {status}"
    body = None
    content_type = response.headers.get("content-type") or ""
    content_type = content_type[0] if isinstance(content_type, list) and content_type else str(content_type)
    if status >= 400:
        if not content_type.startswith("application/json"):
            problems.append(f"{where}: error without a JSON body: {response.text[:200]!r}")
            return
        try:
            body = json.loads(response.content.decode("utf-8", errors="strict"))
        except ValueError as exc:
            problems.append(f"{where}: error body is not UTF-8 JSON ({exc}): {response.content[:200]!r}")
            return
        if lone_surrogate(body) is not None:
            problems.append(f"{where}: error body holds a lone surrogate: {lone_surrogate(body)}")
        if not (isinstance(body, dict) and "detail" in body):
            problems.append(f"{where}: error body without detail: {body!r}")
            return
        if not isinstance(body["detail"], list) and not isinstance(body.get("code"), str):
            problems.append(f"{where}: error body without code: {body!r}")
    if status >= 500 and (status, body.get("code")) not in DOCUMENTED_5XX:
        problems.append(f"{where}: undocumented server error {body!r}")
    if sent is not None and status not in (413, 422):  # 413: a body over the size limit is refused before it is parsed
        problems.append(f"{where}: a lone surrogate in the body was not refused with 422")
    try:
        case.validate_response(response, checks=[schemathesis.checks.status_code_conformance,
                                                 schemathesis.checks.content_type_conformance,
                                                 schemathesis.checks.response_schema_conformance])
    except Exception as exc:  # noqa: BLE001 (schemathesis raises a FailureGroup of its checks)
        problems.append(f"{where}: {str(exc).strip()[:400]}")


def fuzz(url: str, env_ids: list[str], examples: int) -> tuple[Counter, list[str], list[str], int]:
    """Run the fuzzer; returns (status counts, problems, session ids it opened, cases with a lone surrogate)."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    statuses: Counter = Counter()
    problems: list[str] = []
    opened: list[str] = []
    server_errors: list[str] = []
    surrogate_cases = [0]
    live: dict[str, str] = {}
    http = httpx.Client(base_url=url, timeout=120)

    def live_session() -> str:
        sid = live.get("id")
        if sid is None or http.get("/sessions").json()["sessions"] == [] or sid not in {
                s["session_id"] for s in http.get("/sessions").json()["sessions"]}:
            r = http.post("/sessions", json={"env_id": env_ids[0], "seed": 0})
            assert r.status_code == 201, r.text
            sid = live["id"] = r.json()["session_id"]
            opened.append(sid)
        return sid

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode), use_live=st.booleans(),
                   env_index=st.integers(0, len(env_ids) - 1),
                   surrogate=st.tuples(st.integers(0xD800, 0xDFFF), st.integers(0, 2**16)) | st.none())
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def run(case, use_live, env_index, surrogate):
                if use_live and "session_id" in (case.path_parameters or {}):
                    case.path_parameters["session_id"] = live_session()
                if use_live and operation.path == "/sessions" and isinstance(case.body, dict):
                    case.body["env_id"] = env_ids[env_index]
                injected, sent = False, None
                if surrogate is not None and case.body is not None and case.method.upper() != "GET":
                    # on a copy (schemathesis re-validates a changed case and cannot encode a surrogate), sent
                    # as JSON's ASCII escape \udXXX
                    sent, injected = with_surrogate(copy.deepcopy(case.body), *surrogate)
                if injected:
                    response = http.request(case.method, case.formatted_path, content=json.dumps(sent).encode(),
                                            headers={"content-type": "application/json"})
                else:
                    response = case.call(base_url=url, timeout=120)
                statuses[response.status_code] += 1
                if response.status_code >= 500:  # documented ones pass the checks; say which requests got them
                    server_errors.append(f"{case.method} {operation.path} body={str(sent or case.body)[:300]!r} -> "
                                         f"{response.status_code}: {response.text[:160]}")
                if response.status_code == 201:
                    opened.append(response.json()["session_id"])
                surrogate_cases[0] += injected
                check_answer(case, response, problems, sent=sent if injected else None)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (GET /health, /envs, /sessions take no input)
                assert mode == GenerationMode.NEGATIVE
    http.close()
    for line in server_errors:
        print("  documented 5xx:", line)
    return statuses, problems, opened, surrogate_cases[0]


def test_fuzz_the_api_from_its_openapi_schema(server):
    name, url, env_ids = server
    statuses, problems, opened, surrogates = fuzz(url, env_ids, EXAMPLES)
    print(f"\nfuzz {name}: {sum(statuses.values())} cases ({surrogates} with a lone surrogate), "
          f"statuses {dict(sorted(statuses.items()))}, "
          f"{len(problems)} problems, {len(opened)} sessions opened")
    assert problems == [], "\n".join(problems[:20])
    with httpx.Client(base_url=url, timeout=60) as http:
        for sid in opened:
            assert http.delete(f"/sessions/{sid}").status_code in (204, 404)
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["sessions"] == 0, health.text
    assert statuses[404] and statuses[422]  # it reached past validation and into the session routes
    assert surrogates > 0


# ------------------------------------------------------------------------------ OpenEnv WS and MCP (no OpenAPI)
_json = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                     | st.text(max_size=20), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
_reset_data = st.fixed_dictionaries({}, optional={
    "seed": st.integers(-3, 2**33) | st.text(max_size=3), "split": st.sampled_from(["train", "val", "test",
                                                                                    "valid_unseen", "x"]),
    "index": st.integers(-2, 3000) | st.text(max_size=3), "goal_idx": st.integers(-2, 20),
    "options": _json, "env_kwargs": _json | st.fixed_dictionaries({"expert": st.booleans()}),
    "episode_id": st.text(max_size=300)})
_step_data = st.fixed_dictionaries({"action": st.text(max_size=40) | _json | st.sampled_from(
    ["look", "inventory", "search[red shoes]", "click[back to search]", "calc[1 + 2]", "answer[3]", "stop"])},
    optional={"metadata": _json})
WS_MESSAGES = st.one_of(
    st.just({"type": "reset", "data": {}}),  # valid ones often enough that steps reach an episode
    st.builds(lambda a: {"type": "step", "data": {"action": a}}, st.sampled_from(["look", "stop", "answer[3]"])),
    st.builds(lambda d: {"type": "reset", "data": d}, _reset_data),
    st.builds(lambda d: {"type": "step", "data": d}, _step_data),
    st.builds(lambda t, d: {"type": t, "data": d}, st.sampled_from(["reset", "step", "state", "close", "mcp", "x"]),
              _json),
    st.just({"type": "state"}), st.just({"type": "close"}), _json, st.builds(lambda t: {"type": t}, _json),
    st.text(max_size=30),  # not JSON, mostly
    st.tuples(st.integers(0xD800, 0xDFFF), st.sampled_from(["reset", "step"])).map(  # a lone surrogate
        lambda c: json.dumps({"type": c[1], "data": {"action" if c[1] == "step" else "split": chr(c[0])}})),
)
WS_DOCUMENTED_5XX = DOCUMENTED_5XX | {(500, "env_infra_error"), (503, "at_capacity")}


def test_fuzz_the_openenv_ws_channel(server):
    """Fuzzed messages (valid and invalid resets and steps, other types, non-JSON, lone surrogates) on one connection
    per env: every answer is one of openenv-core's message models, errors carry one of its codes and our status,
    the connection survives everything but ``close``, and no session outlives its connection."""
    from openenv.core.env_server.types import WSErrorCode, WSErrorResponse, WSObservationResponse, WSStateResponse
    from websockets.sync.client import connect

    name, url, env_ids = server
    models = {"observation": WSObservationResponse, "state": WSStateResponse, "error": WSErrorResponse}
    codes = {c.value for c in WSErrorCode}
    problems: list[str] = []
    counts: Counter = Counter()
    for env_id in env_ids:
        address = url.replace("http://", "ws://") + f"/envs/{env_id}/ws"
        holder = {"ws": connect(address, open_timeout=30).__enter__()}

        @given(message=WS_MESSAGES)
        @settings(max_examples=10 * EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def run(message):
            text = message if isinstance(message, str) and not message.startswith('{"type"') else (
                message if isinstance(message, str) else json.dumps(message))
            ws = holder["ws"]
            ws.send(text)
            if message == {"type": "close"}:  # OpenEnv's close message (no data): the server closes the connection
                ws.close()
                holder["ws"] = connect(address, open_timeout=30).__enter__()
                counts["close"] += 1
                return
            raw = ws.recv(timeout=120)
            try:
                answer = json.loads(raw)
                models[answer["type"]].model_validate(answer)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{env_id} {text[:200]!r} -> not an OpenEnv message ({exc}): {raw[:200]!r}")
                return
            counts[answer["type"]] += 1
            if answer["type"] == "error":
                data = answer["data"]
                if data.get("code") not in codes or not isinstance(data.get("status"), int):
                    problems.append(f"{env_id} {text[:200]!r} -> error without an OpenEnv code/status: {data}")
                elif data["status"] >= 500 and (data["status"], data.get("error_code")) not in WS_DOCUMENTED_5XX:
                    problems.append(f"{env_id} {text[:200]!r} -> undocumented server error {data}")
                counts[data["code"]] += 1
            if lone_surrogate(answer) is not None:
                problems.append(f"{env_id} {text[:200]!r} -> answer holds a lone surrogate")

        run()
        holder["ws"].close()
    print(f"\nWS fuzz {name}: {dict(sorted(counts.items()))}, {len(problems)} problems")
    assert problems == [], "\n".join(problems[:20])
    with httpx.Client(base_url=url, timeout=60) as http:
        deadline = time.monotonic() + HANG_S  # the ceiling only catches sessions that are never closed
        while http.get("/health").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.1)
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["sessions"] == 0, health.text
    assert counts["observation"] and counts["error"]


_rpc_method = st.sampled_from(["initialize", "tools/list", "tools/call", "server/discover", "ping", "bogus"])
MCP_BODIES = st.one_of(
    st.builds(lambda m, i, p: {"jsonrpc": "2.0", "id": i, "method": m, "params": p}, _rpc_method,
              st.integers(0, 10) | st.text(max_size=4), _json | st.fixed_dictionaries(
                  {"name": st.sampled_from(["reset", "act", "search", "click", "calc", "nope"]),
                   "arguments": _json})),
    _json, st.text(max_size=40))
MCP_CALLS = st.tuples(st.sampled_from(["reset", "act", "search", "click", "calc", "answer", "close", "nope"]),
                      st.dictionaries(st.sampled_from(["split", "index", "seed", "options", "env_kwargs",
                                                       "session_id", "command", "query", "target", "expression",
                                                       "answer", "x"]), _json, max_size=3))


def test_fuzz_mcp(server):
    """Fuzzed JSON-RPC bodies POSTed to each env's /mcp (with and without the 2026 protocol header): never a 5xx,
    every answer JSON; fuzzed tools/call through the mcp SDK's client: a result (maybe ``isError``, with our error
    code) or a JSON-RPC error, never a broken connection; the server healthy and holding no session afterwards."""
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    name, url, env_ids = server
    problems: list[str] = []
    statuses: Counter = Counter()
    told: set[str] = set()  # session ids the fuzzer's resets were answered
    http = httpx.Client(base_url=url, timeout=120)
    for env_id in env_ids:
        @given(body=MCP_BODIES, modern=st.booleans())
        @settings(max_examples=10 * EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def post(body, modern):
            headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
            if modern:
                headers["mcp-protocol-version"] = "2026-07-28"
            r = http.post(f"/envs/{env_id}/mcp", content=json.dumps(body).encode(), headers=headers)
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                problems.append(f"{env_id} POST {str(body)[:200]} -> {r.status_code}: {r.text[:200]}")
            elif r.content and "json" not in (r.headers.get("content-type") or ""):
                problems.append(f"{env_id} POST {str(body)[:200]} -> not JSON: {r.text[:200]}")

        post()
        calls: list[tuple[str, dict]] = []

        @given(call=MCP_CALLS)
        @settings(max_examples=10 * EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def collect(call):
            calls.append(call)

        collect()

        async def play() -> None:
            async with Client(streamable_http_client(f"{url}/envs/{env_id}/mcp",
                                                     http_client=httpx2.AsyncClient(timeout=120))) as client:
                sid = None
                for tool, arguments in calls:
                    if sid is not None and "session_id" not in arguments:
                        arguments = {**arguments, "session_id": sid}
                    try:
                        r = await client.call_tool(tool, arguments)
                    except MCPError:
                        statuses["rpc_error"] += 1
                        continue
                    statuses["tool_error" if r.is_error else "tool_ok"] += 1
                    content = r.structured_content or {}
                    if r.is_error and not isinstance(content.get("error_code"), str):
                        problems.append(f"{env_id} {tool}({arguments}) -> tool error without a code: {r.content}")
                    if r.is_error and content.get("status", 0) >= 500 and (
                            content["status"], content["error_code"]) not in WS_DOCUMENTED_5XX:
                        problems.append(f"{env_id} {tool}({arguments}) -> undocumented server error {content}")
                    if tool == "reset" and not r.is_error:
                        sid = content["session_id"]
                        told.add(sid)
                if sid is not None:
                    await client.call_tool("close", {"session_id": sid})

        asyncio.run(play())
    print(f"\nMCP fuzz {name}: {dict(sorted(statuses.items(), key=str))}, {len(problems)} problems")
    assert problems == [], "\n".join(problems[:20])
    deadline = time.monotonic() + HANG_S  # the ceiling only catches sessions that are never closed
    for sid in told:  # the stateless protocol has no MCP session to end: close every episode the server named
        http.delete(f"/sessions/{sid}")
    while http.get("/health").json()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert http.get("/health").json()["sessions"] == 0
    http.close()
    assert statuses["tool_ok"] and statuses[200]


# ------------------------------------------------------------- hostile bytes: nested, huge, non-UTF-8, truncated
def _nested(depth: int, closed: bool, key: str) -> bytes:
    inner = b"[" * depth + (b"]" * depth if closed else b"")
    return b'{"%s": ' % key.encode() + inner + (b"}" if closed else b"")


# (body, the code the server must answer it with: HTTP's ``code`` or the 422 list, the WS message's ``error_code``)
HOSTILE = st.one_of(
    st.builds(lambda d, c, k: (_nested(d, c, k), "json_too_deep"), st.sampled_from([65, 500, 900, 1500, 3000]),
              st.booleans(), st.sampled_from(["options", "env_kwargs", "action", "params", "data", "x"])),  # nested
    st.builds(lambda n, c: (c * n, "body_too_large"), st.integers(500_000, 2_000_000),
              st.sampled_from([b"a", b"[", b'"', b" "])),  # huge
    st.binary(min_size=1, max_size=200).filter(lambda b: not _is_utf8(b)).map(lambda b: (b, "not_utf8")),
    st.builds(lambda body, cut: (body[:max(1, len(body) * cut // 100)], "invalid_json"),  # truncated
              st.sampled_from([b'{"env_id": "agent_rl/Calculator-v0", "options": {"index": 0}}',
                               b'{"action": "look", "metadata": {}}',
                               b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}']),
              st.integers(1, 99)),
)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_fuzz_hostile_bytes_on_every_surface(server):
    """Nested (60-3000 deep, closed or not), huge (0.5-2 MB), non-UTF-8 and truncated bodies to the session API,
    OpenEnv's HTTP routes and MCP, and as WebSocket frames (text and binary): every HTTP answer a 4xx with a JSON
    ``code`` (never a 5xx), every frame answered with an OpenEnv error message on a connection that still plays;
    the server healthy after, holding no session."""
    from websockets.sync.client import connect

    name, url, env_ids = server
    problems: list[str] = []
    statuses: Counter = Counter()
    http = httpx.Client(base_url=url, timeout=120)
    sid = http.post("/sessions", json={"env_id": env_ids[0], "seed": 0}).json()["session_id"]
    base = f"/envs/{env_ids[0]}"
    paths = ["/sessions", f"/sessions/{sid}/step", f"/sessions/{sid}/reset", f"{base}/reset", f"{base}/step",
             f"{base}/mcp", f"{base}/tasks"]

    @given(case=HOSTILE, path=st.sampled_from(paths))
    @settings(max_examples=max(12, 6 * EXAMPLES), deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def post(case, path):
        body, expected = case
        r = http.post(path, content=body, headers={"content-type": "application/json",
                                                   "accept": "application/json, text/event-stream"})
        statuses[r.status_code] += 1
        where = f"POST {path} {body[:80]!r}... ({len(body)} bytes) -> {r.status_code}: {r.text[:200]}"
        if r.status_code >= 500 or r.status_code < 400:
            problems.append(f"{where}: not refused with a 4xx")
            return
        try:
            answer = r.json()
        except ValueError:
            problems.append(f"{where}: not JSON")
            return
        code = "not_utf8" if r.status_code == 422 and isinstance(answer.get("detail"), list) else answer.get("code")
        if code != expected and not (expected == "body_too_large" and r.status_code == 413):
            problems.append(f"{where}: expected {expected}")

    post()
    frames: list[bytes] = []

    ws_codes = {"not_utf8": "invalid_request"}  # a binary frame that is not UTF-8: INVALID_JSON, invalid_request
    expected_ws: list[str] = []

    @given(case=HOSTILE.filter(lambda c: len(c[0]) < 1_000_000), binary=st.booleans())
    @settings(max_examples=max(12, 6 * EXAMPLES), deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def collect(case, binary):
        body, expected = case
        frames.append(body if binary or not _is_utf8(body) else body.decode())
        expected_ws.append(ws_codes.get(expected, expected))

    collect()
    with connect(url.replace("http://", "ws://") + f"{base}/ws", open_timeout=30, max_size=None) as ws:
        for frame, expected in zip(frames, expected_ws):
            ws.send(frame)
            try:
                answer = json.loads(ws.recv(timeout=60))
            except Exception as exc:  # noqa: BLE001  (a dropped connection included)
                problems.append(f"WS {str(frame)[:80]!r} ({len(frame)}) -> no answer ({exc!r})")
                break
            statuses[f"ws {answer.get('data', {}).get('error_code')}"] += 1
            if answer.get("type") != "error" or answer["data"].get("error_code") != expected:
                problems.append(f"WS {str(frame)[:80]!r} ({len(frame)}) -> {str(answer)[:200]}; expected {expected}")
        ws.send(json.dumps({"type": "state"}))  # still playing
        assert json.loads(ws.recv(timeout=60))["type"] == "state"
    print(f"\nhostile bytes {name}: {dict(sorted(statuses.items(), key=str))}, {len(problems)} problems")
    assert problems == [], "\n".join(problems[:20])
    assert http.delete(f"/sessions/{sid}").status_code == 204
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["sessions"] == 0, health.text
    http.close()
