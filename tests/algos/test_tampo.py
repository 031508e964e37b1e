"""TAMPO (algorithms.md section 8): the section's hand-computed example through the public interface of
``agent_rl.algos``, the TAMPO statistic ``agent_rl.algos.tampo_statistic`` (A_B = (1/N) sum_i hat_ell_{i,k} A_i, with
``tampo_episode_sums`` its additive per-rank part), the meta-policy, the tie-inclusive nucleus and its draws, and a
resumed meta state drawing what an uninterrupted one draws.

Hand example: vocabulary 3, every position's logits z = [2.5, 1.0, 0.0], candidates [0.6, 1.0, 1.4], alpha 0.05,
top_p 0.7. Task 1: episodes [0 0 0], [1 2], [0 1 1], [1 0 0 0], rewards [1, 0, 0, 1]; task 2: [0 2], [0 0], [0 0 1],
[2 0 1 2], rewards [0, 0, 1, 0].
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from agent_rl import algos
from agent_rl.algos import (TampoMetaPolicy, compute_advantages, episode_virtual_likelihoods, logprobs_from_logits,
                            parse_temperature_schedule, scheduled_temperature, sparsemax, tampo_draw,
                            tampo_episode_sums, tampo_meta_policy, tampo_normalise, tampo_nucleus, tampo_statistic,
                            virtual_logprobs)

TEMPS = [0.6, 1.0, 1.4]
Z = torch.tensor([2.5, 1.0, 0.0])
TASK1 = ([[0, 0, 0], [1, 2], [0, 1, 1], [1, 0, 0, 0]], [1.0, 0.0, 0.0, 1.0])
TASK2 = ([[0, 2], [0, 0], [0, 0, 1], [2, 0, 1, 2]], [0.0, 0.0, 1.0, 0.0])
TASK3 = ([[0], [1], [2], [0, 1]], [1.0, 1.0, 1.0, 1.0])  # all equal: A = 0, still counted in N


def rows_of(tasks, split=None):
    """(vlp (B, T, K), response_mask (B, T), episode_index (B,), rewards (E,), group (E,)) of the tasks' episodes,
    each episode one row (``split``: episode e -> list of row lengths, per-turn mode)."""
    split = split or {}
    rows, eps, rewards, groups = [], [], [], []
    e = 0
    for g, (episodes, rs) in enumerate(tasks):
        for tokens, r in zip(episodes, rs):
            cuts = split.get(e, [len(tokens)])
            pos = 0
            for n in cuts:
                rows.append(tokens[pos:pos + n])
                eps.append(e)
                pos += n
            rewards.append(r)
            groups.append(g)
            e += 1
    t = max(len(r) for r in rows)
    vlp = torch.zeros(len(rows), t, len(TEMPS))
    mask = torch.zeros(len(rows), t)
    for i, toks in enumerate(rows):
        ids = torch.tensor(toks)
        vlp[i, :len(toks)] = virtual_logprobs(Z.expand(len(toks), 3), ids, TEMPS)
        mask[i, :len(toks)] = 1
    return vlp, mask, torch.tensor(eps), torch.tensor(rewards), torch.tensor(groups)


def statistic(tasks, norm="sparsemax"):
    vlp, mask, ep, r, g = rows_of(tasks)
    ell, n_tok = episode_virtual_likelihoods(vlp, mask, ep)
    adv = compute_advantages("grpo", r, g)  # (E,) the GRPO A_i of step 1
    return tampo_statistic(ell, adv, norm, n_tokens=n_tok), adv, ell


def test_hand_example_advantages_and_statistic():
    a_b, adv, _ = statistic([TASK1, TASK2])
    # GRPO: task 1 mean 0.5, sample std 0.57735 -> +-0.866025; task 2 mean 0.25, std 0.5 -> -0.5, +1.5
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025, -0.5, -0.5, 1.5, -0.5],
                                         abs=1e-5)
    assert a_b.tolist() == pytest.approx([0.097381, 0.004181, -0.101562], abs=1e-6)
    assert float(a_b.sum()) == pytest.approx(0.0, abs=1e-7)  # every profile finite: sum_k A_B,k = 0 (float32 A)


def test_hand_example_softmax_and_argmax():
    assert statistic([TASK1, TASK2], "softmax")[0].tolist() == pytest.approx([0.051940, -0.004214, -0.047726],
                                                                            abs=1e-6)
    assert statistic([TASK1, TASK2], "argmax")[0].tolist() == pytest.approx([0.045753, 0.295753, -0.341506],
                                                                           abs=1e-6)


def test_all_equal_task_counts_in_n():
    a_b, adv, _ = statistic([TASK1, TASK2, TASK3])
    assert adv[8:].tolist() == [0.0] * 4
    assert a_b.tolist() == pytest.approx([0.064921, 0.002787, -0.067708], abs=1e-6)  # N = 12, not 8
    meta = TampoMetaPolicy(TEMPS, ema_alpha=0.05, top_p=0.7)
    meta.observe((a_b * 12).tolist(), 12)
    assert tampo_meta_policy(meta.ema) == pytest.approx([0.652945, 0.347055, 0.0], abs=1e-6)  # pi unchanged


def test_meta_policy_nucleus_and_draws():
    a_b = statistic([TASK1, TASK2])[0].tolist()
    meta = TampoMetaPolicy(TEMPS, ema_alpha=0.05, top_p=0.7)
    assert meta.pi(1) == [1 / 3] * 3  # E = 0: uniform
    sums = tampo_episode_sums(*statistic_inputs(), TEMPS)
    assert sums["episodes"] == 8
    assert [s / 8 for s in sums["adv_sum"]] == pytest.approx(a_b, abs=1e-12)
    meta.observe(sums["adv_sum"], sums["episodes"])
    pi = meta.pi(2)
    assert pi == pytest.approx([0.652945, 0.347055, 0.0], abs=1e-6)
    nucleus = tampo_nucleus(pi, 0.7)
    assert [p > 0 for p in nucleus] == [True, True, False]  # keeps {0.6, 1.0}
    assert tampo_draw(nucleus, TEMPS, 0.5) == 0.6
    assert tampo_draw(nucleus, TEMPS, 0.9) == 1.0
    # from E = [0.010, -0.020, 0.030] the same A_B gives pi = [0.439947, 0, 0.560053]
    meta.ema = [0.010, -0.020, 0.030]
    meta.observe(a_b, 1)
    assert tampo_meta_policy(meta.ema) == pytest.approx([0.439947, 0.0, 0.560053], abs=1e-6)


def statistic_inputs():
    vlp, mask, ep, r, g = rows_of([TASK1, TASK2])
    ell, _ = episode_virtual_likelihoods(vlp, mask, ep)
    return ell, compute_advantages("grpo", r, g)


def test_nucleus_ties_greedy_and_uniform():
    assert tampo_nucleus([0.25] * 4, 0.7) == [0.25] * 4  # tie-inclusive: a uniform pi keeps all
    assert tampo_nucleus([0.4, 0.4, 0.2], 0.3) == [0.5, 0.5, 0.0]  # the tie with pi_m stays in
    assert tampo_nucleus([0.4, 0.4, 0.2], 0.0) == [1.0, 0.0, 0.0]  # greedy, ties to the lower T
    assert tampo_nucleus([0.1, 0.0, 0.9], 1.0) == [0.1, 0.0, 0.9]  # pi = 0 is never kept
    with pytest.raises(ValueError, match="top_p"):
        tampo_nucleus([1.0], 1.5)


def test_inf_profile_and_empty_episode():
    out = tampo_normalise(torch.tensor([[-math.inf, -1.0, -1.2], [math.nan, -math.inf, -math.inf]],
                                       dtype=torch.float64))
    assert out.tolist()[0] == pytest.approx([0.0, 0.6, 0.4], abs=1e-12)
    assert out.tolist()[1] == [0.0, 0.0, 0.0]  # no finite entry: all zeros (still counted in N)
    sums = tampo_episode_sums(torch.tensor([[-math.inf, -1.0, -1.2], [-1.0, -1.0, -1.0]], dtype=torch.float64),
                              torch.tensor([1.0, -1.0]),
                              TEMPS, n_tokens=torch.tensor([3, 0]))
    assert sums["episodes"] == 2 and sums["nonfinite"] == 1 + 3  # the empty episode's row counts as non-finite
    assert sums["adv_sum"] == pytest.approx([0.0, 0.6, 0.4])


def test_sparsemax_properties():
    v = torch.tensor([[0.3, -0.2, 1.5, 1.4], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    out = sparsemax(v)
    assert out.sum(-1).tolist() == pytest.approx([1.0, 1.0])
    assert out[0].tolist() == pytest.approx([0.0, 0.0, 0.55, 0.45])  # tau = (2.9 - 1) / 2 = 0.95
    assert torch.allclose(sparsemax(v + 7.0), out)  # shift-invariant


def test_per_turn_union_is_a_token_mean_not_a_mean_of_row_means():
    """Episode [1 0 0 0] as rows [1] and [0 0 0] (per-turn mode) gives the token mean over the union."""
    vlp, mask, ep, _, _ = rows_of([TASK1], split={3: [1, 3]})
    ell, n_tok = episode_virtual_likelihoods(vlp, mask, ep)
    assert n_tok.tolist() == [3, 2, 3, 4]
    assert ell[3].tolist() == pytest.approx([-0.718116, -0.641368, -0.680097], abs=1e-6)
    # a mean of the two rows' means would be different (the test can tell them apart)
    rows = vlp[ep == 3]  # (2, T, K)
    m = mask[ep == 3]
    row_means = (rows * m[..., None]).sum(1) / m.sum(1, keepdim=True)
    assert float((row_means.mean(0).double() - ell[3]).abs().max()) > 0.05


def test_virtual_logprob_at_the_sampling_temperature_is_the_old_logprob():
    torch.manual_seed(0)
    z = torch.randn(7, 50) * 3
    ids = torch.randint(0, 50, (7,))
    vlp = virtual_logprobs(z, ids, [0.6, 0.9, 1.3])
    for k, t in enumerate([0.6, 0.9, 1.3]):
        torch.testing.assert_close(vlp[:, k], logprobs_from_logits(z, ids, t), atol=1e-5, rtol=0)
    z[0, 3] = -math.inf
    ids[0] = 3
    assert bool(torch.isinf(virtual_logprobs(z, ids, [1.0])[0]).all())
    big = torch.tensor([[1e4, 0.0, -1e4]])
    assert torch.isfinite(virtual_logprobs(big, torch.tensor([1]), [0.6, 1.5])).all()


def test_resumed_meta_state_draws_what_an_uninterrupted_one_draws():
    rng = torch.Generator().manual_seed(3)
    stats = [torch.randn(3, generator=rng).tolist() for _ in range(8)]
    full = TampoMetaPolicy(TEMPS, top_p=0.9, seed=11)
    draws_full = []
    for step in range(1, 9):
        draws_full.append(full.temperature(step))
        full.observe(stats[step - 1], 4)
    part = TampoMetaPolicy(TEMPS, top_p=0.9, seed=11)
    draws_part = []
    for step in range(1, 5):
        draws_part.append(part.temperature(step))
        part.observe(stats[step - 1], 4)
    state = json.loads(json.dumps(part.state_dict()))  # what extra.json holds
    resumed = TampoMetaPolicy(TEMPS, top_p=0.9, seed=999)  # another seed: the state must carry the RNG
    resumed.load_state_dict(state)
    for step in range(5, 9):
        draws_part.append(resumed.temperature(step))
        resumed.observe(stats[step - 1], 4)
    assert draws_part == draws_full
    assert resumed.state_dict() == full.state_dict()
    assert len(set(draws_full)) > 1  # the draws move: the test can fail
    with pytest.raises(ValueError, match="temps"):
        TampoMetaPolicy([0.6, 1.0], seed=11).load_state_dict(state)


def test_draw_is_idempotent_per_step_and_warmup_uniform():
    meta = TampoMetaPolicy(TEMPS, seed=0, warmup_steps=2)
    meta.ema = [1.0, 0.0, 0.0]
    assert meta.pi(2) == [1 / 3] * 3 and meta.pi(3) == [1.0, 0.0, 0.0]
    t = meta.temperature(1)
    assert all(meta.temperature(1) == t for _ in range(5))
    m = meta.draw_metrics(1)
    assert m["tampo/t"] == t and m["tampo/nucleus_size"] == 3 and m["tampo/pi_entropy"] == pytest.approx(math.log(3))
    assert meta.temperature(3) == 0.6  # pi one-hot after warm-up


def test_bad_candidates_and_schedule():
    for temps in ([], [1.0, 1.0], [1.2, 0.9], [0.0, 1.0]):
        with pytest.raises(ValueError, match="temps"):
            TampoMetaPolicy(temps)
    with pytest.raises(ValueError, match="norm"):
        tampo_normalise(torch.zeros(1, 2), "max")
    assert parse_temperature_schedule("") is None
    spec = parse_temperature_schedule("linear:0.9:1.5")
    assert [scheduled_temperature(spec, s, 4) for s in (1, 2, 3, 4)] == pytest.approx([0.9, 1.1, 1.3, 1.5])
    assert scheduled_temperature(spec, 1, 1) == 0.9
    # an explicit length: the same line whatever the run's total_steps (a run trained in resumed chunks)
    fixed = parse_temperature_schedule("linear:0.9:1.5:4")
    assert [scheduled_temperature(fixed, s, 2) for s in (1, 2)] == pytest.approx([0.9, 1.1])
    assert [scheduled_temperature(fixed, s, 6) for s in (3, 4, 5)] == pytest.approx([1.3, 1.5, 1.5])
    for bad in ("linear:0.9", "cosine:0.9:1.5", "linear:0:1.5", "linear:a:b", "linear:0.9:1.5:0", "linear:1:2:3:4"):
        with pytest.raises(ValueError, match="temperature_schedule"):
            parse_temperature_schedule(bad)


def test_sum_metrics_add_up_over_shards():
    """Two learner ranks' tampo_sum/* added key by key give the whole batch's statistic."""
    ell, adv = statistic_inputs()
    whole = algos.tampo_sum_metrics(tampo_episode_sums(ell, adv, TEMPS), TEMPS)
    parts = [algos.tampo_sum_metrics(tampo_episode_sums(ell[sl], adv[sl], TEMPS), TEMPS)
             for sl in (slice(0, 4), slice(4, 8))]
    for key, value in whole.items():
        assert parts[0][key] + parts[1][key] == pytest.approx(value, abs=1e-12), key
    assert whole["tampo_sum/episodes"] == 8 and whole["tampo_sum/adv/0.6"] / 8 == pytest.approx(0.097381, abs=1e-6)
