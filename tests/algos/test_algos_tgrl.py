"""TGRL (algorithms.md section 3) and temporal schedules (algorithms.md section 4)."""

import math

import pytest
import torch

from agent_rl.algos import (
    masked_row_quantile,
    schedule_value,
    tgrl_advantages,
    tgrl_delta_r,
    tgrl_metrics,
    tgrl_token_weights,
)

# One row with 3 masked tokens J = [0.1, 0.3, 0.2]; column 2 is masked out (its J = 5.0 must never matter).
JS_ROW = torch.tensor([[0.1, 0.3, 5.0, 0.2]])
MASK_ROW = torch.tensor([[1.0, 1.0, 0.0, 1.0]])


def test_token_weights_hand_without_quantile_clip():
    # Jbar = 0.2; omega = ln(1 + J / 0.2) = [ln 1.5, ln 2.5, ln 2] = [0.405465, 0.916291, 0.693147]
    # mean omega = 0.671634; w = omega / mean = [0.603699, 1.364270, 1.032031] (mean 1)
    w = tgrl_token_weights(JS_ROW, MASK_ROW, quantile_clip=False)
    torch.testing.assert_close(w, torch.tensor([[0.603699, 1.364270, 0.0, 1.032031]]), atol=2e-6, rtol=0)


def test_token_weights_hand_with_quantile_clip():
    # sorted omega [0.405465, 0.693147, 0.916291]; 5th pct at position 0.05 * 2 = 0.1:
    #   0.405465 + 0.1 * (0.693147 - 0.405465) = 0.434233
    # 95th pct at position 1.9: 0.693147 + 0.9 * (0.916291 - 0.693147) = 0.893976
    # clipped omega [0.434233, 0.893976, 0.693147], mean 0.673785 -> w = [0.644468, 1.326796, 1.028735]
    w = tgrl_token_weights(JS_ROW, MASK_ROW)
    torch.testing.assert_close(w, torch.tensor([[0.644468, 1.326796, 0.0, 1.028735]]), atol=2e-6, rtol=0)


def test_token_weights_mean_one_masked_invariance_and_loop():
    torch.manual_seed(4)
    js = torch.rand(6, 20) * 0.69
    mask = (torch.rand(6, 20) > 0.3).float()
    mask[:, :3] = 0  # a prompt prefix
    mask[5] = 0  # an empty row
    mask[4] = 0
    mask[4, 7] = 1  # a one-token row
    w = tgrl_token_weights(js, mask)
    n = mask.sum(-1)
    row_mean = (w * mask).sum(-1) / n.clamp_min(1)
    torch.testing.assert_close(row_mean[n > 0], torch.ones(int((n > 0).sum())), atol=1e-6, rtol=0)
    assert (w[mask == 0] == 0).all() and torch.isfinite(w).all()
    # masked-out J never changes anything
    torch.testing.assert_close(tgrl_token_weights(js.masked_fill(mask == 0, 1e6), mask), w)
    # loop over rows with torch.quantile on the compacted row
    for i in range(6):
        sel = mask[i] > 0
        if not sel.any():
            continue
        j = js[i, sel].double()
        omega = torch.log1p((j + 1e-8) / (j.mean() + 1e-8))
        lo, hi = torch.quantile(omega, 0.05), torch.quantile(omega, 0.95)
        omega = omega.clamp(lo, hi)
        torch.testing.assert_close(w[i, sel], (omega / omega.mean()).float(), atol=1e-6, rtol=1e-6)


def test_masked_row_quantile_vs_torch_quantile():
    x = torch.randn(5, 11, dtype=torch.float64)
    mask = (torch.rand(5, 11) > 0.4).float()
    mask[0] = 1
    for q in (0.0, 0.05, 0.5, 0.95, 1.0):
        got = masked_row_quantile(x, mask, q)
        for i in range(5):
            sel = mask[i] > 0
            want = torch.quantile(x[i, sel], q) if sel.any() else torch.tensor(0.0, dtype=torch.float64)
            torch.testing.assert_close(got[i], want)


def test_zero_js_row_gets_weight_one():
    # a low-temperature row (J = 0 everywhere): omega = ln(1 + 1e-8 / 1e-8) = ln 2 for every token -> w = 1
    w = tgrl_token_weights(torch.zeros(1, 4), torch.ones(1, 4))
    torch.testing.assert_close(w, torch.ones(1, 4))


