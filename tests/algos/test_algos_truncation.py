"""Top-k / top-p truncation shared by the sampler and the learner: what is sampled is what is learned."""

import math

import torch

from agent_rl.algos import logprobs_from_logits, truncate_logits, truncation_mask
from agent_rl.engines.hf import _sample_from_logits


def test_truncation_hand_cases():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert truncation_mask(z, 1.0, top_k=2).tolist() == [[True, True, False, False]]
    # softmax([2, 1, 0, -1]) = [0.644, 0.237, 0.087, 0.032]: top_p 0.5 keeps only token 0 (0.644 >= 0.5),
    # top_p 0.7 keeps tokens 0, 1 (0.644 < 0.7, 0.881 >= 0.7)
    assert truncation_mask(z, 1.0, top_p=0.5).tolist() == [[True, False, False, False]]
    assert truncation_mask(z, 1.0, top_p=0.7).tolist() == [[True, True, False, False]]
    # ties with the k-th logit are kept
    assert truncation_mask(torch.tensor([[1.0, 1.0, 1.0, 0.0]]), 1.0, top_k=2).tolist() == [[True, True, True, False]]
    # top_k = 2 on logits [2, 1, 0, -1]: token 0 has probability e^2 / (e^2 + e) = 0.731 (full softmax: 0.644)
    lp = logprobs_from_logits(truncate_logits(z, 1.0, top_k=2), torch.tensor([0]), 1.0)
    assert float(lp) == __import__("pytest").approx(math.log(math.e ** 2 / (math.e ** 2 + math.e)), abs=1e-6)
    assert truncate_logits(z, 1.0) is z  # off: untouched


def test_sampler_frequency_matches_reported_logprob():
    """The issue's case: top_k = 2 on logits [2, 1, 0, -1]: the sampler draws token 0 with frequency 0.731, and the
    log-prob it reports (and the learner recomputes) is log 0.731, not the full-softmax log 0.644 = -0.4402."""
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logp = _sample_from_logits(z, torch.ones(20000), 1.0, 2, [gen] * 20000)
    freq = float((tokens == 0).float().mean())
    assert abs(freq - 0.731) < 0.015
    assert set(tokens.tolist()) <= {0, 1}
    lp0 = float(logp[tokens == 0][0])
    assert abs(math.exp(lp0) - 0.731) < 1e-3
    learner_lp = logprobs_from_logits(truncate_logits(z[:1], 1.0, top_k=2), torch.tensor([0]), 1.0)
    assert abs(float(learner_lp) - lp0) < 1e-6
    # top_p at a temperature: the mask is taken on softmax(z / T)
    tokens, logp = _sample_from_logits(z[:5000], torch.full((5000,), 2.0), 0.5, 0, [gen] * 5000)
    keep = truncation_mask(z[:1], 2.0, top_p=0.5)
    assert set(tokens.tolist()) <= set(keep[0].nonzero().flatten().tolist())


def test_truncated_logprobs_are_differentiable_in_kept_entries():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]], requires_grad=True)
    lp = logprobs_from_logits(truncate_logits(z, 1.0, top_k=2), torch.tensor([0]), 1.0)
    lp.sum().backward()
    assert torch.isfinite(z.grad).all() and z.grad[0, 2:].abs().sum() == 0 and z.grad[0, 0] > 0
