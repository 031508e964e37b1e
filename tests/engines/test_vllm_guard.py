"""The key guard of the run's vLLM servers (``agent_rl_vllm_guard.BearerGuard``, loaded by ``vllm serve
--middleware``), without vLLM (the main suite): a FastAPI app with the routes a vLLM 0.32 server of the run answers
(read from its source, ``vllm/entrypoints/``), the guard added the way vLLM's ``init_entrypoints_middleware`` adds a
``--middleware`` class (``app.add_middleware(cls)``, no arguments), then each route called without the key, with
wrong ones and with it. The same calls against a real ``vllm serve``: ``tests/engines/test_vllm_server_engine.py``
(mark ``vllm``)."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from fastapi import FastAPI, WebSocket
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from agent_rl.engines.vllm_server import GUARD_MIDDLEWARE, PLUGIN_DIR, server_command, server_environment

sys.path.insert(0, str(PLUGIN_DIR))  # as the servers import it: by its bare name from their PYTHONPATH
import agent_rl_vllm_guard  # noqa: E402

KEY = "the-runs-key-0123456789"
# Routes of a vLLM 0.32 server in dev mode that its own --api-key leaves open (no /v1, /v2, /inference prefix): the
# dev and RL routes (VLLM_SERVER_DEV_MODE=1), the weight-transfer routes (ipc: /update_weights is unpickled),
# health, metrics, SageMaker's; then some it guards itself.
OPEN_IN_VLLM = [
    ("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"), ("POST", "/collective_rpc"),
    ("POST", "/reset_prefix_cache"), ("POST", "/reset_mm_cache"), ("POST", "/reset_encoder_cache"),
    ("POST", "/update_weight_version"), ("POST", "/init_weight_transfer_engine"), ("POST", "/start_weight_update"),
    ("POST", "/update_weights"), ("POST", "/finish_weight_update"), ("POST", "/shutdown_weight_transfer_engine"),
    ("POST", "/start_draft_weight_update"), ("GET", "/get_world_size"), ("GET", "/weight_info"),
    ("POST", "/weight_checker"), ("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"),
    ("POST", "/release_kv_cache_memory"), ("POST", "/start_profile"), ("POST", "/stop_profile"),
    ("POST", "/abort_requests"), ("POST", "/scale_elastic_ep"), ("POST", "/is_scaling_elastic_ep"),
    ("GET", "/server_info"), ("GET", "/version"), ("GET", "/load"), ("GET", "/health"), ("GET", "/ping"),
    ("POST", "/invocations"), ("POST", "/tokenize"), ("GET", "/tokenizer_info"), ("GET", "/kv_event_sources"),
    ("GET", "/fault_tolerance/status"),
]
GUARDED_IN_VLLM = [("POST", "/inference/v1/generate"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                   ("POST", "/v1/load_lora_adapter")]
ROUTES = OPEN_IN_VLLM + GUARDED_IN_VLLM


def vllm_like_app() -> FastAPI:
    """The routes above (each answers 200 "served PATH"), ``/metrics`` as vLLM mounts Prometheus' app (a Mount),
    a WebSocket route (``/v1/realtime``), and the guard added as vLLM adds a ``--middleware`` class; one more route
    registered after the guard (SageMaker's bootstrap registers its routes after the middlewares)."""
    app = FastAPI()

    def route(path: str):
        async def handler() -> PlainTextResponse:
            return PlainTextResponse(f"served {path}")
        return handler

    for method, path in ROUTES:
        app.add_api_route(path, route(path), methods=[method])
    app.router.routes.append(Mount("/metrics", app=Starlette(routes=[Mount("/", app=PlainTextResponse("m 1"))])))

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text("hello")
        await ws.close()

    app.add_middleware(getattr(agent_rl_vllm_guard, GUARD_MIDDLEWARE.rsplit(".", 1)[1]))
    app.add_api_route("/late", route("/late"), methods=["GET"])
    return app


@pytest.fixture()
def client(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    with TestClient(vllm_like_app()) as c:
        yield c


WRONG = [
    ("no header", {}),
    ("another key", {"Authorization": "Bearer not-the-key"}),
    ("the key with another scheme", {"Authorization": f"Basic {KEY}"}),
    ("the key alone", {"Authorization": KEY}),
    ("a prefix of the key", {"Authorization": f"Bearer {KEY[:-1]}"}),
    ("the key and more", {"Authorization": f"Bearer {KEY}x"}),
    ("the key in another header", {"X-API-Key": KEY}),
]


@pytest.mark.parametrize("why,headers", WRONG, ids=[w for w, _ in WRONG])
def test_every_route_refuses_a_caller_without_the_key(client, why, headers):
    """Each route (methods as served, OPTIONS too, an unknown path, the Prometheus mount and a route added after
    the guard): 401 with an OpenAI-shaped error and ``WWW-Authenticate: Bearer``; the handler never runs."""
    calls = ROUTES + [("OPTIONS", p) for _, p in ROUTES[:5]] + [("GET", "/metrics"), ("GET", "/late"),
                                                                 ("GET", "/no/such/route"), ("GET", "/docs")]
    for method, path in calls:
        r = client.request(method, path, headers=headers, json={"method": "reload_weights"})
        assert r.status_code == 401, (why, method, path, r.status_code, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == 401 and "served" not in r.text


def test_the_key_sent_twice_is_refused(client):
    """Two ``Authorization`` headers (both the key) are refused: one header, one reading."""
    r = client.get("/health", headers=[("Authorization", f"Bearer {KEY}"), ("Authorization", f"Bearer {KEY}")])
    assert r.status_code == 401


def test_every_route_serves_the_key(client):
    for method, path in ROUTES + [("GET", "/late")]:
        r = client.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        assert (r.status_code, r.text) == (200, f"served {path}"), (method, path)
    assert client.get("/metrics", headers={"Authorization": f"bearer {KEY}"}).text == "m 1"  # scheme: any case


def test_websocket_handshake_needs_the_key(client):
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("/v1/realtime"):
            pass
    assert refused.value.code == 1008
    with client.websocket_connect("/v1/realtime", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert ws.receive_text() == "hello"


def test_no_key_no_server(monkeypatch):
    """Without ``VLLM_API_KEY`` the app fails to start (lifespan) instead of serving unguarded."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is unset"):
        with TestClient(vllm_like_app()):
            pass


def test_asgi_transport_refuses_an_unkeyed_weight_update(monkeypatch):
    """The same through httpx's ASGI transport (the engine's client library): the unpickled route of the ipc path
    refuses an unkeyed body before any handler reads it."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    read = []
    app = FastAPI()

    @app.post("/update_weights")
    async def update(body: dict) -> dict:
        read.append(body)
        return {}

    app.add_middleware(agent_rl_vllm_guard.BearerGuard)
    import asyncio

    async def go() -> tuple[int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
            bad = await http.post("/update_weights", json={"update_info": {"ipc_handles_pickled": "gASVAAAA"}})
            good = await http.post("/update_weights", json={"update_info": {}},
                                   headers={"Authorization": f"Bearer {KEY}"})
            return bad.status_code, good.status_code

    assert asyncio.run(go()) == (401, 200)
    assert read == [{"update_info": {}}]


def test_the_servers_load_the_guard_by_their_own_path_and_stdlib_only(tmp_path):
    """The run's servers get ``--middleware agent_rl_vllm_guard.BearerGuard`` and ``PYTHONPATH`` = the plugin
    folder alone; a bare Python without site-packages (``-S``), in another folder, with that environment imports
    the guard by name and builds it from ``VLLM_API_KEY``: it needs neither the project nor any package."""
    cmd = server_command("py", "m", 1)
    assert cmd[cmd.index("--middleware") + 1] == GUARD_MIDDLEWARE
    env = server_environment("k3y", base={"PATH": os.environ["PATH"], "PYTHONPATH": "/the/trainers/path"})
    assert env["PYTHONPATH"] == str(PLUGIN_DIR) and env["VLLM_API_KEY"] == "k3y"
    module, cls = GUARD_MIDDLEWARE.rsplit(".", 1)
    code = (f"import importlib; g = getattr(importlib.import_module({module!r}), {cls!r})(app=None); "
            "print(g.allowed([(b'authorization', b'Bearer k3y')]), g.allowed([]))")
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_the_readiness_wait_sends_the_key_to_a_guarded_health(monkeypatch):
    """A real uvicorn server with the guard: ``wait_healthy`` without the key waits in vain (HTTP 401 named),
    with the key (what ``ServerProcess.wait_ready`` sends) it returns."""
    import threading

    import uvicorn

    from servers.launch import free_port
    from servers.wait import wait_healthy

    monkeypatch.setenv("VLLM_API_KEY", KEY)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(vllm_like_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy([url], timeout_s=60, interval_s=0.1, headers={"Authorization": f"Bearer {KEY}"})
        with pytest.raises(TimeoutError, match="HTTP 401"):
            wait_healthy([url], timeout_s=0.5, interval_s=0.1)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
