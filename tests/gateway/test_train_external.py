"""``env=external`` end to end: a Calculator tool program (the real ``openai`` client; its tools run on the run's env
server over HTTP, through the gateway's env route) trained 2 TGRL steps; every step logs the gateway's counters and
stores the episodes, whose turns are the program's model calls."""

from __future__ import annotations

import json
import math

import pytest

from agent_rl.logging import read_metrics
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: a real training run with its env server


def test_external_tool_program_trains_two_tgrl_steps(tmp_path):
    out = tmp_path / "run"
    main(["env=external", "env.external.program=tests.gateway.programs:calculator_tools",
          "env.external.tasks=agent_rl/Calculator-v0", "model=tiny", "algo=tgrl", "trainer.total_steps=2",
          "trainer.tasks_per_step=1", "engine.max_new_tokens=16", "trainer.progress=false",
          "trainer.loggers=[jsonl]", "trainer.eval_every=0", "trainer.save_episodes=all",
          f"trainer.output_dir={out}"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    for step, row in zip((1, 2), rows):
        assert math.isfinite(row["actor/pg_loss"]) and row["rollout/dropped_groups"] == 0
        episodes = [json.loads(line) for line in (out / "episodes" / f"step_{step:06d}.jsonl").open()]
        turns = [t for ep in episodes for t in ep["turns"]]
        assert len(episodes) == 4 and row["gateway/requests"] == len(turns) == row["batch/rows"]
        assert row["gateway/prefix_breaks"] == 0
        # the program's env steps reached the env: each turn's action was judged there
        assert all(t["info"]["segment"] == 0 and "invalid_action" in t["info"] for t in turns)
        assert all(t["observation"] for t in turns)  # the env's answer to each call


def _train_reply_length(tmp_path, *overrides: str):
    """Train the ``reply_length`` program (tests.gateway.programs) on a task file of 4 rows ``{"question": "What is
    i + 1?"}`` (tiny model, 2 tasks a step, 8 new tokens); returns the ``train`` rows of its ``metrics.jsonl``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "run"
    tasks.write_text("".join(json.dumps({"question": f"What is {i} + 1?"}) + "\n" for i in range(4)))
    main(["env=external", "env.external.program=tests.gateway.programs:reply_length", f"env.external.tasks={tasks}",
          "model=tiny", "trainer.tasks_per_step=2", "engine.max_new_tokens=8", "trainer.progress=false",
          "trainer.loggers=[jsonl]", "trainer.eval_every=0", f"trainer.output_dir={out}", *overrides])
    return read_metrics(out / "metrics.jsonl", "train")


def test_external_program_on_a_task_file_learns_from_its_rewards(tmp_path):
    rows = _train_reply_length(tmp_path, "algo=tgrl", "algo.warmup_steps=0", "trainer.total_steps=2")
    assert [r["gateway/requests"] for r in rows] == [8, 8]  # 2 tasks x G=4, one call each
    assert all(r["batch/rows"] == 8 for r in rows) and any(r["actor/grad_norm"] > 0 for r in rows)


def test_external_program_under_max_staleness_counts_every_request(tmp_path):
    """``trainer.max_staleness=1`` (the asynchronous producer, algorithms.md section 7) with an agent program: every
    step logs the gateway's counters (the producer's cycle totals, like its generation counters), and no request
    goes uncounted: the requests counted over the run are at least the rows trained (one row per call), the rest
    being calls of groups still in flight or dropped as stale."""
    rows = _train_reply_length(tmp_path, "algo=grpo", "trainer.max_staleness=1", "trainer.total_steps=3")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("gateway/requests" in r and r["gateway/prefix_breaks"] == 0 for r in rows)
    assert all(r["batch/rows"] == 8 for r in rows)  # 2 tasks x G = 4, one call each
    assert sum(r["gateway/requests"] for r in rows) >= sum(r["batch/rows"] for r in rows), [r["gateway/requests"] for r in rows]


def test_external_program_on_ray_samples_what_the_local_backend_samples(tmp_path):
    """``trainer.backend=ray``: the gateway runs in the rollout worker (its engine, its event loop, its program
    threads) and its counters reach the driver's record; the worker samples the local backend's episodes (row seeds
    keyed by group, slot and call), so the rewards and losses of the two runs agree."""
    pytest.importorskip("ray")
    local = _train_reply_length(tmp_path / "local", "algo=grpo", "trainer.total_steps=2")
    ray_rows = _train_reply_length(tmp_path / "ray", "algo=grpo", "trainer.total_steps=2", "trainer.backend=ray",
                                   "rollout.num_workers=1")
    assert [r["gateway/requests"] for r in ray_rows] == [8, 8] and all(r["gateway/attempts"] == 8 for r in ray_rows)
    assert [r["reward/mean"] for r in ray_rows] == pytest.approx([r["reward/mean"] for r in local], abs=1e-6)
    assert [r["actor/pg_loss"] for r in ray_rows] == pytest.approx([r["actor/pg_loss"] for r in local], abs=1e-4)


def test_external_tool_program_in_trajectory_mode(tmp_path):
    """``rollout.mode=trajectory``: one row per episode (the program extends its history: one segment), every call's
    sampled ids trained in it, the observations the env returned between them masked out."""
    out = tmp_path / "run"
    main(["env=external", "env.external.program=tests.gateway.programs:calculator_tools",
          "env.external.tasks=agent_rl/Calculator-v0", "model=tiny", "algo=tgrl", "algo.warmup_steps=0",
          "rollout.mode=trajectory", "trainer.total_steps=2", "trainer.tasks_per_step=1",
          "engine.max_new_tokens=16", "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.eval_every=0",
          "trainer.save_episodes=all", f"trainer.output_dir={out}"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    for step, row in zip((1, 2), rows):
        episodes = [json.loads(line) for line in (out / "episodes" / f"step_{step:06d}.jsonl").open()]
        turns = [t for ep in episodes for t in ep["turns"]]
        assert row["batch/rows"] == len(episodes) == 4 and row["gateway/prefix_breaks"] == 0
        assert row["gateway/requests"] == len(turns) > len(episodes)  # multi-turn episodes, one row each
        assert math.isfinite(row["actor/pg_loss"])


def test_external_program_on_ray_under_max_staleness_counts_every_request(tmp_path):
    """``trainer.backend=ray`` with ``trainer.max_staleness=1``: the workers' streams carry the gateway's counters
    (their totals, summed over workers), and each step logs the calls served since the previous one."""
    pytest.importorskip("ray")
    rows = _train_reply_length(tmp_path, "algo=grpo", "trainer.max_staleness=1", "trainer.total_steps=3",
                               "trainer.backend=ray", "rollout.num_workers=1")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["gateway/prefix_breaks"] == 0 and r["batch/rows"] == 8 for r in rows)
    assert sum(r["gateway/requests"] for r in rows) >= sum(r["batch/rows"] for r in rows), [r["gateway/requests"] for r in rows]
    assert all(r["gateway/requests"] == r["gateway/attempts"] for r in rows)  # one call per attempt
