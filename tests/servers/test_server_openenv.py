"""The OpenEnv surface of the env server (``servers/openenv.py``), tested with openenv-core's own client
(``GenericEnvClient``) and its wire models: HTTP reset/step/state/schema/metadata/health, the WS session channel,
the Task API, the token, and the faults (env errors, dead workers, timeouts, capacity, TTL) on the new routes, which
share the server's sessions and errors. ALFWorld expert and WebShop expert episodes over WS must be won."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import pytest
from openenv import GenericEnvClient
from openenv.core.env_server.types import (
    EnvironmentMetadata,
    HealthResponse,
    ResetResponse,
    SchemaResponse,
    State,
    StepResponse,
    WSErrorCode,
    WSErrorResponse,
    WSObservationResponse,
    WSStateResponse,
)
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

import tool_env_module  # noqa: F401  (registers user/ToolEcho-v0 here)
import user_env_module  # noqa: F401  (registers user/Echo-v0 here)
from served_envs import TOKEN
from servers.app import create_app
from servers.openenv import openenv_path
from servers_helpers import CALC, ECHO, free_port, uvicorn_in_thread
from waiting import HANG_S, http, wait_until

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

TOOL = "user/ToolEcho-v0"
ALFWORLD = "agent_rl/ALFWorld-v0"
WEBSHOP = "agent_rl/WebShop-v0"
# The env timeout of the `local` server: every op of an Echo env (a worker's start with its imports included) takes
# far less, even on a busy machine; the timeout test's step sleeps far longer (it is ended at this limit).
ENV_TIMEOUT_S = 8.0
OPENENV_ROUTES = {"/reset", "/step", "/state", "/schema", "/metadata", "/health", "/splits", "/tasks", "/num_tasks",
                  "/task", "/task_range"}


def client_url(url: str, env_id: str | None, token: str | None = None) -> str:
    """An OpenEnv client's base_url: the env's openenv path (``None``: the server's root), the token as the URL's
    password (openenv-core's client takes no headers; its WebSocket library sends Basic auth for it)."""
    if token:
        url = url.replace("://", f"://agent_rl:{token}@", 1)
    return url + (openenv_path(env_id) if env_id else "")


def ws_url(url: str, env_id: str) -> str:
    return url.replace("http://", "ws://") + openenv_path(env_id) + "/ws"


@pytest.fixture(scope="module")
def local():
    """Calculator, Echo and ToolEcho behind a real uvicorn in this process (max 4 sessions, env timeout
    :data:`ENV_TIMEOUT_S`)."""
    app = create_app([CALC, ECHO, TOOL], imports=["user_env_module", "tool_env_module"], max_sessions=4,
                     prestart_workers=0, env_timeout_s=ENV_TIMEOUT_S)
    port = free_port()
    with uvicorn_in_thread(app, port):
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), "the server answers /health")
        yield url


