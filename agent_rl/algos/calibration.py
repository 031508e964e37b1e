"""TGRL's calibrated temperatures (algorithms.md section 3b, ``algo.calibration=probe``): score every candidate pair
(T_low, T_high) from probe episodes played at each candidate temperature, and keep the best.

Pure Python (no torch): the probe's episodes are played by the run (:mod:`agent_rl.calibration`); this module only
turns their per-task records into the section's statistics, so the hand example of section 3b is a unit test of
:func:`calibration_scores`.

Source: the TGRL authors' small-model practice (their only sub-4B experiment, Qwen3-1.7B), as specified in
algorithms.md section 3b: per task, the pass rate, the reward variance and the format rate at each temperature;
per pair, the spread of the per-task gains, the fraction of tasks the high temperature helps, the mean variance, the
eligible fraction, and a multiplicative penalty for broken formats.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

#: the section's eligibility thresholds: v_i >= 0.01 and x_i >= 0.9
ELIGIBLE_MIN_VAR = 0.01
ELIGIBLE_MIN_FORMAT = 0.9
#: the medium filter: 0.05 <= max(pass_i(L), pass_i(H)) <= 0.8, v_i > 0.01, x_i >= 0.9
MEDIUM_MIN_PASS, MEDIUM_MAX_PASS = 0.05, 0.8
#: the score's weights: gain_std + 0.5 pos + 0.25 var + 0.5 elig, times max(1e-8, ext)
SCORE_WEIGHTS = {"gain_std": 1.0, "pos": 0.5, "var": 0.25, "elig": 0.5}
EXT_FLOOR = 1e-8
#: scores this close count as a tie (float sums of the same terms in another order differ by ~1e-16)
SCORE_TIE = 1e-12
#: the keys of one pair object (the ``calibration`` row's ``pairs``)
PAIR_KEYS = ("t_low", "t_high", "gain_std", "pos", "var", "ext", "elig", "score")


def candidate_pairs(t_low: Iterable[float], t_high: Iterable[float]) -> list[tuple[float, float]]:
    """Every (L, H) with L in ``t_low``, H in ``t_high`` and H > L, in the lists' order (L outer).

    Raises:
        ValueError: a temperature <= 0 or not finite, or no pair with T_high > T_low.
    """
    lows, highs = [float(t) for t in t_low], [float(t) for t in t_high]
    bad = [t for t in lows + highs if not (math.isfinite(t) and t > 0)]
    if bad:
        raise ValueError(f"calibration temperatures must be finite and > 0 (got {bad}); t_low={lows}, t_high={highs}")
    pairs = [(lo, hi) for lo in lows for hi in highs if hi > lo]
    if not pairs:
        raise ValueError(f"no candidate pair with T_high > T_low (t_low={lows}, t_high={highs}): "
                         "give at least one high temperature above a low one")
    return pairs


def task_statistics(rewards: Sequence[float], format_rate: float) -> dict[str, float]:
    """One task at one temperature: ``pass`` (mean reward), ``var`` (sample variance, divisor n - 1; 0 when n = 1)
    and ``ext`` (the format rate as given).

    Raises:
        ValueError: no reward, or a reward or format rate that is not finite.
    """
    r = [float(x) for x in rewards]
    if not r or not all(math.isfinite(x) for x in r) or not math.isfinite(float(format_rate)):
        raise ValueError(f"a probe record needs >= 1 finite reward and a finite format rate (got {rewards}, "
                         f"{format_rate})")
    n = len(r)
    mean = sum(r) / n
    var = sum((x - mean) ** 2 for x in r) / (n - 1) if n > 1 else 0.0
    return {"pass": mean, "var": var, "ext": float(format_rate)}


def _index(records: Sequence[dict[str, Any]]) -> tuple[list[Any], dict[tuple[Any, float], dict[str, float]]]:
    """Tasks in first-seen order and ``{(task, temperature): task_statistics}``.

    Raises:
        ValueError: a record without its keys, or two records of one task and temperature.
    """
    tasks: list[Any] = []
    stats: dict[tuple[Any, float], dict[str, float]] = {}
    for rec in records:
        try:
            key = (rec["task"], float(rec["temperature"]))
            rewards, fmt = rec["rewards"], rec["format_rate"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a probe record needs task, temperature, rewards and format_rate: {rec!r}") from exc
        if key in stats:
            raise ValueError(f"two probe records of task {key[0]!r} at temperature {key[1]:g}")
        if key[0] not in tasks:
            tasks.append(key[0])
        stats[key] = task_statistics(rewards, fmt)
    return tasks, stats


def _pstd(xs: Sequence[float]) -> float:
    """Population standard deviation (divisor len)."""
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def pair_statistics(tasks: Sequence[Any], stats: dict[tuple[Any, float], dict[str, float]], low: float,
                    high: float) -> dict[str, float]:
    """Section 3b's statistics and score of the pair (``low``, ``high``) over ``tasks`` (each must have a record at
    both temperatures): a dict with :data:`PAIR_KEYS`."""
    gains, vs, xs, elig = [], [], [], []
    for t in tasks:
        lo, hi = stats[(t, low)], stats[(t, high)]
        gains.append(hi["pass"] - lo["pass"])
        v, x = (lo["var"] + hi["var"]) / 2, (lo["ext"] + hi["ext"]) / 2
        vs.append(v)
        xs.append(x)
        elig.append(v >= ELIGIBLE_MIN_VAR and x >= ELIGIBLE_MIN_FORMAT)
    p = len(tasks)
    out = {"t_low": float(low), "t_high": float(high), "gain_std": _pstd(gains),
           "pos": sum(g > 0 for g in gains) / p, "var": sum(vs) / p, "ext": sum(xs) / p, "elig": sum(elig) / p}
    out["score"] = (sum(w * out[k] for k, w in SCORE_WEIGHTS.items())) * max(EXT_FLOOR, out["ext"])
    return out


def calibration_scores(records: Sequence[dict[str, Any]], t_low: Iterable[float], t_high: Iterable[float]
                       ) -> dict[str, Any]:
    """Score every candidate pair of section 3b and choose one.

    Args:
        records: one dict per task and temperature, ``{"task": id, "temperature": float, "rewards": [float, ...],
            "format_rate": float}`` (the format rate already averaged over that task's episodes: the mean of
            1 - the episode's invalid-action fraction, or for single-turn math/code the fraction of episodes whose
            final answer the grader extracted).
        t_low, t_high: the candidate lists (``algo.calibration.t_low`` / ``t_high``); only pairs with H > L count.
    Returns:
        ``{"pairs": [pair, ...], "chosen": {"t_low", "t_high"}, "tasks": [id, ...], "dropped_tasks": [id, ...]}``:
        each pair a dict of :data:`PAIR_KEYS` (``gain_std`` population std of the per-task gains pass_i(H) -
        pass_i(L), ``pos`` the fraction of tasks with a positive gain, ``var`` the mean of v_i = (var_i(L) +
        var_i(H))/2, ``ext`` the mean of x_i = (ext_i(L) + ext_i(H))/2, ``elig`` the fraction with v_i >= 0.01 and
        x_i >= 0.9, ``score`` = (gain_std + 0.5 pos + 0.25 var + 0.5 elig) * max(1e-8, ext)); the highest score
        wins, ties to the lower T_high, then the lower T_low. ``tasks``: the tasks scored, those with a record at
        every candidate temperature; ``dropped_tasks``: the others (a probe group that failed), named, not scored.
    Raises:
        ValueError: an invalid candidate list (:func:`candidate_pairs`), a malformed record, or no task with a
            record at every candidate temperature.
    """
    pairs = candidate_pairs(t_low, t_high)
    temps = sorted({t for pair in pairs for t in pair})
    tasks, stats = _index(records)
    kept = [t for t in tasks if all((t, temp) in stats for temp in temps)]
    if not kept:
        raise ValueError(f"no probed task has a record at every candidate temperature {temps}: nothing to score")
    scored = [pair_statistics(kept, stats, lo, hi) for lo, hi in pairs]
    top = max(p["score"] for p in scored)
    best = min((p for p in scored if p["score"] >= top - SCORE_TIE), key=lambda p: (p["t_high"], p["t_low"]))
    return {"pairs": scored, "chosen": {"t_low": best["t_low"], "t_high": best["t_high"]}, "tasks": kept,
            "dropped_tasks": [t for t in tasks if t not in kept]}


def medium_tasks(records: Sequence[dict[str, Any]], t_low: float, t_high: float) -> list[Any]:
    """The medium filter of section 3b for the chosen pair: the probed tasks with 0.05 <= max(pass_i(L), pass_i(H))
    <= 0.8, v_i > 0.01 and x_i >= 0.9, in first-seen order. An empty list means none qualifies (the caller then keeps
    every task, the reference's fallback, and says so)."""
    tasks, stats = _index(records)
    out = []
    for t in tasks:
        lo, hi = stats.get((t, float(t_low))), stats.get((t, float(t_high)))
        if lo is None or hi is None:
            continue
        v, x = (lo["var"] + hi["var"]) / 2, (lo["ext"] + hi["ext"]) / 2
        if MEDIUM_MIN_PASS <= max(lo["pass"], hi["pass"]) <= MEDIUM_MAX_PASS and v > ELIGIBLE_MIN_VAR \
                and x >= ELIGIBLE_MIN_FORMAT:
            out.append(t)
    return out
