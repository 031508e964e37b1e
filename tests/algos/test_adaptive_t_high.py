"""Adaptive high temperature (``algo.t_high=auto``, algorithms.md section 3): the discounted UCB over the T1 ladder,
its state round trip, the config's refusals and the places that read ``algo.t_high``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agent_rl.algos import AdaptiveHighTemperature
from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.learner.config import AlgoConfig, t_high_value
from agent_rl.rollout import group_temperatures


def auto(**kw) -> AlgoConfig:
    return AlgoConfig(name="tgrl", t_high="auto", **kw)


def test_spec_hand_computed_sequence():
    """algorithms.md section 3: ladder [1.0, 1.2, 1.4], delta_R -0.5 (1.0), -0.25 (1.2), 0.0 (1.4), g 0.9, c 1.0."""
    rule = AdaptiveHighTemperature(auto(warmup_steps=0, t_high_discount=0.9, t_high_ucb_c=1.0))
    picks = []
    for step, delta in [(1, -0.5), (2, -0.25), (3, 0.0)]:
        picks.append(rule.t_high(step))  # never used rungs first, lowest first
        rule.observe(step, delta)
    assert picks == [1.0, 1.2, 1.4]
    # step 4 by hand: N_1.0 = 0.9^2 = 0.81, N_1.2 = 0.9, N_1.4 = 1; sum N = 2.71, ln 2.71 = 0.996949...
    ln_sum = math.log(2.71)
    expected = {1.0: -0.5 + math.sqrt(ln_sum / 0.81),    # 0.609415
                1.2: -0.25 + math.sqrt(ln_sum / 0.9),    # 0.802483
                1.4: 0.0 + math.sqrt(ln_sum / 1.0)}      # 0.998473
    got = rule.scores(4)
    assert got.keys() == expected.keys()
    for t in expected:
        assert got[t] == pytest.approx(expected[t], abs=1e-12)
    assert got[1.0] == pytest.approx(0.609415, abs=1e-6) and got[1.4] == pytest.approx(0.998473, abs=1e-6)
    assert rule.t_high(4) == 1.4
    assert rule.t_high(4) == 1.4  # one pick per step, asked again


def test_discounted_means_and_tie_to_lower():
    """Step 5 after 1.4 won at step 4 (delta 0.5), and a tie at c = 0 goes to the lower T."""
    rule = AdaptiveHighTemperature(auto(warmup_steps=0))
    for step, delta in [(1, -0.5), (2, -0.25), (3, 0.0), (4, 0.5)]:
        rule.t_high(step)
        rule.observe(step, delta)
    # N_1.4 = 0.9 + 1 = 1.9, X_1.4 = (0.9 * 0 + 1 * 0.5) / 1.9; N_1.0 = 0.729, N_1.2 = 0.81
    ln_sum = math.log(0.729 + 0.81 + 1.9)
    s = rule.scores(5)
    assert s[1.4] == pytest.approx(0.5 / 1.9 + math.sqrt(ln_sum / 1.9), abs=1e-12)
    assert s[1.0] == pytest.approx(-0.5 + math.sqrt(ln_sum / 0.729), abs=1e-12)
    assert rule.t_high(5) == max(s, key=lambda t: (s[t], -t))

    greedy = AdaptiveHighTemperature(auto(warmup_steps=0, t_high_ucb_c=0.0))
    for step in (1, 2, 3):
        greedy.t_high(step)
        greedy.observe(step, 0.25)  # every rung's mean 0.25: a three-way tie
    assert greedy.t_high(4) == 1.0


def test_warmup_uses_the_middle_rung_and_counts_from_its_end():
    rule = AdaptiveHighTemperature(auto(warmup_steps=4))  # the warm-up: the steps s < 4
    assert [rule.t_high(s) for s in (1, 2, 3)] == [1.2, 1.2, 1.2]
    rule.observe(2, 1.0)  # warm-up observations are ignored
    assert rule.state_dict()["steps"] == []
    assert rule.t_high(4) == 1.0  # step n = 1 after warm-up: the lowest never-used rung
    rule.observe(4, -1.0)
    assert rule.t_high(5) == 1.2
    # the warm-up rung is the config's numeric T1 (t_high_value), for odd and even ladders
    for ladder in ([1.0, 1.2, 1.4], [0.8, 1.0, 1.3, 1.6], [1.1]):
        algo = auto(t_high_ladder=ladder, warmup_steps=2)  # step 1 is the warm-up
        assert AdaptiveHighTemperature(algo).t_high(1) == t_high_value(algo)
    assert t_high_value(auto()) == 1.2 and t_high_value(AlgoConfig(t_high=1.3)) == 1.3
    assert group_temperatures(auto(warmup_steps=2), 1) == [(1.2, True)] * 4
    assert group_temperatures(auto(warmup_steps=2), 2, t_high=1.4) == [(0.3, False)] + [(1.4, True)] * 3
    assert group_temperatures(auto(warmup_steps=0), 1, t_high=1.4) == [(0.3, False)] + [(1.4, True)] * 3


def test_unobserved_step_is_retried_before_ucb():
    rule = AdaptiveHighTemperature(auto(warmup_steps=0))
    assert [rule.t_high(s) for s in (1, 2, 3)] == [1.0, 1.2, 1.4]  # picked ahead, nothing observed yet
    rule.observe(2, 0.0)
    rule.observe(3, 0.0)
    assert rule.t_high(4) == 1.0  # picked but without statistics: tried first
    with pytest.raises(ValueError, match="no T1 pick"):
        rule.observe(7, 0.0)
    with pytest.raises(ValueError, match="observed already"):
        rule.observe(2, 0.1)
    rule.observe(1, float("nan"))  # a non-finite delta_R is no observation
    assert rule.state_dict()["steps"][0] == [1, 1.0, None]


def test_state_round_trip_resumes_the_same_picks():
    """A run interrupted after step k and resumed from its JSON state picks what an uninterrupted one picks."""
    deltas = [-0.5, 0.25, 0.0, 0.75, -0.25, 0.5, 0.0, 1.0, -1.0, 0.25, 0.5, 0.0]
    algo = auto(warmup_steps=2)

    def play(rule, steps):
        out = []
        for step in steps:
            out.append(rule.t_high(step))
            rule.observe(step, deltas[step - 1])
        return out

    full = play(AdaptiveHighTemperature(algo), range(1, 13))
    for k in (2, 3, 6, 9):
        first = AdaptiveHighTemperature(algo)
        head = play(first, range(1, k + 1))
        resumed = AdaptiveHighTemperature(algo)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert head + play(resumed, range(k + 1, 13)) == full, k
    assert len(set(full[2:])) > 1  # the sequence explores (the test would not see a broken restore otherwise)

    other = AdaptiveHighTemperature(auto(t_high_ladder=[1.0, 1.5]))
    with pytest.raises(ValueError, match="t_high_ladder"):
        other.load_state_dict(AdaptiveHighTemperature(algo).state_dict())


@pytest.mark.parametrize("overrides,match", [
    (["algo.t_high=hot"], "algo.t_high='hot' is not valid"),
    (["algo=grpo", "algo.t_high=auto"], "TGRL's adaptive T1"),
    (["algo.t_high=auto", "algo.t_high_ladder=[0.2,1.0]"], "must exceed algo.t_low"),
    (["algo.t_high=auto", "algo.t_high_ladder=[1.4,1.2]"], "strictly increasing"),
    (["algo.t_high=auto", "algo.t_high_ladder=[]"], "strictly increasing"),
    (["algo.t_high=auto", "algo.t_high_discount=0"], "t_high_discount"),
    (["algo.t_high=auto", "algo.t_high_ucb_c=-1"], "t_high_ucb_c"),
    (["algo.t_high=0"], "temperatures must be > 0"),
])
def test_config_refusals(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(["env=choose_item", "model=tiny", *overrides])


def test_config_accepts_auto_and_numbers():
    cfg = load_config(["env=choose_item", "model=tiny", "algo=tgrl", "algo.t_high=auto"])
    assert cfg.algo.t_high == "auto" and cfg.algo.t_high_ladder == [1.0, 1.2, 1.4]
    assert cfg.algo.group_temperatures(cfg.algo.warmup_steps + 1)[1] == (1.2, True)
    cfg = load_config(["env=choose_item", "model=tiny", "algo=tgrl", "algo.t_high=2"])
    assert cfg.algo.t_high == 2.0 and isinstance(cfg.algo.t_high, float)


def test_revised_rule_a_step_with_no_informative_group_is_no_observation():
    """algorithms.md section 3, "Uninformative steps (revised)": the hand sequence with an extra all-zero step at 1.4
    before step 4 gives the same step-4 choice (1.4) as without it; the first rule (delta_R = 0 observed) picks 1.2."""
    def rule_after(extra_step_observed: bool | None):
        rule = AdaptiveHighTemperature(auto(warmup_steps=0, t_high_discount=0.9, t_high_ucb_c=1.0))
        for step, delta in [(1, -0.5), (2, -0.25), (3, 0.0)]:
            rule.t_high(step)
            rule.observe(step, delta, informative_groups=2)
        if extra_step_observed is not None:
            assert rule.t_high(4) == 1.4  # the extra step (UCB picks 1.4 there too)
            # rewards all zero: no informative group; the old rule observed delta_R = 0.0
            rule.observe(4, 0.0, informative_groups=None if extra_step_observed else 0)
        return rule

    assert rule_after(None).t_high(4) == 1.4  # without the extra step
    revised = rule_after(False)
    # step 5 by hand (the discount clock advanced one step; nothing added): N = [0.729, 0.81, 0.9], sum 2.439
    ln_sum = math.log(0.729 + 0.81 + 0.9)
    scores = revised.scores(5)
    assert scores == pytest.approx({1.0: -0.5 + math.sqrt(ln_sum / 0.729), 1.2: -0.25 + math.sqrt(ln_sum / 0.81),
                                    1.4: math.sqrt(ln_sum / 0.9)}, abs=1e-12)
    assert revised.t_high(5) == 1.4  # the same choice as without the extra step
    assert revised.state_dict()["steps"][3] == [4, 1.4, None]  # picked but unobserved
    old = rule_after(True)  # the first rule: a step where nothing won scored delta_R = 0 at 1.4
    assert old.t_high(5) == 1.2


def test_delta_r_over_informative_groups_only():
    from agent_rl.algos import tgrl_delta_r, tgrl_metrics
    # group 0: low 1 | high 1, 0, 0 (informative, delta_R = 1/3 - 1 = -2/3); group 1: all 0 (not informative)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    high = torch.tensor([False, True, True, True] * 2)
    assert tgrl_delta_r(rewards, groups, high, with_count=True) == (pytest.approx(-2 / 3), 1)
    m = tgrl_metrics(rewards, groups, high)
    assert m["tgrl/delta_R"] == pytest.approx(-2 / 3) and m["tgrl/delta_R_groups"] == 1.0
    flat = tgrl_metrics(torch.zeros(8), groups, high)
    assert flat["tgrl/delta_R"] == 0.0 and flat["tgrl/delta_R_groups"] == 0.0