def sessions(url: str, token: str | None = None) -> list[dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return http.get(url + "/sessions", headers=headers, timeout=30).json()["sessions"]


class Raw:
    """A raw WS connection speaking OpenEnv's messages; every answer is checked against openenv-core's model."""

    def __init__(self, url: str, env_id: str, **kw) -> None:
        kw.setdefault("open_timeout", HANG_S)  # websockets' 10 s default would fail a busy server's handshake
        self.ws = ws_connect(ws_url(url, env_id), **kw).__enter__()

    def send(self, message) -> dict:
        self.ws.send(message if isinstance(message, str) else json.dumps(message))
        answer = json.loads(self.ws.recv(timeout=HANG_S))  # the ceiling only catches a server that never answers
        model = {"observation": WSObservationResponse, "state": WSStateResponse, "error": WSErrorResponse}
        model[answer["type"]].model_validate(answer)
        if answer["type"] == "error":
            assert answer["data"]["code"] in {c.value for c in WSErrorCode}, answer
        return answer

    def close(self) -> None:
        self.ws.close()


# ------------------------------------------------------------------------------------------ routes and shapes
def test_envs_lists_each_openenv_path_and_openapi_documents_the_routes(local):
    envs = http.get(local + "/envs").json()
    assert envs["env_ids"] == [CALC, ECHO, TOOL]
    assert envs["envs"] == [{"env_id": e, "openenv_path": f"/envs/{e}", "mcp_path": f"/envs/{e}/mcp"}
                            for e in (CALC, ECHO, TOOL)]
    paths = set(http.get(local + "/openapi.json").json()["paths"])
    for env_id in (CALC, ECHO, TOOL):
        assert {f"/envs/{env_id}{r}" for r in OPENENV_ROUTES} <= paths
    assert "/reset" not in paths  # three envs: no root alias (a one-env server has one, tested below)


def test_http_routes_answer_openenv_shapes_and_are_stateless(local):
    base = local + openenv_path(CALC)
    r = http.post(base + "/reset", json={"index": 0})
    assert r.status_code == 200
    reset = ResetResponse.model_validate(r.json())
    assert reset.observation["text"].startswith("Tom saves 17 dollars a week for 13 weeks and spends 6")
    assert (reset.reward, reset.done, reset.observation["tools"]) == (None, False, [])
    assert reset.observation["info"]["task_id"] == "calculator/0"
    # a fresh env per request: the step resets problem 0 itself, then plays the answer (17 * 13 - 6 = 215)
    r = http.post(base + "/step", json={"action": {"action": "answer[215]"}, "index": 0})
    step = StepResponse.model_validate(r.json())
    assert (step.observation["text"], step.reward, step.done, step.observation["terminated"]) == (
        "Correct!", 1.0, True, True)
    assert "tools" not in step.observation
    assert sessions(local) == []  # nothing kept
    assert State.model_validate(http.get(base + "/state").json()) == State()
    schema = SchemaResponse.model_validate(http.get(base + "/schema").json())
    assert schema.action["required"] == ["action"] and schema.action["properties"]["action"]["type"] == "string"
    assert {"text", "info", "terminated", "truncated", "session_id"} <= set(schema.observation["properties"])
    assert HealthResponse.model_validate(http.get(base + "/health").json()).status == "healthy"
    meta = http.get(base + "/metadata").json()
    EnvironmentMetadata.model_validate({k: v for k, v in meta.items() if k != "tools"})
    assert meta["name"] == CALC and meta["tools"] == []
    assert http.get(local + openenv_path(TOOL) + "/metadata").json()["tools"] == tool_env_module.TOOLS
    assert sessions(local) == []


def test_http_errors_are_our_4xx_5xx_json(local):
    base = local + openenv_path(CALC)
    r = http.post(base + "/reset", json={"index": -1})  # the env's ValueError: the client's error
    assert (r.status_code, r.json()["code"]) == (422, "invalid_request")
    assert r.json()["detail"].endswith("no session was opened")
    assert http.post(base + "/reset", json={"seed": "1"}).status_code == 422  # strict types
    assert http.post(base + "/step", json={"action": {"action": 3}}).status_code == 422
    assert http.post(base + "/step", json={"action": {"action": "x", "bogus": 1}}).status_code == 422
    r = http.post(base + "/step", json={"action": {"action": "x" * (64 * 1024 + 1)}})
    assert (r.status_code, r.json()["code"]) == (413, "action_too_large")
    r = http.post(base + "/reset", content=b'{"index": "\\ud800"}', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "lone UTF-16 surrogate U+D800" in r.text
    echo = local + openenv_path(ECHO)
    r = http.post(echo + "/step", json={"action": {"action": "raise"}})
    assert (r.status_code, r.json()["code"]) == (500, "env_error")
    assert "boom on purpose" in r.json()["detail"] and r.json()["detail"].endswith("the session was closed")
    r = http.post(echo + "/step", json={"action": {"action": "infra"}})
    assert (r.status_code, r.json()["code"]) == (500, "env_infra_error")
    assert sessions(local) == []


def test_task_api_in_openenv_shapes(local):
    base = local + openenv_path(CALC)
    assert http.get(base + "/splits").json() == [{"name": "test", "type": "test"}]
    assert http.get(base + "/tasks").json() == {"env_id": CALC, "splits": [
        {"name": "test", "type": "test", "num_tasks": 1000}]}
    assert http.post(base + "/num_tasks", json={"split": "test"}).json() == {"num_tasks": 1000}
    task = http.post(base + "/task", json={"split": "test", "index": 7}).json()["task"]
    assert task == {"id": "calculator/7", "split": "test", "index": 7, "reset": {"index": 7}}
    tasks = http.post(base + "/task_range", json={"split": "test", "start": 998}).json()["tasks"]
    assert [t["index"] for t in tasks] == [998, 999]
    assert len(http.post(base + "/tasks", json={"split": "test"}).json()["tasks"]) == 1000
    # a task's reset options play it: over HTTP reset, the info names the same task
    r = http.post(base + "/reset", json=task["reset"]).json()
    assert r["observation"]["info"]["task_id"] == task["id"]
    for body, why in [({"split": "test", "index": 1000}, "out of range"), ({"split": "train", "index": 0},
                                                                              "unknown split")]:
        r = http.post(base + "/task", json=body)
        assert (r.status_code, r.json()["code"]) == (400, "invalid_task") and why in r.json()["detail"]
    r = http.get(local + openenv_path(ECHO) + "/splits")  # a user's env without a task listing
    assert (r.status_code, r.json()["code"]) == (501, "not_implemented")
    assert sessions(local) == []


# ------------------------------------------------------------------------------------------- the WS channel
def test_openenv_client_plays_an_episode_over_ws_in_a_session_of_ours(local):
    with GenericEnvClient(base_url=client_url(local, CALC)).sync() as env:
        r = env.reset(index=0)
        sid = r.observation["session_id"]
        assert r.observation["text"].startswith("Tom saves 17 dollars") and (r.reward, r.done) == (None, False)
        assert [s["session_id"] for s in sessions(local)] == [sid]  # the WS session is one of ours
        r = env.step({"action": "calc[17 * 13 - 6]"})
        assert (r.observation["text"], r.reward, r.done) == ("Result: 215", 0.0, False)
        state = env.state()
        assert (state["step_count"], state["session_id"], state["episodes"]) == (1, sid, 1)
        r = env.step({"action": "answer[215]"})
        assert (r.observation["text"], r.reward, r.done, r.observation["info"]["won"]) == ("Correct!", 1.0, True,
                                                                                          True)
        with pytest.raises(RuntimeError, match=r"episode of session .* is over.*SESSION_ERROR"):
            env.step({"action": "answer[215]"})
        r = env.reset(index=1, episode_id="my-episode")  # another task: a new session (placed by task), old closed
        second = r.observation["session_id"]
        assert second != sid and [s["session_id"] for s in sessions(local)] == [second]
        assert env.state()["episode_id"] == "my-episode" and r.observation["info"]["task_id"] == "calculator/1"
        r = env.reset(index=1)  # the same task again: the same session, reset in place
        assert r.observation["session_id"] == second and env.state()["episodes"] == 3
        assert [s["episodes"] for s in sessions(local)] == [2]
        r = env.reset(index=1, env_kwargs={"action_format": "tools"})  # other env kwargs: a new session
        assert r.observation["session_id"] != second
        assert [t["function"]["name"] for t in r.observation["tools"]] == ["calc", "answer"]
        assert [s["session_id"] for s in sessions(local)] == [r.observation["session_id"]]
    wait_until(lambda: sessions(local) == [])  # the connection's session closed with it


def test_ws_messages_and_errors_in_openenv_shapes(local):
    raw = Raw(local, ECHO)
    try:
        assert raw.send("{not json")["data"]["code"] == "INVALID_JSON"
        assert raw.send([1, 2])["data"]["code"] == "VALIDATION_ERROR"
        assert raw.send({"type": "teleport"})["data"]["code"] == "UNKNOWN_TYPE"
        assert raw.send({"type": ["reset"]})["data"]["code"] == "UNKNOWN_TYPE"  # not even a string
        assert raw.send({"type": "step", "data": {"action": "x"}})["data"] == {
            "message": "no episode: send a reset first", "code": "SESSION_ERROR", "status": 409,
            "error_code": "episode_over"}
        assert raw.send({"type": "step"})["data"]["code"] == "VALIDATION_ERROR"  # data is required
        assert raw.send({"type": "reset", "data": {"seed": "1"}})["data"]["code"] == "VALIDATION_ERROR"
        answer = raw.send({"type": "reset", "data": {}})
        assert answer["data"]["observation"]["text"] == "echo: ready" and answer["data"]["reward"] is None
        assert raw.send({"type": "step", "data": {"action": 3}})["data"]["code"] == "VALIDATION_ERROR"
        bad = raw.send('{"type": "step", "data": {"action": "a\\ud800"}}')["data"]
        assert bad["code"] == "VALIDATION_ERROR" and "lone UTF-16 surrogate U+D800" in bad["message"]
        big = raw.send({"type": "step", "data": {"action": "x" * (64 * 1024 + 1)}})["data"]
        assert (big["status"], big["error_code"]) == (413, "action_too_large")
        answer = raw.send({"type": "step", "data": {"action": "hello", "metadata": {"k": 1}}})
        assert (answer["data"]["observation"]["text"], answer["data"]["reward"], answer["data"]["done"]) == (
            "echo: hello", 0.0, False)
        state = raw.send({"type": "state"})["data"]
        assert (state["step_count"], state["env_id"]) == (1, ECHO)
        # the env raises: EXECUTION_ERROR with our code; the session is closed, the connection goes on
        failed = raw.send({"type": "step", "data": {"action": "raise"}})["data"]
        assert (failed["code"], failed["status"], failed["error_code"]) == ("EXECUTION_ERROR", 500, "env_error")
        assert "boom on purpose" in failed["message"] and failed["message"].endswith("the session was closed")
        assert sessions(local) == []
        assert raw.send({"type": "reset", "data": {}})["type"] == "observation"  # a new session
        infra = raw.send({"type": "step", "data": {"action": "infra"}})["data"]
        assert (infra["code"], infra["error_code"]) == ("EXECUTION_ERROR", "env_infra_error")
        rejected = raw.send({"type": "reset", "data": {"raise": "IndexError"}})["data"]  # an option: env rejects
        assert (rejected["code"], rejected["status"]) == ("VALIDATION_ERROR", 422)
        assert raw.send({"type": "reset", "data": {"surrogate": True}})["data"]["observation"]["text"] == (
            "echo: ready high \ufffd low \ufffd pair \U0001f600")  # env text made valid Unicode
    finally:
        raw.close()
    wait_until(lambda: sessions(local) == [])


def test_ws_faults_dead_worker_and_timeout_leave_the_rest_serving(local):
    bystander, raw = Raw(local, ECHO), Raw(local, ECHO)
    try:
        bystander.send({"type": "reset", "data": {"options": {"k": 1}}})
        raw.send({"type": "reset", "data": {"k": 2}})
        dead = raw.send({"type": "step", "data": {"action": "exit"}})["data"]  # the env's worker process dies
        assert (dead["code"], dead["error_code"]) == ("EXECUTION_ERROR", "env_error") and "died" in dead["message"]
        assert bystander.send({"type": "step", "data": {"action": "still"}})["data"]["observation"]["text"] == (
            "echo: still")
        raw.send({"type": "reset", "data": {"k": 2}})
        slow = raw.send({"type": "step", "data": {"action": "sleep:600"}})["data"]  # ended at the env timeout
        assert (slow["code"], slow["status"], slow["error_code"]) == ("EXECUTION_ERROR", 504, "env_timeout")
        assert bystander.send({"type": "step", "data": {"action": "again"}})["type"] == "observation"
        assert raw.send({"type": "reset", "data": {}})["type"] == "observation"
    finally:
        raw.close()
        bystander.close()
    wait_until(lambda: sessions(local) == [])


def test_ws_capacity_is_the_servers_max_sessions(local):
    raws = [Raw(local, ECHO) for _ in range(4)]
    try:
        for raw in raws:
            assert raw.send({"type": "reset", "data": {}})["type"] == "observation"
        r = http.post(local + "/sessions", json={"env_id": ECHO})  # our API sees the same limit
        assert (r.status_code, r.json()["code"]) == (503, "at_capacity")
        late = Raw(local, ECHO)  # a connection holds no session: its reset is refused, the connection stays
        try:
            for _ in range(2):
                refused = late.send({"type": "reset", "data": {}})["data"]
                assert (refused["code"], refused["status"], refused["error_code"]) == (
                    "CAPACITY_REACHED", 503, "at_capacity")
            raws[0].close()
            wait_until(lambda: len(sessions(local)) == 3)
            assert late.send({"type": "reset", "data": {}})["type"] == "observation"  # the retry gets the slot
        finally:
            late.close()
    finally:
        for raw in raws:
            raw.close()
    wait_until(lambda: sessions(local) == [])


def test_ws_session_expires_with_the_ttl_and_an_idle_connection_is_closed():
    ttl_s = 2.0  # the gaps between the keep-alive messages below are ~0.2 s: a tenth of it, even on a busy machine
    app = create_app([ECHO], imports=["user_env_module"], max_sessions=4, prestart_workers=0, session_ttl_s=ttl_s)
    port = free_port()
    with uvicorn_in_thread(app, port):
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), "the server answers /health")
        raw = Raw(url, ECHO)
        try:
            sid = raw.send({"type": "reset", "data": {}})["data"]["observation"]["session_id"]
            started = time.monotonic()
            while time.monotonic() - started < 2 * ttl_s:  # activity keeps both alive past the TTL
                raw.send({"type": "step", "data": {"action": "keepalive"}})
                time.sleep(0.2)
            assert raw.send({"type": "state"})["data"]["session_id"] == sid
            # silence: the server closes the silent connection past the TTL (waited for: the close itself), and
            # its session goes (closed with the connection, or expired by the reaper first: the two clocks race)
            with pytest.raises(ConnectionClosed):
                raw.ws.recv(timeout=HANG_S)
            wait_until(lambda: sessions(url) == [], "the connection's session closed")
        finally:
            raw.close()
        # a session left idle (no connection holds it) is ended by the reaper past the TTL
        expired = http.get(url + "/health").json()["expired_sessions"]
        assert http.post(url + "/sessions", json={"env_id": ECHO}).status_code == 201
        wait_until(lambda: sessions(url) == [], "the idle session expired")
        assert http.get(url + "/health").json()["expired_sessions"] == expired + 1


