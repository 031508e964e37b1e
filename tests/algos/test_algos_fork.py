"""Forked groups' step-group estimator: the hand-computed example of docs/algorithms_impl.md ("Forked groups")."""

import math

import pytest
import torch

from agent_rl.algos import CreditInputs, advantage_plan, fork_advantages, token_advantages

AG = 1 / math.sqrt(2)  # group {1, 0}: mean 0.5, sample std 0.70711
AS_BASE = -(2 / 3) / math.sqrt(1 / 3)  # step group {0, 1, 1}: mean 2/3, std sqrt(1/3): -1.15470
AS_SIB = (1 / 3) / math.sqrt(1 / 3)  # +0.57735


def _example(second_fork: bool = False):
    """Trajectory mode, one row per episode, 2 response tokens per turn (no observation gaps needed for the rule).
    Episodes: b0 (2 turns, R 1), b1 (3 turns, R 0), s1, s2 siblings of b1 at t=1 (3 turns, R 1); with
    ``second_fork`` s3, a sibling of b1 at t=2 (3 turns, R 0)."""
    turns = [2, 3, 3, 3] + ([3] if second_fork else [])
    rewards = [1.0, 0.0, 1.0, 1.0] + ([0.0] if second_fork else [])
    base = [-1, -1, 1, 1] + ([1] if second_fork else [])
    fturn = [-1, -1, 1, 1] + ([2] if second_fork else [])
    e, t_len = len(turns), 6
    mask = torch.zeros(e, t_len)
    token_turn = torch.full((e, t_len), -1, dtype=torch.long)
    for i, k in enumerate(turns):
        mask[i, :2 * k] = 1
        token_turn[i, :2 * k] = torch.arange(k).repeat_interleave(2)
        if base[i] >= 0:  # the replayed prefix is masked (build_rollout_batch does this)
            mask[i, :2 * fturn[i]] = 0
    return dict(episode_rewards=torch.tensor(rewards), episode_group_index=torch.zeros(e, dtype=torch.long),
                fork_base=torch.tensor(base), fork_turn=torch.tensor(fturn), token_turn=token_turn,
                episode_index=torch.arange(e), response_mask=mask)


def test_hand_example():
    adv = fork_advantages("grpo", **_example())
    expect = torch.tensor([
        [AG] * 4 + [0, 0],  # b0: group advantage on both turns (2 turns: the last 2 positions are padding)
        [-AG] * 2 + [AS_BASE] * 4,  # b1: group before the fork, step group from turn 1
        [0, 0] + [AS_SIB] * 4,  # s1: replayed turn 0 masked
        [0, 0] + [AS_SIB] * 4,
    ])
    torch.testing.assert_close(adv, expect.float(), rtol=1e-5, atol=1e-5)
    assert abs(AS_BASE - -1.15470) < 1e-5 and abs(AS_SIB - 0.57735) < 1e-5 and abs(AG - 0.70711) < 1e-5


def test_second_fork_latest_wins_and_flat_step_group_is_zero():
    adv = fork_advantages("grpo", **_example(second_fork=True))
    # b1: turn 0 group, turn 1 S(b1,1), turn 2 S(b1,2) = {0, 0}: flat -> 0
    torch.testing.assert_close(adv[1], torch.tensor([-AG, -AG, AS_BASE, AS_BASE, 0, 0]).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv[4], torch.zeros(6))
    # the siblings of t=1 keep their own step group {b1, s1, s2}: s3 is not in it
    torch.testing.assert_close(adv[2], torch.tensor([0, 0] + [AS_SIB] * 4).float(), rtol=1e-5, atol=1e-5)


def test_without_forks_equals_the_group_estimator():
    ex = _example()
    keep = torch.tensor([0, 1])
    adv = fork_advantages("rloo", ex["episode_rewards"][keep], ex["episode_group_index"][keep],
                          ex["fork_base"][keep], ex["fork_turn"][keep], ex["token_turn"][keep],
                          torch.arange(2), ex["response_mask"][keep])
    # rloo of {1, 0}: +1, -1 on every trained token
    torch.testing.assert_close(adv, torch.tensor([[1.0] * 4 + [0, 0], [-1.0] * 6]))


def test_drgrpo_step_baseline():
    adv = fork_advantages("drgrpo", **_example())
    torch.testing.assert_close(adv[1], torch.tensor([-0.5, -0.5] + [-2 / 3] * 4), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(adv[2, 2:], torch.full((4,), 1 / 3), rtol=1e-5, atol=1e-6)


def test_composes_with_the_pipeline_js_weights():
    """Stage 2 multiplies the (B, T) fork advantages per token with TGRL's weights over s1's trained (post-fork)
    tokens only: J = [1, 3, 1, 3], Jbar = 2, omega = log(1 + J / Jbar) = [0.405, 0.916, ...], w = omega / mean omega
    = [0.613, 1.387, ...]; the replayed turn stays 0."""
    ex = _example()
    adv = fork_advantages("grpo", **ex)
    js = torch.ones(4, 6)
    js[2, 2:] = torch.tensor([1.0, 3.0, 1.0, 3.0])
    plan = advantage_plan(is_tgrl=False, warmup=False, credit="js", level="token", S=1.0, scheduled=True)
    out, mask = token_advantages(plan, CreditInputs(adv, ex["response_mask"], torch.zeros(4, dtype=torch.long),
                                                    torch.tensor([2, 3, 3, 3]), torch.arange(4), js=js),
                                 quantile_clip=False)
    torch.testing.assert_close(out[2, 2:], AS_SIB * _w([1.0, 3.0, 1.0, 3.0]), rtol=1e-5, atol=1e-5)
    assert float(out[2, :2].abs().sum()) == 0.0 and float(mask[2, :2].sum()) == 0.0


def _w(j):
    omega = torch.log1p(torch.tensor(j) / (sum(j) / len(j)))
    return omega / omega.mean()


@pytest.mark.parametrize("name", ["reinforce_pp", "gigpo"])
def test_refuses_estimators_without_group_baseline(name):
    with pytest.raises(ValueError, match="per-group baseline"):
        fork_advantages(name, **_example())


def test_refuses_bad_fork_base():
    ex = _example()
    ex["fork_base"] = torch.tensor([-1, -1, 2, 1])  # s1 names a sibling as its base
    with pytest.raises(ValueError, match="base episode"):
        fork_advantages("grpo", **ex)
