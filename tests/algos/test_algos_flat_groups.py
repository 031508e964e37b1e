"""Issue 10 section 3: the zero-variance test compares by value, with one tolerance for every estimator.

Input of the issue: seven float32 0.3 and one value 3e-8 away (the next float32 above 0.3). Before the fix REINFORCE++
gave -0.181 (x7) and +1.270 (exact-equality test, then whitening of a 3e-8 spread); the right value is 0 everywhere,
because the group's range (3e-8) is within the documented tolerance 1e-6 * max(1, max |R|)."""

import pytest
import torch

from agent_rl.algos import compute_advantages, dapo_keep_groups, tgrl_advantages
from agent_rl.algos._groups import FLAT_RTOL, flat_range

R_NEAR = torch.tensor([0.3] * 7 + [0.3 + 3e-8], dtype=torch.float32)
G1 = torch.zeros(8, dtype=torch.long)


def test_issue_input_is_not_exactly_equal():
    # the input really holds two distinct float32 values: exact equality (the old test) sees a non-flat group
    assert len(set(R_NEAR.tolist())) == 2
    assert 2.9e-8 < float(R_NEAR[7] - R_NEAR[0]) < 3.1e-8


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_pp"])
def test_near_equal_group_gets_zero(name):
    # right value: exactly 0 (before the fix: reinforce_pp [-0.181 x7, 1.270], grpo [-0.0037 x7, 0.0258])
    a = compute_advantages(name, R_NEAR, G1)
    assert a.tolist() == [0.0] * 8
    # per-turn mode (rows of one episode share the reward) gives the same
    ep = torch.arange(8).repeat_interleave(2)
    assert compute_advantages(name, R_NEAR.repeat_interleave(2), G1.repeat_interleave(2), episode_index=ep).tolist() \
        == [0.0] * 16


def test_gigpo_near_equal_episodes_and_returns_get_zero():
    # 8 one-turn episodes on the same observation: episode-level and step-level (anchor) groups are both flat
    kw = dict(episode_index=torch.arange(8), turn_index=torch.zeros(8, dtype=torch.long),
              obs_key=torch.zeros(8, dtype=torch.long))
    assert compute_advantages("gigpo", R_NEAR, G1, **kw).tolist() == [0.0] * 8


def test_dapo_filter_and_tgrl_path_use_the_same_test():
    assert dapo_keep_groups(R_NEAR, G1).tolist() == [False] * 8  # the group is dropped by dynamic sampling
    mask = torch.ones(8, 3)
    js = torch.rand(8, 3)
    is_high = torch.tensor([False, True, True, True] * 2)
    for warmup in (False, True):
        a = tgrl_advantages(R_NEAR, G1, is_high, js, mask, warmup=warmup)
        assert a.abs().max().item() == 0.0


def test_rollout_filter_uses_the_same_test():
    from agent_rl.rollout.orchestrator import all_equal

    assert all_equal(R_NEAR.tolist())
    assert not all_equal([0.3] * 7 + [0.3 + 2e-6])
    assert all_equal([1.0])  # a single-row group cannot be learned from: filtered


def test_tolerance_boundary_and_relative_scale():
    # absolute 1e-6 for |R| <= 1: a spread of 2e-6 is a real difference and is learned from
    r = torch.tensor([0.0, 2e-6], dtype=torch.float64)
    torch.testing.assert_close(compute_advantages("drgrpo", r, torch.zeros(2, dtype=torch.long)),
                               torch.tensor([-1e-6, 1e-6], dtype=torch.float64))
    # whitened: a = +-1e-6, sample std sqrt(2) * 1e-6, eps 1e-8 -> +-1e-6 / (1.414214e-6 + 1e-8) = +-0.702142
    a = compute_advantages("reinforce_pp", r, torch.zeros(2, dtype=torch.long))
    torch.testing.assert_close(a, torch.tensor([-0.702142, 0.702142], dtype=torch.float64), atol=2e-6, rtol=0)
    # relative above 1: rewards near 1000 in float32 (one ulp = 6.1e-5) differing by one ulp are equal
    big = torch.tensor([1000.0, 1000.0 + 6.1035e-5], dtype=torch.float32)
    assert big[1] != big[0]
    assert compute_advantages("grpo", big, torch.zeros(2, dtype=torch.long)).tolist() == [0.0, 0.0]
    # the helper itself, on the boundary
    assert FLAT_RTOL == 1e-6
    vmax = torch.tensor([1e-6, 1.1e-6, 2000.0 + 2e-3, 2000.0 + 2.1e-3], dtype=torch.float64)
    vmin = torch.tensor([0.0, 0.0, 2000.0, 2000.0], dtype=torch.float64)
    assert flat_range(vmax, vmin).tolist() == [True, False, True, False]


def test_other_groups_keep_their_values():
    # a flat group next to a real one: the real group is untouched (grpo: +-0.707106 with sample std)
    r = torch.cat([R_NEAR, torch.tensor([0.0, 1.0])])
    g = torch.tensor([0] * 8 + [1, 1])
    a = compute_advantages("grpo", r, g)
    assert a[:8].tolist() == [0.0] * 8
    torch.testing.assert_close(a[8:], torch.tensor([-0.707106, 0.707106]), atol=2e-6, rtol=0)
