"""Advantage estimators (algorithms.md section 1): hand-computed cases, invariances, loop-vs-vectorised, safety."""

import math

import pytest
import torch

from agent_rl.algos import (
    AdvEstimator,
    compute_advantages,
    compute_gae,
    dapo_keep_groups,
    dapo_overlong_penalty,
)

# 2 groups x 4 rows. Group 0 (label 0): [1, 0, 0, 1]; group 1 (label 1): [0, 1, 2, 3].
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 2.0, 3.0])
G = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_grpo_hand_sample_std():
    # group 0: mean 0.5, sample var = 4 * 0.25 / 3 = 1/3, std = 0.577350; A = +-0.5 / (0.577350 + 1e-6) = +-0.866024
    # group 1: mean 1.5, sample var = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, std = 1.290994;
    #          A = [-1.5, -0.5, 0.5, 1.5] / 1.290995 = [-1.161894, -0.387298, 0.387298, 1.161894]
    a = compute_advantages("grpo", R, G)
    want = torch.tensor([0.866024, -0.866024, -0.866024, 0.866024, -1.161894, -0.387298, 0.387298, 1.161894])
    torch.testing.assert_close(a, want, atol=2e-6, rtol=0)


def test_grpo_hand_population_std():
    # group 0: population std = 0.5 -> A = +-0.5 / 0.500001 = +-0.999998
    # group 1: population var = 5/4, std = 1.118034 -> A = [-1.341640, -0.447213, 0.447213, 1.341640]
    a = compute_advantages("grpo", R, G, std="population")
    want = torch.tensor([0.999998, -0.999998, -0.999998, 0.999998, -1.341640, -0.447213, 0.447213, 1.341640])
    torch.testing.assert_close(a, want, atol=2e-6, rtol=0)


def test_grpo_enum_name_and_bad_std():
    torch.testing.assert_close(compute_advantages(AdvEstimator.GRPO, R, G), compute_advantages("grpo", R, G))
    with pytest.raises(ValueError, match="sample"):
        compute_advantages("grpo", R, G, std="pop")


def test_drgrpo_rloo_hand():
    # drgrpo: R - mean: group 0 -> [0.5, -0.5, -0.5, 0.5]; group 1 -> [-1.5, -0.5, 0.5, 1.5]
    torch.testing.assert_close(
        compute_advantages("drgrpo", R, G), torch.tensor([0.5, -0.5, -0.5, 0.5, -1.5, -0.5, 0.5, 1.5])
    )
    # rloo: R_i - mean of the other 3. group 0: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3
    # group 1: 0 - 6/3 = -2, 1 - 5/3 = -2/3, 2 - 4/3 = 2/3, 3 - 3/3 = 2
    torch.testing.assert_close(
        compute_advantages("rloo", R, G),
        torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -2.0, -2 / 3, 2 / 3, 2.0]),
    )


def test_reinforce_pp_hand():
    # R = [1, 0, 0, 1, 2, 2, 2, 2]: batch mean 1.25 -> a = [-.25, -1.25, -1.25, -.25, .75, .75, .75, .75]
    # sum a^2 = 2 * 0.0625 + 2 * 1.5625 + 4 * 0.5625 = 5.5; sample std = sqrt(5.5 / 7) = 0.886405
    r = torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2])
    a = compute_advantages("reinforce_pp", r, G)
    want = torch.tensor([-0.25, -1.25, -1.25, -0.25, 0.75, 0.75, 0.75, 0.75]) / 0.886405
    torch.testing.assert_close(a, want, atol=1e-5, rtol=0)


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match=r"grpo.*Did you mean 'grpo'") as e:
        compute_advantages("grp", R, G)
    for name in ("drgrpo", "rloo", "reinforce_pp"):
        assert name in str(e.value)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_other_groups_never_change_a_group(name):
    base = compute_advantages(name, R, G)
    r2 = R.clone()
    r2[4:] = torch.tensor([7.0, -3.0, 0.5, 100.0])  # change group 1 only
    torch.testing.assert_close(compute_advantages(name, r2, G)[:4], base[:4])
    # labels are arbitrary integers and rows may be interleaved
    perm = torch.tensor([4, 0, 5, 1, 6, 2, 7, 3])
    g_lab = torch.where(G == 0, torch.tensor(-7), torch.tensor(42))
    torch.testing.assert_close(compute_advantages(name, R[perm], g_lab[perm]), base[perm])


