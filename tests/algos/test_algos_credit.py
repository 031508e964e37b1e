"""Credit rules at token and turn level (algorithms.md section 5) on a 3-turn episode worked by hand, in per-turn and
full-trajectory mode; invariance to prompt padding / observation gaps; loop-versus-vectorised checks."""

import math

import pytest
import torch

from agent_rl.algos import (
    CreditInputs,
    apply_credit,
    empg_advantages,
    entropy_adv,
    forking_mask,
    next_turn_values,
    tgrl_advantages,
    tp_mask,
    turn_tp_mask,
)

X = 9.0  # value at masked-out positions: must never matter

# One episode of K = 3 turns in per-turn mode (3 rows), T = 6 with prompt positions (mask 0) first.
#   turn 0: mask [0 0 1 1 1 1]  (L = 4)  entropy on masked [0.5 2.0 1.0 0.5] (mean 1.0)  J [0.1 0.3 0.2 0.2] (mean 0.2)
#   turn 1: mask [0 0 0 1 1 0]  (L = 2)  entropy [4.0 2.0]               (mean 3.0)  J [0.5 0.3]         (mean 0.4)
#   turn 2: mask [0 1 1 1 1 1]  (L = 5)  entropy [2.0 1.0 3.0 2.5 1.5]   (mean 2.0)  J zeros             (mean 0.0)
# Episode advantage A = 1 broadcast to the three rows.
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1]], dtype=torch.float32)
ENT = torch.tensor([[X, X, 0.5, 2.0, 1.0, 0.5], [X, X, X, 4.0, 2.0, X], [X, 2.0, 1.0, 3.0, 2.5, 1.5]])
JS = torch.tensor([[X, X, 0.1, 0.3, 0.2, 0.2], [X, X, X, 0.5, 0.3, X], [X, 0.0, 0.0, 0.0, 0.0, 0.0]])


def _inputs(adv=None, **kw):
    base = dict(
        advantages=torch.ones(3) if adv is None else adv,
        response_mask=MASK,
        turn_index=torch.tensor([0, 1, 2]),
        num_turns=torch.tensor([3, 3, 3]),
        episode_index=torch.tensor([7, 7, 7]),
        entropy=ENT,
        js=JS,
    )
    base.update(kw)
    return CreditInputs(**base)


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("level", ["token", "turn"])
def test_uniform(level):
    adv, mask = apply_credit("uniform", _inputs(), 0.7, level)
    torch.testing.assert_close(adv, MASK)
    torch.testing.assert_close(mask, MASK)