def _up(url: str) -> bool:
    try:
        return http.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# -------------------------------------------------------------------------------------- tools and the token
def test_session_create_returns_the_declared_tools(local):
    r = http.post(local + "/sessions", json={"env_id": TOOL})
    assert r.status_code == 201 and r.json()["tools"] == tool_env_module.TOOLS
    sid = r.json()["session_id"]
    step = http.post(f"{local}/sessions/{sid}/step", json={"action": json.dumps(
        {"name": "finish", "arguments": {"answer": "42"}})}).json()
    assert (step["observation"], step["reward"], step["terminated"]) == ("right", 1.0, True)
    http.delete(f"{local}/sessions/{sid}")
    r = http.post(local + "/sessions", json={"env_id": ECHO})  # an env that declares none
    assert r.json()["tools"] == []
    http.delete(f"{local}/sessions/{r.json()['session_id']}")
    with GenericEnvClient(base_url=client_url(local, TOOL)).sync() as env:
        assert env.reset().observation["tools"] == tool_env_module.TOOLS


def test_token_guards_every_surface_and_openenv_client_passes_it_in_the_url():
    app = create_app([CALC], max_sessions=4, prestart_workers=0, token="s3cret")
    port = free_port()
    with uvicorn_in_thread(app, port):
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), "the server answers /health")
        base = url + openenv_path(CALC)
        basic = "Basic " + base64.b64encode(b"anyone:s3cret").decode()
        for path in (base + "/health", url + "/health"):  # health checks need none
            assert http.get(path).status_code == 200
        for method, path, body in [("POST", "/reset", {}), ("POST", "/step", {"action": {"action": "x"}}),
                                   ("GET", "/state", None), ("GET", "/schema", None), ("GET", "/metadata", None),
                                   ("GET", "/splits", None), ("POST", "/task", {"split": "test", "index": 0})]:
            for root in (base, url):  # the env's path and the one-env server's root alias
                r = http.request(method, root + path, json=body)
                assert (r.status_code, r.json()["code"]) == (401, "unauthorized"), path
                assert http.request(method, root + path, json=body,
                                     headers={"Authorization": "Bearer wrong"}).status_code == 401
                assert http.request(method, root + path, json=body, headers={"Authorization": basic}).status_code \
                    == 200, path
        assert http.post(url + "/sessions", json={"env_id": CALC}, headers={"Authorization": basic}).status_code \
            == 201
        with pytest.raises(ConnectionError, match="HTTP 401"):
            with GenericEnvClient(base_url=client_url(url, CALC)).sync() as env:
                env.reset()
        with pytest.raises(ConnectionError, match="HTTP 401"):
            with GenericEnvClient(base_url=client_url(url, CALC, "wrong")).sync() as env:
                env.reset()
        for root in (CALC, None):  # the env's path, and the root of a one-env server
            with GenericEnvClient(base_url=client_url(url, root, "s3cret")).sync() as env:
                r = env.reset(index=0)
                assert env.step({"action": "answer[215]"}).reward == 1.0 and r.observation["session_id"]


