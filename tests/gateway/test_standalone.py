"""``python -m agent_rl.gateway --checkpoint DIR --port P``: the gateway alone in front of a trained checkpoint serves
``GET /v1/models`` and ``POST /v1/chat/completions`` to the real ``openai`` client, needs its token, and stores each
episode (on its posted reward, and the open ones at exit) for the viewer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from agent_rl.episodes import load_episodes
from agent_rl.learner.config import ModelConfig
from agent_rl.models import load_policy
from agent_rl.runtime import free_port
from servers.wait import ServerExited, wait_healthy
from waiting import HANG_S, http

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model, tok = load_policy(ModelConfig(name="tiny"))
    path = tmp_path_factory.mktemp("ckpt") / "step_1"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_standalone_gateway_serves_a_checkpoint_and_stores_episodes(checkpoint, tmp_path):
    port, token, out = free_port(), "t" * 43, tmp_path / "out"
    env = {**os.environ, "AGENT_RL_GATEWAY_TOKEN": token, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "agent_rl.gateway", "--checkpoint", str(checkpoint), "--port",
                             str(port), "--out", str(out), "--max-new-tokens", "8", "--threads", "1"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        try:  # the ceiling only catches a server that never comes up; one that exits fails at once
            wait_healthy([url], timeout_s=HANG_S, interval_s=0.1, process=proc)
        except ServerExited:
            pytest.fail(proc.stdout.read().decode())
        assert http.get(f"{url}/v1/models").status_code == 401  # the token is required
        llm = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=HANG_S,
                            default_headers={"X-Session-ID": "ep-1"})
        assert len(llm.models.list().data) == 1
        messages = [{"role": "user", "content": "What is 2 + 2?"}]
        first = llm.chat.completions.create(model="x", messages=messages, max_tokens=100)
        assert first.usage.completion_tokens <= 8  # capped by --max-new-tokens
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Again."}]
        llm.chat.completions.create(model="x", messages=messages)
        assert http.post(f"{url}/sessions/ep-1/reward", json={"reward": 1.0},
                          headers={"Authorization": f"Bearer {token}"}).status_code == 200
        other = openai.OpenAI(base_url=f"{url}/sessions/ep-2/v1", api_key=token, max_retries=0, timeout=HANG_S)
        other.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        stored = load_episodes(out, 0)
        assert [(e["reward"], e["num_turns"], e["source"]) for e in stored] == [(1.0, 2, "gateway")]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    stored = load_episodes(out, 0)
    assert len(stored) == 2 and stored[1]["failure"] == "no reward posted" and stored[1]["num_turns"] == 1
