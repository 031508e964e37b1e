"""Policy losses, aggregation and KL penalty (algorithms.md section 2)."""

import math

import pytest
import torch

from agent_rl.algos import agg_loss, kl_penalty, policy_loss


def _ppo_case():
    # one row, T = 4, ratios r = [1.5, 0.5, 1.1, 5], A = [1, 1, -1, -1], eps 0.2/0.2, dual clip c = 3
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 5.0]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    return logp, old, adv, mask


def test_ppo_clip_hand():
    # token 0: r 1.5, A 1: max(-1.5, -1.2) = -1.2 (clipped: the clipped term is the larger)
    # token 1: r 0.5, A 1: max(-0.5, -0.8) = -0.5
    # token 2: r 1.1, A -1: max(1.1, 1.1) = 1.1; dual: min(1.1, 3) = 1.1
    # token 3: r 5, A -1: max(5, 1.2) = 5; dual: min(5, 3) = 3 (dual clip binds)
    # token_mean = (-1.2 - 0.5 + 1.1 + 3) / 4 = 0.6; clipfrac = 1/4; pg_clipfrac_lower = 1/4
    # approx_kl = mean (r - 1 - ln r) = (0.094535 + 0.193147 + 0.004690 + 2.390562) / 4 = 0.670733
    logp, old, adv, mask = _ppo_case()
    loss, met = policy_loss("ppo_clip", logp, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor(0.6))
    assert float(met["actor/clipfrac"]) == pytest.approx(0.25)
    assert float(met["actor/pg_clipfrac_lower"]) == pytest.approx(0.25)
    assert float(met["actor/approx_kl"]) == pytest.approx(0.670733, abs=1e-5)
    assert float(met["actor/pg_loss"]) == pytest.approx(0.6)
    assert all(v.dim() == 0 and not v.requires_grad for v in met.values())
    # gradient d loss / d logp_t = -A r / 4 where unclipped, 0 where clipped: [0, -0.125, 0.275, 0]
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.125, 0.275, 0.0]]))


def test_ppo_clip_without_dual_clip_and_asymmetric():
    logp, old, adv, mask = _ppo_case()
    # no dual clip: token 3 stays 5 -> (-1.2 - 0.5 + 1.1 + 5) / 4 = 1.1
    loss, _ = policy_loss("ppo_clip", logp, old, adv, mask, dual_clip=None)
    torch.testing.assert_close(loss, torch.tensor(1.1))
    # DAPO clip-higher 0.2 / 0.28 with (B,) advantages A = 1: r 1.5 -> -1.28, r 0.5 -> -0.5, 1.1 -> -1.1, 5 -> -1.28
    loss, _ = policy_loss("ppo_clip", logp, old, torch.tensor([1.0]), mask, clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor((-1.28 - 0.5 - 1.1 - 1.28) / 4))


def test_aggregations_hand():
    lm = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # row 2 has no tokens
    # token_mean: (1 + 2 + 3 + 4) / 4 = 2.5
    torch.testing.assert_close(agg_loss(lm, mask, "token_mean"), torch.tensor(2.5))
    # seq_mean_token_mean: rows with tokens: mean(2, 4) = 3
    torch.testing.assert_close(agg_loss(lm, mask, "seq_mean_token_mean"), torch.tensor(3.0))
    # seq_mean_token_sum_norm, L_max = 5: (6/5 + 4/5 + 0) / 3 rows = 2/3
    torch.testing.assert_close(agg_loss(lm, mask, "seq_mean_token_sum_norm", max_len=5), torch.tensor(2 / 3))
    # a mini-batch-wide denominator (micro-batching): 10 / 8 tokens
    torch.testing.assert_close(agg_loss(lm, mask, "token_mean", denominator=8.0), torch.tensor(1.25))
    with pytest.raises(ValueError, match="token_mean"):
        agg_loss(lm, mask, "token_sum")


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
def test_masked_tokens_never_change_the_loss(name, agg):
    torch.manual_seed(3)
    logp, old = torch.randn(3, 6) * 0.1, torch.randn(3, 6) * 0.1
    adv = torch.randn(3, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1.0]])
    loss, met = policy_loss(name, logp, old, adv, mask, loss_agg=agg, max_len=6)
    off = mask == 0
    loss2, met2 = policy_loss(
        name, logp.masked_fill(off, 50.0), old.masked_fill(off, -50.0), adv.masked_fill(off, 1e9), mask,
        loss_agg=agg, max_len=6,
    )
    torch.testing.assert_close(loss2, loss)
    for k in met:
        torch.testing.assert_close(met2[k], met[k])


def test_gspo_hand():
    # row 0: log ratios [0.1, 0.2, 0.3] -> mean 0.2, s = e^0.2 = 1.221403, A = 1 -> clipped at 1.2 -> -1.2 per token
    # row 1: log ratios [-0.5, -0.1, (masked)] -> mean -0.3, s = 0.740818, A = -1: max(0.740818, 0.8) = 0.8
    # seq_mean_token_mean: (-1.2 + 0.8) / 2 = -0.2; every token belongs to a clipped sequence -> clipfrac 1
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.2, 0.3], [-0.5, -0.1, 7.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    loss, met = policy_loss("gspo", logp, old, torch.tensor([1.0, -1.0]), mask, loss_agg="seq_mean_token_mean")
    torch.testing.assert_close(loss, torch.tensor(-0.2))
    assert float(met["actor/clipfrac"]) == pytest.approx(1.0)


def test_gspo_gradient_is_sequence_level():
    # unclipped row, A = 1, log ratios [0.01, 0.02, 0.03]: s = e^0.02; loss (seq_mean_token_mean, B = 1) = -s, and
    # d loss / d logp_t = -s / 3 for every token (the sequence ratio's gradient, spread evenly)
    logp = torch.tensor([[0.01, 0.02, 0.03]], requires_grad=True)
    loss, _ = policy_loss("gspo", logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3),
                          loss_agg="seq_mean_token_mean")
    s = math.exp(0.02)
    assert loss.item() == pytest.approx(-s, rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -s / 3))


def test_policy_loss_safety_empty_mask_and_extreme_ratios():
    logp = torch.tensor([[100.0, -100.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-100.0, 100.0, 0.0]])
    for name in ("ppo_clip", "gspo"):
        for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
            loss, met = policy_loss(name, logp, old, torch.tensor([2.0]), torch.zeros(1, 3), loss_agg=agg)
            assert loss.item() == 0.0 and all(torch.isfinite(v) for v in met.values())
            loss, met = policy_loss(name, logp, old, torch.tensor([-2.0]), torch.ones(1, 3), loss_agg=agg)
            assert torch.isfinite(loss) and all(torch.isfinite(v) for v in met.values())
            loss.backward()
            assert torch.isfinite(logp.grad).all()
    with pytest.raises(ValueError, match="ppo_clip"):
        policy_loss("ppo", logp, old, torch.tensor([1.0]), torch.ones(1, 3))


def test_kl_penalty_hand():
    # logp = 0, ref = ln 2: k1 = -ln 2 = -0.693147; k2 = 0.5 ln^2 2 = 0.240227; k3 = 2 - ln 2 - 1 = 0.306853
    logp, ref = torch.zeros(1, 1), torch.full((1, 1), math.log(2.0))
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([[-0.693147]]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[0.240227]]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([[0.306853]]))
    assert torch.isfinite(kl_penalty(torch.tensor([[-1e4]]), torch.tensor([[1e4]]))).all()
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k4")