# ------------------------------------------------------------------------ the real envs, over openenv's client
def test_openenv_client_wins_alfworld_expert_episodes_over_ws(alfworld_url):
    """Games 0-2 of valid_unseen, the env's handcoded expert (env_kwargs expert=True) played through
    openenv-core's async client, three connections at once; each game's task id is the Task API's."""
    tasks = http.post(alfworld_url + openenv_path(ALFWORLD) + "/task_range", json={
        "split": "valid_unseen", "start": 0, "stop": 3}, headers={"Authorization": f"Bearer {TOKEN}"}).json()["tasks"]

    async def play(task: dict) -> tuple[str, bool, float, int]:
        async with GenericEnvClient(base_url=client_url(alfworld_url, ALFWORLD, TOKEN),
                                    message_timeout_s=300) as env:
            r = await env.reset(**task["reset"], seed=task["index"], env_kwargs={"expert": True})
            task_id, steps = r.observation["info"]["task_id"], 0
            while not r.done:
                r = await env.step({"action": r.observation["info"]["expert_action"]})
                steps += 1
            return task_id, bool(r.observation["info"]["won"]), r.reward, steps

    async def main():
        return await asyncio.gather(*(play(t) for t in tasks))

    results = asyncio.run(main())
    assert [r[0] for r in results] == [t["id"] for t in tasks]
    assert [(won, reward) for _, won, reward, _ in results] == [(True, 1.0)] * 3, results
    assert all(0 < steps < 50 for *_, steps in results)


