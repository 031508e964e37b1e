"""``algo.micro_batch_tokens``: micro-batches packed by a token budget (verl's dynamic batch size). The packing rule by
hand, and the accumulated gradient equal to the fixed-row-count path's on the same batch (the loss is unchanged)."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig
from agent_rl.learner.learner import token_budget_micro_batches
from learner_helpers import build_batch, sample_batch


def test_packing_by_hand():
    rows = torch.arange(10, 16)
    lengths = torch.tensor([5, 9, 3, 9, 2, 20])
    got = [t.tolist() for t in token_budget_micro_batches(rows, lengths, 18)]
    # longest first: 20 (> 18, alone) | 9, 9 (2 x 9 = 18) | 5, 3, 2 (3 x 5 = 15)
    assert got == [[15], [11, 13], [10, 12, 14]]
    assert [t.tolist() for t in token_budget_micro_batches(rows, lengths, 1000)] == [[15, 11, 13, 10, 12, 14]]
    assert [t.tolist() for t in token_budget_micro_batches(rows, lengths, 1)] == [[15], [11], [13], [10], [12], [14]]
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_micro_batches(rows, lengths, 0)


def test_packing_invariants():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 60, (200,), generator=g)
    rows = torch.randperm(200, generator=g)
    for budget in (7, 64, 150, 1000):
        mbs = token_budget_micro_batches(rows, lengths, budget)
        flat = torch.cat(mbs)
        assert sorted(flat.tolist()) == sorted(rows.tolist())  # a permutation of the rows
        pos = {int(r): i for i, r in enumerate(rows)}
        for mb in mbs:
            ls = [int(lengths[pos[int(r)]]) for r in mb]
            assert len(mb) == 1 or len(mb) * max(ls) <= budget


def _grads_of_update(model, tok, batch, **algo_kw):
    """The gradient each optimiser step applies (captured before AdamW's step), and the metrics."""
    algo = AlgoConfig(**{"name": "tgrl", "warmup_steps": 0, **algo_kw})
    learner = Learner(copy.deepcopy(model), tok, algo, OptimConfig(lr=1e-3, weight_decay=0.0, max_grad_norm=0.0),
                      credit=CreditConfig(name="js" if algo.is_tgrl else "uniform"))
    grads, sizes = [], []
    step, split = learner.optimizer.step, learner._micro_batches

    def capture(*a, **k):
        grads.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in learner.params])
        return step(*a, **k)

    def record(rows, am):
        out = split(rows, am)
        sizes.append([len(m) for m in out])
        return out

    learner.optimizer.step = capture
    learner._micro_batches = record
    metrics = learner.update(batch, step=1, total_steps=1)
    return grads, metrics, sizes


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("algo_kw", [
    dict(),  # TGRL: JS weights, low rows in the denominator, token_mean
    pytest.param(dict(name="grpo", loss_agg="seq_mean_token_mean", num_mini_batches=2), marks=pytest.mark.slow),
    pytest.param(dict(name="drgrpo", adv_estimator="drgrpo", loss_agg="seq_mean_token_sum_norm", loss_max_len=8, ppo_epochs=2),
                 marks=pytest.mark.slow),
])
def test_gradients_equal_the_fixed_size_path(tiny, algo_kw):
    model, tok = tiny
    _, specs = sample_batch(model, tok, groups=2, max_new_tokens=10, seed=3)
    # rows of very different lengths (a longer prompt changes nothing else: the learner recomputes old log-probs)
    filler = tok.encode(" context", add_special_tokens=False)
    specs = [dict(s, prompt=filler * (7 * (i % 5)) + s["prompt"]) for i, s in enumerate(specs)]
    batch = build_batch(specs, tok.pad_token_id)
    ref, ref_m, _ = _grads_of_update(model, tok, batch, micro_batch_size=2, **algo_kw)
    one, _, _ = _grads_of_update(model, tok, batch, micro_batch_size=64, **algo_kw)
    lengths = batch.attention_mask.sum(-1)
    budget = 2 * int(lengths.max()) + int(lengths.min())  # 2 of the longest rows, 3 or more of the shorter ones
    got, got_m, sizes = _grads_of_update(model, tok, batch, micro_batch_tokens=budget, micro_batch_size=2, **algo_kw)
    grad_sizes = sizes[1:]  # [0] is the no-grad pass over the whole batch
    assert any(len(s) > 1 for s in grad_sizes) and len({n for s in grad_sizes for n in s}) > 1  # a real re-split
    assert len(ref) == len(got) == len(one) >= 1
    for g_ref, g_one, g_got in zip(ref, one, got):
        for a, b, c in zip(g_ref, g_one, g_got):
            torch.testing.assert_close(c, a, atol=1e-6, rtol=0)
            torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    assert max(float(t.abs().max()) for t in ref[0]) > 1e-4  # the gradient is not trivially zero
    for key in ("actor/pg_loss", "actor/grad_norm", "credit/js_mean", "actor/entropy"):
        assert got_m[key] == pytest.approx(ref_m[key], abs=1e-6)
