"""Text that is not valid Unicode (issue 20, section 3). A lone UTF-16 surrogate is legal JSON (``"\\ud800"``) and a
legal Python ``str``, but has no UTF-8 encoding. The rule (``docs/servers.md``, "Text"):

- in a request, anywhere (env id, session id, seed, options and env kwargs keys and values, action), it is a 422 with
  a JSON body naming the field, on every route, never a 500; both pools refuse it as ``EnvClientError`` with
  ``code="invalid_request"`` and the same message, before any env sees it;
- in an env's text (observation, ``info`` keys and values, an error message) each lone surrogate reaches the client
  as U+FFFD, a pair stored as two code points as the character it encodes; the answer is valid UTF-8 JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from servers_helpers import ECHO, free_port, make_app, serve_asgi, uvicorn_in_thread, wait_healthy
from user_env_module import SURROGATE_TEXT

from agent_rl.envclient import EnvClientError, EnvServerError, HTTPEnvPool, LocalEnvPool
from envs.hosting import lone_surrogate, scrub_text, to_jsonable
from servers.app import create_app

CHOOSE = "agent_rl/ChooseItem-v0"
# What SURROGATE_TEXT ("high \ud800 low \udfff pair \ud83d\ude00") becomes: one U+FFFD per lone surrogate, the pair
# joined into U+1F600.
SCRUBBED = "high \ufffd low \ufffd pair \U0001f600"
LIVE = "a" * 20  # a client-chosen session id (16-64 of [A-Za-z0-9_-])


def run(coro):
    return asyncio.run(coro)


def raw_json(body: object) -> bytes:
    """``body`` as the JSON a client sends: ``json.dumps`` escapes a lone surrogate as ``\\ud800`` (ASCII)."""
    return json.dumps(body).encode("ascii")


def strict_json(response: httpx.Response) -> object:
    """The answer as JSON, checking that it is valid UTF-8 and that every string in it is valid Unicode."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    value = json.loads(response.content.decode("utf-8", errors="strict"))
    assert lone_surrogate(value) is None, value
    return value


# ---- the rule's two functions ------------------------------------------------------------------------------------
def test_scrub_and_locate_by_hand():
    assert scrub_text(SURROGATE_TEXT) == SCRUBBED
    assert scrub_text("\ud800\ud800\ude00") == "\ufffd\U00010200"  # lone high, then a pair (U+10200)
    assert scrub_text("plain ü 😀") == "plain ü 😀"
    assert to_jsonable({"k\udfff": ["\ud800", ("x\udc80",)]}) == {"k\ufffd": ["\ufffd", ["x\ufffd"]]}
    assert lone_surrogate({"a": "ok ü", "b": [1, None, "😀"]}) is None
    assert lone_surrogate("abc\ud800", "session_id") == (
        "session_id: lone UTF-16 surrogate U+D800 at index 3 (not a Unicode character; send valid UTF-8 text)")
    assert lone_surrogate({"task": [0, 1, "xx\udfff"]}, "options").startswith(
        "options['task'][2]: lone UTF-16 surrogate U+DFFF at index 2")
    assert lone_surrogate({"k\ud800": 1}, "env_kwargs").startswith(
        "env_kwargs key 'k\ufffd': lone UTF-16 surrogate U+D800 at index 1")


# ---- requests: 422 with a JSON body on every route, for every field -----------------------------------------------
def test_issue_input_session_id_with_a_lone_surrogate_is_422():
    """Issue 20's input: it answered 500 (FastAPI's validation handler echoed the input and could not encode it)."""
    async def main():
        app = create_app([CHOOSE], max_sessions=4, prestart_workers=0)
        async with serve_asgi(app) as c:
            r = await c.post("/sessions", content=raw_json({"env_id": CHOOSE, "session_id": "abc\ud800"}),
                             headers={"content-type": "application/json"})
            assert r.status_code == 422
            (error,) = strict_json(r)["detail"]
            assert error["loc"] == ["body", "session_id"] and error["input"] == "abc\ufffd"
            assert "lone UTF-16 surrogate U+D800 at index 3" in error["msg"]
            assert (await c.get("/sessions")).json()["sessions"] == []
    run(main())


