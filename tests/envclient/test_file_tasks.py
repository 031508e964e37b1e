"""A task file's rows reach Math-v0 and Code-v0 as reset options (their content, never a path), the same in-process
(LocalEnvPool) and over HTTP (the served app); bad rows are refused with a message naming the field."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

import httpx
import pytest

datasets = pytest.importorskip("datasets")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # servers_helpers

from servers_helpers import serve_asgi  # noqa: E402

from agent_rl.envclient import EnvClientError, HTTPEnvPool, LocalEnvPool  # noqa: E402
from agent_rl.rollout.config import TaskSamplerConfig  # noqa: E402
from agent_rl.rollout.samplers import TaskSampler  # noqa: E402
from agent_rl.task_files import load_tasks  # noqa: E402
from envs.code.env import task_from_options as code_task  # noqa: E402
from envs.math.env import MathEnv, task_from_options as math_task  # noqa: E402
from servers.app import create_app  # noqa: E402

pytestmark = pytest.mark.slow  # the served app with the real verifier pool and sandbox (fast tier: -m 'not slow')

MATH, CODE = "agent_rl/Math-v0", "agent_rl/Code-v0"
MATH_ROWS = [{"question": "What is 7*6?", "final": 42, "level": 1},
             {"question": "What is 2+3?", "final": "5", "level": 2}]
CODE_ROWS = [{"prompt": "Write add(a, b) returning a + b.", "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]}]


@contextlib.asynccontextmanager
async def open_pool(kind: str):
    if kind == "http":
        app = create_app([MATH, CODE], max_sessions=16, prestart_workers=0)
        async with serve_asgi(app):
            async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0,
                                   timeout=120) as pool:
                yield pool
    else:
        async with LocalEnvPool(max_workers=1, mode="thread") as pool:
            yield pool


def _sampled(rows, env_id):
    sampler = TaskSampler(env_id, TaskSamplerConfig(kind="seed", options={"dataset": "ignored"}), rows=rows)
    return sampler.sample(len(rows))


@pytest.mark.parametrize("kind", ["local", "http"])
def test_file_tasks_play_through_both_pools(kind, tmp_path):
    datasets.Dataset.from_list([{**r, "final": str(r["final"])} for r in MATH_ROWS]).to_parquet(
        str(tmp_path / "m.parquet"))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CODE_ROWS))
    math_rows = load_tasks(tmp_path / "m.parquet", {"problem": "question", "answer": "final"},
                           cache_dir=str(tmp_path / "cache"))
    code_rows = load_tasks(tmp_path / "c.jsonl", cache_dir=str(tmp_path / "cache"))
    math_tasks, code_tasks = _sampled(math_rows, MATH), _sampled(code_rows, CODE)
    # the options are the rows themselves (index kind over the rows: a permutation), never env.sampler.options
    assert sorted(t.index for t in math_tasks) == [0, 1]
    assert all(t.options == math_rows[t.index] for t in math_tasks)

    async def main() -> None:
        async with open_pool(kind) as pool:
            for task in math_tasks:
                reset = await pool.reset(MATH, options=task.options, seed=0)
                assert task.options["problem"] in reset.observation
                assert reset.info["dataset"] == "file" and reset.info["uid"].startswith("file/")
                answer = {"What is 7*6?": "42", "What is 2+3?": "5"}[task.options["problem"]]
                step = await pool.step(reset.session_id, f"so \\boxed{{{answer}}}")
                assert step.reward == 1.0 and step.terminated and step.info["reference"] == answer
                wrong = await pool.reset(MATH, options=task.options, seed=0)
                step = await pool.step(wrong.session_id, "\\boxed{1000}")
                assert step.reward == 0.0 and step.info["reason"] == "wrong_answer"
            reset = await pool.reset(CODE, options=code_tasks[0].options, seed=0)
            assert reset.info["entry_point"] == "add" and reset.info["n_tests_declared"] == 2
            step = await pool.step(reset.session_id, "```python\ndef add(a, b):\n    return a + b\n```")
            assert step.reward == 1.0 and step.info["n_tests"] == 2, step.info
            reset = await pool.reset(CODE, options=code_tasks[0].options, seed=0)
            step = await pool.step(reset.session_id, "```python\ndef add(a, b):\n    return a - b\n```")
            assert step.reward == 0.0 and step.info["n_passed"] == 1
            # a bad row is the client's error (a 4xx over HTTP), naming what is wrong; the server goes on
            for env_id, options, words in [(MATH, {"problem": "x"}, "needs answer"),
                                           (MATH, {"problem": "x", "answer": "1", "dataset": "gsm8k"}, "not both"),
                                           (CODE, {"prompt": "p", "tests": ["assert f()"], "language": "rust"},
                                            "language 'rust'"),
                                           (CODE, {"prompt": "p"}, "either tests")]:
                with pytest.raises(EnvClientError, match=words):
                    await pool.reset(env_id, options=options)

    asyncio.run(main())


def test_task_from_options_rules():
    assert math_task({"problem": "p", "answer": 27.0}).answer == "27"
    assert math_task({"problem": "p", "answer": "x", "uid": "mine/1"}).uid == "mine/1"
    with pytest.raises(ValueError, match="'problem' has 100001 characters"):
        math_task({"problem": "p" * 100_001, "answer": "1"})
    with pytest.raises(ValueError, match="must be a string"):
        math_task({"problem": ["p"], "answer": "1"})
    task = code_task({"prompt": "p", "tests": "assert f(1) == 2\n\nassert f(2) == 3\n", "setup": "import math"})
    assert task.spec == {"mode": "asserts", "setup": "import math", "asserts": ["assert f(1) == 2", "assert f(2) == 3"]}
    assert task.entry_point == "f"
    check = code_task({"prompt": "def g(x):\n", "entry_point": "g", "test": "def check(c):\n    assert c(1) == 1\n",
                       "context": "def g(x):\n"})
    assert check.spec["mode"] == "check" and check.context == "def g(x):\n"
    with pytest.raises(ValueError, match="needs its entry_point"):
        code_task({"prompt": "p", "test": "def check(c): pass"})
    with pytest.raises(ValueError, match="at most 1000"):
        code_task({"prompt": "p", "tests": ["assert True"] * 1001})
    # the reset info of a file task: dataset "file", nothing of a data root read
    env = MathEnv(root="/nonexistent")
    _, info = env.reset(options={"problem": "1+1?", "answer": "2"})
    assert info["dataset"] == "file" and info["problem"] == "1+1?"


ALFWORLD = "agent_rl/ALFWorld-v0"


@pytest.mark.parametrize("kind", ["thread", "process", "http"])
def test_a_task_rows_host_path_is_refused_on_every_pool(kind, tmp_path):
    """A task row naming ALFWorld's ``gamefile`` (a host path) reached the env in-process (``env_server.mode=local``)
    while the server refused it: every pool now refuses it the same way (422 ``invalid_request`` naming it) before
    any env is made, and the pool goes on serving."""
    (tmp_path / "t.jsonl").write_text(json.dumps({"gamefile": "/etc", "task_id": "x"}) + "\n")
    row = load_tasks(tmp_path / "t.jsonl", cache_dir=str(tmp_path / "cache"))[0]

    async def main() -> str:
        if kind == "http":
            app = create_app([ALFWORLD, MATH], max_sessions=4, prestart_workers=0, check_envs=False)
            async with serve_asgi(app):
                async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0,
                                       timeout=120) as pool:
                    return await refused(pool)
        async with LocalEnvPool(max_workers=1, mode=kind) as pool:
            return await refused(pool)

    async def refused(pool) -> str:
        with pytest.raises(EnvClientError) as caught:
            await pool.reset(ALFWORLD, options=row)
        assert caught.value.code == "invalid_request"
        reset = await pool.reset(MATH, options={"problem": "What is 2+3?", "answer": "5"}, seed=0)  # goes on
        await pool.close(reset.session_id)
        return str(caught.value)

    message = asyncio.run(main())
    assert "reset options gamefile name host paths" in message, message
