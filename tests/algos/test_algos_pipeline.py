"""The advantage pipeline (base -> TGRL JS weights -> credit -> low-row mask -> clamp): the plan each config gets,
and the TGRL cases of algorithms.md worked by hand through the pure functions."""

import math

import pytest
import torch

from agent_rl.algos import (
    CreditInputs,
    advantage_plan,
    clamp_stage,
    compute_advantages,
    low_row_stage,
    tgrl_advantages,
    tgrl_delta_r,
    tgrl_token_weights,
    token_advantages,
)

SQ3 = math.sqrt(3.0) / 2  # 0.866: GRPO advantage of a group [1, 1, 0, 0] (sample std 0.577)


def _plan(**kw):
    base = dict(is_tgrl=True, warmup=False, credit="js", level="token", S=0.0, scheduled=False)
    return advantage_plan(**{**base, **kw})


def test_plan_of_each_ablation():
    # full TGRL: JS weights at strength 1, no other rule, low rows 0, clamp 10
    p = _plan()
    assert (p.js_strength, p.credit, p.zero_low_rows, p.adv_clip) == (1.0, None, True, 10.0)
    # mixed groups + uniform credit: only the JS weights go; the low-row rule stays
    p = _plan(credit="uniform")
    assert (p.js_strength, p.credit, p.zero_low_rows, p.adv_clip) == (None, "uniform", True, 10.0)
    # TGRL + tp: JS weights, then the TP mask on top
    p = _plan(credit="tp", S=0.4, scheduled=True)
    assert (p.js_strength, p.credit, p.S, p.zero_low_rows) == (1.0, "tp", 0.4, True)
    # TGRL + scheduled js: the JS weights interpolated at S
    assert _plan(credit="js", S=0.3, scheduled=True).js_strength == 0.3
    # TGRL + empg: the row rule first
    assert _plan(credit="empg", level="turn").credit_first
    # warm-up: plain GRPO over all G (no JS, no zeroing, no clamp); another rule still acts
    p = _plan(warmup=True)
    assert (p.js_strength, p.credit, p.zero_low_rows, p.adv_clip) == (None, None, False, None)
    assert _plan(warmup=True, credit="tp").credit == "tp"
    # GRPO (any temperature): the rule alone; credit=js on GRPO runs at the schedule's S
    p = _plan(is_tgrl=False, credit="uniform")
    assert (p.js_strength, p.credit, p.zero_low_rows, p.adv_clip) == (None, "uniform", False, None)
    assert _plan(is_tgrl=False, credit="js", S=1.0, scheduled=True).js_strength == 1.0


def _inputs(adv, mask, episode, high, js=None, turn=None, num_turns=None, entropy=None):
    b = mask.shape[0]
    return CreditInputs(advantages=adv, response_mask=mask, episode_index=episode,
                        turn_index=torch.zeros(b, dtype=torch.long) if turn is None else turn,
                        num_turns=torch.ones(b, dtype=torch.long) if num_turns is None else num_turns,
                        js=js, entropy=entropy, is_high=high)


def test_js_weights_per_trajectory_issue_case():
    # a winning high episode of two turns (rows 0, 1), J = [0.1, 0.1] and [0.01, 0.01], in a group whose other three
    # episodes lost: group advantage (1 - 0.25) / 0.5 = 1.5 -> token advantages [2.58, 2.58] and [0.42, 0.42]
    # (Jbar 0.055, omega 1.036 / 0.167, mean 0.602, w 1.722 / 0.278); a per-turn normalisation would give 1.5
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])
    group = torch.zeros(5, dtype=torch.long)
    episode = torch.tensor([0, 0, 1, 2, 3])
    high = torch.tensor([True, True, True, True, False])
    js = torch.tensor([[0.1, 0.1], [0.01, 0.01], [0.2, 0.2], [0.2, 0.2], [0.0, 0.0]])
    mask = torch.ones(5, 2)
    adv = tgrl_advantages(rewards, group, high, js, mask, episode_index=episode)
    torch.testing.assert_close(adv[:2], torch.tensor([[2.5835, 2.5835], [0.4165, 0.4165]]), atol=1e-4, rtol=0)
    # a per-turn normalisation (each row its own trajectory) gives w = 1, so 1.5 on all four tokens
    torch.testing.assert_close(tgrl_token_weights(js, mask)[:2], torch.ones(2, 2))
    w = tgrl_token_weights(js, mask, episode_index=episode)
    torch.testing.assert_close(w[:2], torch.tensor([[1.7223, 1.7223], [0.2777, 0.2777]]), atol=1e-4, rtol=0)
    # the same through the pipeline (credit=js under algo=tgrl), rows of the episode advantage broadcast
    base = compute_advantages("grpo", rewards, group, episode_index=episode)
    got, loss_mask = token_advantages(_plan(), _inputs(base, mask, episode, high, js=js))
    torch.testing.assert_close(got, adv)
    assert torch.equal(loss_mask, mask)


