"""Tools reach the trainer through every env pool: the Calculator made with ``action_format="tools"`` behind the
server (``HTTPEnvPool`` over the real app) and in-process (``LocalEnvPool`` threads and worker processes) declares
the same schemas at reset, takes the same encoded calls, and a scripted tool-calling episode through the
orchestrator is the same, turn for turn, in all three."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # servers_helpers, user_env_module

from servers_helpers import CALC, make_app, serve_asgi  # noqa: E402
from test_tool_calls import PROBLEM, TokenEngine, script, with_template  # noqa: E402

from agent_rl.envclient import HTTPEnvPool, LocalEnvPool  # noqa: E402
from agent_rl.models import finish_tokenizer, smollm2_tokenizer  # noqa: E402
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, get_prompt  # noqa: E402
from agent_rl.rollout.tool_calls import get_tool_call_format  # noqa: E402
from agent_rl.types import Task  # noqa: E402
from envs.examples.calculator import CALCULATOR_TOOLS  # noqa: E402
from envs.tools import encode_call  # noqa: E402


@contextlib.asynccontextmanager
async def open_pool(kind: str):
    if kind == "http":
        app = make_app()
        async with serve_asgi(app):
            async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0) as pool:
                yield pool
    else:
        async with LocalEnvPool(max_workers=2, mode=kind) as pool:
            yield pool


@pytest.fixture(scope="module")
def qwen():
    return with_template(finish_tokenizer(smollm2_tokenizer()), "qwen2_5")


def play(kind: str, tok):
    async def main():
        async with open_pool(kind) as pool:
            r = await pool.reset(CALC, options=PROBLEM, env_kwargs={"action_format": "tools"})
            step = await pool.step(r.session_id, encode_call("calc", {"expression": "2 ** 5"}))
            await pool.close(r.session_id)
            engine = TokenEngine(tok, script(get_tool_call_format("hermes")))
            orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), RolloutConfig(max_turns=6),
                                       max_new_tokens=200, seed=0, action_format="tools")
            task = Task(CALC, options=PROBLEM, env_kwargs={"action_format": "tools", "max_episode_steps": 6})
            res = await orch.run_groups([GroupSpec(task, [(1.0, False)])])
            return r.info["tools"], step.observation, res.episodes[0]

    return asyncio.run(main())


@pytest.mark.parametrize("kind", ["http", "thread", "process"])
def test_tools_through_every_pool(kind, qwen):
    tools, observation, ep = play(kind, qwen)
    assert tools == CALCULATOR_TOOLS and observation == "Result: 32"
    assert [t.invalid for t in ep.turns] == [False, True, True, True, False] and ep.won
    reference = play("thread", qwen)[2] if kind != "thread" else ep
    assert [(t.prompt_ids, t.action, t.observation) for t in ep.turns] == \
        [(t.prompt_ids, t.action, t.observation) for t in reference.turns]
