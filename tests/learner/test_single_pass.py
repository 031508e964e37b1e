"""The on-policy single pass (``Learner.single_pass_step``): one forward per row where the separate no-grad pass
changes nothing, the same loss, gradients and metrics as the two-pass path; the two-pass path kept where a rule needs
the old policy apart from the grad pass."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig
from learner_helpers import sample_batch

# metrics that must agree between the paths (time and memory differ by nature)
COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/clipfrac", "actor/approx_kl", "actor/entropy",
            "actor/engine_logprob_diff", "credit/trained_token_frac", "credit/js_mean", "async/behaviour_weight_mean")


def _run(model0, tok, batch, *, single_pass: bool, algo: dict, credit: str = "uniform", max_staleness: int = 0,
         step: int = 1):
    """One update on a copy of ``model0``; returns (learner, metrics, gradients captured at the optimiser step,
    number of separate no-grad passes over the whole batch)."""
    model = copy.deepcopy(model0)
    learner = Learner(model, tok, AlgoConfig(**algo), OptimConfig(lr=1e-4, weight_decay=0.0),
                      credit=CreditConfig(name=credit), single_pass=single_pass, max_staleness=max_staleness)
    grads: list[torch.Tensor] = []

    def record(optimizer, args, kwargs):  # the accumulated gradients, as the optimiser step reads them
        grads.extend(p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in learner.params)

    learner.optimizer.register_step_pre_hook(record)
    full_passes = []
    no_grad_pass = learner._no_grad_pass

    def counting_pass(b, with_js, rows=None, out=None):
        if rows is None:
            full_passes.append(1)
        return no_grad_pass(b, with_js, rows=rows, out=out)

    learner._no_grad_pass = counting_pass
    metrics = learner.update(batch, step=step, total_steps=10)
    return learner, metrics, grads, len(full_passes)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("algo", [
    dict(name="grpo"),
    dict(name="grpo", ent_coef=0.01, micro_batch_size=3),  # entropy bonus with grad, several micro-batches
    dict(name="drgrpo", adv_estimator="drgrpo", loss_agg="seq_mean_token_sum_norm", loss_max_len=8),
    dict(name="tgrl", warmup_steps=5),  # TGRL's warm-up: plain GRPO over all rows, no JS weights
], ids=["grpo", "grpo-ent-micro3", "drgrpo", "tgrl-warmup"])
def test_single_pass_equals_two_pass(tiny_base, algo):
    """On an on-policy step the single pass gives the two-pass path's loss, gradients (to 1e-6), metrics and
    per-token old log-probs / entropy, and runs no separate no-grad pass over the batch."""
    model0, tok = tiny_base
    batch, _ = sample_batch(model0, tok, max_new_tokens=6)
    credit = "js" if algo["name"] == "tgrl" else "uniform"
    one, m1, g1, passes1 = _run(model0, tok, batch, single_pass=True, algo=algo, credit=credit)
    two, m2, g2, passes2 = _run(model0, tok, batch, single_pass=False, algo=algo, credit=credit)
    assert (passes1, passes2) == (0, 1)
    assert m1["actor/single_pass"] == 1.0 and m2["actor/single_pass"] == 0.0
    assert m1["actor/optimizer_steps"] == m2["actor/optimizer_steps"] == 1.0
    assert m1["actor/grad_norm"] > 1e-4  # a learning signal: the comparison is not of zeros
    for key in COMPARED:
        assert m1[key] == pytest.approx(m2[key], abs=1e-6), key
    assert len(g1) == len(g2) > 0
    assert sum(float(g.abs().sum()) for g in g1) > 0
    for a, b_ in zip(g1, g2):
        torch.testing.assert_close(a, b_, atol=1e-6, rtol=0)
    for key in ("old_logprobs", "entropy", "advantages", "loss_mask", "js"):  # entropy ~10 nats: float32's 1e-6
        torch.testing.assert_close(one.last_token_stats[key], two.last_token_stats[key], atol=1e-6, rtol=1e-6)
    for p1, p2 in zip(one.params, two.params):  # the same optimiser step
        torch.testing.assert_close(p1.detach(), p2.detach(), atol=1e-6, rtol=0)


@pytest.mark.timeout(600)
def test_rows_without_gradient_still_get_old_logprobs(tiny_base):
    """All rewards of every group equal: no row is forwarded with grad, and the single pass's no-grad forward of
    those rows still gives every row's old log-probs and entropy (the metrics and the episode store read them)."""
    model0, tok = tiny_base
    batch, _ = sample_batch(model0, tok, max_new_tokens=6)
    batch.rewards = torch.ones_like(batch.rewards)
    batch.episode_rewards = torch.ones_like(batch.episode_rewards)
    one, m1, g1, _ = _run(model0, tok, batch, single_pass=True, algo=dict(name="grpo"))
    two, m2, g2, _ = _run(model0, tok, batch, single_pass=False, algo=dict(name="grpo"))
    assert m1["actor/single_pass"] == 1.0
    assert m1["actor/entropy"] > 0
    for key in COMPARED:
        assert m1[key] == pytest.approx(m2[key], abs=1e-6), key
    rm = batch.response_mask > 0
    assert bool((one.last_token_stats["old_logprobs"][rm] < 0).all())
    torch.testing.assert_close(one.last_token_stats["old_logprobs"], two.last_token_stats["old_logprobs"],
                               atol=1e-6, rtol=0)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", [
    dict(algo=dict(name="grpo", ppo_epochs=2)),
    dict(algo=dict(name="grpo", num_mini_batches=2)),
    dict(algo=dict(name="grpo"), max_staleness=1),
    dict(algo=dict(name="grpo"), versions=0, step=2),  # rows sampled one version back
    dict(algo=dict(name="grpo", kl_coef=0.01)),
    dict(algo=dict(name="ppo", adv_estimator="gae")),
    dict(algo=dict(name="tgrl", warmup_steps=0), credit="js"),  # JS weights read the pass before the loss
    dict(algo=dict(name="grpo"), credit="entropy_adv"),  # the rule reads the old entropy
], ids=["epochs", "mini-batches", "max-staleness", "stale-rows", "kl", "ppo-gae", "tgrl-js", "entropy-credit"])
def test_two_pass_kept_where_a_rule_needs_it(tiny_base, case):
    """Several epochs or mini-batches, staleness, a KL reference, GAE values, JS weights or an entropy-reading credit
    rule: the update runs the separate no-grad pass over the batch, single_pass on or off."""
    model0, tok = tiny_base
    batch, _ = sample_batch(model0, tok, max_new_tokens=4)
    if "versions" in case:
        batch.policy_versions = torch.full_like(batch.input_ids, case["versions"])
    _, m, _, passes = _run(model0, tok, batch, single_pass=True, algo=case["algo"],
                           credit=case.get("credit", "uniform"), max_staleness=case.get("max_staleness", 0),
                           step=case.get("step", 1))
    assert passes == 1
    assert m["actor/single_pass"] == 0.0


def test_advantages_without_the_pass_refuse_what_needs_it(tiny_base):
    """``advantages(batch, None)`` (the single pass's order) raises for a rule that reads the pass."""
    model0, tok = tiny_base
    batch, _ = sample_batch(model0, tok, max_new_tokens=4)
    learner = Learner(copy.deepcopy(model0), tok, AlgoConfig(name="grpo"), OptimConfig(),
                      credit=CreditConfig(name="entropy_adv"))
    with pytest.raises(ValueError, match="entropy"):
        learner.advantages(batch, None, step=1, total_steps=10)
