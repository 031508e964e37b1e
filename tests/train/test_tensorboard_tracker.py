"""TensorBoard as a tracker (``agent_rl.trackers.TensorBoardTracker``): the logger attaches one per phase and hands
it every row it writes to ``metrics.jsonl`` (each non-null value at the row's step, the calibration row's numbers as
``calibration/...``); the warm start's events go to ``tb/warm_start``; checkpoints reach the run's trackers through
the logger; closing the logger detaches the phase's TensorBoard and leaves the run's trackers open."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_rl.logging import MetricsLogger
from agent_rl.trackers import TensorBoardTracker, Trackers

pytest.importorskip("tensorboard")


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of the one event file in ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = folder.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class Recorder:
    """A run tracker that records its calls."""

    name = "recorder"
    run_id = "r1"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        self.calls.append(("log", step, kind, dict(metrics)))

    def rewind(self, step: int) -> None:
        self.calls.append(("rewind", step))

    def checkpoint(self, step: int, path: Path) -> None:
        self.calls.append(("checkpoint", step, path))

    def files(self, paths: list[Path]) -> None:
        self.calls.append(("files", paths))

    def close(self) -> None:
        self.calls.append(("close",))


def test_rows_reach_tensorboard_and_the_run_trackers(tmp_path: Path) -> None:
    run = Recorder()
    trackers = Trackers([run])
    logger = MetricsLogger(tmp_path, total_steps=2, progress=False, phase="rl", trackers=trackers)
    assert [t.name for t in trackers.attached] == ["tensorboard"]
    logger.log_calibration({"pairs": [{"t_low": 0.3, "t_high": 0.8, "score": 0.125},
                                      {"t_low": 0.3, "t_high": 1.2, "score": 0.25}],
                            "chosen": {"t_low": 0.3, "t_high": 1.2}})
    logger.log(1, {"reward/mean": 0.5, "eval/p/success": 0.75, "extra": None}, kind="train")
    logger.checkpoint(1, tmp_path / "checkpoints" / "step_1")
    logger.close()
    assert trackers.attached == [] and trackers.trackers == [run]  # the run's tracker stays open (its owner's)
    tb = scalars(tmp_path / "tb")
    assert tb["calibration/t_high"] == [(0, 1.2)] and tb["calibration/score/0.3_0.8"] == [(0, 0.125)]
    assert tb["reward/mean"] == [(1, 0.5)] and tb["eval/p/success"] == [(1, 0.75)]
    assert tb["actor/skipped_nonfinite"] == [(1, 0.0)]
    assert "extra" not in tb and "actor/pg_loss" not in tb  # nulls are not scalars
    assert [c[:3] for c in run.calls] == [("log", 0, "calibration"), ("log", 1, "train"), ("log", 1, "eval"),
                                          ("checkpoint", 1, tmp_path / "checkpoints" / "step_1")]
    assert {k for c in run.calls if c[0] == "log" for k in c[3]} == set(tb)  # the same numbers in both


def test_warm_start_events_in_their_own_folder_and_no_tensorboard_when_off(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, total_steps=1, progress=False, phase="warm_start")
    logger.log(1, {"sft/loss": 1.5}, kind="sft")
    logger.close()
    assert scalars(tmp_path / "tb" / "warm_start")["sft/loss"] == [(1, 1.5)]
    off = MetricsLogger(tmp_path / "off", total_steps=1, tensorboard=False, progress=False)
    assert off.trackers.attached == []
    off.close()
    assert not (tmp_path / "off" / "tb").exists()


def test_a_failing_tensorboard_warns_once_and_the_file_goes_on(tmp_path: Path, capsys) -> None:
    logger = MetricsLogger(tmp_path, total_steps=2, progress=False)
    tb = logger.trackers.attached[0]
    assert isinstance(tb, TensorBoardTracker)
    tb._writer.close()
    tb.log = lambda *a: (_ for _ in ()).throw(OSError("disk full"))  # type: ignore[method-assign]
    logger.log(1, {"reward/mean": 0.5})
    logger.log(2, {"reward/mean": 0.25})
    logger.close()
    assert capsys.readouterr().err.count("tracker tensorboard failed in log") == 1
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
