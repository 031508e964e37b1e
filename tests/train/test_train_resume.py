"""Issue 10 sections 4, 5, 7 through ``agent_rl.train``: resume compares configs and keeps each one; a step that
trains on nothing is loud; config errors stop the CLI with one line (tiny model, ChooseItem, in-process envs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_rl.config.schema import ConfigError
from agent_rl.logging import read_metrics
from agent_rl.runtime import saved_run_config
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs (fast tier: pytest -m 'not slow')

BASE = ["model=tiny", "env=choose_item", "env_server.mode=local", "trainer.tasks_per_step=1", "rollout.max_turns=1",
        "engine.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[jsonl]"]


def _steps(out: Path) -> list[int]:
    """The training steps logged in ``out/metrics.jsonl`` (its ``train`` rows)."""
    return [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")]


def test_resume_under_another_algorithm_is_refused_even_when_allowed(tmp_path, capsys):
    # a reported input: grpo for 1 step, then algo=tgrl total_steps=2 resume=auto into the same dir
    out = tmp_path / "D"
    main([*BASE, "algo=grpo", "trainer.total_steps=1", f"trainer.output_dir={out}"])
    first = (out / "config.yaml").read_text()
    assert yaml.safe_load(first)["algo"]["name"] == "grpo"
    second = [*BASE, "algo=tgrl", "trainer.total_steps=2", f"trainer.output_dir={out}", "trainer.resume=auto"]
    capsys.readouterr()
    with pytest.raises(ConfigError) as err:
        main(second)
    msg = str(err.value)
    assert "resuming changes" in msg and "algo.name: 'grpo' -> 'tgrl'" in msg and "credit.name: 'uniform' -> 'js'" in msg
    assert "trainer.resume_allow_changes=true" in msg and "\n" not in msg
    assert (out / "config.yaml").read_text() == first  # nothing overwritten, nothing trained
    assert _steps(out) == [1] and not list(out.glob("config.resume-*"))
    # even asked for explicitly: nothing applies another algorithm to the checkpoint's state (issue 20; the keys a
    # resume can apply, config.RESUME_APPLIED, are tested in test_resume_contract.py)
    with pytest.raises(ConfigError, match=r"even with trainer.resume_allow_changes=true: .*algo.name: 'grpo' -> "
                                          r"'tgrl'"):
        main([*second, "algo.warmup_steps=0", "trainer.resume_allow_changes=true"])
    assert (out / "config.yaml").read_text() == first
    assert _steps(out) == [1] and not list(out.glob("config.resume-*"))


def test_resume_with_keys_that_may_change_is_silent_apart_from_the_list(tmp_path, capsys):
    out = tmp_path / "D"
    main([*BASE, "algo=grpo", "trainer.total_steps=1", f"trainer.output_dir={out}"])
    capsys.readouterr()
    main([*BASE, "algo=grpo", "trainer.total_steps=2", f"trainer.output_dir={out}", "trainer.resume=auto",
          "trainer.save_every=7", "trainer.progress=true", "trainer.keep_checkpoints=0"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("resume: ")]
    assert lines == ["resume: trainer.keep_checkpoints: 2 -> 0 (may change)",
                     "resume: trainer.progress: False -> True (may change)",
                     "resume: trainer.save_every: 50 -> 7 (may change)",
                     "resume: trainer.total_steps: 1 -> 2 (may change)"]
    assert _steps(out) == [1, 2]
    assert sorted(p.name for p in out.glob("config*.yaml")) == ["config.resume-2.yaml", "config.yaml"]


def test_old_checkpoint_without_a_saved_config_compares_with_the_run_files(tmp_path):
    run = tmp_path / "D"
    run.mkdir()
    (run / "config.yaml").write_text("algo:\n  name: grpo\n")
    (run / "config.resume-3.yaml").write_text("algo:\n  name: tgrl\n")
    assert saved_run_config(run, 3) == ({"algo": {"name": "grpo"}}, str(run / "config.yaml"))
    assert saved_run_config(run, 5) == ({"algo": {"name": "tgrl"}}, str(run / "config.resume-3.yaml"))
    assert saved_run_config(tmp_path / "none", 2)[0] is None


def test_bad_resume_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.resume=.*nope does not exist; valid: '' \(fresh\), auto"):
        main([*BASE, "trainer.total_steps=1", f"trainer.output_dir={tmp_path / 'D'}",
              f"trainer.resume={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match="is not a checkpoint folder"):
        main([*BASE, "trainer.total_steps=1", f"trainer.output_dir={tmp_path / 'D'}", f"trainer.resume={tmp_path}"])


def test_dapo_group_size_one_refused_before_anything_starts(tmp_path):
    out = tmp_path / "D"
    with pytest.raises(ConfigError, match="dapo_dynamic_sampling needs algo.group_size >= 2"):
        main([*BASE, "algo=dapo", "algo.group_size=1", "trainer.total_steps=1", f"trainer.output_dir={out}"])
    assert not out.exists()


def test_step_that_trains_on_nothing_is_loud(tmp_path, capsys):
    # top_k=1: both episodes of the group play the same greedy token, so their rewards are equal whatever it is
    # (ChooseItem's initial-letter rule lets one sampled token win), DAPO filters the group and (no extra round) the
    # step has no episode to train on
    out = tmp_path / "D"
    main([*BASE, "algo=dapo", "algo.group_size=2", "algo.dapo_max_extra_rounds=0", "engine.max_new_tokens=1",
          "engine.top_k=1", "trainer.total_steps=2", f"trainer.output_dir={out}"])
    err = capsys.readouterr().err
    assert "WARNING: step 1 trains on nothing (0 episodes: 0 group(s) dropped, 1 filtered as all-equal" in err
    assert "WARNING: 2 of 2 step(s) trained on nothing" in err
    recs = read_metrics(out / "metrics.jsonl", "train")
    assert [(r["batch/rows"], r["rollout/filtered_groups"]) for r in recs] == [(0, 1.0), (0, 1.0)]


def test_cli_prints_one_line_and_exits_2(tmp_path):
    # a registry name that used to end in a ValueError traceback after the model was built (the other config errors
    # are ConfigErrors in-process, tests/test_config.py, which the CLI prints the same way)
    start = "config error: unknown advantage estimator 'grpoo' (algo.adv_estimator); valid"
    proc = subprocess.run([sys.executable, "-m", "agent_rl.train", *BASE, f"trainer.output_dir={tmp_path / 'D'}",
                           "algo.adv_estimator=grpoo"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("config error")]
    assert len(lines) == 1 and lines[0].startswith(start)
