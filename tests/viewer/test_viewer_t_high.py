"""The viewer's overview draws the step's T1 (``tgrl/t_high``, logged by every TGRL run; picked per step under
``algo.t_high=auto``) and leaves the panel out for runs without it."""

from __future__ import annotations

import json

from agent_rl.viewer.data import Filters, RunReader

TITLE = "T1 (TGRL; algo.t_high=auto picks it per step)"


def test_t1_curve_for_tgrl_runs_only(tmp_path):
    picks = [1.2, 1.0, 1.2, 1.4]
    rows = [{"step": s, "kind": "train", "reward/mean": 0.5, "tgrl/t_high": t} for s, t in enumerate(picks, 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curves = dict(RunReader(tmp_path).curves(Filters()))
    assert curves[TITLE] == {"tgrl/t_high": ([1.0, 2.0, 3.0, 4.0], picks)}
    grpo = [{k: v for k, v in r.items() if k != "tgrl/t_high"} for r in rows]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in grpo))
    assert TITLE not in dict(RunReader(tmp_path).curves(Filters()))
