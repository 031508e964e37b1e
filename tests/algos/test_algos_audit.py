"""Independent audit of ``agent_rl.algos`` against ``docs/algorithms.md``, formula by formula.

Every expected value here is recomputed from the spec text with numpy (float64) or plain-python loops over rows,
groups and tokens, on random inputs; no helper of the package is called to build an expected value. Each test names
the spec item it checks. Dims: B rows, T tokens, V vocabulary, G group size, K turns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import agent_rl.algos as A

LN2 = math.log(2.0)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _groups(rng: np.random.Generator, sizes: list[int]) -> np.ndarray:
    """(B,) shuffled integer group labels (arbitrary, non-contiguous values) for groups of the given sizes."""
    labels = np.concatenate([np.full(s, 7 * g + 3) for g, s in enumerate(sizes)])
    return rng.permutation(labels)


def _by_group(group_index: np.ndarray) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, g in enumerate(group_index.tolist()):
        out.setdefault(g, []).append(i)
    return out


def _random_rewards(rng: np.random.Generator, group_index: np.ndarray) -> np.ndarray:
    """Mixed rewards: binary, continuous, and some all-equal groups (incl. the 0.1 + 0.1 + 0.1 rounding trap)."""
    r = np.zeros(group_index.shape[0])
    for n, (g, rows) in enumerate(sorted(_by_group(group_index).items())):
        kind = n % 4
        if kind == 0:
            r[rows] = rng.integers(0, 2, len(rows)).astype(float)
        elif kind == 1:
            r[rows] = rng.normal(size=len(rows))
        elif kind == 2:
            r[rows] = 0.1  # all equal
        else:
            r[rows] = rng.choice([0.0, 0.5, 1.0], len(rows))
    return r


# ----------------------------------------------------------------------------------------------------------------------
# Section 1: advantage estimators
# ----------------------------------------------------------------------------------------------------------------------
def _grpo_ref(r: np.ndarray, g: np.ndarray, ddof: int, eps: float = 1e-6) -> np.ndarray:
    """A_i = (R_i - mean_g R) / (std_g R + eps); all-equal group -> 0 (algorithms.md section 1)."""
    out = np.zeros_like(r)
    for rows in _by_group(g).values():
        x = r[rows]
        if np.all(x == x[0]):
            continue  # all equal (also a single-row group) -> 0
        mean = sum(x) / len(x)
        var = sum((v - mean) ** 2 for v in x) / (len(x) - ddof)
        out[rows] = (x - mean) / (math.sqrt(var) + eps)
    return out


@pytest.mark.parametrize("std,ddof", [("sample", 1), ("population", 0)])
def test_audit_grpo_random_groups(std, ddof):
    rng = _rng(1)
    g = _groups(rng, [4, 4, 1, 3, 6, 4, 2, 5])
    r = _random_rewards(rng, g)
    got = A.compute_advantages("grpo", torch.tensor(r), torch.tensor(g), std=std)
    np.testing.assert_allclose(got.numpy(), _grpo_ref(r, g, ddof), rtol=1e-12, atol=1e-12)
    # eps is honoured
    got = A.compute_advantages("grpo", torch.tensor(r), torch.tensor(g), std=std, eps=0.5)
    np.testing.assert_allclose(got.numpy(), _grpo_ref(r, g, ddof, eps=0.5), rtol=1e-12, atol=1e-12)


def test_audit_grpo_hand_sample_vs_population_and_all_equal():
    # rewards [1, 0, 0, 0]: mean 0.25; sample std sqrt(0.75 / 3) = 0.5, population std sqrt(0.75 / 4) = 0.4330127
    # sample: A_0 = 0.75 / 0.500001 = 1.4999970, others -0.25 / 0.500001 = -0.49999900
    # population: A_0 = 0.75 / 0.4330137 = 1.7320468
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    a = A.compute_advantages("grpo", r, g)
    np.testing.assert_allclose(a[:4].numpy(), [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001])
    assert (a[4:] == 0).all()  # all-equal group: exactly 0
    a = A.compute_advantages("grpo", r, g, std="population")
    np.testing.assert_allclose(float(a[0]), 0.75 / (math.sqrt(0.1875) + 1e-6), rtol=1e-12)


def test_audit_drgrpo_rloo_random():
    rng = _rng(2)
    g = _groups(rng, [4, 1, 3, 5, 4, 2])
    r = _random_rewards(rng, g)
    dr = np.zeros_like(r)
    rloo = np.zeros_like(r)
    for rows in _by_group(g).values():
        x = r[rows]
        dr[rows] = x - x.mean()  # A_i = R_i - mean_g R
        if len(rows) > 1:
            for k, i in enumerate(rows):  # A_i = R_i - mean over the other G - 1 rewards
                others = [x[j] for j in range(len(rows)) if j != k]
                rloo[i] = r[i] - sum(others) / len(others)
    got_dr = A.compute_advantages("drgrpo", torch.tensor(r), torch.tensor(g)).numpy()
    got_rloo = A.compute_advantages("rloo", torch.tensor(r), torch.tensor(g)).numpy()
    np.testing.assert_allclose(got_dr, dr, atol=1e-12)
    np.testing.assert_allclose(got_rloo, rloo, atol=1e-12)


def test_audit_reinforce_pp_random():
    rng = _rng(3)
    r = rng.normal(size=17)
    g = _groups(rng, [17])
    a = r - r.mean()  # A = R - mean over the batch
    ref = (a - a.mean()) / (a.std(ddof=1) + 1e-8)  # whitened over the batch (sample std, eps 1e-8: the impl's choice)
    got = A.compute_advantages("reinforce_pp", torch.tensor(r), torch.tensor(g)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    assert abs(got.mean()) < 1e-12 and abs(got.std(ddof=1) - 1.0) < 1e-6


def test_audit_advantages_episode_index_counts_each_episode_once():
    # per-turn mode: 2 groups of 3 episodes with 1..3 turns each; stats must equal the per-episode GRPO
    rng = _rng(4)
    ep_r = np.array([1.0, 0.0, 0.0, 0.3, 0.9, 0.3])
    ep_g = np.array([0, 0, 0, 1, 1, 1])
    turns = [3, 1, 2, 2, 3, 1]
    rows = rng.permutation([e for e, k in enumerate(turns) for _ in range(k)])
    ref = _grpo_ref(ep_r, ep_g, 1)[rows]
    got = A.compute_advantages(
        "grpo", torch.tensor(ep_r[rows]), torch.tensor(ep_g[rows]), episode_index=torch.tensor(rows)
    )
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)


def test_audit_gae_random_with_gaps():
    # delta_t = r_t + gamma V_{t+1} - V_t; A_t = sum_k (gamma lam)^k delta_{t+k}; returns = A + V, over each row's
    # masked tokens (t+1 = next masked token; after the last one V = 0)
    rng = _rng(5)
    b, t_len, gamma, lam = 5, 12, 0.97, 0.9
    rew = rng.normal(size=(b, t_len))
    val = rng.normal(size=(b, t_len))
    mask = (rng.random((b, t_len)) > 0.3).astype(float)
    mask[:, :2] = 0  # prompt
    mask[3] = 0  # empty row
    ref_a = np.zeros((b, t_len))
    for i in range(b):
        pos = [t for t in range(t_len) if mask[i, t] > 0]
        deltas = []
        for n, t in enumerate(pos):
            v_next = val[i, pos[n + 1]] if n + 1 < len(pos) else 0.0
            deltas.append(rew[i, t] + gamma * v_next - val[i, t])
        for n, t in enumerate(pos):
            ref_a[i, t] = sum((gamma * lam) ** k * deltas[n + k] for k in range(len(pos) - n))
    ref_ret = (ref_a + val) * mask
    adv, ret = A.compute_gae(torch.tensor(rew), torch.tensor(val), torch.tensor(mask), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), ref_a, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), ref_ret, atol=1e-12)


def test_audit_dapo_overlong_and_dynamic_filter():
    # R_len = 0 if |y| <= L_max - L_c; ((L_max - L_c) - |y|) / L_c if |y| <= L_max; -1 beyond
    l_max, l_c = 100, 20
    lengths = list(range(0, 130, 3)) + [80, 81, 100, 101]
    ref = [0.0 if y <= l_max - l_c else ((l_max - l_c) - y) / l_c if y <= l_max else -1.0 for y in lengths]
    got = A.dapo_overlong_penalty(torch.tensor(lengths), l_max, l_c)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-7)
    # dynamic sampling: drop groups whose rewards are all equal
    rng = _rng(6)
    g = _groups(rng, [4, 4, 4, 1, 3])
    r = _random_rewards(rng, g)
    keep_ref = np.array([len(set(r[_by_group(g)[gi]].tolist())) > 1 for gi in g.tolist()])
    got = A.dapo_keep_groups(torch.tensor(r), torch.tensor(g)).numpy()
    np.testing.assert_array_equal(got, keep_ref)


# ----------------------------------------------------------------------------------------------------------------------
# Section 2: policy losses and aggregations
# ----------------------------------------------------------------------------------------------------------------------
def _ppo_token(lp: float, olp: float, a: float, cl: float, ch: float, c: float | None) -> float:
    r = math.exp(min(max(lp - olp, -20.0), 20.0))
    loss = max(-a * r, -a * min(max(r, 1 - cl), 1 + ch))
    if c is not None and a < 0:
        loss = min(loss, -a * c)  # dual clip
    return loss


def _agg_ref(loss: np.ndarray, mask: np.ndarray, mode: str, max_len: int | None = None) -> float:
    b, t_len = loss.shape
    if mode == "token_mean":  # sum of masked token losses / number of masked tokens
        n = mask.sum()
        return float((loss * mask).sum() / n) if n else 0.0
    if mode == "seq_mean_token_mean":  # mean over rows (with >= 1 token) of each row's token mean
        rows = [(loss[i] * mask[i]).sum() / mask[i].sum() for i in range(b) if mask[i].sum() > 0]
        return float(sum(rows) / len(rows)) if rows else 0.0
    if mode == "seq_mean_token_sum_norm":  # Dr.GRPO: token sum / L_max, mean over rows == sum / (B * L_max)
        l_max = max_len if max_len is not None else t_len
        return float((loss * mask).sum() / (b * l_max))
    raise AssertionError(mode)


def _loss_inputs(seed: int, b: int = 6, t_len: int = 9):
    rng = _rng(seed)
    old = rng.normal(-1.5, 0.5, size=(b, t_len))
    lp = old + rng.normal(0, 0.4, size=(b, t_len))
    lp[0, 0] = old[0, 0] + 30.0  # beyond the +-20 ratio clamp
    lp[1, 1] = old[1, 1] - 30.0
    lp[2, :] = old[2, :] + 2.0  # ratio e^2 = 7.4 > c = 3: the dual clip binds where A < 0
    adv = rng.normal(size=(b, t_len))
    adv[2, :] = -np.abs(adv[2, :])
    mask = (rng.random((b, t_len)) > 0.25).astype(float)
    mask[:, 0] = 1.0
    mask[5] = 0.0  # an empty row
    return lp, old, adv, mask


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("cl,ch,c", [(0.2, 0.2, 3.0), (0.2, 0.28, 3.0), (0.2, 0.28, None)])
def test_audit_ppo_clip_random(mode, cl, ch, c):
    lp, old, adv, mask = _loss_inputs(7)
    b, t_len = lp.shape
    tok = np.array([[_ppo_token(lp[i, t], old[i, t], adv[i, t], cl, ch, c) for t in range(t_len)] for i in range(b)])
    ref = _agg_ref(tok, mask, mode, max_len=16)
    # clipfrac: fraction of masked tokens where the clipped term is the larger one
    cf = [
        -adv[i, t] * min(max(math.exp(lp[i, t] - old[i, t]), 1 - cl), 1 + ch)
        > -adv[i, t] * math.exp(min(max(lp[i, t] - old[i, t], -20), 20))
        for i in range(b)
        for t in range(t_len)
        if mask[i, t] > 0
    ]
    loss, metrics = A.policy_loss(
        "ppo_clip", torch.tensor(lp), torch.tensor(old), torch.tensor(adv), torch.tensor(mask),
        clip_low=cl, clip_high=ch, dual_clip=c, loss_agg=mode, max_len=16,
    )  # fmt: skip
    np.testing.assert_allclose(float(loss), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(metrics["actor/clipfrac"]), sum(cf) / len(cf), atol=1e-12)
    # dual-clip fraction: masked tokens with A < 0 where -A c is below the clipped loss
    dual = [
        adv[i, t] < 0 and -adv[i, t] * c < _ppo_token(lp[i, t], old[i, t], adv[i, t], cl, ch, None)
        for i in range(b)
        for t in range(t_len)
        if mask[i, t] > 0 and c is not None
    ]
    np.testing.assert_allclose(float(metrics["actor/pg_clipfrac_lower"]), sum(dual) / len(cf), atol=1e-7)
    assert (sum(dual) > 0) == (c is not None)  # the dual clip is exercised (row 2: ratio e^2 > 3, A < 0)
    assert math.isfinite(float(metrics["actor/approx_kl"])) and float(metrics["actor/approx_kl"]) >= 0


def test_audit_ppo_clip_row_advantages_broadcast_and_grad():
    # (B,) advantages broadcast over tokens; gradient of token_mean = (1/N) d loss_t / d logp_t, which for an unclipped
    # token is -A r and for a clipped (or dual-clipped) token is 0
    lp, old, _, mask = _loss_inputs(8)
    adv_row = np.array([1.0, -1.0, -0.5, 0.7, -2.0, 0.3])
    lp_t = torch.tensor(lp, requires_grad=True)
    loss, _ = A.policy_loss("ppo_clip", lp_t, torch.tensor(old), torch.tensor(adv_row), torch.tensor(mask))
    loss.backward()
    n = mask.sum()
    b, t_len = lp.shape
    ref_grad = np.zeros_like(lp)
    for i in range(b):
        for t in range(t_len):
            if mask[i, t] == 0:
                continue
            a, lr = adv_row[i], lp[i, t] - old[i, t]
            r = math.exp(min(max(lr, -20), 20))
            unclipped = -a * r >= -a * min(max(r, 0.8), 1.2)
            dual = a < 0 and -a * 3.0 < max(-a * r, -a * min(max(r, 0.8), 1.2))
            if unclipped and not dual and -20 < lr < 20:
                ref_grad[i, t] = -a * r / n
    np.testing.assert_allclose(lp_t.grad.numpy(), ref_grad, rtol=1e-10, atol=1e-12)


def test_audit_drgrpo_divisor_is_g_times_lmax_per_group():
    # seq_mean_token_sum_norm over a batch of equal groups == mean over groups of (group token sum) / (G * L_max)
    rng = _rng(9)
    n_groups, g_size, t_len, l_max = 3, 4, 7, 10
    loss = rng.normal(size=(n_groups * g_size, t_len))
    mask = (rng.random(loss.shape) > 0.4).astype(float)
    per_group = [
        (loss[k * g_size : (k + 1) * g_size] * mask[k * g_size : (k + 1) * g_size]).sum() / (g_size * l_max)
        for k in range(n_groups)
    ]
    got = A.agg_loss(torch.tensor(loss), torch.tensor(mask), "seq_mean_token_sum_norm", max_len=l_max)
    np.testing.assert_allclose(float(got), sum(per_group) / n_groups, rtol=1e-12)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_audit_gspo_value_and_sequence_gradient(mode):
    # s_i = exp(mean_t (logp - old_logp)) over the row's masked tokens, clipped per sequence:
    # l_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)), the same value on each of the row's tokens
    rng = _rng(10)
    b, t_len = 5, 8
    old = rng.normal(-1.0, 0.3, size=(b, t_len))
    lp = old + rng.normal(0, 0.15, size=(b, t_len))
    mask = (rng.random((b, t_len)) > 0.3).astype(float)
    mask[:, 0] = 1
    adv = np.array([1.0, -1.0, 0.5, -0.3, 2.0])
    s = np.array([math.exp(sum((lp[i] - old[i]) * mask[i]) / mask[i].sum()) for i in range(b)])
    l_seq = np.maximum(-adv * s, -adv * np.clip(s, 0.9, 1.1))
    ref = _agg_ref(l_seq[:, None] * np.ones((1, t_len)), mask, mode)
    lp_t = torch.tensor(lp, requires_grad=True)
    loss, _ = A.policy_loss(
        "gspo", lp_t, torch.tensor(old), torch.tensor(adv), torch.tensor(mask), clip_low=0.1, clip_high=0.1,
        loss_agg=mode,
    )  # fmt: skip
    np.testing.assert_allclose(float(loss.detach()), ref, rtol=1e-10)
    if mode == "seq_mean_token_mean":  # the paper's objective: its gradient is that of mean_i l_i(s_i(theta))
        loss.backward()
        lp2 = torch.tensor(lp, requires_grad=True)
        m = torch.tensor(mask)
        s2 = torch.exp(((lp2 - torch.tensor(old)) * m).sum(-1) / m.sum(-1))
        a = torch.tensor(adv)
        torch.maximum(-a * s2, -a * s2.clamp(0.9, 1.1)).mean().backward()
        np.testing.assert_allclose(lp_t.grad.numpy(), lp2.grad.numpy(), rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------------
# Section 3: TGRL
# ----------------------------------------------------------------------------------------------------------------------
def _js_ref(z: np.ndarray, t0: float, t1: float) -> np.ndarray:
    """J = 0.5 sum p0 (log p0 - log(m + 1e-8)) + 0.5 sum p1 (log p1 - log(m + 1e-8)), clamped to [0, ln 2]."""
    out = np.zeros(z.shape[0])
    for n in range(z.shape[0]):
        x0 = z[n] / t0
        x1 = z[n] / t1
        lp0 = x0 - (x0.max() + np.log(np.exp(x0 - x0.max()).sum()))
        lp1 = x1 - (x1.max() + np.log(np.exp(x1 - x1.max()).sum()))
        p0, p1 = np.exp(lp0), np.exp(lp1)
        log_m = np.log((p0 + p1) / 2 + 1e-8)
        j = 0.5 * np.sum(p0 * (lp0 - log_m)) + 0.5 * np.sum(p1 * (lp1 - log_m))
        out[n] = min(max(j, 0.0), LN2)
    return out


@pytest.mark.parametrize("chunk", [None, 1, 3, 7])
def test_audit_js_random_logits(chunk):
    rng = _rng(11)
    z = rng.normal(0, 3.0, size=(10, 500))
    z[0] *= 100.0  # very peaked: both distributions near one-hot -> J near 0
    z[1, :] = 0.0  # uniform: J = 0
    z[2, 0] = 1e4  # huge logit
    ref = _js_ref(z, 0.3, 1.2)
    got = A.js_divergence_from_logits(torch.tensor(z, dtype=torch.float32), 0.3, 1.2, chunk_size=chunk)
    assert got.shape == (10,)
    np.testing.assert_allclose(got.numpy(), ref, atol=2e-6, rtol=1e-5)
    assert (got >= 0).all() and (got <= LN2).all()
    np.testing.assert_allclose(A.js_divergence_from_logits(torch.tensor(z), 0.7, 0.7).numpy(), 0.0, atol=1e-6)


def test_audit_js_eps_inside_log_m_matters_for_tiny_m():
    # With p0, p1 both ~1e-9 on many tokens, log(m + 1e-8) differs from log(m): the spec's eps must be inside the log.
    # Two-token-type vocabulary: one dominant logit, V - 1 tiny ones. Checked against the reference with the eps.
    v = 2000
    z = np.full((1, v), -20.0)
    z[0, 0] = 0.0
    ref_eps = _js_ref(z, 0.3, 1.2)[0]
    got = float(A.js_divergence_from_logits(torch.tensor(z, dtype=torch.float32), 0.3, 1.2)[0])
    np.testing.assert_allclose(got, ref_eps, atol=1e-6)


def _weights_ref(js: np.ndarray, mask: np.ndarray, clip: bool) -> np.ndarray:
    """Spec 3.4 per row with numpy percentiles (method 'linear')."""
    eps = 1e-8
    w = np.zeros_like(js)
    for i in range(js.shape[0]):
        idx = np.nonzero(mask[i] > 0)[0]
        if idx.size == 0:
            continue
        j = js[i, idx]
        j_bar = j.mean()
        omega = np.log(1.0 + (j + eps) / (j_bar + eps))
        if clip:
            lo = np.percentile(omega, 5, method="linear")
            hi = np.percentile(omega, 95, method="linear")
            omega = np.clip(omega, lo, hi)
        w[i, idx] = omega / omega.mean()
    return w


@pytest.mark.parametrize("clip", [True, False])
def test_audit_tgrl_token_weights_random(clip):
    rng = _rng(12)
    b, t_len = 8, 30
    js = rng.random((b, t_len)) * LN2
    js[1] = rng.random(t_len) ** 8 * LN2  # skewed row
    js[2] = 0.0  # all-zero (low row): w = 1
    js[3, ::2] = 0.0
    mask = (rng.random((b, t_len)) > 0.3).astype(float)
    mask[:, :4] = 0  # prompt
    mask[6] = 0  # empty row
    mask[7] = 0
    mask[7, 10] = 1  # one-token row
    ref = _weights_ref(js, mask, clip)
    got = A.tgrl_token_weights(torch.tensor(js), torch.tensor(mask), quantile_clip=clip).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    for i in range(b):  # mean 1 over the masked tokens of each non-empty row
        if mask[i].sum() > 0:
            assert abs(got[i][mask[i] > 0].mean() - 1.0) < 1e-12


def test_audit_percentile_matches_torch_quantile_and_numpy():
    rng = _rng(13)
    x = rng.normal(size=(5, 23))
    mask = (rng.random((5, 23)) > 0.4).astype(float)
    mask[0] = 1
    mask[4] = 0
    mask[4, 3] = 1
    for q in (0.05, 0.5, 0.95, 0.0, 1.0):
        got = A.masked_row_quantile(torch.tensor(x), torch.tensor(mask), q).numpy()
        for i in range(5):
            vals = x[i][mask[i] > 0]
            np.testing.assert_allclose(got[i], np.percentile(vals, 100 * q, method="linear"), rtol=1e-12)
            np.testing.assert_allclose(got[i], float(torch.quantile(torch.tensor(vals), q)), rtol=1e-12)


def _tgrl_ref(r, g, is_high, js, mask, warmup, adv_clip=10.0, clip=True):
    a_row = _grpo_ref(r, g, ddof=1)  # 3.1: GRPO over all G (sample std + 1e-6)
    if warmup:  # 3.7: plain GRPO broadcast over all rows
        return a_row[:, None] * mask
    w = _weights_ref(js, mask, clip)
    out = np.zeros_like(js)
    for i in range(js.shape[0]):
        for t in range(js.shape[1]):
            if mask[i, t] > 0 and is_high[i]:  # 3.5: high rows clamp(A_i w_t, -10, 10); low rows 0
                out[i, t] = min(max(a_row[i] * w[i, t], -adv_clip), adv_clip)
    return out


@pytest.mark.parametrize("warmup", [False, True])
@pytest.mark.parametrize("clip", [True, False])
def test_audit_tgrl_advantages_random(warmup, clip):
    rng = _rng(14)
    n_groups, t_len = 4, 40
    g = np.repeat(np.arange(n_groups) * 5 + 1, 4)
    is_high = np.tile([False, True, True, True], n_groups)
    r = np.array([0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0], dtype=float)  # group 1: all equal -> 0
    js = rng.random((16, t_len)) * 0.3
    js[~is_high] = 0.0
    js[1] = 0.0
    js[1, [5, 6]] = 0.69  # sparse row: large weights; with clip=False A * w exceeds 10 -> clamp binds
    mask = (rng.random((16, t_len)) > 0.2).astype(float)
    mask[:, :3] = 0
    mask[1, 3:] = 1
    ref = _tgrl_ref(r, g, is_high, js, mask, warmup, clip=clip)
    got = A.tgrl_advantages(
        torch.tensor(r), torch.tensor(g), torch.tensor(is_high), torch.tensor(js), torch.tensor(mask),
        warmup=warmup, quantile_clip=clip,
    ).numpy()  # fmt: skip
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-9)
    if not warmup and not clip:
        assert np.abs(got).max() == pytest.approx(10.0)  # the clamp was exercised


def test_audit_tgrl_low_rows_count_in_token_mean_denominator():
    # 3.5: low rows have A = 0 but keep their loss mask -> token_mean divides by all masked tokens (high + low).
    # With ratio 1 (logp == old_logp) the ppo_clip token loss is -A, so loss = -sum_high A / (N_high + N_low).
    rng = _rng(15)
    g = np.repeat([0, 1], 4)
    is_high = np.tile([False, True, True, True], 2)
    r = np.array([1, 0, 0, 0, 0, 1, 0.5, 0], dtype=float)  # high-row advantages do not cancel
    js = rng.random((8, 6)) * 0.5
    mask = np.ones((8, 6))
    mask[:, 4:] = rng.integers(0, 2, (8, 2))
    adv = A.tgrl_advantages(
        torch.tensor(r), torch.tensor(g), torch.tensor(is_high), torch.tensor(js), torch.tensor(mask)
    )
    lp = torch.full((8, 6), -1.0, dtype=torch.float64)
    loss, _ = A.policy_loss("ppo_clip", lp, lp.clone(), adv, torch.tensor(mask))
    ref = -_tgrl_ref(r, g, is_high, js, mask, False).sum() / mask.sum()
    assert abs(ref) > 0.05
    np.testing.assert_allclose(float(loss), ref, rtol=1e-6)


def test_audit_tgrl_delta_r_random():
    # delta_R = mean R(high) - mean R(low) per group, averaged over groups
    rng = _rng(16)
    n_groups = 6
    g = np.repeat(np.arange(n_groups), 4)
    is_high = np.tile([False, True, True, True], n_groups)
    r = rng.integers(0, 2, 4 * n_groups).astype(float)
    per_group = []
    for k in range(n_groups):
        rows = [i for i in range(len(g)) if g[i] == k]
        hi = [r[i] for i in rows if is_high[i]]
        lo = [r[i] for i in rows if not is_high[i]]
        per_group.append(sum(hi) / len(hi) - sum(lo) / len(lo))
    got = A.tgrl_delta_r(torch.tensor(r), torch.tensor(g), torch.tensor(is_high))
    assert got == pytest.approx(sum(per_group) / n_groups, abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------------
# Section 4: schedules
# ----------------------------------------------------------------------------------------------------------------------
def _sched_ref(kind: str, step: int, n: int, m: float = 0.99) -> float:
    s_min, s_max = math.floor(n * 0.0), math.floor(n * 0.8)
    tau = min(max((step - s_min) / (s_max - s_min), 0.0), 1.0)
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731
    k = 8.0
    return {
        "linear": m * (1 - tau),
        "sigmoid": m * (sig(-k * (tau - 0.5)) - sig(-k / 2)) / (sig(k / 2) - sig(-k / 2)),
        "power": (m * (1 - tau)) ** 2,
        "constant": 1.0,
        "none": 0.0,
    }[kind]


@pytest.mark.parametrize("kind", ["linear", "sigmoid", "power", "constant", "none"])
def test_audit_schedules_all_steps(kind):
    for n in (5, 37, 100, 1001):
        for step in range(1, n + 1):
            assert A.schedule_value(kind, step, n) == pytest.approx(_sched_ref(kind, step, n), abs=1e-12)
    # hand values, N = 100: s_max = 80, step 1 -> tau = 1/80; step 40 -> tau = 0.5; step >= 80 -> 0
    if kind == "linear":
        assert A.schedule_value(kind, 1, 100) == pytest.approx(0.99 * 79 / 80)
        assert A.schedule_value(kind, 40, 100) == pytest.approx(0.495)
    if kind == "sigmoid":
        assert A.schedule_value(kind, 40, 100) == pytest.approx(0.495)  # symmetric: m / 2 at tau = 1/2
    if kind == "power":
        assert A.schedule_value(kind, 40, 100) == pytest.approx(0.495**2)
    if kind in ("linear", "sigmoid", "power"):
        assert A.schedule_value(kind, 80, 100) == 0.0 and A.schedule_value(kind, 100, 100) == 0.0


# ----------------------------------------------------------------------------------------------------------------------
# Section 5: credit rules
# ----------------------------------------------------------------------------------------------------------------------
def _random_mask(rng, b, t_len):
    mask = (rng.random((b, t_len)) > 0.3).astype(float)
    mask[:, :2] = 0  # prompt
    mask[0] = 0  # empty row
    mask[1] = 0
    mask[1, 5] = 1  # single token
    return mask


def _safe_S(rng, lengths) -> list[float]:
    """Random S in [0, 1) with L S far from an integer for every L (float rounding never decides floor/ceil)."""
    out = []
    while len(out) < 12:
        s = float(rng.random())
        if all(abs(n * s - round(n * s)) > 1e-6 for n in lengths if n > 0):
            out.append(s)
    return out + [0.0]


def test_audit_tp_token_mask_random():
    # token j (0-based among the row's action tokens) of L trained iff j >= floor(L S); the last token always trained
    rng = _rng(17)
    b, t_len = 7, 25
    mask = _random_mask(rng, b, t_len)
    lengths = [int(x) for x in mask.sum(-1)]
    for s in _safe_S(rng, lengths) + [0.999999]:
        ref = np.zeros_like(mask)
        for i in range(b):
            pos = [t for t in range(t_len) if mask[i, t] > 0]
            L = len(pos)
            for j, t in enumerate(pos):
                if j >= math.floor(L * s) or j == L - 1:
                    ref[i, t] = 1
        np.testing.assert_array_equal(A.tp_mask(torch.tensor(mask), s).numpy(), ref)
    # S = 0 trains every token; S close to 1 only the last
    np.testing.assert_array_equal(A.tp_mask(torch.tensor(mask), 0.0).numpy(), mask)


def test_audit_tp_turn_mask_random():
    # turn k (0-based) of K trained iff k >= floor(K S)
    rng = _rng(18)
    num_turns = rng.integers(1, 9, 40)
    turn_index = np.array([rng.integers(0, k) for k in num_turns])
    for s in _safe_S(rng, list(range(1, 9))):
        ref = [float(k >= math.floor(n * s)) for k, n in zip(turn_index, num_turns)]
        got = A.turn_tp_mask(torch.tensor(turn_index), torch.tensor(num_turns), s).numpy()
        np.testing.assert_array_equal(got, ref)


def test_audit_forking_mask_random():
    # eps = 80th percentile (numpy linear) of H over the batch's masked tokens; keep H >= S * eps
    rng = _rng(19)
    b, t_len = 7, 25
    mask = _random_mask(rng, b, t_len)
    ent = rng.random((b, t_len)) * 3.0  # distinct values, no ties
    lengths = [int(x) for x in mask.sum(-1)]
    eps = np.quantile(ent[mask > 0], 0.8)
    for s in _safe_S(rng, lengths) + [0.8, 1.0]:
        ref = ((ent >= s * eps) & (mask > 0)).astype(mask.dtype)
        got = A.forking_mask(torch.tensor(ent), torch.tensor(mask), s).numpy()
        np.testing.assert_array_equal(got, ref)
        # via apply_credit: the selection replaces the loss mask, advantages unchanged on the response
        adv = rng.normal(size=b)
        ci = A.CreditInputs(
            torch.tensor(adv), torch.tensor(mask), torch.zeros(b, dtype=torch.long), torch.ones(b, dtype=torch.long),
            torch.arange(b), entropy=torch.tensor(ent),
        )  # fmt: skip
        a2, m2 = A.apply_credit("forking", ci, s)
        np.testing.assert_array_equal(m2.numpy(), ref)
        np.testing.assert_allclose(a2.numpy(), adv[:, None] * mask, rtol=1e-6)


def test_audit_entropy_adv_random():
    # A_t = A + S min(alpha H_t, |A| / kappa); never flips sign
    rng = _rng(20)
    b, t_len = 6, 10
    adv = rng.normal(size=b)
    adv[0] = 0.0
    ent = rng.random((b, t_len)) * 4.0
    for s in (0.0, 0.37, 1.0):
        ref = np.array(
            [[adv[i] + s * min(0.4 * ent[i, t], abs(adv[i]) / 2.0) for t in range(t_len)] for i in range(b)]
        )
        got = A.entropy_adv(torch.tensor(adv), torch.tensor(ent), s).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
        assert (np.sign(got) == np.sign(adv)[:, None]).all()


def test_audit_empg_random_batch():
    # H_k = mean token entropy of turn k; Hn = min-max over the batch; g = exp(-Hn) / mean exp(-Hn);
    # A_k = g A + zeta exp(-Hn_{k+1}) (only with a next turn); minus the batch mean
    rng = _rng(21)
    turns = [3, 1, 2, 4]
    rows = [(e, k) for e, n in enumerate(turns) for k in range(n)]
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    b, t_len = len(rows), 8
    mask = (rng.random((b, t_len)) > 0.3).astype(float)
    mask[:, 0] = 1
    ent = rng.random((b, t_len)) * 2.0
    ep_adv = rng.normal(size=len(turns))
    adv = np.array([ep_adv[e] for e, _ in rows])
    h = np.array([ent[i][mask[i] > 0].mean() for i in range(b)])
    hn = (h - h.min()) / (h.max() - h.min())
    gw = np.exp(-hn) / np.exp(-hn).mean()
    where = {r: i for i, r in enumerate(rows)}
    ref = np.zeros(b)
    for i, (e, k) in enumerate(rows):
        ref[i] = gw[i] * adv[i]
        if (e, k + 1) in where:
            ref[i] += 0.05 * math.exp(-hn[where[(e, k + 1)]])
    ref -= ref.mean()
    ci = A.CreditInputs(
        torch.tensor(adv), torch.tensor(mask), torch.tensor([k for _, k in rows]),
        torch.tensor([turns[e] for e, _ in rows]), torch.tensor([e for e, _ in rows]), entropy=torch.tensor(ent),
    )  # fmt: skip
    got, m = A.apply_credit("empg", ci, 1.0, level="turn")
    np.testing.assert_allclose(got.numpy(), ref[:, None] * mask, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m.numpy(), mask)
    # the bare function with the next-turn entropies given explicitly
    nxt = np.array([h[where[(e, k + 1)]] if (e, k + 1) in where else 0.0 for e, k in rows])
    has = np.array([(e, k + 1) in where for e, k in rows])
    got2 = A.empg_advantages(torch.tensor(adv), torch.tensor(h), torch.tensor(nxt), torch.tensor(has)).numpy()
    np.testing.assert_allclose(got2, ref, rtol=1e-5, atol=1e-6)


def test_audit_js_turn_level_and_tp_turn_via_apply_credit():
    # js at turn level: the turn's mean J / the episode's mean of turn means (mean 1 over the episode), S = 1
    rng = _rng(22)
    turns = [3, 2]
    rows = [(e, k) for e, n in enumerate(turns) for k in range(n)]
    b, t_len = len(rows), 6
    mask = (rng.random((b, t_len)) > 0.3).astype(float)
    mask[:, 0] = 1
    js = rng.random((b, t_len)) * 0.5
    adv = np.array([1.0, 1.0, 1.0, -0.5, -0.5])
    jbar = np.array([js[i][mask[i] > 0].mean() for i in range(b)])
    ep_mean = {e: np.mean([jbar[i] for i, (e2, _) in enumerate(rows) if e2 == e]) for e in range(len(turns))}
    w = np.array([(jbar[i] + 1e-8) / (ep_mean[e] + 1e-8) for i, (e, _) in enumerate(rows)])
    ci = A.CreditInputs(
        torch.tensor(adv), torch.tensor(mask), torch.tensor([k for _, k in rows]),
        torch.tensor([turns[e] for e, _ in rows]), torch.tensor([e for e, _ in rows]), js=torch.tensor(js),
    )  # fmt: skip
    got, _ = A.apply_credit("js", ci, 1.0, level="turn")
    np.testing.assert_allclose(got.numpy(), (adv * w)[:, None] * mask, rtol=1e-5)
    # tp at turn level, S = 0.5: episode 0 (K = 3): floor(1.5) = 1 -> turns 1, 2; episode 1 (K = 2): turn 1
    _, m = A.apply_credit("tp", ci, 0.5, level="turn")
    keep = np.array([0, 1, 1, 0, 1], dtype=float)
    np.testing.assert_array_equal(m.numpy(), keep[:, None] * mask)
