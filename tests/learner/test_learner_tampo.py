"""The learner under ``algo=tampo`` (algorithms.md 8.2-8.4): the candidates' log-probs come from the no-grad pass's
own logits (chunked, no extra forward), an episode's likelihood at its sampling temperature equals its mean old
log-prob (1e-5), and the update reports the additive ``tampo_sum/*`` of the batch's episodes."""

from __future__ import annotations

import pytest
import torch

from agent_rl import algos
from agent_rl.learner import AlgoConfig, Learner, OptimConfig
from agent_rl.learner.config import TampoConfig
from learner_helpers import sample_batch

TEMPS = [0.3, 0.9, 1.2]


def tampo_learner(model, tok, chunk: int = 5) -> Learner:
    return Learner(model, tok, AlgoConfig(name="tampo", logits_chunk_size=chunk, tampo=TampoConfig(temps=TEMPS)),
                   OptimConfig())


def test_virtual_logprobs_match_the_old_logprobs_at_each_rows_temperature(tiny):
    model, tok = tiny
    batch, specs = sample_batch(model, tok, groups=2, t_low=0.3, t_high=1.2, max_new_tokens=6, seed=1)
    old = tampo_learner(model, tok).evaluate(batch)
    rm = batch.response_mask > 0
    assert old.virtual_logprobs.shape == (*batch.response_mask.shape, 3)
    for i, s in enumerate(specs):
        k = TEMPS.index(s["temperature"])
        torch.testing.assert_close(old.virtual_logprobs[i, :, k][rm[i]], old.logprobs[i][rm[i]], atol=1e-5, rtol=0)
    # chunking does not change them
    whole = tampo_learner(model, tok, chunk=4096).evaluate(batch)
    torch.testing.assert_close(whole.virtual_logprobs[rm], old.virtual_logprobs[rm], atol=1e-5, rtol=0)
    # the episode's ell at its own T is its token-mean old log-prob over the union of its turn rows
    ell, n_tok = algos.episode_virtual_likelihoods(old.virtual_logprobs, batch.response_mask, batch.episode_index)
    for e in range(ell.shape[0]):
        rows = batch.episode_index == e
        k = TEMPS.index(specs[int(rows.nonzero()[0])]["temperature"])
        mean_old = old.logprobs[rows][rm[rows]].double().mean()
        assert float(ell[e, k]) == pytest.approx(float(mean_old), abs=1e-5)
        assert int(n_tok[e]) == int(rm[rows].sum())
    assert max(s["num_turns"] for s in specs) == 2  # per-turn episodes of two rows are in the batch


def test_update_reports_the_batch_sums(tiny):
    model, tok = tiny
    batch, _ = sample_batch(model, tok, groups=2, max_new_tokens=4, seed=2)
    learner = tampo_learner(model, tok)
    old = learner.evaluate(batch)
    adv = learner.advantages(batch, old, step=1, total_steps=1)
    ell, n_tok = algos.episode_virtual_likelihoods(old.virtual_logprobs, batch.response_mask, batch.episode_index)
    want = algos.tampo_sum_metrics(algos.tampo_episode_sums(ell, adv.episode_advantages, TEMPS, n_tokens=n_tok),
                                   TEMPS)
    metrics = learner.update(batch, step=1, total_steps=1)
    assert metrics["tampo_sum/episodes"] == 8
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key
    assert sum(metrics[f"tampo_sum/adv/{t:g}"] for t in TEMPS) == pytest.approx(0.0, abs=1e-5)
    assert metrics["time/tampo_s"] >= 0.0