def _loop_reference(name, r, g):
    out = torch.zeros_like(r, dtype=torch.float64)
    for lab in g.unique():
        idx = (g == lab).nonzero().flatten()
        x = r[idx].double()
        n = len(idx)
        if name == "grpo":
            std = x.std(unbiased=True) if n > 1 else torch.tensor(0.0, dtype=torch.float64)
            a = (x - x.mean()) / (std + 1e-6)
        elif name == "drgrpo":
            a = x - x.mean()
        else:
            a = torch.stack([x[i] - (x.sum() - x[i]) / (n - 1) for i in range(n)]) if n > 1 else torch.zeros(1)
        if bool((x == x[0]).all()):
            a = torch.zeros_like(x)
        out[idx] = a.double()
    return out.float()


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_loop_vs_vectorised(name):
    g = torch.randint(0, 7, (60,))
    r = torch.randint(0, 3, (60,)).float() + torch.rand(60) * (torch.rand(60) > 0.5)
    torch.testing.assert_close(compute_advantages(name, r, g), _loop_reference(name, r, g), atol=1e-5, rtol=1e-5)


def test_episode_index_counts_each_episode_once():
    # one group, episode 0 has 3 turns (rows) with reward 1, episode 1 has 1 row with reward 0.
    # per episode: [1, 0] -> mean 0.5, sample std 0.707107 -> A = +-0.707106, broadcast to rows.
    r = torch.tensor([1.0, 1.0, 1.0, 0.0])
    g = torch.tensor([3, 3, 3, 3])
    ep = torch.tensor([10, 10, 10, 11])
    a = compute_advantages("grpo", r, g, episode_index=ep)
    torch.testing.assert_close(a, torch.tensor([0.707106, 0.707106, 0.707106, -0.707106]), atol=2e-6, rtol=0)
    # counting rows instead would give [1, 1, 1, 0] statistics: different
    assert not torch.allclose(compute_advantages("grpo", r, g), a)
    with pytest.raises(ValueError, match="spans"):
        compute_advantages("grpo", r, torch.tensor([3, 3, 4, 4]), episode_index=ep)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_pp"])
def test_safety_all_equal_single_row_and_float_rounding(name):
    # all-equal groups (with values whose float mean is inexact), single-row groups, integer rewards
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 5.0, 0.3])
    g = torch.tensor([0, 0, 0, 1, 2, 2])
    a = compute_advantages(name, r, g)
    assert torch.isfinite(a).all()
    if name != "reinforce_pp":
        assert (a[:4] == 0).all()  # all-equal group and single-row group give exactly 0
    assert (compute_advantages(name, torch.full((5,), 0.1), torch.zeros(5, dtype=torch.long)) == 0).all()
    assert torch.isfinite(compute_advantages(name, torch.tensor([1, 0, 1]), torch.tensor([0, 0, 0]))).all()
    assert compute_advantages(name, torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


# ---------------------------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------------------------
def test_gae_hand_with_prompt_and_gap():
    # T = 5, mask [0, 1, 1, 0, 1]: column 0 is prompt, column 3 an observation gap. Masked positions 1, 2, 4 with
    # V = 0.5, 0.6, 0.8 and reward 1 on the last. gamma = 0.9, lam = 0.5 (gamma * lam = 0.45):
    #   t=4: delta = 1 + 0 - 0.8 = 0.2                 A = 0.2
    #   t=2: delta = 0 + 0.9 * 0.8 - 0.6 = 0.12        A = 0.12 + 0.45 * 0.2 = 0.21
    #   t=1: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04        A = 0.04 + 0.45 * 0.21 = 0.1345
    # returns = A + V = [0.6345, 0.81, 1.0]; 0 off the mask.
    mask = torch.tensor([[0.0, 1, 1, 0, 1]])
    values = torch.tensor([[9.0, 0.5, 0.6, 9.0, 0.8]])
    rewards = torch.tensor([[5.0, 0, 0, 5.0, 1.0]])  # off-mask rewards are ignored
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.1345, 0.21, 0.0, 0.2]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, 0.6345, 0.81, 0.0, 1.0]]))


