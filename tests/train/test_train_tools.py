"""A short TGRL run with tool calls (``env=gym env.id=agent_rl/Calculator-v0 env.action_format=tools``, tiny model,
in-process envs), in both rollout modes: the run trains, the env declared its tools, every turn's reply was read by
the Hermes parser and sent as a call or answered as an invalid one with the reason in the next observation, and
``episode/invalid_action_frac`` counts exactly the turns the env refused (recomputed from the stored episodes)."""

from __future__ import annotations

import json
import math

import pytest

from agent_rl.logging import read_metrics
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs (fast tier: pytest -m 'not slow')

RUN = ["env=gym", "env.id=agent_rl/Calculator-v0", "env.action_format=tools", "model=tiny", "env_server.mode=local",
       "algo=tgrl", "algo.warmup_steps=0", "trainer.total_steps=2", "trainer.tasks_per_step=2", "rollout.max_turns=3",
       "engine.max_new_tokens=16", "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.save_episodes=all"]


@pytest.mark.parametrize("mode", ["turn", "trajectory"])
def test_tgrl_run_with_tool_calls(tmp_path, mode):
    out = tmp_path / "run"
    main([*RUN, f"rollout.mode={mode}", f"trainer.output_dir={out}"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["actor/pg_loss"]) and row["batch/rows"] > 0
    for step, row in zip((1, 2), rows):
        episodes = [json.loads(line) for line in (out / "episodes" / f"step_{step:06d}.jsonl").open()]
        assert len(episodes) == 2 * 4  # 2 tasks x TGRL's 4 episodes
        turns = [t for ep in episodes for t in ep["turns"]]
        for t in turns:
            info = t["info"]
            if t["invalid"]:  # refused by the env, the reason first in what the model sees next
                assert t["observation"] == f"Invalid tool call: {info['tool_error']}" and info["invalid_action"]
            else:
                assert json.loads(t["action"])["name"] in ("calc", "answer")
        assert row["episode/invalid_action_frac"] == pytest.approx(sum(t["invalid"] for t in turns) / len(turns))
        assert row["episode/turns_mean"] == pytest.approx(len(turns) / len(episodes))
    prompt = episodes[0]["prompt"]  # the tools are shown to the model: SmolLM2's template has no tools branch
    assert "<tools>" in prompt and '"name": "calc"' in prompt and '"name": "answer"' in prompt
