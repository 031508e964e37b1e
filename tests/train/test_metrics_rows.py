"""The rows of ``metrics.jsonl`` (docs/training.md, "The rows of metrics.jsonl"): each row has its kind, written by
``MetricsLogger`` and read by the one reader ``read_metrics``; a repeated step's last row wins; lines written before
rows had a kind are read as what they hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl.logging import SECTION6_METRICS, MetricsLogger, metrics_by_step, read_metrics


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_logger_writes_one_row_per_kind(tmp_path):
    logger = MetricsLogger(tmp_path, total_steps=2, tensorboard=False, progress=False)
    logger.log(0, {"eval/p/success": 0.25}, kind="eval")
    first = logger.log(1, {"reward/mean": 0.5, "batch/rows": 8})
    logger.log(2, {"reward/mean": 1.0, "batch/rows": 8, "eval/p/success": 0.75, "eval/p/mean_turns": float("nan")})
    logger.close()
    written = lines(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in written] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    assert written[0] == {"step": 0, "kind": "eval", "eval/p/success": 0.25}  # no training name, not even null
    assert written[3] == {"step": 2, "kind": "eval", "eval/p/success": 0.75, "eval/p/mean_turns": None}
    train = [r for r in written if r["kind"] == "train"]
    assert all(set(SECTION6_METRICS) <= set(r) and not any(k.startswith("eval/") for k in r) for r in train)
    assert first == written[1] and first["success/rate"] is None and first["batch/rows"] == 8.0
    assert read_metrics(tmp_path / "metrics.jsonl") == written  # already in order, nothing repeated
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "eval")] == [0, 2]
    assert sorted(metrics_by_step(tmp_path / "metrics.jsonl", "train")) == [1, 2]


def test_sft_rows_hold_no_rl_names(tmp_path):
    logger = MetricsLogger(tmp_path, total_steps=1, tensorboard=False, progress=False)
    logger.log(1, {"sft/loss": 1.5, "actor/grad_norm": 0.1}, kind="sft")
    logger.close()
    assert lines(tmp_path / "metrics.jsonl") == [{"step": 1, "kind": "sft", "actor/grad_norm": 0.1,
                                                  "sft/loss": 1.5}]
    assert read_metrics(tmp_path / "metrics.jsonl", "train") == []


def test_bad_kinds_are_refused(tmp_path):
    logger = MetricsLogger(tmp_path, total_steps=1, tensorboard=False, progress=False)
    with pytest.raises(ValueError, match="unknown metrics row kind 'training'; the kinds are calibration, train, sft, eval"):
        logger.log(1, {"reward/mean": 0.0}, kind="training")
    with pytest.raises(ValueError, match=r"an eval row holds only eval/ names; got \['reward/mean'\]"):
        logger.log(0, {"reward/mean": 0.0, "eval/p/success": 1.0}, kind="eval")
    logger.close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # nothing half written
    with pytest.raises(ValueError, match="unknown metrics row kind 'evals'"):
        read_metrics(tmp_path / "metrics.jsonl", "evals")


def test_the_last_row_of_a_repeated_step_wins(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "kind": "eval", "eval/p/success": 0.0},
            {"step": 1, "kind": "train", "reward/mean": 0.1},
            {"step": 2, "kind": "train", "reward/mean": 0.2},  # logged, then the run crashed before its checkpoint
            {"step": 2, "kind": "train", "reward/mean": 0.3},  # the resumed run's step 2
            {"step": 2, "kind": "eval", "eval/p/success": 0.5},
            {"step": 0, "kind": "eval", "eval/p/success": 0.4}]  # a repeated evaluation: the later one
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "kind": "tr')  # a line being written
    got = read_metrics(path)
    assert [(r["kind"], r["step"], r.get("reward/mean", r.get("eval/p/success"))) for r in got] == [
        ("eval", 0, 0.4), ("train", 1, 0.1), ("train", 2, 0.3), ("eval", 2, 0.5)]
    assert read_metrics(tmp_path / "missing.jsonl") == []


def test_lines_without_a_kind_are_read_as_what_they_hold(tmp_path):
    path = tmp_path / "metrics.jsonl"
    old = [{"step": 0, **{name: None for name in SECTION6_METRICS}, "eval/p/success": 0.25},  # the old step-0 line
           {"step": 1, "reward/mean": 0.5, "batch/rows": 4.0},
           {"step": 2, "reward/mean": 1.0, "eval/p/success": 0.75},  # an evaluation merged into its step's line
           {"step": 1.0, "sft/loss": 2.0, "actor/grad_norm": 0.5},
           {"reward/mean": 1.0}, {"step": "3"}, {"step": True}, [1, 2]]  # no (integer) step: no row
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    got = read_metrics(path)
    assert [(r["kind"], r["step"]) for r in got] == [("eval", 0), ("train", 1), ("sft", 1), ("train", 2),
                                                     ("eval", 2)]
    assert got[0] == {"step": 0, "kind": "eval", "eval/p/success": 0.25}
    assert got[3] == {"step": 2, "kind": "train", "reward/mean": 1.0}
    assert got[4] == {"step": 2, "kind": "eval", "eval/p/success": 0.75}
    assert got[2] == {"step": 1, "kind": "sft", "sft/loss": 2.0, "actor/grad_norm": 0.5}


def test_a_resumed_logger_drops_the_steps_that_run_again(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "kind": "eval"}, {"step": 1, "kind": "train"}, {"step": 2, "kind": "train"},
            {"step": 2, "kind": "eval"}, {"step": 3, "kind": "train"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{cut")
    MetricsLogger(tmp_path, total_steps=4, start_step=3, tensorboard=False, progress=False).close()
    assert [(r["kind"], r["step"]) for r in lines(path)] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    # a run from step 1 again (resume=auto without a checkpoint) evaluates step 0 again: nothing old is kept
    MetricsLogger(tmp_path, total_steps=4, start_step=1, tensorboard=False, progress=False).close()
    assert path.read_text() == ""