def test_gae_limits():
    torch.manual_seed(1)
    mask = (torch.rand(4, 9) > 0.3).float()
    values = torch.randn(4, 9)
    rewards = torch.randn(4, 9)
    # gamma = lam = 1: returns = sum of future masked rewards (Monte Carlo)
    _, ret = compute_gae(rewards, values, mask, 1.0, 1.0)
    mc = torch.flip(torch.cumsum(torch.flip(rewards * mask, [1]), 1), [1]) * mask
    torch.testing.assert_close(ret, mc, atol=1e-5, rtol=1e-5)
    # lam = 0: A = one-step TD error with the next masked value
    adv0, _ = compute_gae(rewards, values, mask, 0.9, 0.0)
    adv_loop, _ = _gae_loop(rewards, values, mask, 0.9, 0.0)
    torch.testing.assert_close(adv0, adv_loop)


def _gae_loop(rewards, values, mask, gamma, lam):
    adv = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        pos = mask[i].nonzero().flatten().tolist()
        last, nv = 0.0, 0.0
        for p in reversed(pos):
            delta = rewards[i, p].item() + gamma * nv - values[i, p].item()
            last = delta + gamma * lam * last
            adv[i, p] = last
            nv = values[i, p].item()
    return adv, (adv + values) * mask


def test_gae_loop_vs_vectorised_and_masked_invariance():
    torch.manual_seed(2)
    mask = (torch.rand(5, 12) > 0.4).float()
    mask[3] = 0  # an empty row
    values, rewards = torch.randn(5, 12), torch.randn(5, 12)
    adv, ret = compute_gae(rewards, values, mask, 0.95, 0.9)
    adv_l, ret_l = _gae_loop(rewards, values, mask, 0.95, 0.9)
    torch.testing.assert_close(adv, adv_l, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, ret_l, atol=1e-5, rtol=1e-5)
    off = mask == 0
    adv2, ret2 = compute_gae(rewards.masked_fill(off, 1e30), values.masked_fill(off, float("inf")), mask, 0.95, 0.9)
    torch.testing.assert_close(adv2, adv)
    torch.testing.assert_close(ret2, ret)
    assert (adv[3] == 0).all()


# ---------------------------------------------------------------------------------------------------------------
# DAPO helpers
# ---------------------------------------------------------------------------------------------------------------
def test_dapo_overlong_penalty_hand():
    # L_max = 10, L_c = 4: free up to 6; (6 - |y|) / 4 up to 10; -1 beyond
    got = dapo_overlong_penalty(torch.tensor([5, 6, 7, 10, 11]), max_len=10, cache_len=4)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.25, -1.0, -1.0]))
    assert math.isfinite(float(dapo_overlong_penalty(torch.tensor([3]), 10, 0)[0]))


def test_dapo_keep_groups_hand():
    r = torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2, 5])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2])  # group 1 all equal, group 2 a single row
    assert dapo_keep_groups(r, g).tolist() == [True] * 4 + [False] * 5


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_pp"])
def test_estimators_accept_the_same_config_keywords(name):
    # the trainer passes algo.std / eps to whichever estimator is selected, without branching on the name
    a = compute_advantages(name, R, G, std="sample", eps=1e-6)
    assert a.shape == (8,) and torch.isfinite(a).all()