def test_tp_token_level_hand():
    # Positions run over the trajectory (the episode's turn rows in turn order): L = 4 + 2 + 5 = 11.
    # S = 0.5: cut floor(5.5) = 5 -> j >= 5: turn 1's 2nd token (j = 5, col 4) and all of turn 2 (j = 6..10).
    adv, mask = apply_credit("tp", _inputs(), 0.5, "token")
    torch.testing.assert_close(mask, _rows([0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0], [0, 1, 1, 1, 1, 1]))
    torch.testing.assert_close(adv, MASK)
    # S = 0 trains every token; S = 0.99 (cut 10) and 1 (cut 11) only the trajectory's last token
    assert torch.equal(apply_credit("tp", _inputs(), 0.0, "token")[1], MASK)
    last = _rows([0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1])
    assert torch.equal(apply_credit("tp", _inputs(), 0.99, "token")[1], last)
    assert torch.equal(apply_credit("tp", _inputs(), 1.0, "token")[1], last)
    # credit.kwargs.scope=turn keeps the per-row reading: turn 0 L = 4, floor(2) = 2 -> j = 2, 3 (cols 4, 5);
    # turn 1 L = 2 -> j = 1 (col 4); turn 2 L = 5, floor(2.5) = 2 -> j = 2, 3, 4 (cols 3, 4, 5)
    _, mask = apply_credit("tp", _inputs(), 0.5, "token", scope="turn")
    torch.testing.assert_close(mask, _rows([0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="scope"):
        apply_credit("tp", _inputs(), 0.5, "token", scope="episode")


def test_tp_trajectory_issue_case_and_turn_order():
    # 3 turns of 10 action tokens, S = 0.5 -> turn 0 untrained, turn 1 tokens 5..9, turn 2 all (15 of 30);
    # the per-row reading trains tokens 5..9 of each turn
    m = torch.ones(3, 10)
    got = tp_mask(m, 0.5, episode_index=torch.tensor([4, 4, 4]))
    want = torch.zeros(3, 10)
    want[1, 5:] = 1
    want[2] = 1
    torch.testing.assert_close(got, want)
    assert tp_mask(m, 0.5).sum(-1).tolist() == [5.0, 5.0, 5.0]
    # the rule reads the turns in turn order even when the batch's rows are not: rows (turn 2, turn 0, turn 1)
    inp = CreditInputs(torch.ones(3), m, turn_index=torch.tensor([2, 0, 1]), num_turns=torch.tensor([3, 3, 3]),
                       episode_index=torch.tensor([4, 4, 4]))
    _, mask = apply_credit("tp", inp, 0.5, "token")
    torch.testing.assert_close(mask, want[[2, 0, 1]])
    # two episodes interleaved in one batch are two trajectories
    got = tp_mask(torch.ones(4, 10), 0.5, episode_index=torch.tensor([0, 1, 0, 1]))
    assert got.sum(-1).tolist() == [0.0, 0.0, 10.0, 10.0]


def test_tp_turn_level_hand():
    # K = 3. S = 0.5: floor(1.5) = 1 -> turns 1, 2 trained. S = 0.9: floor(2.7) = 2 -> turn 2 only.
    # S = 1: floor(3) = 3 -> none by the formula, but the last turn is always trained. S = 0: all.
    _, mask = apply_credit("tp", _inputs(), 0.5, "turn")
    torch.testing.assert_close(mask, MASK * torch.tensor([[0.0], [1.0], [1.0]]))
    for s in (0.9, 1.0):
        torch.testing.assert_close(apply_credit("tp", _inputs(), s, "turn")[1], MASK * torch.tensor([[0.0], [0], [1]]))
    torch.testing.assert_close(apply_credit("tp", _inputs(), 0.0, "turn")[1], MASK)
    assert turn_tp_mask(torch.tensor([0, 1, 2, 3]), torch.tensor([4, 4, 4, 4]), 0.5).tolist() == [0, 0, 1, 1]


def test_forking_token_level_hand():
    # eps = 80th percentile of H over the batch's 11 masked tokens: sorted [0.5 0.5 1 1 1.5 2 2 2 2.5 3 4],
    # position 0.8 * 10 = 8 -> eps = 2.5. S = 0.5: keep H >= 1.25; masked-out entropy 9 is never picked.
    _, mask = apply_credit("forking", _inputs(), 0.5, "token")
    torch.testing.assert_close(mask, _rows([0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 1, 0, 1, 1, 1]))
    # S = 1 is static Forking-Tok: H >= 2.5 -> 4.0 (turn 1), 3.0 and 2.5 (turn 2); S = 0 keeps all
    _, mask = apply_credit("forking", _inputs(), 1.0, "token")
    torch.testing.assert_close(mask, _rows([0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0]))
    assert torch.equal(apply_credit("forking", _inputs(), 0.0, "token")[1], MASK)
    # equal entropies: eps = that value, S <= 1 keeps every token
    assert forking_mask(torch.ones(1, 5), torch.ones(1, 5), 0.6).tolist() == [[1, 1, 1, 1, 1]]


def test_forking_relaxed_threshold_issue_case():
    # 100 tokens with H = 0.01 * rank (rank 1..100), spread over 4 rows: eps = 0.80 + 0.2 * 0.01 = 0.802;
    # S = 0.99 -> H >= 0.794: 21 tokens (ranks 80..100); S = 0.5 -> H >= 0.401: 60 tokens (ranks 41..100)
    shuffle = torch.randperm(100, generator=torch.Generator().manual_seed(0))
    h = (torch.arange(1, 101, dtype=torch.float64) * 0.01)[shuffle]
    h, m = h.reshape(4, 25), torch.ones(4, 25)
    assert int(forking_mask(h, m, 0.99).sum()) == 21
    assert int(forking_mask(h, m, 0.5).sum()) == 60
    assert int(forking_mask(h, m, 1.0).sum()) == 20  # static Forking-Tok: the top 20%
    assert int(forking_mask(h, m, 0.0).sum()) == 100
    assert int(forking_mask(h, m, 1.0, quantile=0.5).sum()) == 50


def test_forking_and_empg_levels_that_make_no_sense_raise():
    with pytest.raises(ValueError, match="forking.*turn"):
        apply_credit("forking", _inputs(), 0.5, "turn")
    with pytest.raises(ValueError, match="empg.*token"):
        apply_credit("empg", _inputs(), 0.5, "token")
    with pytest.raises(ValueError, match="level"):
        apply_credit("tp", _inputs(), 0.5, "episode")
    with pytest.raises(ValueError, match="uniform"):
        apply_credit("unifrom", _inputs(), 0.5, "token")
    with pytest.raises(ValueError, match=r"S must be"):
        apply_credit("tp", _inputs(), 1.5, "token")
    with pytest.raises(ValueError, match="entropy"):
        apply_credit("forking", _inputs(entropy=None), 0.5, "token")


def test_entropy_adv_token_and_turn_hand():
    # token, S = 1, A = 1: A + min(0.4 H, 0.5)
    #   turn 0 H [0.5 2 1 0.5] -> bonus [0.2 0.5 0.4 0.2]; turn 1 H [4 2] -> [0.5 0.5];
    #   turn 2 H [2 1 3 2.5 1.5] -> [0.5 0.4 0.5 0.5 0.5]
    adv, mask = apply_credit("entropy_adv", _inputs(), 1.0, "token")
    want = _rows([0, 0, 1.2, 1.5, 1.4, 1.2], [0, 0, 0, 1.5, 1.5, 0], [0, 1.5, 1.4, 1.5, 1.5, 1.5])
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(mask, MASK)
    # turn, S = 0.5: H per turn = [1, 3, 2] -> bonus 0.5 * min([0.4 1.2 0.8], 0.5) = [0.2 0.25 0.25]
    adv, _ = apply_credit("entropy_adv", _inputs(), 0.5, "turn")
    torch.testing.assert_close(adv, MASK * torch.tensor([[1.2], [1.25], [1.25]]))
    # never flips sign: A = -1, H = 2, S = 1 -> -1 + min(0.8, 0.5) = -0.5
    torch.testing.assert_close(entropy_adv(torch.tensor([-1.0]), torch.tensor([[2.0]]), 1.0), torch.tensor([[-0.5]]))
    a = torch.randn(50)
    out = entropy_adv(a, torch.rand(50, 7) * 20, 1.0)
    assert (torch.sign(out) == torch.sign(a)[:, None]).all()


def test_empg_turn_level_hand():
    # H per turn = [1, 3, 2] -> min-max Hn = [0, 1, 0.5]; exp(-Hn) = [1, 0.367879, 0.606531], mean 0.658137
    # g = [1.519441, 0.558971, 0.921588]; next-turn bonus 0.05 exp(-Hn_next) = [0.018394, 0.030327, 0 (no next)]
    # A_k = g + bonus = [1.537835, 0.589298, 0.921588]; minus the batch mean 1.016240:
    #     [0.521595, -0.426942, -0.094653]
    want = torch.tensor([0.521595, -0.426942, -0.094653])
    adv, mask = apply_credit("empg", _inputs(), 1.0, "turn")
    torch.testing.assert_close(adv, MASK * want[:, None], atol=2e-6, rtol=0)
    # S = 0.5 interpolates with the plain advantage: 0.5 * 1 + 0.5 * A_empg
    adv, _ = apply_credit("empg", _inputs(), 0.5, "turn")
    torch.testing.assert_close(adv, MASK * (0.5 + 0.5 * want)[:, None], atol=2e-6, rtol=0)
    got = empg_advantages(torch.ones(3), torch.tensor([1.0, 3.0, 2.0]), torch.tensor([3.0, 2.0, 0.0]),
                          torch.tensor([True, True, False]))
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match=r"\(B,\)"):
        apply_credit("empg", _inputs(adv=MASK.clone()), 1.0, "turn")


def test_js_token_and_turn_hand():
    # token, S = 1, no quantile clip, normalised over the trajectory (all 11 tokens of the episode):
    #   J = [0.1 0.3 0.2 0.2 | 0.5 0.3 | 0 0 0 0 0], Jbar = 1.6 / 11 = 0.145455, omega = log(1 + J / Jbar)
    #   -> w = omega / mean omega = [0.962207 2.058168 1.590654 1.590654 | 2.740147 2.058168 | ~0 x5]
    #   (a zero-J turn inside a trajectory gets ~0: omega = log(1 + 1e-8 / (Jbar + 1e-8)))
    adv, _ = apply_credit("js", _inputs(), 1.0, "token", quantile_clip=False)
    want = _rows([0, 0, 0.962207, 2.058168, 1.590654, 1.590654], [0, 0, 0, 2.740147, 2.058168, 0],
                 [0, 0, 0, 0, 0, 0])
    torch.testing.assert_close(adv, want, atol=2e-6, rtol=0)
    assert abs(float(adv.sum()) / 11 - 1.0) < 1e-6  # mean 1 over the trajectory
    # with the 5th..95th percentile clip: omega clipped to [0 (5th), 1.157 (95th)] -> 2.740147 becomes 2.475908
    adv, _ = apply_credit("js", _inputs(), 1.0, "token")
    want = _rows([0, 0, 0.992989, 2.124011, 1.64154, 1.64154], [0, 0, 0, 2.475908, 2.124011, 0], [0, 0, 0, 0, 0, 0])
    torch.testing.assert_close(adv, want, atol=2e-6, rtol=0)
    # turn: mean J per turn [0.2, 0.4, 0], episode mean 0.2 -> turn weights [1, 2, 0] (up to the 1e-8 eps)
    adv, _ = apply_credit("js", _inputs(), 1.0, "turn")
    torch.testing.assert_close(adv, MASK * torch.tensor([[1.0], [2.0], [0.0]]), atol=1e-6, rtol=0)
    # S = 0.5: w_S = 1 + 0.5 (w - 1) = [1, 1.5, 0.5]; S = 0: uniform
    adv, _ = apply_credit("js", _inputs(), 0.5, "turn")
    torch.testing.assert_close(adv, MASK * torch.tensor([[1.0], [1.5], [0.5]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(apply_credit("js", _inputs(), 0.0, "token")[0], MASK)


# Full-trajectory mode: the same episode as ONE row: prompt (2), turn 0 (4 tokens), observation (1), turn 1 (2),
# observation (1), turn 2 (5) -> L = 11 masked tokens, T = 15; turn_index 0, num_turns 1.
FT_MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1]], dtype=torch.float32)
FT_ENT = torch.tensor([[X, X, 0.5, 2.0, 1.0, 0.5, X, 4.0, 2.0, X, 2.0, 1.0, 3.0, 2.5, 1.5]])


def _ft_inputs():
    return CreditInputs(
        advantages=torch.ones(1),
        response_mask=FT_MASK,
        turn_index=torch.tensor([0]),
        num_turns=torch.tensor([1]),
        episode_index=torch.tensor([0]),
        entropy=FT_ENT,
        js=torch.zeros(1, 15),
    )


def test_full_trajectory_mode_hand():
    # tp token S = 0.5: floor(5.5) = 5 -> masked j >= 5: the 2nd token of turn 1 (col 8) and all of turn 2
    _, mask = apply_credit("tp", _ft_inputs(), 0.5, "token")
    assert mask.tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1]]
    # tp turn: the turn structure is not visible (K = 1): the whole row is trained
    assert torch.equal(apply_credit("tp", _ft_inputs(), 0.5, "turn")[1], FT_MASK)
    # forking S = 0.5: the same 11 entropies -> eps = 2.5, keep H >= 1.25: 2.0 (3), 4.0 (7), 2.0 (8), 2.0 (10),
    # 3.0 (12), 2.5 (13), 1.5 (14)
    _, mask = apply_credit("forking", _ft_inputs(), 0.5, "token")
    assert mask.tolist() == [[0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 1]]
    # empg on one row: Hn = 0, g = 1, no next turn, minus the batch mean -> 0
    assert (apply_credit("empg", _ft_inputs(), 1.0, "turn")[0] == 0).all()


