"""Math-v0 and Code-v0 through the unchanged env server (in-process app, ``httpx.ASGITransport``).

The server runs each session in a daemonic worker process: the math verifier pool and the code sandbox must both
work from there (the verifier uses plain subprocesses for that reason).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from servers.app import create_app

pytestmark = pytest.mark.slow  # end to end: the served app with the real verifier pool and sandbox (fast tier: -m 'not slow')

MATH, CODE = "agent_rl/Math-v0", "agent_rl/Code-v0"


def test_math_and_code_over_http():
    async def main() -> None:
        app = create_app([MATH, CODE], max_sessions=4, prestart_workers=0)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost",
                                         timeout=120) as client:
                r = await client.post("/sessions", json={"env_id": MATH, "options": {"dataset": "aime25", "index": 0}})
                assert r.status_code == 201, r.text
                assert r.json()["info"]["dataset"] == "aime25"
                sid = r.json()["session_id"]
                r = await client.post(f"/sessions/{sid}/step", json={"action": "so b = 21 or 49: \\boxed{70}"})
                body = r.json()
                assert r.status_code == 200 and body["reward"] == 1.0 and body["terminated"] is True, r.text
                assert body["info"]["extracted"] == "70" and body["info"]["reference"] == "70"

                r = await client.post("/sessions", json={"env_id": CODE,
                                                         "options": {"dataset": "humaneval", "index": 2}})
                assert r.status_code == 201, r.text
                sid = r.json()["session_id"]
                action = "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
                r = await client.post(f"/sessions/{sid}/step", json={"action": action})
                body = r.json()
                assert r.status_code == 200 and body["reward"] == 1.0 and body["info"]["reason"] == "passed", r.text
                assert body["info"]["n_tests"] == 3
                json.dumps(body)

    asyncio.run(main())
