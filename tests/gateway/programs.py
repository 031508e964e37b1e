"""Agent programs the gateway tests train: each is ``function(task, gateway)`` and talks to the gateway with the real
``openai`` client, as a researcher's program would (its env through the env server's step route, over HTTP)."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import httpx
import openai

from envs.examples.calculator import CALCULATOR_TOOLS


def client(gateway: dict[str, Any], *, per_session_url: bool = False) -> openai.OpenAI:
    """The program's OpenAI client: the gateway's base URL and key, the session in a header (or in the URL)."""
    if per_session_url:  # a client that cannot set headers: the per-episode base URL
        base = gateway["base_url"].removesuffix("/v1") + f"/sessions/{gateway['session_id']}/v1"
        return openai.OpenAI(base_url=base, api_key=gateway["api_key"], max_retries=0, timeout=120)
    return openai.OpenAI(base_url=gateway["base_url"], api_key=gateway["api_key"], max_retries=0, timeout=120,
                         default_headers=gateway["headers"])


def env_step(task: dict[str, Any], action: str) -> dict[str, Any]:
    """One step of the task's env session (the env server's route, ``POST {base_url}/sessions/<id>/step``)."""
    env = task["env"]
    r = httpx.post(f"{env['base_url']}/sessions/{env['session_id']}/step", json={"action": action},
                   headers=env["headers"], timeout=60)
    r.raise_for_status()
    return r.json()


FEW_SHOT = ("You solve arithmetic problems with tools. To use a tool, reply with one call and nothing else, e.g.\n"
            '<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>\nthen, once you know '
            'the result:\n<tool_call>\n{"name": "answer", "arguments": {"answer": "84"}}\n</tool_call>')
"""A system message with a worked call in the hermes format (``calculator_tools_fewshot``: small models copy it)."""


def calculator_tools(task: dict[str, Any], gateway: dict[str, Any], *,
                     system: str = "You solve arithmetic problems with tools.") -> Any:
    """Solve a Calculator problem with the calc/answer tools: every tool call runs on the env; a reply without a
    call is sent to the env as text (judged: an invalid action). Reward: the env's (returns None)."""
    llm = client(gateway)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                      {"role": "user", "content": task["observation"]}]
    for _ in range(3):
        resp = llm.chat.completions.create(model="any-name", messages=messages, tools=CALCULATOR_TOOLS,
                                           temperature=0.0, max_tokens=10_000, n=1)
        msg = resp.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if msg.tool_calls:
            done = False
            for call in msg.tool_calls:
                args = json.loads(call.function.arguments or "{}")
                arg = args.get("expression", args.get("answer", ""))
                step = env_step(task, f"{call.function.name}[{arg}]"[:200])
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(step["observation"])})
                done = done or step["terminated"] or step["truncated"]
            if done:
                return None
        else:
            step = env_step(task, (msg.content or "?")[:200])
            if step["terminated"] or step["truncated"]:
                return None
            messages.append({"role": "user", "content": str(step["observation"])})
    return None


def calculator_tools_fewshot(task: dict[str, Any], gateway: dict[str, Any]) -> Any:
    """:func:`calculator_tools` with :data:`FEW_SHOT` as its system message (so that a small model writes tool calls,
    and the client sends them back as ``tool_calls`` with ``tool`` results: the prefix rule on tool calls)."""
    return calculator_tools(task, gateway, system=FEW_SHOT)


_ACTION = re.compile(r"Action:\s*((?:calc|answer)\[[^\]]*\])")