def _with_gaps(x, mask, new_t, positions):
    """Scatter each row's columns to ``positions[i]`` of a wider row; the other columns are gaps (mask 0, value X)."""
    out = torch.full((x.shape[0], new_t), X, dtype=x.dtype)
    m = torch.zeros((x.shape[0], new_t), dtype=mask.dtype)
    for i, pos in enumerate(positions):
        out[i, pos] = x[i]
        m[i, pos] = mask[i]
    return out, m


@pytest.mark.parametrize(
    "rule,level,kw",
    [
        ("uniform", "token", {}),
        ("tp", "token", {}),
        ("tp", "turn", {}),
        ("forking", "token", {}),
        ("entropy_adv", "token", {}),
        ("entropy_adv", "turn", {}),
        ("empg", "turn", {}),
        ("js", "token", {}),
        ("js", "turn", {}),
    ],
)
def test_prompt_and_gaps_never_change_a_rule(rule, level, kw):
    """Inserting prompt positions / observation gaps (mask 0, any values) anywhere gives the same result on the
    masked tokens and zeros on the gaps: positions are counted among masked tokens only."""
    torch.manual_seed(6)
    b, t = 5, 8
    mask = (torch.rand(b, t) > 0.25).float()
    ent = torch.rand(b, t) * 3
    js = torch.rand(b, t) * 0.6
    adv = torch.randn(b)
    meta = dict(turn_index=torch.tensor([0, 1, 2, 0, 1]), num_turns=torch.tensor([3, 3, 3, 2, 2]),
                episode_index=torch.tensor([0, 0, 0, 1, 1]))
    ref_adv, ref_mask = apply_credit(rule, CreditInputs(adv, mask, entropy=ent, js=js, **meta), 0.5, level, **kw)
    new_t = 14
    positions = [sorted(torch.randperm(new_t)[:t].tolist()) for _ in range(b)]
    ent2, mask2 = _with_gaps(ent, mask, new_t, positions)
    js2, _ = _with_gaps(js, mask, new_t, positions)
    got_adv, got_mask = apply_credit(rule, CreditInputs(adv, mask2, entropy=ent2, js=js2, **meta), 0.5, level, **kw)
    for i, pos in enumerate(positions):
        torch.testing.assert_close(got_mask[i, pos], ref_mask[i])
        torch.testing.assert_close(got_adv[i, pos], ref_adv[i], atol=1e-6, rtol=1e-6)
        gap = [p for p in range(new_t) if p not in pos]
        assert (got_mask[i, gap] == 0).all() and (got_adv[i, gap] == 0).all()


