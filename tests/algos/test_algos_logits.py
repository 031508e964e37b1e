"""Log-probs, entropy and TGRL JS divergence from logits (spec sections 0 and 3.3)."""

import math

import pytest
import torch

from agent_rl.algos import LN2, entropy_from_logits, js_divergence_from_logits, logprobs_from_logits


def _js_reference(z: torch.Tensor, t0: float, t1: float) -> torch.Tensor:
    """Spec 3.3 written literally, in float64, row by row."""
    out = []
    for row in z.double():
        p0 = torch.softmax(row / t0, -1)
        p1 = torch.softmax(row / t1, -1)
        m = (p0 + p1) / 2
        j = 0.5 * (p0 * (torch.log(p0) - torch.log(m + 1e-8))).sum() + 0.5 * (
            p1 * (torch.log(p1) - torch.log(m + 1e-8))
        ).sum()
        out.append(j.clamp(0, math.log(2)))
    return torch.stack(out).float()


def test_js_hand_two_tokens():
    # z = [0, ln 3]. T0 = 1: p0 = [1/4, 3/4]. T1 = 2: p1 ∝ [1, sqrt 3] = [0.366025, 0.633975].
    # m = [0.308013, 0.691987].
    # KL(p0||m) = 0.25 ln(0.25/0.308013) + 0.75 ln(0.75/0.691987) = -0.052180 + 0.060395 = 0.008215 (approx)
    # KL(p1||m) = 0.366025 ln(0.366025/0.308013) + 0.633975 ln(0.633975/0.691987) = 0.063155 - 0.055509 = 0.007646
    # J = 0.5 (0.008215 + 0.007646) = 0.0079306
    z = torch.tensor([[0.0, math.log(3.0)]])
    torch.testing.assert_close(js_divergence_from_logits(z, 1.0, 2.0), torch.tensor([0.0079306]), atol=2e-6, rtol=0)


def test_js_matches_literal_spec_and_chunking_does_not_matter():
    z = torch.randn(23, 1000) * 4
    ref = _js_reference(z, 0.3, 1.2)
    full = js_divergence_from_logits(z, 0.3, 1.2)
    torch.testing.assert_close(full, ref, atol=2e-6, rtol=1e-4)
    for cs in (1, 5, 8, 23, 100):
        torch.testing.assert_close(js_divergence_from_logits(z, 0.3, 1.2, chunk_size=cs), full, atol=1e-7, rtol=0)
    # any leading shape: (B, L, V) -> (B, L)
    torch.testing.assert_close(js_divergence_from_logits(z[:22].reshape(2, 11, 1000), 0.3, 1.2), full[:22].reshape(2, 11))


def test_js_limits():
    z = torch.randn(16, 500) * 10
    # same temperature: the two distributions coincide
    assert js_divergence_from_logits(z, 0.7, 0.7).abs().max() <= 1e-6
    # bounded by ln 2, even for extreme separations (one-hot at T0 vs nearly uniform at T1)
    z2 = torch.zeros(4, 500)
    z2[:, 0] = 40.0
    j = js_divergence_from_logits(z2, 0.05, 1000.0)
    assert (j <= LN2).all() and (j >= 0).all()
    assert j.min() > 0.6  # nearly disjoint supports -> close to ln 2 = 0.693
    assert (js_divergence_from_logits(z, 0.3, 1.2) <= LN2).all()
    # a uniform row has J = 0 at any temperatures
    assert js_divergence_from_logits(torch.zeros(2, 10), 0.3, 1.2).abs().max() < 1e-7


def test_js_numerical_safety_large_and_masked_logits_and_low_precision():
    z = torch.randn(6, 300) * 1e6  # very large logits
    z[0] = 3e38  # largest float32 values
    z[1, 5] = -3e38
    z[2, :100] = -torch.inf  # masked vocabulary
    j = js_divergence_from_logits(z, 0.3, 1.2, chunk_size=4)
    assert torch.isfinite(j).all() and (j >= 0).all() and (j <= LN2).all()
    jb = js_divergence_from_logits(torch.randn(5, 300).bfloat16() * 50, 0.3, 1.2)
    assert jb.dtype == torch.float32 and torch.isfinite(jb).all()
    assert js_divergence_from_logits(torch.zeros(0, 7), 0.3, 1.2).shape == (0,)
    with pytest.raises(ValueError):
        js_divergence_from_logits(z, 0.0, 1.2)
    with pytest.raises(ValueError):
        js_divergence_from_logits(z, 0.3, 1.2, chunk_size=0)


