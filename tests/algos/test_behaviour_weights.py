"""Behaviour weights of the off-policy correction (algorithms.md section 7, "Off-policy correction"):
w = min(exp(old_logp - logp_beh), C) per token (GSPO: per sequence), ``tis`` / ``mask`` / ``none``, applied by
``policy_loss`` to the policy-gradient term of every registered loss; -inf old log-probs give w = 0 without NaN.

Expected values are computed here by hand (python ``math`` on the listed numbers), never with the package's helpers.
"""

from __future__ import annotations

import math

import pytest
import torch

from agent_rl import algos
from agent_rl.algos import agg_loss, behaviour_weights, kl_penalty, policy_loss
from agent_rl.learner.config import AlgoConfig, resolve_behaviour_correction

NEG_INF = float("-inf")

# one row, 4 columns: three trained tokens and one padding column (mask 0)
OLD = [[-1.0, -0.5, -2.0, 0.0]]
BEH = [[-1.2, -1.5, -2.0, 0.0]]  # old - beh = 0.2, 1.0, 0.0 -> rho = 1.2214, 2.7183 (> C = 2), 1.0
MASK = [[1.0, 1.0, 1.0, 0.0]]


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_tis_weights_are_min_rho_cap_by_hand():
    w, m = behaviour_weights(_t(OLD), _t(BEH), _t(MASK), "tis", cap=2.0)
    expected = [math.exp(0.2), 2.0, 1.0, 0.0]
    assert torch.allclose(w, _t([expected]), atol=1e-6)
    assert float(m["async/behaviour_weight_mean"]) == pytest.approx((math.exp(0.2) + 2.0 + 1.0) / 3, abs=1e-6)
    assert float(m["async/behaviour_weight_capped_frac"]) == pytest.approx(1 / 3)
    assert float(m["async/behaviour_weight_zero_frac"]) == 0.0


def test_mask_weights_drop_tokens_above_the_cap():
    w, m = behaviour_weights(_t(OLD), _t(BEH), _t(MASK), "mask", cap=2.0)
    assert w.tolist() == [[1.0, 0.0, 1.0, 0.0]]
    assert float(m["async/behaviour_weight_mean"]) == pytest.approx(2 / 3)
    assert float(m["async/behaviour_weight_capped_frac"]) == pytest.approx(1 / 3)
    assert float(m["async/behaviour_weight_zero_frac"]) == pytest.approx(1 / 3)
    # a larger cap keeps the token whose ratio is e = 2.718
    w3, _ = behaviour_weights(_t(OLD), _t(BEH), _t(MASK), "mask", cap=3.0)
    assert w3.tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_none_weights_are_one_and_nothing_is_capped():
    w, m = behaviour_weights(_t(OLD), _t(BEH), _t(MASK), "none", cap=2.0)
    assert w.tolist() == [[1.0, 1.0, 1.0, 0.0]]
    assert float(m["async/behaviour_weight_capped_frac"]) == 0.0
    assert float(m["async/behaviour_weight_mean"]) == 1.0


@pytest.mark.parametrize("correction", ["tis", "mask", "none"])
def test_minus_inf_old_logprob_gives_weight_zero_without_nan(correction):
    old = _t([[NEG_INF, -0.5, -1.0]])
    beh = _t([[-3.0, -0.5, NEG_INF]])  # the last: logp_beh = -inf -> rho = inf, capped (tis: C, mask: 0)
    w, m = behaviour_weights(old, beh, torch.ones(1, 3), correction, cap=2.0)
    assert torch.isfinite(w).all()
    last = {"tis": 2.0, "mask": 0.0, "none": 1.0}[correction]
    assert w.tolist() == [[0.0, 1.0, last]]
    zero = {"tis": 1 / 3, "mask": 2 / 3, "none": 1 / 3}[correction]
    assert float(m["async/behaviour_weight_zero_frac"]) == pytest.approx(zero)