def test_tp_and_forking_loop_vs_vectorised():
    torch.manual_seed(7)
    mask = (torch.rand(20, 17) > 0.4).float()
    ent = torch.randint(0, 4, (20, 17)).float()  # many ties
    episode = torch.randint(0, 6, (20,))  # rows of an episode taken in row order
    for s in (0.0, 0.13, 0.29, 0.5, 0.7, 0.99, 1.0):
        tp = tp_mask(mask, s)
        tp_ep = tp_mask(mask, s, episode_index=episode)
        fk = forking_mask(ent, mask, s)
        for i in range(20):
            pos = mask[i].nonzero().flatten().tolist()
            n = len(pos)
            cut = math.floor(round(n * s, 9))
            want = torch.zeros(17)
            for j, p in enumerate(pos):
                want[p] = float(j >= cut or j == n - 1)
            torch.testing.assert_close(tp[i], want)
        for e in episode.unique().tolist():
            rows = (episode == e).nonzero().flatten().tolist()
            flat = [(r, p) for r in rows for p in mask[r].nonzero().flatten().tolist()]
            cut = math.floor(round(len(flat) * s, 9))
            want = torch.zeros(20, 17)
            for j, (r, p) in enumerate(flat):
                want[r, p] = float(j >= cut or j == len(flat) - 1)
            torch.testing.assert_close(tp_ep[rows], want[rows])
        h = sorted(ent[mask > 0].tolist())
        q = 0.8 * (len(h) - 1)
        eps = h[int(q)] + (q - int(q)) * (h[min(int(q) + 1, len(h) - 1)] - h[int(q)])
        want = ((ent >= s * eps) & (mask > 0)).float()
        torch.testing.assert_close(fk, want)


