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

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("AGENT_RL_FUZZ_EXAMPLES", "3"))
SERVERS = {
    "calculator": (["agent_rl/Calculator-v0", "user/Echo-v0"], ["--import", "user_env_module"]),
    "webshop": (["agent_rl/WebShop-v0"], ["--workers", "2", "--import", "envs.webshop.preload"]),
    "alfworld": (["agent_rl/ALFWorld-v0"], ["--workers", "2"]),
}
DOCUMENTED_5XX = {(500, "env_error"), (504, "env_timeout")}


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