def test_uniform_credit_under_tgrl_keeps_low_rows_untrained():
    # group [low 1 | high 1, 0, 0] under credit=uniform: low row 0; high rows +0.866, -0.866, -0.866
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    high = torch.tensor([False, True, True, True])
    base = compute_advantages("grpo", rewards, torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(base, torch.tensor([SQ3, SQ3, -SQ3, -SQ3]))
    got, mask = token_advantages(_plan(credit="uniform"), _inputs(base, torch.ones(4, 3), torch.arange(4), high))
    torch.testing.assert_close(got, torch.tensor([0.0, SQ3, -SQ3, -SQ3])[:, None].expand(4, 3))
    assert torch.equal(mask, torch.ones(4, 3))  # low rows still count in the token-mean denominator
    # every other rule under algo=tgrl keeps the low rows at 0 too
    ent = torch.rand(4, 3)
    for credit, level in [("tp", "token"), ("forking", "token"), ("entropy_adv", "token"), ("empg", "turn"),
                          ("tp", "turn"), ("js", "turn")]:
        inp = _inputs(base, torch.ones(4, 3), torch.arange(4), high, js=torch.rand(4, 3), entropy=ent)
        got, _ = token_advantages(_plan(credit=credit, level=level, S=0.5, scheduled=True), inp)
        assert (got[0] == 0).all(), credit
    # algo.low_rows_in_denominator=false: the low row leaves the loss mask as well
    got, mask = token_advantages(advantage_plan(is_tgrl=True, warmup=False, credit="uniform", level="token", S=0.0,
                                                scheduled=False, low_rows_in_denominator=False),
                                 _inputs(base, torch.ones(4, 3), torch.arange(4), high))
    assert mask[0].sum() == 0 and mask[1:].sum() == 9


def test_low_row_and_clamp_stages():
    adv = torch.tensor([[3.0, -12.0], [20.0, 1.0]])
    out, mask = low_row_stage(adv, torch.ones(2, 2), torch.tensor([False, True]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0], [20.0, 1.0]]))
    torch.testing.assert_close(clamp_stage(out, 10.0), torch.tensor([[0.0, 0.0], [10.0, 1.0]]))
    assert clamp_stage(adv, None) is adv
    with pytest.raises(ValueError, match="is_high"):
        low_row_stage(adv, torch.ones(2, 2), torch.tensor([True]))


@pytest.mark.parametrize("rewards,want", [
    ([1.0, 1.0, 0.0, 0.0], -SQ3),  # [low 1 | high 1, 0, 0]: delta_R = 1/3 - 1 = -2/3
    ([0.0, 1.0, 1.0, 0.0], SQ3),  # [low 0 | high 1, 1, 0]: delta_R = 2/3
    ([1.0, 0.0, 0.0, 0.0], -SQ3),  # [low 1 | high 0, 0, 0]: delta_R = -1, std 0.5 -> 0.75 * -1 / 0.5 * ... see below
])
def test_trained_advantages_do_not_sum_to_zero_in_a_group(rewards, want):
    """TGRL trains only the T1 rows, so the sum of trained (episode) advantages in a group is the Proposition-1 term
    (n_low n_high / G) delta_R_g / std_g, not 0 (GRPO's sum over all G is 0). This is the mechanism of the late
    drift documented in docs/algorithms_impl.md."""
    r = torch.tensor(rewards)
    high = torch.tensor([False, True, True, True])
    group = torch.zeros(4, dtype=torch.long)
    base = compute_advantages("grpo", r, group)
    got, _ = token_advantages(_plan(credit="uniform"), _inputs(base, torch.ones(4, 1), torch.arange(4), high))
    trained_sum = float(got.sum())
    std = float(r.std(unbiased=True))
    delta = tgrl_delta_r(r, group, high)
    assert trained_sum == pytest.approx((1 * 3 / 4) * delta / (std + 1e-6), abs=1e-5)
    if rewards == [1.0, 0.0, 0.0, 0.0]:
        want = 0.75 * -1.0 / 0.5  # std of [1, 0, 0, 0] is 0.5
    assert trained_sum == pytest.approx(want, abs=1e-5)
    assert float(base.sum()) == pytest.approx(0.0, abs=1e-6)  # GRPO over all G sums to 0


def test_empty_stages_broadcast_row_advantages():
    got, mask = token_advantages(_plan(is_tgrl=False, credit="uniform"),
                                 _inputs(torch.tensor([1.0, -2.0]), torch.tensor([[0.0, 1.0], [1.0, 1.0]]),
                                         torch.arange(2), None))
    torch.testing.assert_close(got, torch.tensor([[0.0, 1.0], [-2.0, -2.0]]))


@pytest.mark.parametrize("clip", [False, True])
def test_trajectory_weights_loop_vs_vectorised(clip):
    """tgrl_token_weights with episode_index equals a numpy loop over episodes (masked tokens of the episode's rows
    concatenated; percentiles by numpy's linear interpolation)."""
    import numpy as np

    gen = torch.Generator().manual_seed(3)
    b, t = 12, 9
    mask = (torch.rand(b, t, generator=gen) > 0.3).float()
    js = torch.rand(b, t, generator=gen, dtype=torch.float64) * 0.5
    episode = torch.randint(0, 5, (b,), generator=gen)
    got = tgrl_token_weights(js, mask, episode_index=episode, quantile_clip=clip)
    want = np.zeros((b, t))
    for e in episode.unique().tolist():
        rows = (episode == e).nonzero().flatten().tolist()
        cells = [(r, c) for r in rows for c in range(t) if mask[r, c] > 0]
        if not cells:
            continue
        j = np.array([float(js[r, c]) for r, c in cells])
        omega = np.log1p((j + 1e-8) / (j.mean() + 1e-8))
        if clip:
            omega = np.clip(omega, np.quantile(omega, 0.05), np.quantile(omega, 0.95))
        for (r, c), w in zip(cells, omega / omega.mean()):
            want[r, c] = w
    np.testing.assert_allclose(got.numpy(), want, atol=1e-10)
