"""A command-template agent program: ``python -m tests.gateway.command_program MODE BASE_URL API_KEY SESSION_ID
TASK_JSON``. One model call with the real ``openai`` client, then the reward: ``print`` (last stdout line as JSON)
or ``post`` (``POST /sessions/<id>/reward``); ``fail`` exits 3; ``raw=TEXT`` prints TEXT as the last line."""

from __future__ import annotations

import json
import sys

import httpx
import openai


def main() -> None:
    mode, base_url, api_key, session_id, task_json = sys.argv[1:6]
    task = json.loads(task_json)
    llm = openai.OpenAI(base_url=base_url, api_key=api_key, default_headers={"X-Session-ID": session_id},
                        max_retries=0, timeout=120)
    reply = llm.chat.completions.create(model="policy", max_tokens=6,
                                        messages=[{"role": "user", "content": str(task["question"])}])
    reward = 1.0 if str(task["answer"]) in (reply.choices[0].message.content or "") else 0.25
    if mode == "fail":
        sys.exit(3)
    if mode.startswith("raw="):  # the reward line as written (NaN, Infinity, 1e308: refused by the gateway)
        print(mode.removeprefix("raw="))
        return
    if mode == "post":
        root = base_url.removesuffix("/v1")
        httpx.post(f"{root}/sessions/{session_id}/reward", json={"reward": reward, "info": {"via": "post"}},
                   headers={"Authorization": f"Bearer {api_key}"}, timeout=30).raise_for_status()
        print("some log line")
        return
    print("thinking...")
    print(json.dumps({"reward": reward, "info": {"via": "print"}}))


if __name__ == "__main__":
    main()