# One group of 4 episodes: [low R=0, high R=1, high R=0, high R=1], T = 4 (column 2 masked out).
# GRPO: mean 0.5, sample std 0.577350 -> A = [-0.866024, 0.866024, -0.866024, 0.866024]
R4 = torch.tensor([0.0, 1.0, 0.0, 1.0])
G4 = torch.tensor([0, 0, 0, 0])
HIGH4 = torch.tensor([False, True, True, True])
MASK4 = MASK_ROW.repeat(4, 1)
JS4 = JS_ROW.repeat(4, 1)
A = 0.866024


def test_tgrl_advantages_hand():
    # high rows: A_i * w (no quantile clip: w = [0.603699, 1.364270, -, 1.032031]); low row 0: zeros
    # row 1: 0.866024 * w = [0.522818, 1.181491, 0, 0.893763]
    adv = tgrl_advantages(R4, G4, HIGH4, JS4, MASK4, quantile_clip=False)
    w = torch.tensor([0.603699, 1.364270, 0.0, 1.032031])
    want = torch.stack([torch.zeros(4), A * w, -A * w, A * w])
    torch.testing.assert_close(adv, want, atol=3e-6, rtol=0)
    # clamp at adv_clip: with adv_clip = 0.6 row 1 becomes [0.522818, 0.6, 0, 0.6]
    adv = tgrl_advantages(R4, G4, HIGH4, JS4, MASK4, quantile_clip=False, adv_clip=0.6)
    torch.testing.assert_close(adv[1], torch.tensor([0.522818, 0.6, 0.0, 0.6]), atol=3e-6, rtol=0)
    torch.testing.assert_close(adv[2], torch.tensor([-0.522818, -0.6, 0.0, -0.6]), atol=3e-6, rtol=0)


def test_tgrl_warmup_is_plain_grpo_on_all_rows():
    adv = tgrl_advantages(R4, G4, HIGH4, JS4, MASK4, warmup=True)
    want = torch.tensor([-A, A, -A, A])[:, None] * MASK4
    torch.testing.assert_close(adv, want, atol=2e-6, rtol=0)


