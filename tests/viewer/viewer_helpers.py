"""Shared pieces of the viewer tests: a byte tokenizer, hand-made episodes (one with hostile text), the tiny run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from agent_rl.types import Episode, Task, Turn
from waiting import HANG_S

REPO = Path(__file__).resolve().parents[2]
# the tiny training run of these tests: TGRL after warm-up (T0 and T1 episodes, JS on the T1 rows), 2 steps of
# 2 groups of 4
TINY_RUN = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.total_steps=2",
            "trainer.tasks_per_step=2", "rollout.max_turns=2", "engine.max_new_tokens=6", "algo=tgrl",
            "algo.warmup_steps=0", "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.save_episodes=all"]
HOSTILE_OBS = "<script>alert('obs')</script> & <b>bold</b>"
HOSTILE_ACTION = "<img src=x onerror=alert(1)>"


class ByteTokenizer:
    """ids = UTF-8 bytes + 3 (0 pad, 1 eos): a token can hold half a character, as byte-level BPE tokens can."""

    pad_token_id, eos_token_id = 0, 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + 3 for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


def make_episode(tok: ByteTokenizer, group_id: int, *, is_high: bool, responses: list[str],
                 observations: list[str], won: bool = False, task_type: str = "pick", prompt: str = "task: pick",
                 trajectory: bool = False) -> Episode:
    """An episode whose turns hold ``responses`` (engine log-probs -0.1 * (j + 1)) and ``observations``; in
    ``trajectory`` mode each turn's prompt is the conversation so far (as the orchestrator builds it)."""
    ep = Episode(task=Task("agent_rl/ChooseItem-v0", {"index": group_id}, group_id=group_id, seed=7),
                 temperature=1.2 if is_high else 0.3, is_high=is_high, task_type=task_type)
    prompt_ids = tok.encode(prompt)
    for k, (resp, obs) in enumerate(zip(responses, observations)):
        rid = tok.encode(resp)
        ep.turns.append(Turn(prompt_ids=list(prompt_ids), response_ids=rid,
                             response_logprobs=[-0.1 * (j + 1) for j in range(len(rid))], action=resp.strip(),
                             observation=obs, reward=float(won and k == len(responses) - 1),
                             terminated=k == len(responses) - 1, invalid=k == 0, info={"won": won, "big": [1, 2]}))
        prompt_ids = (prompt_ids + rid + tok.encode(f"\n{obs}\n")) if trajectory else tok.encode(f"{prompt} {obs}")
    ep.reward, ep.won = float(won), won
    return ep


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float = HANG_S) -> None:
    """Until ``url`` answers 200; the viewer exiting fails at once, the ceiling only catches one that never serves."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"viewer exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


def start_viewer(run_dir: Path, port: int) -> subprocess.Popen:
    """``python -m agent_rl.viewer RUN_DIR --port P`` (default host) as a user starts it; waits until it answers."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "agent_rl.viewer", str(run_dir), "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/steps", proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc
