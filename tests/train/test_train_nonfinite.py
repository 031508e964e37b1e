"""A run whose learner meets a non-finite loss (``agent_rl.train.main``, tiny model, ChooseItem in-process): the step's
update is skipped, every ``train`` row of metrics.jsonl holds ``actor/skipped_nonfinite`` (0 or 1), the progress line
says ``update=skipped_nonfinite``, and ``trainer.max_nonfinite_skips`` skips in a row stop the run with the cause."""

from __future__ import annotations

import math

import pytest

from agent_rl.learner.learner import Learner
from agent_rl.logging import read_metrics
from agent_rl.loop import NonFiniteUpdates, check_nonfinite_skips
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: a real training run

SMALL = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.tasks_per_step=1", "rollout.max_turns=2",
         "engine.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[jsonl]", "algo=grpo",
         "trainer.save_every=100"]


def test_nonfinite_loss_from_step_2_skips_and_stops_the_run(tmp_path, monkeypatch, capsys):
    update, micro = Learner.update, Learner._micro_loss

    def update_at(self, batch, *, step, total_steps):
        self.at_step = step
        return update(self, batch, step=step, total_steps=total_steps)

    def micro_loss(self, *a, **k):  # from step 2 on, the loss overflows (as an unstable update's would)
        loss, m = micro(self, *a, **k)
        return (loss * math.inf if self.at_step >= 2 else loss), m

    monkeypatch.setattr(Learner, "update", update_at)
    monkeypatch.setattr(Learner, "_micro_loss", micro_loss)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteUpdates, match=r"2 updates in a row \(steps 2..3\).*max_nonfinite_skips=2"):
        main([*SMALL, f"trainer.output_dir={out}", "trainer.total_steps=6", "trainer.max_nonfinite_skips=2"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["actor/skipped_nonfinite"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[0]["actor/grad_norm"] is not None and rows[1]["actor/grad_norm"] is None  # inf: logged as null
    err = capsys.readouterr().err
    assert "step 2:" in err and "update=skipped_nonfinite" in err and "update skipped, nothing applied" in err


def test_check_nonfinite_skips():
    check_nonfinite_skips(5, 0, 1, {})  # no skip: nothing
    check_nonfinite_skips(5, 2, 3, {})  # under the limit: a warning
    check_nonfinite_skips(5, 9, 0, {})  # 0: never stops
    with pytest.raises(NonFiniteUpdates, match="steps 3..5"):
        check_nonfinite_skips(5, 3, 3, {"actor/pg_loss": None})
