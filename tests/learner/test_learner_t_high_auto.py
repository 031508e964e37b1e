"""The learner under ``algo.t_high=auto``: TGRL's JS of each high row is taken at that row's own T1 (the pick of the
step its group started in), so a batch mixing groups of two rungs (``trainer.max_staleness``) weights each right."""

from __future__ import annotations

import torch

from agent_rl import algos
from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig
from learner_helpers import build_batch, sample_batch


def test_js_at_each_high_rows_own_t1(tiny):
    model, tok = tiny
    _, specs_a = sample_batch(model, tok, groups=1, t_high=1.0, max_new_tokens=6, seed=1)
    _, specs_b = sample_batch(model, tok, groups=1, t_high=1.4, max_new_tokens=6, seed=2)
    n_ep = max(s["episode"] for s in specs_a) + 1
    specs = specs_a + [dict(s, group=1, episode=s["episode"] + n_ep) for s in specs_b]
    batch = build_batch(specs, tok.pad_token_id)
    learner = Learner(model, tok, AlgoConfig(name="tgrl", t_high="auto", warmup_steps=0, logits_chunk_size=5),
                      OptimConfig(), credit=CreditConfig(name="js"))
    js = learner.evaluate(batch).js
    with torch.no_grad():
        logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits.float()  # (B, L, V)
    checked = 0
    for i, s in enumerate(specs):
        m = batch.response_mask[i, 1:] > 0
        if not s["is_high"]:
            assert float(js[i].abs().max()) == 0.0
            continue
        expected = algos.js_divergence_from_logits(logits[i, :-1][m], 0.3, s["temperature"])
        torch.testing.assert_close(js[i, 1:][m], expected, atol=1e-6, rtol=1e-5)
        wrong = algos.js_divergence_from_logits(logits[i, :-1][m], 0.3, 1.2)  # the ladder's middle rung
        assert float((expected - wrong).abs().max()) > 1e-4  # the test can tell the rungs apart
        checked += 1
    assert checked == sum(s["is_high"] for s in specs) >= 6
