"""Command programs (``agent_rl.gateway.command``) without the gateway: the argv a template gives (no secret field
allowed), the scrubbed environment, and one run of a real process group (shell programs): a helper left behind is
killed and does not hold the attempt, the timeout ends the whole group and keeps what was printed, a cancelled run
leaves nothing, output is bounded. Through the rollout with the real openai client:
``tests/gateway/test_gateway.py`` (``test_a_command_programs_argv_and_environment_hold_no_secret`` and after)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from agent_rl.gateway.command import (MAX_OUTPUT_BYTES, PROGRAM_ENV_KEEP, TASK_ENV_MAX_BYTES, command_argv,
                                      last_json_line, program_environment, run_command)
from agent_rl.gateway.config import ExternalConfig


def _gone(pid: int) -> bool:
    """No process ``pid`` left (a zombie counts as gone: a PID 1 that never reaps may keep it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# ------------------------------------------------------------------------------------------------ argv
def test_template_fields_and_refusals():
    argv = command_argv("python 'my agent.py' --url={base_url} --sid {session_id} '{{literal}}'",
                        base_url="http://127.0.0.1:9/v1", session_id="abc")
    assert argv == ["python", "my agent.py", "--url=http://127.0.0.1:9/v1", "--sid", "abc", "{literal}"]
    for field, name in (("api_key", "OPENAI_API_KEY"), ("task_json", "AGENT_RL_TASK")):
        with pytest.raises(ValueError, match=rf"\{{{field}\}} would put the episode's key on the program's argv.*"
                                             rf"{name}"):
            command_argv(f"python a.py {{{field}}}", base_url="u", session_id="s")
    for bad, why in (("python a.py {token}", "unknown field"), ("python a.py {0}", "unknown field"),
                     ("python a.py {base_url.__class__}", "unknown field"), ("python a.py {", "literal braces"),
                     ("python 'a.py", "quotation"), ("", "empty")):
        with pytest.raises(ValueError, match=why):
            command_argv(bad, base_url="u", session_id="s")


def test_config_refuses_a_secret_on_argv_at_load():
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        ExternalConfig(command="python a.py {base_url} {api_key}")
    with pytest.raises(ValueError, match="not environment variable names"):
        ExternalConfig(command="python a.py", env_pass=["A=B"])
    assert ExternalConfig(command="python a.py {base_url}", env_pass=["HF_HOME"]).env_pass == ["HF_HOME"]


# ------------------------------------------------------------------------------------------------ environment
def test_environment_is_the_allow_list_plus_the_episodes_values():
    parent = {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C", "AGENT_RL_SERVER_TOKEN": "t",
              "VLLM_API_KEY": "v", "OPENAI_API_KEY": "the-trainers-own", "WANDB_API_KEY": "w", "HF_TOKEN": "h",
              "PYTHONPATH": "/repo", "AWS_SECRET_ACCESS_KEY": "a", "MY_SETTING": "m"}
    task = json.dumps({"question": "1 + 1", "env": {"headers": {"Authorization": "Bearer ep-key"}}})
    env = program_environment(base_url="http://127.0.0.1:5/v1", api_key="ep-key", session_id="sid", task_json=task,
                              env_pass=["MY_SETTING"], parent=parent)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C", "PYTHONPATH": "/repo",
                   "MY_SETTING": "m", "OPENAI_BASE_URL": "http://127.0.0.1:5/v1", "OPENAI_API_KEY": "ep-key",
                   "AGENT_RL_SESSION_ID": "sid", "AGENT_RL_TASK": task, "PYTHONUNBUFFERED": "1"}
    assert set(PROGRAM_ENV_KEEP) >= {"PATH", "HOME", "LANG"}
    big = json.dumps({"question": "x" * TASK_ENV_MAX_BYTES})
    assert "AGENT_RL_TASK" not in program_environment(base_url="u", api_key="k", session_id="s", task_json=big,
                                                      parent={})