def test_openenv_client_wins_webshop_expert_episodes_over_ws(webshop_url):
    """Goals 0-3 (val), the env's expert (the oracle, env_kwargs expert=True), through openenv-core's sync client
    on one connection (one session reset in place per goal); goal 0's actions are the oracle's (hand-checked in
    tests/webshop): search, click b0743jkhbv, click 28" x 28", buy now."""
    played = []
    with GenericEnvClient(base_url=client_url(webshop_url, WEBSHOP, TOKEN), message_timeout_s=120).sync() as env:
        for goal in range(4):
            r = env.reset(goal_idx=goal, env_kwargs={"expert": True})
            actions = []
            while not r.done:
                actions.append(r.observation["info"]["expert_action"])
                r = env.step({"action": actions[-1]})
            played.append((goal, r.reward, r.observation["info"]["won"], actions))
    assert [(g, reward, won) for g, reward, won, _ in played] == [(g, 1.0, True) for g in range(4)]
    assert played[0][3][1:] == ["click[b0743jkhbv]", 'click[28" x 28"]', "click[buy now]"]
    wait_until(lambda: sessions(webshop_url, TOKEN) == [])


def test_the_trl_snippet_in_docs_plays_webshop(webshop_url):
    """docs/servers.md's TRL environment class, run as written (its ENV_URL pointed at the test server, with the
    token): goal 0 (val index 0) with the oracle's actions through its search/click tools wins, reward_func reads
    1.0, a tool call after the end raises as TRL expects."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "servers.md").read_text()
    code = re.search(r"<!-- snippet: trl-environment -->\s*```python\n(.*?)```", doc, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/servers.md", "exec"), namespace)
    assert namespace["ENV_URL"] == "http://127.0.0.1:8002/envs/agent_rl/WebShop-v0"
    namespace["ENV_URL"] = client_url(webshop_url, WEBSHOP, TOKEN)
    env = namespace["WebShopEnv"]()
    first = env.reset(index=0)
    assert "double sided, machine washable decorative pillows" in first.lower()
    env.search('Find me double sided, machine washable decorative pillows with printing technology with size: '
               '28" x 28"')
    env.click("b0743jkhbv")
    env.click('28" x 28"')
    env.click("buy now")
    assert (env.done, namespace["reward_func"]([env])) == (True, [1.0])
    with pytest.raises(ValueError, match="over"):
        env.click("buy now")
    env.client.close()
