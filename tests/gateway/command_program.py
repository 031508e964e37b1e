"""A command agent program: ``python -m tests.gateway.command_program MODE [DIR]``. Its base URL, key and session id
come from its environment (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``: the real ``openai`` client reads them without
being told; ``AGENT_RL_SESSION_ID``), its task from stdin (the same as ``AGENT_RL_TASK``). One model call, then
the reward: ``print`` (last stdout line as JSON) or ``post`` (``POST /sessions/<id>/reward``); ``fail`` exits 3.
With DIR (files named by the session id): ``inspect`` writes its pid to ``DIR/<sid>.pid`` and waits for ``DIR/go``
before it starts (the test reads its ``/proc`` meanwhile); ``helper`` leaves a ``sleep 40`` running in the
background (holding its stdout) and exits; ``hang`` does the same but runs on itself after printing its reward;
``silent`` runs on without printing one; ``raw=TEXT`` prints TEXT as the last line. Pids go to ``DIR/<sid>.pids`` (its own, then the helper's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    mode = sys.argv[1]
    folder = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    session_id = os.environ["AGENT_RL_SESSION_ID"]
    task = json.loads(sys.stdin.read())
    assert task == json.loads(os.environ["AGENT_RL_TASK"])
    if mode in ("helper", "hang", "silent"):
        helper = subprocess.Popen(["sleep", "40"])  # inherits stdout: the pipe stays open while it lives
        (folder / f"{session_id}.pids").write_text(f"{os.getpid()} {helper.pid}")
    import httpx  # after the helper's start: the timeout tests need its pid early
    import openai

    if mode == "inspect":
        (folder / f"{session_id}.pid").write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    llm = openai.OpenAI(max_retries=0, timeout=120)  # OPENAI_BASE_URL, OPENAI_API_KEY from the environment
    reply = llm.chat.completions.create(model="policy", max_tokens=6,
                                        messages=[{"role": "user", "content": str(task["question"])}])
    reward = 1.0 if str(task["answer"]) in (reply.choices[0].message.content or "") else 0.25
    if mode == "fail":
        sys.exit(3)
    if mode.startswith("raw="):  # the reward line as written (NaN, Infinity, 1e308: refused by the gateway)
        print(mode.removeprefix("raw="))
        return
    if mode == "post":
        root = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
        httpx.post(f"{root}/sessions/{session_id}/reward", json={"reward": reward, "info": {"via": "post"}},
                   headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}, timeout=30).raise_for_status()
        print("some log line")
        return
    print("thinking...")
    if mode != "silent":
        print(json.dumps({"reward": reward, "info": {"via": "print"}}))
    if mode in ("hang", "silent"):
        time.sleep(60)


if __name__ == "__main__":
    main()