# ------------------------------------------------------------------------------------------------ one run
def _run(argv: list[str], timeout_s: float, stdin: bytes = b"", env: dict[str, str] | None = None):
    return asyncio.run(run_command(argv, env if env is not None else {"PATH": os.environ["PATH"]},
                                   timeout_s=timeout_s, stdin=stdin))


def test_a_helper_left_behind_is_killed_and_the_reward_read_at_once(tmp_path):
    """The issue's case: the program starts ``sleep 40`` in the background (holding its stdout), prints its reward
    and exits; against a 3 s timeout the run returns with the reward and exit 0 (not timed out), and the helper is
    gone by pid."""
    script = f'sleep 40 & echo $! > {tmp_path}/helper; echo thinking; echo \'{{"reward": 0.5}}\''
    t0 = time.monotonic()
    run = _run(["sh", "-c", script], timeout_s=3.0)
    wall = time.monotonic() - t0
    helper = int((tmp_path / "helper").read_text())
    print(f"program with a 40 s helper, timeout 3 s: returned after {wall:.2f} s")
    assert (run.returncode, run.timed_out) == (0, False)
    assert last_json_line(run.stdout) == {"reward": 0.5}
    assert _gone(helper)


def test_the_timeout_ends_the_group_and_keeps_what_was_printed(tmp_path):
    """A program that prints its reward and runs on (its helper too) past the 3 s timeout: timed out, its printed
    reward kept, every process of its group gone by pid."""
    script = f'sleep 40 & echo $! > {tmp_path}/helper; echo $$ > {tmp_path}/main; echo 0.75; sleep 50'
    run = _run(["sh", "-c", script], timeout_s=3.0)
    assert run.timed_out and run.returncode is None
    assert last_json_line(run.stdout) == 0.75
    for name in ("helper", "main"):
        assert _gone(int((tmp_path / name).read_text())), name


def test_a_cancelled_run_kills_its_group(tmp_path):
    """The attempt cancelled (the rollout stopping): the cancellation goes on and the program's group is gone."""
    script = f'sleep 40 & echo $! > {tmp_path}/helper; echo $$ > {tmp_path}/main; sleep 50'

    async def go() -> None:
        task = asyncio.ensure_future(run_command(["sh", "-c", script], {"PATH": os.environ["PATH"]}, timeout_s=60))
        while not (tmp_path / "main").exists() or not (tmp_path / "helper").exists():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    deadline = time.monotonic() + 10
    pids = [int((tmp_path / n).read_text()) for n in ("helper", "main")]
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids)


def test_stdin_carries_the_task_the_environment_is_exact_and_output_is_bounded():
    """The task reaches stdin (then EOF) even when the program never reads it; the environment is exactly the one
    given (nothing inherited); stdout is kept to its last ``MAX_OUTPUT_BYTES``; a non-zero exit is reported."""
    code = ("import os, sys; data = sys.stdin.read(); print(sorted(os.environ)); "
            f"sys.stdout.write('x' * {2 * MAX_OUTPUT_BYTES} + '\\n'); print(len(data)); sys.exit(4)")
    task = b"{" + b"\"q\": \"" + b"y" * 200_000 + b"\"}\n"
    run = _run([sys.executable, "-c", code], timeout_s=60, stdin=task, env={"ONLY": "1"})
    assert run.returncode == 4 and not run.timed_out
    assert run.stdout.splitlines()[-1] == str(len(task))
    assert len(run.stdout.encode()) <= MAX_OUTPUT_BYTES and "ONLY" not in run.stdout  # the head was dropped
    ignored = _run(["sh", "-c", "echo 1"], timeout_s=60, stdin=task)  # a program that never reads its stdin
    assert (ignored.returncode, last_json_line(ignored.stdout)) == (0, 1)


def test_a_program_that_cannot_start_is_an_os_error():
    with pytest.raises(OSError):
        _run(["/no/such/program"], timeout_s=5)