def test_decimal_s_rounds_like_the_math():
    # 0.29 * 100 = 28.999999999999996 in binary; floor must give 29 -> tokens 29..99 trained (71 tokens)
    assert int(tp_mask(torch.ones(1, 100), 0.29).sum()) == 71
    assert int(tp_mask(torch.ones(4, 25), 0.29, episode_index=torch.zeros(4, dtype=torch.long)).sum()) == 71


def test_next_turn_values_loop_vs_vectorised():
    ep = torch.tensor([5, 5, 5, 9, 9, 2, 5])
    turn = torch.tensor([0, 2, 1, 1, 0, 0, 3])
    vals = torch.tensor([10.0, 12.0, 11.0, 21.0, 20.0, 30.0, 13.0])
    nxt, has = next_turn_values(vals, ep, turn)
    lut = {(int(e), int(k)): float(v) for e, k, v in zip(ep, turn, vals)}
    for i in range(len(ep)):
        key = (int(ep[i]), int(turn[i]) + 1)
        assert bool(has[i]) == (key in lut)
        assert float(nxt[i]) == lut.get(key, 0.0)


def test_composition_with_tgrl_and_tp():
    # algo=tgrl credit=tp: the TP mask applies on top of the JS-weighted advantage (algorithms.md section 5, last line)
    r = torch.tensor([0.0, 1.0, 0.0, 1.0])
    high = torch.tensor([False, True, True, True])
    js = torch.rand(4, 6) * 0.5
    mask = torch.ones(4, 6)
    adv_t = tgrl_advantages(r, torch.zeros(4, dtype=torch.long), high, js, mask)
    inp = CreditInputs(adv_t, mask, torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long),
                       torch.arange(4), entropy=None, js=js, is_high=high)
    adv, lmask = apply_credit("tp", inp, 0.5, "token")
    torch.testing.assert_close(adv, adv_t)
    assert lmask[:, :3].sum() == 0 and (lmask[:, 3:] == 1).all()