def test_gspo_sequence_weight_by_hand():
    # row 0: valid tokens 0, 1 (token 2 has old -inf): mean(0.5, -0.1) = 0.2 -> w_seq = e^0.2 on both, 0 on token 2
    # row 1: mean(1.0, 0.5) = 0.75 -> e^0.75 = 2.117 > C = 2 -> tis: 2, mask: 0
    old = _t([[-1.0, -2.0, NEG_INF], [-1.0, -1.0, 0.0]])
    beh = _t([[-1.5, -1.9, -3.0], [-2.0, -1.5, 0.0]])
    mask = _t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, m = behaviour_weights(old, beh, mask, "tis", cap=2.0, sequence_level=True)
    e02 = math.exp(0.2)
    assert torch.allclose(w, _t([[e02, e02, 0.0], [2.0, 2.0, 0.0]]), atol=1e-6)
    assert float(m["async/behaviour_weight_capped_frac"]) == pytest.approx(2 / 5)
    assert float(m["async/behaviour_weight_zero_frac"]) == pytest.approx(1 / 5)
    wm, _ = behaviour_weights(old, beh, mask, "mask", cap=2.0, sequence_level=True)
    assert wm.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown behaviour correction 'auto'"):  # auto is resolved before
        behaviour_weights(_t(OLD), _t(BEH), _t(MASK), "auto")
    with pytest.raises(ValueError, match="must be > 1"):
        behaviour_weights(_t(OLD), _t(BEH), _t(MASK), "tis", cap=1.0)


# ------------------------------------------------------------------------------------------- in the policy loss
ADV = [[1.5, -0.5, 2.0, 0.0]]
DELTA = [[0.05, -0.1, 0.12, 0.0]]  # logp - old: ratios inside the clip range [0.8, 1.2]


def _loss_and_grads(correction, loss_name="ppo_clip", cap=2.0, loss_agg="token_mean"):
    logp = (_t(OLD) + _t(DELTA)).requires_grad_(True)
    old = _t(OLD).requires_grad_(True)  # the loss may differentiate the ratio w.r.t. old, never through w
    beh = _t(BEH).requires_grad_(True)
    loss, m = policy_loss(loss_name, logp, old, _t(ADV), _t(MASK), loss_agg=loss_agg, behaviour_logprobs=beh,
                          behaviour_correction=correction, behaviour_weight_cap=cap)
    loss.backward()
    return loss, m, logp.grad, old.grad, beh.grad


@pytest.mark.parametrize("correction", ["tis", "mask", "none"])
def test_ppo_clip_loss_and_gradients_with_weights_by_hand(correction):
    loss, m, g_logp, g_old, g_beh = _loss_and_grads(correction)
    w = {"tis": [math.exp(0.2), 2.0, 1.0], "mask": [1.0, 0.0, 1.0], "none": [1.0, 1.0, 1.0]}[correction]
    adv, delta = ADV[0][:3], DELTA[0][:3]
    r = [math.exp(d) for d in delta]
    # inside the clip range: l_t = -A_t r_t w_t, token mean over the 3 trained tokens; d l_t / d logp_t = -A_t r_t w_t
    assert float(loss.detach()) == pytest.approx(sum(-a * rt * wt for a, rt, wt in zip(adv, r, w)) / 3, abs=1e-6)
    expected = [-a * rt * wt / 3 for a, rt, wt in zip(adv, r, w)] + [0.0]
    assert torch.allclose(g_logp, _t([expected]), atol=1e-6)
    # no gradient through w: old only gets the ratio's -d/dlogp, the behaviour log-probs none at all
    assert torch.allclose(g_old, -g_logp, atol=1e-7)
    assert g_beh is None
    assert float(m["async/behaviour_weight_mean"]) == pytest.approx(sum(w) / 3, abs=1e-6)