def test_tgrl_other_groups_and_masked_tokens_never_matter():
    torch.manual_seed(5)
    r = torch.tensor([0.0, 1, 0, 1, 1, 1, 0, 0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    high = torch.tensor([False, True, True, True] * 2)
    js = torch.rand(8, 6) * 0.6
    mask = (torch.rand(8, 6) > 0.3).float()
    base = tgrl_advantages(r, g, high, js, mask)
    r2 = r.clone()
    r2[4:] = torch.tensor([3.0, -1.0, 2.0, 0.5])
    js2 = js.clone()
    js2[4:] = torch.rand(4, 6)
    torch.testing.assert_close(tgrl_advantages(r2, g, high, js2, mask)[:4], base[:4])
    torch.testing.assert_close(tgrl_advantages(r, g, high, js.masked_fill(mask == 0, 9.0), mask), base)
    assert (base[~high] == 0).all() and (base[mask == 0] == 0).all()


def test_tgrl_safety_all_equal_single_row_empty_mask():
    js = torch.rand(5, 4)
    adv = tgrl_advantages(torch.ones(5), torch.tensor([0, 0, 0, 0, 1]), torch.ones(5, dtype=torch.bool), js,
                          torch.ones(5, 4))
    assert (adv == 0).all()
    adv = tgrl_advantages(torch.tensor([0.0, 1, 1, 0, 1]), torch.tensor([0, 0, 0, 0, 1]),
                          torch.ones(5, dtype=torch.bool), js, torch.zeros(5, 4))
    assert (adv == 0).all() and torch.isfinite(adv).all()


def test_tgrl_episode_index_per_turn_mode():
    # group of 2 episodes: high episode (2 turns, R 1) and low episode (1 turn, R 0). Per episode: [1, 0]
    # -> A = +-0.707106; the high episode's 2 rows get 0.707106 * w (w = 1 with identical J per token)
    r = torch.tensor([1.0, 1.0, 0.0])
    adv = tgrl_advantages(r, torch.zeros(3, dtype=torch.long), torch.tensor([True, True, False]),
                          torch.full((3, 2), 0.1), torch.ones(3, 2), episode_index=torch.tensor([0, 0, 1]))
    torch.testing.assert_close(adv, torch.tensor([[0.707106] * 2, [0.707106] * 2, [0.0, 0.0]]), atol=2e-6, rtol=0)


def test_delta_r_hand():
    # group 0: low [0], high [1, 0, 1] -> 2/3 - 0 = 0.666667
    # group 1: low [1], high [1, 1, 0] -> 2/3 - 1 = -0.333333
    # group 2: high only -> excluded. delta_R = (0.666667 - 0.333333) / 2 = 0.166667
    r = torch.tensor([0.0, 1, 0, 1, 1, 1, 1, 0, 1, 1])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    high = torch.tensor([False, True, True, True, False, True, True, True, True, True])
    assert tgrl_delta_r(r, g, high) == pytest.approx(1 / 6)
    assert tgrl_delta_r(r[8:], g[8:], high[8:]) == 0.0  # no group with both kinds (warm-up)
    m = tgrl_metrics(r, g, high)
    # success = R > 0: high episodes 6 of 8 -> 0.75; low 1 of 2 -> 0.5
    assert m == pytest.approx({"tgrl/delta_R": 1 / 6, "tgrl/delta_R_groups": 2.0, "tgrl/success_high": 0.75,
                               "tgrl/success_low": 0.5})  # both groups with T0 and T1 vary: informative
    # one temperature (GRPO, TAMPO, a schedule): no row is high, nothing TGRL-specific to report
    assert tgrl_metrics(r, g, torch.zeros_like(high)) == {}
    # warm-up: every row high -> kept (success_high = 7 of 10, no T0 episode -> 0.0, no informative group)
    assert tgrl_metrics(r, g, torch.ones_like(high)) == pytest.approx(
        {"tgrl/delta_R": 0.0, "tgrl/delta_R_groups": 0.0, "tgrl/success_high": 0.7, "tgrl/success_low": 0.0})


def test_delta_r_per_episode():
    # per-turn rows: the high episode has 3 rows; per episode it counts once: high [1], low [0] -> delta 1
    r = torch.tensor([1.0, 1.0, 1.0, 0.0])
    high = torch.tensor([True, True, True, False])
    ep = torch.tensor([0, 0, 0, 1])
    assert tgrl_delta_r(r, torch.zeros(4, dtype=torch.long), high, episode_index=ep) == pytest.approx(1.0)
    m = tgrl_metrics(r, torch.zeros(4, dtype=torch.long), high, success=torch.tensor([1, 1, 1, 0]), episode_index=ep)
    assert m["tgrl/success_high"] == 1.0 and m["tgrl/success_low"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Schedules (algorithms.md section 4). N = 100 -> s_min = 0, s_max = 80; tau = step / 80.
# ---------------------------------------------------------------------------------------------------------------
def _sig(x):
    return 1 / (1 + math.exp(-x))


def test_schedules_hand():
    # step 40: tau = 0.5. linear 0.99 * 0.5 = 0.495. sigmoid: 0.99 (sig(0) - sig(-4)) / (sig(4) - sig(-4))
    #   = 0.99 * (0.5 - 0.017986) / (0.982014 - 0.017986) = 0.495 (symmetric). power: 0.495^2 = 0.245025
    assert schedule_value("linear", 40, 100) == pytest.approx(0.495)
    assert schedule_value("sigmoid", 40, 100) == pytest.approx(0.495)
    assert schedule_value("power", 40, 100) == pytest.approx(0.245025)
    # step 20: tau = 0.25. sigmoid: 0.99 (sig(2) - sig(-4)) / (sig(4) - sig(-4)) = 0.99 * 0.862811 / 0.964028
    #   = 0.886056; linear 0.7425
    assert schedule_value("sigmoid", 20, 100) == pytest.approx(0.886056, abs=1e-6)
    assert schedule_value("linear", 20, 100) == pytest.approx(0.7425)
    # step 1 (1-based): tau = 1/80 -> linear 0.99 * 79/80 = 0.977625
    assert schedule_value("linear", 1, 100) == pytest.approx(0.977625)
    assert schedule_value("constant", 50, 100) == 1.0 and schedule_value("none", 1, 100) == 0.0


@pytest.mark.parametrize("kind", ["linear", "sigmoid", "power"])
def test_schedules_reach_zero_at_s_max_and_stay(kind):
    vals = [schedule_value(kind, s, 100) for s in range(1, 101)]
    assert all(vals[i] >= vals[i + 1] for i in range(99))  # non-increasing
    assert all(v == 0.0 for v in vals[79:])  # step 80 .. 100
    assert vals[78] > 0
    # s_min_ratio shifts the start: before s_min, S = m (tau clipped to 0)
    assert schedule_value(kind, 5, 100, s_min_ratio=0.1, s_max_ratio=0.5) == pytest.approx(
        {"linear": 0.99, "sigmoid": 0.99, "power": 0.99**2}[kind]
    )


def test_schedule_errors_and_tiny_runs():
    with pytest.raises(ValueError, match="linear"):
        schedule_value("cosine", 1, 10)
    with pytest.raises(ValueError):
        schedule_value("linear", 1, 0)
    # N = 1: s_max = floor(0.8) = 0 <= s_min -> tau = 1 at step 1
    assert schedule_value("linear", 1, 1) == 0.0
