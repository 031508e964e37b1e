"""TGRL's calibrated temperatures (algorithms.md section 3b): the hand example through the public function, ties,
the medium filter, refusals."""

from __future__ import annotations

import pytest

from agent_rl.algos import calibration_scores, candidate_pairs, medium_tasks

# section 3b's example: P = 3 tasks, n = 4 episodes, T_low = [0.3], T_high = [0.8, 1.0, 1.2]
REWARDS = {
    0.3: [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]],
    0.8: [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]],
    1.0: [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]],
    1.2: [[1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]],
}
FORMAT = {0.3: [1, 1, 1], 0.8: [1, 0.95, 0.95], 1.0: [0.9, 0.85, 0.9], 1.2: [0.6, 0.5, 0.6]}
RECORDS = [{"task": i, "temperature": t, "rewards": REWARDS[t][i], "format_rate": FORMAT[t][i]}
           for t in REWARDS for i in range(3)]
# the section's numbers (6 digits)
EXPECTED = {
    (0.3, 0.8): dict(gain_std=0.235702, pos=0.666667, var=0.180556, ext=0.983333, elig=1.0, score=1.095605),
    (0.3, 1.0): dict(gain_std=0.353553, pos=0.666667, var=0.194444, ext=0.941667, elig=1.0, score=1.163427),
    (0.3, 1.2): dict(gain_std=0.353553, pos=0.0, var=0.125, ext=0.783333, elig=0.0, score=0.301429),
}


def test_hand_example_every_statistic_score_and_choice() -> None:
    out = calibration_scores(RECORDS, [0.3], [0.8, 1.0, 1.2])
    assert [(p["t_low"], p["t_high"]) for p in out["pairs"]] == list(EXPECTED)
    for pair in out["pairs"]:
        assert set(pair) == {"t_low", "t_high", "gain_std", "pos", "var", "ext", "elig", "score"}
        for key, value in EXPECTED[(pair["t_low"], pair["t_high"])].items():
            assert pair[key] == pytest.approx(value, abs=1e-6), (pair["t_low"], pair["t_high"], key)
    assert out["chosen"] == {"t_low": 0.3, "t_high": 1.0}
    assert out["tasks"] == [0, 1, 2] and out["dropped_tasks"] == []


def test_hand_example_by_hand_for_one_pair() -> None:
    """(0.3, 1.0) from the definitions: gains [-0.5, 0.25, 0.25], v_i [1/6, 1/8, 7/24], x_i [0.95, 0.925, 0.95]."""
    gains = [-0.5, 0.25, 0.25]
    gain_std = (sum(g * g for g in gains) / 3) ** 0.5  # mean gain 0
    var = (1 / 6 + 1 / 8 + 7 / 24) / 3
    ext = (0.95 + 0.925 + 0.95) / 3
    score = (gain_std + 0.5 * 2 / 3 + 0.25 * var + 0.5 * 1.0) * ext
    pair = next(p for p in calibration_scores(RECORDS, [0.3], [1.0])["pairs"])
    assert pair["gain_std"] == pytest.approx(gain_std, abs=1e-12)
    assert pair["var"] == pytest.approx(var, abs=1e-12)
    assert pair["ext"] == pytest.approx(ext, abs=1e-12)
    assert pair["score"] == pytest.approx(score, abs=1e-12)


def test_medium_filter_keeps_tasks_1_and_2() -> None:
    assert medium_tasks(RECORDS, 0.3, 1.0) == [1, 2]  # task 0: max pass 1 > 0.8


def test_medium_filter_none_qualifies_gives_empty() -> None:
    # every task either always wins or never varies: nothing is "medium" (the caller then keeps every task)
    recs = [{"task": i, "temperature": t, "rewards": [1, 1] if i == 0 else [0, 0], "format_rate": 1.0}
            for t in (0.3, 1.0) for i in range(2)]
    assert medium_tasks(recs, 0.3, 1.0) == []


def test_ties_go_to_lower_t_high_then_lower_t_low() -> None:
    # identical records at every temperature: every pair scores the same
    recs = [{"task": i, "temperature": t, "rewards": [1, 0], "format_rate": 1.0}
            for t in (0.3, 0.4, 0.8, 1.0) for i in range(2)]
    out = calibration_scores(recs, [0.4, 0.3], [1.0, 0.8])
    scores = {p["score"] for p in out["pairs"]}
    assert len(scores) == 1
    assert out["chosen"] == {"t_low": 0.3, "t_high": 0.8}


def test_only_pairs_with_t_high_above_t_low() -> None:
    assert candidate_pairs([0.3, 1.0], [0.8, 1.0, 1.2]) == [(0.3, 0.8), (0.3, 1.0), (0.3, 1.2), (1.0, 1.2)]


def test_single_sample_has_zero_variance() -> None:
    recs = [{"task": 0, "temperature": t, "rewards": [r], "format_rate": 1.0} for t, r in ((0.3, 0), (1.0, 1))]
    pair = calibration_scores(recs, [0.3], [1.0])["pairs"][0]
    assert pair["var"] == 0.0 and pair["elig"] == 0.0 and pair["pos"] == 1.0


def test_a_task_missing_a_temperature_is_dropped_and_named() -> None:
    recs = [r for r in RECORDS if not (r["task"] == 2 and r["temperature"] == 1.2)]
    out = calibration_scores(recs, [0.3], [0.8, 1.0, 1.2])
    assert out["tasks"] == [0, 1] and out["dropped_tasks"] == [2]


@pytest.mark.parametrize("t_low, t_high, match", [
    ([1.2], [0.8, 1.0], "no candidate pair"),
    ([0.0], [1.0], "> 0"),
    ([0.3], [-1.0], "> 0"),
    ([0.3], [float("nan")], "finite"),
])
def test_refusals(t_low: list[float], t_high: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        calibration_scores(RECORDS, t_low, t_high)


def test_no_task_with_every_temperature_is_refused() -> None:
    with pytest.raises(ValueError, match="every candidate temperature"):
        calibration_scores([r for r in RECORDS if r["temperature"] != 0.3], [0.3], [1.0])


def test_malformed_records_are_refused() -> None:
    with pytest.raises(ValueError, match="needs task, temperature"):
        calibration_scores([{"task": 0, "rewards": [1]}], [0.3], [1.0])
    with pytest.raises(ValueError, match="two probe records"):
        calibration_scores(RECORDS + RECORDS[:1], [0.3], [0.8])
    with pytest.raises(ValueError, match="finite"):
        calibration_scores([{"task": 0, "temperature": 0.3, "rewards": [float("nan")], "format_rate": 1.0}],
                           [0.3], [1.0])