def test_gspo_loss_uses_the_sequence_weight():
    # seq_mean_token_mean over one row of 3 tokens; s = exp(mean(delta)) inside the clip range, w_seq = exp(mean
    # (old - beh)) = exp((0.2 + 1.0 + 0.0) / 3) = exp(0.4) = 1.4918 < C = 2
    loss, m, g_logp, _, g_beh = _loss_and_grads("tis", loss_name="gspo", loss_agg="seq_mean_token_mean")
    adv, delta = ADV[0][:3], DELTA[0][:3]
    s = math.exp(sum(delta) / 3)
    w = math.exp(0.4)
    assert float(loss.detach()) == pytest.approx(sum(-a * s * w for a in adv) / 3, abs=1e-6)
    # token form: d l_t / d logp_t = -A_t s w (value s_t = s, gradient of exp(logp_t - sg logp_t) is s), / 3 tokens
    assert torch.allclose(g_logp, _t([[-a * s * w / 3 for a in adv] + [0.0]]), atol=1e-6)
    assert g_beh is None
    assert float(m["async/behaviour_weight_mean"]) == pytest.approx(w, abs=1e-6)


def _plain(name, logp, old, adv, mask, loss_agg):
    """Today's formula: the registered loss, then the aggregation, no weights."""
    fn = algos.get_policy_loss(name)
    pg, _ = fn(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    return agg_loss(pg, mask, loss_agg)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("with_beh", [True, False])
def test_none_is_bit_identical_to_the_unweighted_formula(name, loss_agg, with_beh):
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 7, generator=g) * 3
    logp0 = old + 0.4 * torch.randn(4, 7, generator=g)  # some ratios outside the clip range
    adv = torch.randn(4, 7, generator=g)
    mask = (torch.rand(4, 7, generator=g) > 0.3).float()
    beh = old + 0.5 * torch.randn(4, 7, generator=g)
    ref_lp = logp0.clone().requires_grad_(True)
    ref = _plain(name, ref_lp, old, adv, mask, loss_agg)
    ref.backward()
    lp = logp0.clone().requires_grad_(True)
    loss, _ = policy_loss(name, lp, old, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg=loss_agg,
                          behaviour_logprobs=beh if with_beh else None, behaviour_correction="none")
    loss.backward()
    assert torch.equal(loss.detach(), ref.detach())
    assert torch.equal(lp.grad, ref_lp.grad)
    # auto resolves to none at k = 0 (the learner passes the resolved name)
    assert resolve_behaviour_correction(AlgoConfig(name="grpo"), 0) == "none"


def test_minus_inf_old_logprobs_from_the_truncation_give_no_nan():
    # real truncated logits: top_k = 1 keeps only the argmax, so the sampled token 0 of row 1 is outside it
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 5, generator=g)
    z[0, 0] = 5.0  # row 0: token 0 is the argmax (kept); row 1: token 0 is not
    z[1, 0], z[1, 3] = -1.0, 4.0
    tokens = torch.tensor([0, 0])
    temps = torch.tensor([1.0, 0.7])
    with torch.no_grad():
        old = algos.logprobs_from_logits(algos.truncate_logits(z, temps, 1, 1.0), tokens, temps)  # (2,)
    assert old[0] == 0.0 and torch.isneginf(old[1])
    zg = z.clone().requires_grad_(True)
    old2 = old[None, :]  # (B=1, T=2): column 0 from row 0, column 1 (old -inf) from row 1
    adv, mask = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    beh = torch.tensor([[-0.1, -2.0]])
    for correction in ("tis", "mask", "none"):
        for name in ("ppo_clip", "gspo"):
            zg.grad = None
            logp = algos.logprobs_from_logits(algos.truncate_logits(zg, temps, 1, 1.0), tokens, temps)[None, :]
            loss, m = policy_loss(name, logp, old2, adv, mask, behaviour_logprobs=beh,
                                  behaviour_correction=correction)
            loss.backward()
            assert torch.isfinite(loss) and torch.isfinite(zg.grad).all(), (correction, name)
            # the -inf token is out of the loss; the denominator still counts it (2 tokens): ratio 1 on token 0
            w0 = {"tis": math.exp(0.1), "mask": 1.0, "none": 1.0}[correction]
            assert float(loss.detach()) == pytest.approx(-1.0 * w0 / 2, abs=1e-6)
            assert float(m["async/behaviour_weight_zero_frac"]) == 0.5
            assert all(torch.isfinite(v) for v in m.values())