def test_safety_empty_rows_and_empty_batch():
    mask = torch.zeros(2, 4)
    mask[1, 2] = 1
    inp = CreditInputs(torch.tensor([1.0, -1.0]), mask, torch.tensor([0, 0]), torch.tensor([1, 1]),
                       torch.tensor([0, 1]), entropy=torch.rand(2, 4), js=torch.rand(2, 4))
    for rule, level in [("uniform", "token"), ("tp", "token"), ("tp", "turn"), ("forking", "token"),
                        ("entropy_adv", "token"), ("entropy_adv", "turn"), ("empg", "turn"), ("js", "token"),
                        ("js", "turn")]:
        for s in (0.0, 0.5, 1.0):
            adv, m = apply_credit(rule, inp, s, level)
            assert torch.isfinite(adv).all() and (m[0] == 0).all() and (adv[0] == 0).all()
    empty = CreditInputs(torch.zeros(0), torch.zeros(0, 4), torch.zeros(0, dtype=torch.long),
                         torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                         entropy=torch.zeros(0, 4), js=torch.zeros(0, 4))
    for rule, level in [("tp", "token"), ("forking", "token"), ("empg", "turn"), ("js", "turn")]:
        adv, m = apply_credit(rule, empty, 0.5, level)
        assert adv.shape == (0, 4) and m.shape == (0, 4)