# ---------------------------------------------------------------------------------------------------------------
# GiGPO (optional estimator of algorithms.md section 1)
# ---------------------------------------------------------------------------------------------------------------
def test_gigpo_hand():
    # one group, 3 episodes (per-turn rows), sparse reward on the last turn, gamma 0.95:
    #   episode A (R = 1): turns on observations [10, 20, 30] -> returns [0.95^2, 0.95, 1] = [0.9025, 0.95, 1]
    #   episode B (R = 0): observations [10, 20]               -> returns [0, 0]
    #   episode C (R = 1): observation  [10]                   -> return  [1]
    # episode level: GRPO over [1, 0, 1]: mean 2/3, sample std sqrt(1/3) = 0.577350 -> [0.577350, -1.154700, 0.577350]
    # anchor obs 10: {A 0.9025, B 0, C 1}: mean 0.634167, sample std 0.551364
    #   -> [0.486671, -1.150176, 0.663505]
    # anchor obs 20: {A 0.95, B 0} -> +-0.707106; anchor obs 30: {A} alone -> 0
    # total A = [0.577350 + 0.486671, 0.577350 + 0.707106, 0.577350] = [1.064021, 1.284456, 0.577350]
    #       B = [-1.154700 - 1.150176, -1.154700 - 0.707106] = [-2.304876, -1.861806];  C = [1.240855]
    r = torch.tensor([1.0, 1, 1, 0, 0, 1])
    kw = dict(episode_index=torch.tensor([0, 0, 0, 1, 1, 2]), turn_index=torch.tensor([0, 1, 2, 0, 1, 0]),
              obs_key=torch.tensor([10, 20, 30, 10, 20, 10]))
    a = compute_advantages("gigpo", r, torch.zeros(6, dtype=torch.long), **kw)
    want = torch.tensor([1.064021, 1.284456, 0.577350, -2.304876, -1.861806, 1.240855])
    torch.testing.assert_close(a, want, atol=3e-6, rtol=0)
    # the same observation in another group is a different anchor group: adding group 1 changes nothing in group 0
    r2 = torch.cat([r, torch.tensor([0.0, 1.0])])
    kw2 = {k: torch.cat([v, torch.tensor(x)]) for (k, v), x in zip(kw.items(), ([3, 4], [0, 0], [10, 10]))}
    g2 = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    torch.testing.assert_close(compute_advantages("gigpo", r2, g2, **kw2)[:6], want, atol=3e-6, rtol=0)
    with pytest.raises(ValueError, match="obs_key"):
        compute_advantages("gigpo", r, torch.zeros(6, dtype=torch.long), episode_index=kw["episode_index"])


def test_discounted_turn_returns_loop_vs_vectorised():
    from agent_rl.algos import discounted_turn_returns

    ep = torch.tensor([4, 4, 9, 4, 9, 1])
    k = torch.tensor([0, 1, 0, 3, 1, 0])  # episode 4 misses turn 2: it still counts in the exponent
    rew = torch.tensor([0.5, -1.0, 2.0, 3.0, 1.0, 7.0])
    got = discounted_turn_returns(rew, ep, k, 0.9)
    for i in range(6):
        want = sum(0.9 ** (int(k[j]) - int(k[i])) * float(rew[j]) for j in range(6) if ep[j] == ep[i] and k[j] >= k[i])
        assert float(got[i]) == pytest.approx(want)


def test_gigpo_safety_all_equal_and_single_rows():
    # all-equal episode rewards and one-turn anchor groups: every part is 0, never NaN
    kw = dict(episode_index=torch.tensor([0, 0, 1, 2]), turn_index=torch.tensor([0, 1, 0, 0]),
              obs_key=torch.tensor([1, 2, 3, 4]))
    a = compute_advantages("gigpo", torch.ones(4), torch.tensor([0, 0, 0, 5]), **kw)
    assert (a == 0).all()
    empty = {k: v[:0] for k, v in kw.items()}
    assert compute_advantages("gigpo", torch.zeros(0), torch.zeros(0, dtype=torch.long), **empty).shape == (0,)
