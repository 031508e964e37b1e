"""The driver's step temperature (``agent_rl.temperature.StepTemperature``, algorithms.md section 8): TAMPO's draw and
its observation of the learner's summed statistics, ``rollout.temperature_schedule``, the config's refusals, the
Ray merge of the additive sums, and the temperature per step in ``summary.md`` and the viewer."""

from __future__ import annotations

import json

import pytest

from agent_rl import algos
from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.learner.config import AlgoConfig
from agent_rl.temperature import STATE_KEY, StepTemperature

TINY = ["env=choose_item", "model=tiny"]


def cfg(*overrides: str):
    return load_config([*TINY, *overrides])


def test_tampo_draws_one_candidate_per_step_and_observes_the_sums():
    rule = StepTemperature.from_config(cfg("algo=tampo", "algo.tampo.temps=[0.6,1.0,1.4]", "trainer.seed=5"))
    assert rule.kind == "tampo"
    t1 = rule.temperature(1)
    assert t1 in (0.6, 1.0, 1.4) and rule.temperature(1) == t1
    m = rule.step_metrics(1)
    assert m["tampo/t"] == t1 and m["tampo/nucleus_size"] == 3 and set(m) >= {"tampo/pi/0.6", "tampo/pi_entropy"}
    # section 8's hand example summed over its 8 episodes (A_B * 8), as the learner ranks report it
    update = {"tampo_sum/adv/0.6": 0.097381 * 8, "tampo_sum/adv/1": 0.004181 * 8, "tampo_sum/adv/1.4": -0.101562 * 8,
              "tampo_sum/episodes": 8.0, "tampo_sum/tstar_pos_sum": 1.2, "tampo_sum/tstar_pos_n": 2.0,
              "tampo_sum/tstar_neg_sum": 0.0, "tampo_sum/tstar_neg_n": 0.0, "tampo_sum/nonfinite": 3.0,
              "actor/pg_loss": 0.1}
    out = rule.observe(1, update)
    assert set(update) == {"actor/pg_loss"}  # the sums are consumed, not logged
    assert out["tampo/adv/0.6"] == pytest.approx(0.097381) and out["tampo/ema/1.4"] == pytest.approx(-0.0050781)
    assert out["tampo/tstar_mean_pos"] == pytest.approx(0.6) and out["tampo/nonfinite_frac"] == pytest.approx(3 / 24)
    assert rule.meta.pi(2) == pytest.approx([0.652945, 0.347055, 0.0], abs=1e-5)
    state = json.loads(json.dumps(rule.state_dict()))
    again = StepTemperature.from_config(cfg("algo=tampo", "algo.tampo.temps=[0.6,1.0,1.4]", "trainer.seed=5"))
    again.load_state_dict({STATE_KEY: state})
    assert again.temperature(2) == rule.temperature(2)
    with pytest.raises(ConfigError, match="no TAMPO state"):
        again.load_state_dict({}, "ckpt")


def test_linear_schedule_and_refusals():
    rule = StepTemperature.from_config(cfg("algo=grpo", "rollout.temperature_schedule=linear:0.9:1.5",
                                           "trainer.total_steps=4"))
    assert [rule.temperature(s) for s in (1, 2, 3, 4)] == pytest.approx([0.9, 1.1, 1.3, 1.5])
    assert rule.step_metrics(3) == {"rollout/temperature": pytest.approx(1.3)}
    assert rule.state_dict() is None and rule.observe(1, {"x": 1.0}) == {}
    assert StepTemperature.from_config(cfg("algo=grpo")) is None
    for algo in ("tgrl", "tampo"):
        with pytest.raises(ConfigError, match="temperature_schedule"):
            StepTemperature.from_config(cfg(f"algo={algo}", "rollout.temperature_schedule=linear:0.9:1.5"))
    with pytest.raises(ConfigError, match="scope=group"):
        StepTemperature.from_config(cfg("algo=tampo", "algo.tampo.scope=group"))
    for bad in ("algo.tampo.temps=[1.0,0.9]", "algo.tampo.norm=max", "algo.tampo.top_p=1.5",
                "rollout.temperature_schedule=cosine"):
        with pytest.raises((ConfigError, ValueError)):
            cfg("algo=tampo", bad)


def test_group_temperatures_use_the_step_temperature_for_single_temperature_algos():
    grpo = AlgoConfig(name="grpo", temperature=1.0)
    assert grpo.group_temperatures(1) == [(1.0, False)] * 4
    assert grpo.group_temperatures(1, 1.3) == [(1.3, False)] * 4
    tampo = AlgoConfig(name="tampo")
    assert tampo.group_size == 4 and tampo.group_temperatures(2, 0.7) == [(0.7, False)] * 4


def test_ray_merge_adds_the_tampo_sums():
    pytest.importorskip("ray")
    import torch

    from agent_rl.distributed.backend import merge_learner_metrics

    class B:  # the fields merge_learner_metrics reads
        rewards = torch.zeros(2)
        group_index = torch.zeros(2, dtype=torch.long)
        is_high = torch.zeros(2, dtype=torch.bool)
        won = None
        episode_index = torch.arange(2)

    ranks = [{"batch/response_tokens": 30.0, "tampo_sum/adv/0.6": 0.5, "tampo_sum/episodes": 4.0},
             {"batch/response_tokens": 10.0, "tampo_sum/adv/0.6": -0.2, "tampo_sum/episodes": 4.0}]
    out = merge_learner_metrics(ranks, B())
    assert out["tampo_sum/adv/0.6"] == pytest.approx(0.3) and out["tampo_sum/episodes"] == 8.0


def test_summary_and_viewer_show_the_temperature_per_step(tmp_path):
    from agent_rl.report import finish_run
    from agent_rl.viewer.data import Filters, RunReader

    rows = [{"step": s, "kind": "train", "reward/mean": 0.5, "tampo/t": t, "tampo/pi_entropy": 2.0}
            for s, t in enumerate([1.4, 1.4, 1.3], 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    finish_run(tmp_path)
    assert "- temperature per step (tampo/t): 1: 1.4, 2: 1.4, 3: 1.3" in (tmp_path / "summary.md").read_text()
    curves = dict(RunReader(tmp_path).curves(Filters()))
    title = "temperature (TAMPO's draw per step; rollout.temperature_schedule)"
    assert curves[title] == {"tampo/t": ([1.0, 2.0, 3.0], [1.4, 1.4, 1.3])}
    tgrl = [{"step": s, "kind": "train", "tgrl/t_high": t} for s, t in enumerate([1.2, 1.0, 1.4], 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tgrl))
    finish_run(tmp_path)
    assert "- temperature per step (tgrl/t_high): 1: 1.2, 2: 1, 3: 1.4" in (tmp_path / "summary.md").read_text()
    assert title not in dict(RunReader(tmp_path).curves(Filters()))
