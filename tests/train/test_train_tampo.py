"""``algo=tampo`` end to end (tiny model, ChooseItem, in-process envs; algorithms.md section 8): the issue's
acceptance command, every episode of a step sampled at its drawn ``tampo/t``, the meta state in each checkpoint, a
resumed run drawing what an uninterrupted one draws, ``trainer.max_staleness=1`` in trajectory mode, and GRPO's
linear temperature schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl.config.schema import ConfigError
from agent_rl.episodes import load_episodes
from agent_rl.logging import read_metrics
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs

FAST = ["rollout.max_turns=2", "engine.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[jsonl]",
        "trainer.save_episodes=all"]
ARGS = ["env=choose_item", "model=tiny", "algo=tampo", "env_server.mode=local", "trainer.tasks_per_step=2", *FAST]
TEMPS = [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5]


def episode_temperatures(out: Path, step: int) -> set[float]:
    return {round(ep["temperature"], 6) for ep in load_episodes(out, step)}


def test_acceptance_logs_the_draw_every_step_and_samples_at_it(tmp_path):
    out = tmp_path / "run"
    main([*ARGS, "trainer.total_steps=3", f"trainer.output_dir={out}"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert {"tampo/t", "tampo/pi_entropy", "tampo/nucleus_size", "tampo/adv/0.6", "tampo/ema/1.5",
                "tampo/tstar_mean_pos", "tampo/nonfinite_frac", "time/tampo_s"} <= set(r)
        assert r["tampo/t"] in TEMPS
        assert episode_temperatures(out, r["step"]) == {round(r["tampo/t"], 6)}
        assert not any(k.startswith("tampo_sum/") for k in r)
        assert sum(r[f"tampo/adv/{t:g}"] for t in TEMPS) == pytest.approx(0.0, abs=1e-5)
    assert rows[0]["tampo/nucleus_size"] == 10  # E = 0: uniform pi, the tie-inclusive nucleus keeps all
    state = json.loads((out / "checkpoints" / "step_3" / "extra.json").read_text())["tampo_state"]
    assert state["temps"] == TEMPS and [d[2] for d in state["draws"]] == [r["tampo/t"] for r in rows]
    assert state["ema"] == pytest.approx([rows[-1][f"tampo/ema/{t:g}"] for t in TEMPS])
    assert "tampo/t" in (out / "summary.md").read_text()


def test_resume_draws_what_an_uninterrupted_run_draws(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    main([*ARGS, "trainer.total_steps=4", "algo.tampo.top_p=1.0", f"trainer.output_dir={full}"])
    main([*ARGS, "trainer.total_steps=2", "algo.tampo.top_p=1.0", f"trainer.output_dir={part}"])
    main([*ARGS, "trainer.total_steps=4", "algo.tampo.top_p=1.0", "trainer.resume=auto",
          f"trainer.output_dir={part}"])
    a, b = (read_metrics(p / "metrics.jsonl", "train") for p in (full, part))
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["tampo/t"] for r in b] == [r["tampo/t"] for r in a]
    states = [json.loads((p / "checkpoints" / "step_4" / "extra.json").read_text())["tampo_state"]
              for p in (full, part)]
    assert states[1]["rng"] == states[0]["rng"] and [d[:3] for d in states[1]["draws"]] == \
        [d[:3] for d in states[0]["draws"]]
    assert states[1]["ema"] == pytest.approx(states[0]["ema"], abs=1e-9)
    # a checkpoint without the state cannot resume a TAMPO run
    extra_path = part / "checkpoints" / "step_4" / "extra.json"
    extra = json.loads(extra_path.read_text())
    del extra["tampo_state"]
    extra_path.write_text(json.dumps(extra))
    with pytest.raises(ConfigError, match="no TAMPO state"):
        main([*ARGS, "trainer.total_steps=5", "algo.tampo.top_p=1.0", "trainer.resume=auto",
              f"trainer.output_dir={part}"])


def test_async_trajectory_mode(tmp_path):
    out = tmp_path / "run"
    main([*ARGS, "trainer.total_steps=3", "trainer.max_staleness=1", "rollout.mode=trajectory",
          f"trainer.output_dir={out}"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert len(rows) == 3 and all(r["tampo/t"] in TEMPS for r in rows)
    drawn = {round(r["tampo/t"], 6) for r in rows}
    for r in rows:  # a group keeps the T of the step it started in (section 7): one of the run's draws
        assert episode_temperatures(out, r["step"]) <= drawn


def test_grpo_linear_temperature_schedule(tmp_path):
    out = tmp_path / "run"
    main(["env=choose_item", "model=tiny", "algo=grpo", "env_server.mode=local", "trainer.tasks_per_step=1",
          "trainer.total_steps=2", "rollout.temperature_schedule=linear:0.9:1.5", *FAST, f"trainer.output_dir={out}"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["rollout/temperature"] for r in rows] == pytest.approx([0.9, 1.5])
    assert episode_temperatures(out, 1) == {0.9} and episode_temperatures(out, 2) == {1.5}