def test_logprobs_hand_and_temperature_per_row():
    # z = [0, ln 3], T = 1: log p = [ln 1/4, ln 3/4] = [-1.386294, -0.287682]
    # T = 0.5: p ∝ [1, 9] -> log p(token 1) = ln 0.9 = -0.105361
    z = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    got = logprobs_from_logits(z, torch.tensor([0, 1]), torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(got, torch.tensor([-1.386294, -0.105361]))
    # (B, L, V) with a per-row temperature (B,) -> pass temperature[:, None]
    zz = torch.randn(3, 4, 50)
    ids = torch.randint(0, 50, (3, 4))
    temp = torch.tensor([0.3, 1.0, 1.2])
    ref = torch.log_softmax(zz / temp[:, None, None], -1).gather(-1, ids[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs_from_logits(zz, ids, temp[:, None]), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logprobs_from_logits(zz, ids, temp[:, None], chunk_size=5), ref, atol=1e-5, rtol=1e-5)


def test_logprobs_gradient_flows():
    z = torch.randn(4, 20, requires_grad=True)
    lp = logprobs_from_logits(z, torch.tensor([1, 2, 3, 4]), 0.7, chunk_size=3)
    lp.sum().backward()
    ref = torch.softmax(z.detach() / 0.7, -1)
    onehot = torch.nn.functional.one_hot(torch.tensor([1, 2, 3, 4]), 20).float()
    torch.testing.assert_close(z.grad, (onehot - ref) / 0.7, atol=1e-5, rtol=1e-5)


def test_entropy_hand_and_limits():
    # uniform over V = 8: H = ln 8 = 2.079442; [0, ln 3] at T = 1: H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335
    z = torch.zeros(2, 8)
    z[1, :] = -torch.inf
    z[1, 0], z[1, 1] = 0.0, math.log(3.0)  # -inf entries: a masked vocabulary, 0 log 0 counts as 0
    torch.testing.assert_close(entropy_from_logits(z, 1.0), torch.tensor([2.079442, 0.562335]))
    # temperature -> 0 on distinct logits: H -> 0; very large logits stay finite
    big = torch.randn(5, 100) * 1e7
    h = entropy_from_logits(big, 1.0, chunk_size=2)
    assert torch.isfinite(h).all() and (h >= 0).all() and h.max() < 1e-3
    # per-row temperature and chunking agree with torch.distributions
    zz = torch.randn(7, 30)
    temp = torch.linspace(0.3, 1.5, 7)
    ref = torch.distributions.Categorical(logits=zz / temp[:, None]).entropy()
    torch.testing.assert_close(entropy_from_logits(zz, temp, chunk_size=3), ref, atol=1e-5, rtol=1e-5)


def test_entropy_gradient_matches_autograd_reference():
    z = torch.randn(3, 40, requires_grad=True)
    h = entropy_from_logits(z, 0.8, chunk_size=2)
    h.sum().backward()
    z2 = z.detach().clone().requires_grad_(True)
    torch.distributions.Categorical(logits=z2 / 0.8).entropy().sum().backward()
    torch.testing.assert_close(z.grad, z2.grad, atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(entropy_from_logits(z, 0.8), h.detach())


def test_js_accuracy_at_qwen_vocabulary_size():
    # V = 151936: float32 result within 1e-6 of the literal formula in float64, for peaked and flat rows
    z = torch.randn(4, 151936) * torch.tensor([[3.0], [0.3], [10.0], [1.0]])
    torch.testing.assert_close(js_divergence_from_logits(z, 0.3, 1.2, chunk_size=3), _js_reference(z, 0.3, 1.2),
                               atol=1e-6, rtol=0)


def test_logprobs_safety_very_large_logits():
    z = torch.randn(3, 50) * 1e6
    z[0] = 3e38
    z[1, :10] = -torch.inf
    lp = logprobs_from_logits(z, torch.tensor([0, 20, 5]), 0.3, chunk_size=2)
    assert torch.isfinite(lp).all() and (lp <= 0).all()
    assert lp[0].item() == pytest.approx(-math.log(50), abs=1e-4)  # equal logits -> uniform


def test_functional_js_kernel_matches_the_chunked_one():
    # js_divergence_rows is the compile-friendly kernel behind compile=True (compilation itself is not run here: it
    # takes ~30 s on CPU; benchmarks/bench_js.py --compile times it)
    from agent_rl.algos import js_divergence_rows

    z = torch.randn(9, 700) * 5
    z[2, :50] = -torch.inf
    torch.testing.assert_close(js_divergence_rows(z, 0.3, 1.2), js_divergence_from_logits(z, 0.3, 1.2, chunk_size=4),
                               atol=1e-6, rtol=0)