def react_text(task: dict[str, Any], gateway: dict[str, Any]) -> Any:
    """A ReAct-style text agent (no tools): Thought/Action lines read from the reply, through the per-episode base
    URL (no headers); the env's observation comes back as the next user message. Reward: the env's."""
    llm = client(gateway, per_session_url=True)
    messages = [{"role": "system", "content": "Answer with 'Thought: ...' then 'Action: calc[...]' or "
                                              "'Action: answer[...]'."},
                {"role": "user", "content": task["observation"]}]
    for _ in range(3):
        resp = llm.chat.completions.create(model="policy", messages=messages, max_tokens=24)
        text = resp.choices[0].message.content or ""
        found = _ACTION.search(text)
        step = env_step(task, found.group(1) if found else text[:200] or "?")
        if step["terminated"] or step["truncated"]:
            return None
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": f"Observation: {step['observation']}"}]
    return None


def rewriting(task: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """Two calls that extend each other, then a call whose history was rewritten (the first user message edited, as
    a harness that summarizes its context does): a prefix break. Reward: returned."""
    llm = client(gateway)
    messages = [{"role": "user", "content": task["observation"]}]
    first = llm.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Go on."}]
    llm.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    summary = [{"role": "user", "content": "Summary of the problem so far: " + task["observation"][:40]}]
    llm.chat.completions.create(model="policy", messages=summary, max_tokens=8)
    return {"reward": 0.5, "info": {"rewritten": True}}


_ATTEMPTS: dict[Any, int] = {}
_LOCK = threading.Lock()


def crash_first_attempt(task: dict[str, Any], gateway: dict[str, Any]) -> float:
    """One model call, then: the first program run of each group raises (a crashing harness), later ones return 1.0."""
    client(gateway).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4)
    with _LOCK:
        n = _ATTEMPTS[task["group_id"]] = _ATTEMPTS.get(task["group_id"], 0) + 1
    if n == 1:
        raise RuntimeError("the harness crashed")
    return 1.0


def always_crash(task: dict[str, Any], gateway: dict[str, Any]) -> float:
    client(gateway).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4)
    raise RuntimeError("the harness always crashes")


def no_reward(task: dict[str, Any], gateway: dict[str, Any]) -> None:
    """A model call, no env step, no reward: an env failure (never a reward 0)."""
    client(gateway).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4)
    return None


def slow(task: dict[str, Any], gateway: dict[str, Any]) -> float:
    """Runs 5 s before its reward (past a shorter ``env.external.timeout_s``)."""
    threading.Event().wait(5.0)
    return 1.0


def file_task(task: dict[str, Any], gateway: dict[str, Any]) -> float:
    """A task file's row (``question``, ``answer``) asked once; reward 1.0 if the reply holds the answer, else 0.25."""
    reply = client(gateway).chat.completions.create(model="policy", max_tokens=6,
                                                    messages=[{"role": "user", "content": task["question"]}])
    return 1.0 if str(task["answer"]) in (reply.choices[0].message.content or "") else 0.25


def reply_length(task: dict[str, Any], gateway: dict[str, Any]) -> float:
    """A file task asked once; reward: the reply's distinct characters / 10 (differs between a group's episodes, so
    the update has a learning signal even with the tiny random model)."""
    reply = client(gateway).chat.completions.create(model="policy", max_tokens=8,
                                                    messages=[{"role": "user", "content": task["question"]}])
    return len(set(reply.choices[0].message.content or "")) / 10


def row_reward(task: dict[str, Any], gateway: dict[str, Any]) -> float:
    """A task file's row asked once; reward: the row's own ``reward`` read as a float (``"nan"``, ``"1e308"``: a
    number a batch cannot hold, which the gateway must refuse)."""
    client(gateway).chat.completions.create(model="policy", max_tokens=2,
                                            messages=[{"role": "user", "content": task["question"]}])
    return float(task["reward"])


def echo_steps(task: dict[str, Any], gateway: dict[str, Any]) -> None:
    """One model call, then two steps of its Echo env that each answer reward 3e38 (fits float32; their sum does
    not). Reward: the env's (returns None)."""
    client(gateway).chat.completions.create(model="policy", max_tokens=2,
                                            messages=[{"role": "user", "content": task["observation"]}])
    env_step(task, "reward:3e38")
    env_step(task, "reward:3e38")