def test_gspo_with_a_new_logprob_that_left_the_truncation_has_no_nan():
    # after an update a token can fall outside top-k: logp -inf, old finite (-inf - -inf would be NaN)
    logp = torch.tensor([[-0.5, NEG_INF, -1.0]], requires_grad=True)
    old = torch.tensor([[-0.6, -1.2, -1.1]])
    loss, _ = policy_loss("gspo", logp, old, torch.ones(1, 3), torch.ones(1, 3), loss_agg="seq_mean_token_mean")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


def test_kl_penalty_of_a_token_both_policies_exclude_is_zero():
    logp = torch.tensor([[NEG_INF, -0.5]], requires_grad=True)
    ref = torch.tensor([[NEG_INF, -0.7]])
    for kind in ("k1", "k2", "k3"):
        logp.grad = None
        kl = kl_penalty(logp, ref, kind)
        kl.sum().backward()
        assert kl[0, 0] == 0.0 and torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()
    # k3 of the finite token by hand: exp(d) - d - 1 with d = ref - logp = -0.2
    assert float(kl_penalty(logp, ref, "k3")[0, 1].detach()) == pytest.approx(math.exp(-0.2) + 0.2 - 1, abs=1e-7)


def test_every_registered_policy_loss_is_weighted_alike():
    # a uniform weight w = 2 (rho = 2 everywhere, C = 4: per token and per sequence alike) doubles the
    # policy-gradient loss and its gradient, for every loss in the registry
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 5, generator=g) * 2
    logp0 = old + 0.05 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = (torch.rand(3, 5, generator=g) > 0.2).float()
    beh = old - math.log(2.0)
    names = algos.POLICY_LOSSES.names()
    assert {"ppo_clip", "gspo"} <= set(names)
    for name in names:
        lp_a = logp0.clone().requires_grad_(True)
        plain, _ = policy_loss(name, lp_a, old, adv, mask, behaviour_logprobs=beh, behaviour_correction="none")
        plain.backward()
        lp_b = logp0.clone().requires_grad_(True)
        weighted, m = policy_loss(name, lp_b, old, adv, mask, behaviour_logprobs=beh, behaviour_correction="tis",
                                  behaviour_weight_cap=4.0)
        weighted.backward()
        assert float(weighted.detach()) == pytest.approx(2 * float(plain.detach()), rel=1e-5, abs=1e-7), name
        assert torch.allclose(lp_b.grad, 2 * lp_a.grad, rtol=1e-5, atol=1e-7), name
        assert float(m["async/behaviour_weight_mean"]) == pytest.approx(2.0, rel=1e-5)


# ------------------------------------------------------------------------------------------- config
def test_config_keys_and_resolution():
    a = AlgoConfig(name="grpo")
    assert (a.behaviour_correction, a.behaviour_weight_cap) == ("auto", 2.0)
    assert resolve_behaviour_correction(a, 0) == "none"
    assert resolve_behaviour_correction(a, 1) == "tis"
    assert resolve_behaviour_correction(a, 3) == "tis"
    for c in ("tis", "mask", "none"):
        assert resolve_behaviour_correction(AlgoConfig(name="grpo", behaviour_correction=c), 0) == c
        assert resolve_behaviour_correction(AlgoConfig(name="grpo", behaviour_correction=c), 2) == c
    # max_staleness itself is validated once, by TrainerConfig (tests/train/test_async.py)
    with pytest.raises(ValueError, match="algo.behaviour_correction='is' is not valid; valid values: auto, tis"):
        AlgoConfig(name="grpo", behaviour_correction="is")
    for bad in (1.0, 0.5, float("nan")):
        with pytest.raises(ValueError, match="behaviour_weight_cap=.* must be > 1"):
            AlgoConfig(name="grpo", behaviour_weight_cap=bad)
