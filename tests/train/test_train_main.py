"""``agent_rl.train.main`` with the tiny model on ChooseItem (in-process envs): every algo, credit rule and schedule
runs one step; metrics.jsonl holds every section-6 name; checkpoints resume; config errors name the valid keys."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.config.compose import load_config

from agent_rl.config.schema import ConfigError
from agent_rl.logging import SECTION6_METRICS, read_metrics
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs (fast tier: pytest -m 'not slow')

SMALL = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.total_steps=1", "trainer.tasks_per_step=1",
         "rollout.max_turns=2", "engine.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[jsonl]"]


def run(tmp_path: Path, *overrides: str) -> list[dict]:
    out = tmp_path / "run"
    main([*SMALL, f"trainer.output_dir={out}", *overrides])
    return read_metrics(out / "metrics.jsonl", "train")


def check_record(rec: dict) -> None:
    for name in SECTION6_METRICS:
        assert name in rec, name
    for name in ("reward/mean", "success/rate", "actor/pg_loss", "actor/grad_norm", "actor/lr", "time/rollout_s",
                 "time/update_s", "response/length_mean", "episode/turns_mean", "throughput/tokens_per_s"):
        assert rec[name] is not None and math.isfinite(rec[name]), name


@pytest.mark.parametrize("algo", ["tgrl", "grpo", "drgrpo", "dapo", "rloo", "ppo", "gspo"])
def test_every_algo_one_step(tmp_path, algo):
    extra = ["algo.warmup_steps=0"] if algo == "tgrl" else []
    if algo == "dapo":
        extra = ["algo.dapo_max_extra_rounds=0"]  # keep even an all-equal group: the step must train or skip cleanly
    (rec,) = run(tmp_path, f"algo={algo}", *extra)
    if algo == "dapo" and rec["rollout/filtered_groups"] == 1.0:
        assert rec["actor/pg_loss"] is None  # filtered: nothing trained, and said so
        return
    check_record(rec)
    assert (tmp_path / "run" / "checkpoints" / "step_1" / "extra.json").is_file()


@pytest.mark.parametrize("credit", ["uniform", "js", "tp", "forking", "entropy_adv", "empg"])
def test_every_credit_one_step(tmp_path, credit):
    (rec,) = run(tmp_path, "algo=tgrl", "algo.warmup_steps=0", f"credit={credit}", "schedule=constant")
    check_record(rec)
    assert rec["schedule/S"] == pytest.approx(1.0)


@pytest.mark.parametrize("schedule", ["linear", "sigmoid", "power", "constant", "none"])
def test_every_schedule_one_step(tmp_path, schedule):
    (rec,) = run(tmp_path, "algo=grpo", "credit=tp", f"schedule={schedule}")
    check_record(rec)
    # step 1 of N = 1: s_max = floor(0.8) = 0 -> tau = 1 -> S = 0, except constant (S = 1).
    assert rec["schedule/S"] == pytest.approx(1.0 if schedule == "constant" else 0.0)


def test_resume_continues_at_next_step(tmp_path):
    out = tmp_path / "run"
    args = [*SMALL, f"trainer.output_dir={out}", "algo=grpo", "trainer.save_every=1"]
    main([*args, "trainer.total_steps=2"])
    main([*args, "trainer.total_steps=3", "trainer.resume=auto"])
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")]
    assert steps == [1, 2, 3]
    extra = json.loads((out / "checkpoints" / "step_3" / "extra.json").read_text())
    # one group per step: the data position after 3 steps is 3 tasks
    assert (extra["step"], extra["sampler"]) == (3, {"position": 3})
    assert extra["config"]["trainer"]["total_steps"] == 3  # the config this checkpoint was trained under
    assert "trainer:" in (out / "config.resume-3.yaml").read_text()  # each config the run ran under is kept
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2", "step_3"]  # keep_checkpoints=2
    assert "trainer:" in (out / "config.yaml").read_text()


def test_resume_after_a_crash_does_not_log_steps_twice(tmp_path, capsys):
    out = tmp_path / "run"
    args = [*SMALL, f"trainer.output_dir={out}", "algo=grpo", "trainer.save_every=2"]
    main([*args, "trainer.total_steps=3"])
    # a crash after step 3 was logged but before its checkpoint: the newest checkpoint is step_2
    shutil.rmtree(out / "checkpoints" / "step_3")
    main([*args, "trainer.total_steps=3", "trainer.resume=auto"])
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in lines] == [("train", 1), ("train", 2), ("train", 3)]  # no step twice
    # resuming a finished run says so and changes nothing
    main([*args, "trainer.total_steps=3", "trainer.resume=auto"])
    assert "nothing to train: the checkpoint is at step 3 and trainer.total_steps=3" in capsys.readouterr().err
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


def test_fresh_run_into_a_used_output_dir_is_refused(tmp_path):
    run(tmp_path, "algo=grpo")
    with pytest.raises(ConfigError, match="already holds a run .* trainer.resume=auto"):
        run(tmp_path, "algo=grpo")  # would append a second step 1 to metrics.jsonl and mix checkpoints


def test_broken_env_fails_fast_with_reason(tmp_path, capsys):
    # A bad constructor kwarg is refused before anything starts (the constructor's keywords are checked at load
    # time); an env that breaks at run time makes every episode fail: the run stops at step 1 naming the cause,
    # never training on nothing for total_steps steps.
    with pytest.raises(ConfigError, match="env.kwargs bogus not accepted"):
        run(tmp_path, "algo=grpo", "+env.kwargs.bogus=1")
    with pytest.raises(RuntimeError, match="every episode of step 1 failed.*IndexError"):
        run(tmp_path, "algo=grpo", "env.kwargs.items=[]", "rollout.retry_backoff_s=0.01")
    assert "warning: step 1: 1 group(s) dropped" in capsys.readouterr().err


def test_unknown_key_names_valid_keys():
    with pytest.raises(ConfigError) as err:
        main(["trainer.total_step=3"])
    msg = str(err.value)
    assert "trainer.total_step" in msg and "total_steps" in msg and "tasks_per_step" in msg
    with pytest.raises(ConfigError, match="valid keys of the root config"):
        load_config(["trainr.total_steps=3"])
    with pytest.raises(ConfigError, match="available options in 'algo'"):
        load_config(["algo=ppo2"])
    with pytest.raises(ConfigError, match="valid values: turn, trajectory"):
        load_config(["rollout.mode=rows"])
    with pytest.raises(ConfigError, match="could not be converted"):
        load_config(["trainer.total_steps=many"])


def test_cli_config_error_is_one_message_not_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "agent_rl.train", "trainer.total_step=2"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("config error: unknown config key 'trainer.total_step'")
    assert "Did you mean 'trainer.total_steps'?" in proc.stderr


def test_config_defaults():
    cfg = load_config([])
    assert (cfg.env.id, cfg.algo.name, cfg.credit.name, cfg.schedule.kind, cfg.model.name, cfg.engine.name) == (
        "agent_rl/ALFWorld-v0", "tgrl", "js", "none", "smollm2", "hf")
    assert (cfg.algo.n_low, cfg.algo.n_high, cfg.algo.t_low, cfg.algo.t_high) == (1, 3, 0.3, 1.2)
    assert cfg.env.sampler.options == {"split": "train"} and cfg.rollout.max_turns == 50
    assert load_config(["algo=grpo"]).credit.name == "uniform"
    assert load_config(["algo=tgrl", "credit=uniform"]).credit.name == "uniform"  # the mixed-groups ablation
    # data.root reaches the env, and rollout.max_turns is its turn budget (gymnasium's max_episode_steps)
    assert load_config(["data.root=/data"]).env_kwargs == {"data_root": "/data", "max_episode_steps": 50}
    for env in ("alfworld", "choose_item", "gym", "webshop", "math", "code"):
        assert load_config([f"env={env}"]).env.id.startswith("agent_rl/")
    for model in ("smollm2", "tiny", "qwen2.5-1.5b", "qwen2.5-7b", "qwen3-4b"):
        load_config([f"model={model}"])
    assert load_config(["engine=vllm"], check=False).engine.name == "vllm"  # composes; refused without CUDA


def test_gym_env_calculator_one_step(tmp_path):
    (rec,) = run(tmp_path, "env=gym", "env.id=agent_rl/Calculator-v0", "algo=grpo")
    check_record(rec)
    assert 1 <= rec["episode/turns_mean"] <= 2


def test_user_estimator_via_trainer_imports(tmp_path, monkeypatch):
    """A registry entry from a user's module runs through the unchanged trainer (trainer.imports)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    (rec,) = run(tmp_path, "algo=grpo", "algo.adv_estimator=user_mean_baseline",
                 "trainer.imports=[user_algos_module]")
    check_record(rec)
    import user_algos_module

    assert user_algos_module.CALLS, "the user's estimator was never called"


