"""The learner side of asynchronous rollouts (algorithms.md section 7): behaviour weights in the loss (``tis`` /
``mask`` / ``none``, ``auto`` by ``max_staleness``), only on the policy-gradient term, -inf old log-probs without NaN,
and the ``async/*`` metrics of a hand-made batch with hand-made versions."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from agent_rl import algos
from agent_rl.learner import Learner
from agent_rl.learner.config import AlgoConfig, OptimConfig

from learner_helpers import sample_batch

ASYNC_KEYS = ("async/staleness_mean", "async/staleness_max", "async/behaviour_weight_mean",
              "async/behaviour_weight_capped_frac", "async/behaviour_weight_zero_frac")


def _algo(**kw) -> AlgoConfig:
    return AlgoConfig(name="grpo", **kw)


def _optim() -> OptimConfig:
    return OptimConfig(lr=1e-3, max_grad_norm=0.0)  # no clip: the gradients left after update are the raw ones


@pytest.fixture()
def batch(tiny_base):
    model, tok = tiny_base
    b, _ = sample_batch(copy.deepcopy(model), tok, groups=2, max_new_tokens=4, seed=3)
    return b


def _grads(learner: Learner) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in learner.params]


def test_async_metrics_of_a_hand_made_batch(tiny, batch):
    model, tok = tiny
    learner = Learner(model, tok, _algo(), _optim(), max_staleness=2)
    assert learner.behaviour_correction == "tis"  # auto with k = 2
    old = learner.evaluate(batch).logprobs  # the update's no-grad pass sees the same weights
    rm = batch.response_mask > 0
    cols = torch.arange(rm.shape[1])[None, :].expand_as(rm)
    # behaviour log-probs: old - 0.3 on even columns (rho = e^0.3 = 1.35), old - 1.0 on odd ones (e = 2.72 > C = 2)
    offset = torch.where(cols % 2 == 0, 0.3, 1.0)
    engine = torch.where(rm, old - offset, 0.0)
    step = 7
    rows = torch.arange(rm.shape[0])[:, None].expand_as(rm)
    versions = torch.where(rm, (step - 1) - rows % 3, -1)  # row r sampled by version step - 1 - (r % 3)
    b = dataclasses.replace(batch, engine_logprobs=engine, policy_versions=versions)
    m = learner.update(b, step=step, total_steps=10)
    # by hand over the trained tokens (GRPO, uniform credit: the loss mask is the response mask)
    stale, weights, capped = [], [], 0
    for r, c in rm.nonzero().tolist():
        stale.append(r % 3)
        if c % 2 == 0:
            weights.append(math.exp(0.3))
        else:
            weights.append(2.0)
            capped += 1
    n = len(stale)
    assert m["async/staleness_mean"] == pytest.approx(sum(stale) / n)
    assert m["async/staleness_max"] == 2.0
    assert m["async/behaviour_weight_mean"] == pytest.approx(sum(weights) / n, abs=1e-5)
    assert m["async/behaviour_weight_capped_frac"] == pytest.approx(capped / n)
    assert m["async/behaviour_weight_zero_frac"] == 0.0
    # the same batch under mask: capped tokens get weight 0
    learner_m = Learner(copy.deepcopy(tiny[0]), tok, _algo(behaviour_correction="mask"), _optim(), max_staleness=2)
    mm = learner_m.update(b, step=step, total_steps=10)
    assert mm["async/behaviour_weight_mean"] == pytest.approx((n - capped) / n)
    assert mm["async/behaviour_weight_zero_frac"] == pytest.approx(capped / n)


def test_synchronous_run_emits_the_async_metrics_as_zero(tiny, batch):
    model, tok = tiny
    learner = Learner(model, tok, _algo(), _optim())  # k = 0: auto -> none
    assert learner.behaviour_correction == "none"
    step = 3
    rm = batch.response_mask > 0
    b = dataclasses.replace(batch, policy_versions=torch.where(rm, step - 1, -1))
    m = learner.update(b, step=step, total_steps=5)
    assert m["async/staleness_mean"] == 0.0 and m["async/staleness_max"] == 0.0
    assert m["async/behaviour_weight_mean"] == 1.0
    assert m["async/behaviour_weight_capped_frac"] == 0.0 and m["async/behaviour_weight_zero_frac"] == 0.0
    # a batch without versions (hand-made, no policy_versions) counts as staleness 0 too
    m2 = Learner(copy.deepcopy(tiny[0]), tok, _algo(), _optim()).update(batch, step=step, total_steps=5)
    assert all(k in m2 for k in ASYNC_KEYS) and m2["async/staleness_max"] == 0.0


def _plain_policy_loss(name, logprobs, old_logprobs, advantages, response_mask, clip_low=0.2, clip_high=0.2,
                       dual_clip=3.0, loss_agg="token_mean", max_len=None, denominator=None, **_behaviour):
    """The policy loss as it was before behaviour weights: the registered loss, then the aggregation."""
    fn = algos.get_policy_loss(name)
    adv = advantages[:, None].expand_as(logprobs) if advantages.dim() == 1 else advantages
    pg, metrics = fn(logprobs, old_logprobs, adv, response_mask, clip_low=clip_low, clip_high=clip_high,
                     dual_clip=dual_clip)
    loss = algos.agg_loss(pg, response_mask, loss_agg, max_len=max_len, denominator=denominator)
    return loss, {"actor/pg_loss": loss.detach(), **metrics}


def _plain_kl(logprobs, ref_logprobs, kind="k3"):
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


@pytest.mark.parametrize("policy_loss", ["ppo_clip", "gspo"])
def test_auto_at_k0_is_bit_identical_to_the_unweighted_loss(tiny, batch, monkeypatch, policy_loss):
    # two optimiser steps (the second with ratio != 1), KL and entropy terms on: the k = 0 learner's weights after
    # the update equal, bit for bit, those of a learner running the formulas without behaviour weights
    model, tok = tiny
    kw = dict(policy_loss=policy_loss, num_mini_batches=2, kl_coef=0.1, ent_coef=0.01, micro_batch_size=3)
    ref_model = copy.deepcopy(model)
    learner = Learner(model, tok, _algo(**kw), _optim(), max_staleness=0)
    m = learner.update(batch, step=1, total_steps=3)
    with monkeypatch.context() as mp:
        mp.setattr(algos, "policy_loss", _plain_policy_loss)
        mp.setattr(algos, "kl_penalty", _plain_kl)
        plain = Learner(ref_model, tok, _algo(**kw), _optim())
        m_plain = plain.update(batch, step=1, total_steps=3)
    for p, q in zip(learner.model.parameters(), plain.model.parameters()):
        assert torch.equal(p, q)
    assert m["actor/pg_loss"] == m_plain["actor/pg_loss"]
    assert m["actor/grad_norm"] == m_plain["actor/grad_norm"]


def test_tis_weight_multiplies_only_the_policy_gradient_term(tiny, batch):
    # rho = 2 on every token (cap 4): the pg gradient doubles, the KL and entropy gradients do not:
    # grad(tis) = grad(none, pg + kl + ent) + grad(pg alone)
    model, tok = tiny
    extra = dict(kl_coef=0.2, ent_coef=0.05)
    base = copy.deepcopy(model)
    none = Learner(copy.deepcopy(base), tok, _algo(**extra), _optim())
    old = none.evaluate(batch).logprobs
    b2 = dataclasses.replace(batch, engine_logprobs=torch.where(batch.response_mask > 0, old - math.log(2.0), 0.0))
    none.update(b2, step=1, total_steps=2)
    tis = Learner(copy.deepcopy(base), tok, _algo(behaviour_correction="tis", behaviour_weight_cap=4.0, **extra),
                  _optim())
    mt = tis.update(b2, step=1, total_steps=2)
    pg_only = Learner(copy.deepcopy(base), tok, _algo(), _optim())
    pg_only.update(b2, step=1, total_steps=2)
    assert mt["async/behaviour_weight_mean"] == pytest.approx(2.0, rel=1e-5)
    g_none, g_tis, g_pg = _grads(none), _grads(tis), _grads(pg_only)
    assert any(float(g.abs().max()) > 0 for g in g_pg)
    for a, b, c in zip(g_none, g_tis, g_pg):
        assert torch.allclose(b, a + c, rtol=1e-4, atol=1e-7)


def test_minus_inf_old_logprobs_under_top_k_give_no_nan(tiny, batch):
    # top_k = the median rank of the sampled tokens in the learner: the sampled tokens ranked below it have old
    # log-prob -inf (the engine sampled without truncation); they get w = 0, and the loss, gradients and weights
    # stay finite
    model, tok = tiny
    rm = batch.response_mask > 0
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, L, V)
    ranks = [int((logits[r, c - 1] > logits[r, c - 1, batch.input_ids[r, c]]).sum()) + 1
             for r, c in rm.nonzero().tolist()]
    top_k = sorted(ranks)[len(ranks) // 2]
    learner = Learner(model, tok, _algo(kl_coef=0.1, ent_coef=0.01, num_mini_batches=2), _optim(), top_k=top_k,
                      max_staleness=1)
    old = learner.evaluate(batch).logprobs
    n_inf = int((torch.isneginf(old) & rm).sum())
    assert 0 < n_inf < int(rm.sum())
    m = learner.update(batch, step=2, total_steps=3)
    assert all(math.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not math.isfinite(v)}
    assert m["async/behaviour_weight_zero_frac"] == pytest.approx(n_inf / int(rm.sum()))
    assert all(bool(torch.isfinite(p).all()) for p in learner.model.parameters())
    assert any(float(g.abs().max()) > 0 for g in _grads(learner))


def test_ray_merge_takes_the_max_staleness_and_trained_token_means(batch):
    pytest.importorskip("ray")
    from agent_rl.distributed.backend import merge_learner_metrics

    # rank 0: 30 response tokens, 20 trained; rank 1: 10 response tokens, all 10 trained
    ranks = [{"batch/response_tokens": 30.0, "credit/trained_token_frac": 2 / 3, "async/staleness_max": 2.0,
              "async/staleness_mean": 1.0, "async/behaviour_weight_mean": 1.2,
              "async/behaviour_weight_capped_frac": 0.1, "async/behaviour_weight_zero_frac": 0.0,
              "perf/max_rss_gb": 3.0},
             {"batch/response_tokens": 10.0, "credit/trained_token_frac": 1.0, "async/staleness_max": 1.0,
              "async/staleness_mean": 0.5, "async/behaviour_weight_mean": 0.9,
              "async/behaviour_weight_capped_frac": 0.4, "async/behaviour_weight_zero_frac": 0.3,
              "perf/max_rss_gb": 5.0}]
    out = merge_learner_metrics(ranks, batch)
    assert out["async/staleness_max"] == 2.0
    assert out["perf/max_rss_gb"] == 5.0  # memory: the largest rank's
    assert out["async/staleness_mean"] == pytest.approx((20 * 1.0 + 10 * 0.5) / 30)
    assert out["async/behaviour_weight_mean"] == pytest.approx((20 * 1.2 + 10 * 0.9) / 30)
    assert out["async/behaviour_weight_capped_frac"] == pytest.approx((20 * 0.1 + 10 * 0.4) / 30)
    assert out["async/behaviour_weight_zero_frac"] == pytest.approx(10 * 0.3 / 30)


def test_config_refuses_a_bad_cap_or_correction_at_load():
    from agent_rl.config.compose import load_config
    from agent_rl.config.schema import ConfigError

    cheap = ["env=choose_item", "model=tiny", "env_server.mode=local"]
    with pytest.raises(ConfigError, match=r"algo.behaviour_weight_cap=0.5 must be > 1"):
        load_config([*cheap, "algo.behaviour_weight_cap=0.5"])
    with pytest.raises(ConfigError, match=r"algo.behaviour_correction='is' is not valid; valid values: auto, tis, "
                                          r"mask, none"):
        load_config([*cheap, "algo.behaviour_correction=is"])
    cfg = load_config([*cheap, "algo.behaviour_correction=mask", "algo.behaviour_weight_cap=3"])
    assert (cfg.algo.behaviour_correction, cfg.algo.behaviour_weight_cap) == ("mask", 3.0)