# (route, body, field the error names); "{live}" is a live session of the echo env
BAD_REQUESTS = [
    ("/sessions", {"env_id": ECHO + "\ud800"}, "env_id"),
    ("/sessions", {"env_id": ECHO, "session_id": LIVE[:-1] + "\udfff"}, "session_id"),
    ("/sessions", {"env_id": ECHO, "seed": "\ud800"}, "seed"),
    ("/sessions", {"env_id": ECHO, "options": {"tag": "x\ud800"}}, "options"),
    ("/sessions", {"env_id": ECHO, "options": {"t\ud800g": 1}}, "options"),
    ("/sessions", {"env_id": ECHO, "env_kwargs": {"prefix": ["\udbff"]}}, "env_kwargs"),
    ("/sessions", {"env_id": ECHO, "unknown\ud800": 1}, None),  # an unknown field's name: pydantic's own 422
    ("/sessions/{live}/step", {"action": "look \ud800"}, "action"),
    ("/sessions/{live}/step", {"action": "\udfff" * 3}, "action"),
    ("/sessions/{live}/reset", {"options": {"tag": "\ud800"}}, "options"),
    ("/sessions/{live}/reset", {"seed": 1, "options": {"\udc00": None}}, "options"),
]


def test_every_field_of_every_route_answers_422_with_a_json_body():
    async def main():
        async with serve_asgi(make_app()) as c:
            r = await c.post("/sessions", json={"env_id": ECHO, "session_id": LIVE})
            assert r.status_code == 201, r.text
            for path, body, field in BAD_REQUESTS:
                r = await c.post(path.format(live=LIVE), content=raw_json(body),
                                 headers={"content-type": "application/json"})
                assert r.status_code == 422, (path, body, r.text)
                detail = strict_json(r)["detail"]
                if field is not None:
                    assert [e["loc"] for e in detail] == [["body", field]], detail
                    assert "lone UTF-16 surrogate" in detail[0]["msg"] and field in detail[0]["msg"]
            # nothing reached the env: the live session took no step and no reset, no other session was opened
            listed = (await c.get("/sessions")).json()["sessions"]
            assert [(s["session_id"], s["steps"], s["episodes"]) for s in listed] == [(LIVE, 0, 1)]
            r = await c.post(f"/sessions/{LIVE}/step", json={"action": "ok"})
            assert r.status_code == 200 and r.json()["info"]["t"] == 1
            # a session id in the path is bytes: %ED%A0%80 (a surrogate's UTF-8 form) is replaced, never echoed raw
            r = await c.post("/sessions/%ED%A0%80/step", json={"action": "x"})
            assert r.status_code == 404 and strict_json(r)["code"] == "session_not_found"
            assert (await c.delete("/sessions/%ED%A0%80")).status_code == 404
    run(main())