def test_dapo_overlong_defaults_from_engine(tmp_path):
    """algo.dapo_overlong=true alone works: L_max = engine.max_new_tokens, L_c = L_max // 5."""
    cfg = load_config(["algo=dapo", "algo.dapo_overlong=true", "engine.max_new_tokens=40"])
    assert (cfg.algo.dapo_overlong_max_len, cfg.algo.dapo_overlong_cache_len) == (40, 8)
    (rec,) = run(tmp_path, "algo=dapo", "algo.dapo_overlong=true", "algo.dapo_max_extra_rounds=0")
    assert rec["reward/mean"] is not None


def test_static_forking_fixed_S(tmp_path):
    """schedule.value fixes S; forking's static variant is S = 1 (tokens at or above the batch's 80th entropy
    percentile, about 20%); S = 0.5 relaxes the threshold and trains more."""
    (rec,) = run(tmp_path, "algo=grpo", "credit=forking", "schedule.value=1.0", "engine.max_new_tokens=10")
    assert rec["schedule/S"] == pytest.approx(1.0)
    assert 0.0 < rec["credit/trained_token_frac"] <= 0.5
    shutil.rmtree(tmp_path / "run")
    (rec2,) = run(tmp_path, "algo=grpo", "credit=forking", "schedule.value=0.5", "engine.max_new_tokens=10")
    assert rec2["credit/trained_token_frac"] > rec["credit/trained_token_frac"]
