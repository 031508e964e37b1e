"""``algo.t_high=auto`` end to end (tiny model, ChooseItem, in-process envs): ``tgrl/t_high`` every step, the episodes
sampled at the picked T1, the bandit state in each checkpoint, and a resumed run picking what an uninterrupted one
picks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl.config.schema import ConfigError
from agent_rl.episodes import load_episodes
from agent_rl.logging import read_metrics
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs

ARGS = ["env=choose_item", "model=tiny", "algo=tgrl", "algo.t_high=auto", "algo.warmup_steps=2",
        "trainer.tasks_per_step=2", "env_server.mode=local", "rollout.max_turns=2", "engine.max_new_tokens=4",
        "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.save_episodes=all"]


def episode_temperatures(out: Path, step: int) -> set[float]:
    return {round(ep["temperature"], 6) for ep in load_episodes(out, step)}


def test_auto_logs_t_high_every_step_and_samples_at_it(tmp_path):
    out = tmp_path / "run"
    main([*ARGS, "trainer.total_steps=4", f"trainer.output_dir={out}"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    # step 1 (the warm-up: the steps s < algo.warmup_steps=2): the middle rung; steps 2-4 (n = 1..3): every rung once,
    # lowest first
    assert [r["tgrl/t_high"] for r in rows] == [1.2, 1.0, 1.2, 1.4]
    assert episode_temperatures(out, 1) == {1.2}  # warm-up: every episode at T1
    for r in rows[1:]:
        assert episode_temperatures(out, r["step"]) == {0.3, r["tgrl/t_high"]}
    extra = json.loads((out / "checkpoints" / "step_4" / "extra.json").read_text())
    state = extra["tgrl_t_high"]
    assert state["ladder"] == [1.0, 1.2, 1.4]
    assert [s[:2] for s in state["steps"]] == [[1, 1.0], [2, 1.2], [3, 1.4]]
    # a step with no informative group is no observation (algorithms.md 3, revised): None in the state
    assert [s[2] for s in state["steps"]] == [pytest.approx(r["tgrl/delta_R"]) if r["tgrl/delta_R_groups"] > 0
                                              else None for r in rows[1:]]
    # a checkpoint without the state cannot resume an auto run (it could not pick what the run would)
    del extra["tgrl_t_high"]
    (out / "checkpoints" / "step_4" / "extra.json").write_text(json.dumps(extra))
    with pytest.raises(ConfigError, match="no adaptive-T1 state"):
        main([*ARGS, "trainer.total_steps=5", "trainer.resume=auto", f"trainer.output_dir={out}"])


def test_resume_picks_what_an_uninterrupted_run_picks(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    main([*ARGS, "trainer.total_steps=7", f"trainer.output_dir={full}"])
    main([*ARGS, "trainer.total_steps=4", "trainer.save_every=2", f"trainer.output_dir={part}"])
    main([*ARGS, "trainer.total_steps=7", "trainer.resume=auto", f"trainer.output_dir={part}"])
    a = read_metrics(full / "metrics.jsonl", "train")
    b = read_metrics(part / "metrics.jsonl", "train")
    assert [r["step"] for r in b] == list(range(1, 8))
    assert [r["tgrl/t_high"] for r in b] == [r["tgrl/t_high"] for r in a]
    assert [r["tgrl/delta_R"] for r in b] == pytest.approx([r["tgrl/delta_R"] for r in a])
    full_state = json.loads((full / "checkpoints" / "step_7" / "extra.json").read_text())["tgrl_t_high"]
    part_state = json.loads((part / "checkpoints" / "step_7" / "extra.json").read_text())["tgrl_t_high"]
    assert part_state == full_state


def test_fixed_t_high_is_logged_and_cannot_turn_auto_on_resume(tmp_path):
    out = tmp_path / "run"
    fixed = [a for a in ARGS if a != "algo.t_high=auto"]
    main([*fixed, "trainer.total_steps=2", f"trainer.output_dir={out}"])
    assert [r["tgrl/t_high"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1.2, 1.2]
    assert "tgrl_t_high" not in json.loads((out / "checkpoints" / "step_2" / "extra.json").read_text())
    with pytest.raises(ConfigError, match="algo.t_high"):  # the T1 rule is part of the algorithm: must match
        main([*ARGS, "trainer.total_steps=3", "trainer.resume=auto", f"trainer.output_dir={out}"])
