"""Dr.GRPO's constant divisor (Liu et al. 2025; algorithms.md section 1: loss = token sum / (G * L_max), L_max a
constant): the ``drgrpo`` preset sets ``algo.loss_max_len`` to the generation budget ``engine.max_new_tokens`` and
``algo.loss_max_len=0`` is refused at load with the reason; the same row's loss is the same beside a short row and
beside a long one (with the batch's longest response as the divisor it was not)."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig
from agent_rl.rollout import build_rollout_batch
from agent_rl.types import Episode, Task, Turn

CHEAP = ["env=choose_item", "model=tiny", "env_server.mode=local"]


def test_preset_divides_by_the_generation_budget_and_refuses_0():
    cfg = load_config([*CHEAP, "algo=drgrpo", "engine.max_new_tokens=40"])
    assert (cfg.algo.loss_agg, cfg.algo.loss_max_len) == ("seq_mean_token_sum_norm", 40)
    with pytest.raises(ConfigError, match=r"algo=drgrpo needs algo.loss_max_len > 0 \(got 0\).*a constant"):
        load_config([*CHEAP, "algo=drgrpo", "algo.loss_max_len=0"])
    with pytest.raises(ValueError, match="longest response"):
        AlgoConfig(name="drgrpo", adv_estimator="drgrpo", loss_agg="seq_mean_token_sum_norm")


def _episode(group: int, response: list[int], reward: float) -> Episode:
    turn = Turn(prompt_ids=[5, 6, 7, 8], response_ids=response, response_logprobs=[-1.0] * len(response), action="a",
                reward=reward, terminated=True)
    return Episode(task=Task("e", group_id=group), temperature=1.0, is_high=False, turns=[turn], reward=reward)


def _pg_loss(model, tok, algo: AlgoConfig, beside: int) -> float:
    """``actor/pg_loss`` of one update on group 0 (row A: 6 response tokens, reward 1; row A': 2 tokens, reward 0;
    Dr.GRPO advantages +0.5 and -0.5) beside group 1, two rows of ``beside`` response tokens with equal rewards
    (advantage 0: nothing in the loss sum; each counts once in the row mean, whatever its length)."""
    episodes = [_episode(0, [20, 21, 22, 23, 24, 25], 1.0), _episode(0, [30, 31], 0.0),
                _episode(1, [40 + i % 50 for i in range(beside)], 1.0),
                _episode(1, [41 + i % 50 for i in range(beside)], 1.0)]
    batch = build_rollout_batch(episodes, pad_token_id=0)
    learner = Learner(copy.deepcopy(model), tok, algo, OptimConfig(lr=1e-3, weight_decay=0.0),
                      credit=CreditConfig(name="uniform"))
    return learner.update(batch, step=1, total_steps=1)["actor/pg_loss"]


def test_the_same_rows_loss_beside_a_short_and_a_long_row(tiny):
    model, tok = tiny
    algo = load_config([*CHEAP, "algo=drgrpo", "engine.max_new_tokens=64"]).algo
    # first optimiser step: ratio 1, token loss -A; row sums -0.5 * 6 = -3 and +0.5 * 2 = +1, group 1's 0;
    # seq_mean_token_sum_norm: (-3 + 1 + 0 + 0) / (4 rows * L_max), L_max = 64 beside either row
    expected = -2 / (4 * 64)
    short, long = _pg_loss(model, tok, algo, 2), _pg_loss(model, tok, algo, 60)
    assert short == pytest.approx(expected, rel=1e-5) and long == pytest.approx(expected, rel=1e-5)
    # what the preset used to leave (0: the batch's longest response): L_max 6 beside the short rows, 60 beside the
    # long ones, so the same rows' loss changed with their neighbours
    algo.loss_max_len = 0
    assert _pg_loss(model, tok, algo, 2) == pytest.approx(-2 / (4 * 6), rel=1e-5)
    assert _pg_loss(model, tok, algo, 60) == pytest.approx(-2 / (4 * 60), rel=1e-5)