# ---- env text: U+FFFD on the wire, the same from both pools ---------------------------------------------------------
def test_env_text_with_lone_surrogates_reaches_the_client_as_valid_json():
    """A real server (uvicorn on a port, worker processes) serving the echo env, which emits lone surrogates in its
    observation, ``info`` values and an ``info`` key, and in an exception message."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with uvicorn_in_thread(make_app(), port):
        wait_healthy(url)
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post("/sessions", json={"env_id": ECHO, "options": {"surrogate": True}})
            assert r.status_code == 201
            created = strict_json(r)
            assert created["observation"] == f"echo: ready {SCRUBBED}" and created["info"]["note"] == SCRUBBED
            sid = created["session_id"]
            r = c.post(f"/sessions/{sid}/step", json={"action": "surrogate"})
            assert r.status_code == 200
            step = strict_json(r)
            assert step["observation"] == f"echo: {SCRUBBED}"
            assert step["info"] == {"note": SCRUBBED, "list": [SCRUBBED], "key \ufffd": 1, "t": 1}
            r = c.post(f"/sessions/{sid}/step", json={"action": "raise-surrogate"})
            assert r.status_code == 500  # the env raised: documented 500 env_error, its message scrubbed
            error = strict_json(r)
            assert error["code"] == "env_error" and f"boom on purpose: {SCRUBBED}" in error["detail"]

        async def through_the_client():
            async with HTTPEnvPool(url, retries=0) as pool:
                reset = await pool.reset(ECHO, options={"surrogate": True})
                return reset, await pool.step(reset.session_id, "surrogate")

        reset, step = run(through_the_client())
        assert reset.observation == f"echo: ready {SCRUBBED}" and step.observation == f"echo: {SCRUBBED}"
        assert step.info["key \ufffd"] == 1


@contextlib.asynccontextmanager
async def open_pool(kind: str) -> AsyncIterator[object]:
    if kind == "http":
        app = make_app()
        async with serve_asgi(app):
            async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0) as pool:
                yield pool
    else:
        async with LocalEnvPool(max_workers=2, mode=kind, imports=["user_env_module"]) as pool:
            yield pool


@pytest.mark.parametrize("kind", ["http", "thread", "process"])
def test_both_pools_refuse_bad_text_alike_and_scrub_env_text_alike(kind):
    async def main():
        async with open_pool(kind) as pool:
            refused = []
            r = await pool.reset(ECHO, options={"surrogate": True})
            assert r.observation == f"echo: ready {SCRUBBED}"
            for call in (pool.step(r.session_id, "look \ud800"),
                         pool.reset(ECHO, options={"tag": ["ok", "\udfff"]}),
                         pool.reset(ECHO, env_kwargs={"pre\ud800fix": "x"}),
                         pool.reset(ECHO + "\ud800")):
                with pytest.raises(EnvClientError) as info:
                    await call
                assert not isinstance(info.value, EnvServerError)
                refused.append((type(info.value).__name__, info.value.code, info.value.status, str(info.value)))
            s = await pool.step(r.session_id, "surrogate")  # the refused step consumed nothing
            assert (s.observation, s.info["t"], s.info["note"]) == (f"echo: {SCRUBBED}", 1, SCRUBBED)
            with pytest.raises(EnvServerError, match="boom on purpose: high \ufffd low \ufffd pair \U0001f600"):
                await pool.step(r.session_id, "raise-surrogate")
            return refused

    refused = run(main())
    tail = " (not a Unicode character; send valid UTF-8 text)"
    assert refused == [
        ("EnvClientError", "invalid_request", None, "action: lone UTF-16 surrogate U+D800 at index 5" + tail),
        ("EnvClientError", "invalid_request", None,
         "options['tag'][1]: lone UTF-16 surrogate U+DFFF at index 0" + tail),
        ("EnvClientError", "invalid_request", None,
         "env_kwargs key 'pre\ufffdfix': lone UTF-16 surrogate U+D800 at index 3" + tail),
        ("EnvClientError", "invalid_request", None, "env_id: lone UTF-16 surrogate U+D800 at index 12" + tail),
    ]


def test_http_pool_scrubs_escaped_surrogates_from_another_server():
    """A server that is not ours may escape a lone surrogate (``json.dumps``' default): the client applies the same
    rule, so the trainer never gets text it cannot tokenize."""
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(204)
        body = {"session_id": json.loads(request.content)["session_id"], "observation": "obs \ud800 \ud83d\ude00",
                "info": {"k\udfff": ["\udc00"]}}
        return httpx.Response(201, content=json.dumps(body).encode("ascii"),
                              headers={"content-type": "application/json"})

    async def main():
        async with HTTPEnvPool("http://other", transport=httpx.MockTransport(answer), retries=0) as pool:
            return await pool.reset(ECHO)

    r = run(main())
    assert r.observation == "obs \ufffd \U0001f600" and r.info == {"k\ufffd": ["\ufffd"]}
