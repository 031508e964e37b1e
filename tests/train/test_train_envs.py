"""The same trainer on the other env families: one TGRL step with the tiny model for math, code and WebShop
(in-process envs), and the metrics line holds every section-6 name."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent_rl.logging import SECTION6_METRICS, read_metrics
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs (fast tier: pytest -m 'not slow')

BASE = ["model=tiny", "algo=tgrl", "algo.warmup_steps=0", "env_server.mode=local", "trainer.total_steps=1",
        "trainer.tasks_per_step=1", "trainer.progress=false", "trainer.loggers=[jsonl]", "engine.num_threads=1"]


@pytest.mark.parametrize("env, extra", [
    ("math", ["engine.max_new_tokens=16"]),
    ("code", ["engine.max_new_tokens=16"]),
    ("webshop", ["engine.max_new_tokens=8", "rollout.max_turns=2"]),
])
def test_env_family_one_tgrl_step(tmp_path: Path, env: str, extra: list[str]) -> None:
    out = tmp_path / "run"
    main([f"env={env}", *BASE, *extra, f"trainer.output_dir={out}"])
    (rec,) = read_metrics(out / "metrics.jsonl", "train")
    assert set(SECTION6_METRICS) <= set(rec)
    # a random tiny model answers nothing right: rewards are 0, so the group advantage is 0 (nothing to train on),
    # but the rollout and the learner ran end to end on real problems
    assert rec["reward/mean"] == 0.0 and rec["episode/turns_mean"] >= 1
    assert rec["response/length_mean"] is not None and math.isfinite(rec["response/length_mean"])
    assert (out / "checkpoints" / "step_1").is_dir()


@pytest.mark.parametrize("env, options", [
    ("alfworld", {"split": "train"}),
    ("math", {"dataset": "math_train_deepscaler"}),
    ("code", {"dataset": "mbpp"}),
    ("webshop", {"split": "train"}),
    ("choose_item", {}),
])
def test_env_sampler_options_are_the_env_presets_own(env: str, options: dict) -> None:
    """Each env preset's reset options are exactly its own (no option of another env merged in)."""
    from agent_rl.config.compose import load_config

    assert load_config([f"env={env}"]).env.sampler.options == options
