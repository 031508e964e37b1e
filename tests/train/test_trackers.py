"""agent_rl.trackers: W&B (offline) and MLflow (file store) through their real clients, read back; a tracker that
fails warns once and the run goes on; trainer.tensorboard is refused with the key that replaced it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.trackers import Trackers, TrackingConfig

wandb = pytest.importorskip("wandb")
pytest.importorskip("mlflow")


def wandb_records(run_dir: Path) -> list:
    """The records of the offline run in ``run_dir/wandb`` (its ``run-*.wandb`` file: the LevelDB log format of
    wandb's transaction log, 32 KiB blocks of [crc32 4][length 2][type 1] chunks after a 7-byte header), parsed with
    wandb's own protobuf ``Record`` (wandb 0.31 ships no Python reader of the file)."""
    from wandb.proto import wandb_internal_pb2 as pb

    path, = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return wandb_file_records(path)


def wandb_file_records(path: Path) -> list:
    """The records of one offline run file (``wandb_records``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks, buf = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # FULL
            chunks.append(chunk)
        elif kind == 2:  # FIRST
            buf = chunk
        elif kind == 3:  # MIDDLE
            buf += chunk
        elif kind == 4:  # LAST
            chunks.append(buf + chunk)
        elif kind == 0 and length == 0:  # zero padding to the block's end
            pos += left - 7
    return [pb.Record.FromString(c) for c in chunks]


def wandb_history(run_dir: Path, records: list | None = None) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` of the offline run (the ``history`` records; of ``records`` when given)."""
    import json

    out: dict[int, dict[str, float]] = {}
    for rec in wandb_records(run_dir) if records is None else records:
        if rec.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            out[int(row["_step"])] = {k: v for k, v in row.items() if not k.startswith("_")}
    return out


def mlflow_run(run_dir: Path, run_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    return client, client.get_run(run_id)


def test_both_trackers_log_rows_config_checkpoints_and_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {"env": {"name": "math", "kwargs": {}}, "trainer": {"loggers": ["jsonl", "wandb", "mlflow"]}}
    trackers = Trackers.open(["jsonl", "wandb", "mlflow"], tmp_path, config, TrackingConfig(tags=["mine"]),
                             resume=False, tags=["math", "grpo"])
    assert [t.name for t in trackers.trackers] == ["wandb", "mlflow"]
    trackers.log(0, {"step": 0, "kind": "eval", "eval/math/success": 0.25})
    trackers.log(1, {"step": 1, "kind": "train", "phase": "rl", "reward/mean": 0.5, "actor/grad_norm": None})
    trackers.log(2, {"step": 2, "kind": "train", "reward/mean": 0.75})
    trackers.checkpoint(2, tmp_path / "checkpoints" / "step_2")
    (tmp_path / "summary.md").write_text("# run\n")
    trackers.finish([tmp_path / "summary.md", tmp_path / "curves.png"])  # curves.png absent: left out
    assert "trackers: wandb run" in capsys.readouterr().err

    history = wandb_history(tmp_path)
    assert history == {0: {"eval/math/success": 0.25}, 1: {"reward/mean": 0.5}, 2: {"reward/mean": 0.75}}
    records = wandb_records(tmp_path)
    run, = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == tmp_path.name and list(run.tags) == ["mine", "math", "grpo"]
    config_keys = {i.key for i in run.config.update}
    assert {"env", "trainer"} <= config_keys
    summary = {i.key: i.value_json for r in records if r.WhichOneof("record_type") == "summary"
               for i in r.summary.update}
    assert summary["checkpoint/step_2"] == f'"{tmp_path / "checkpoints" / "step_2"}"'
    files = {f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files}
    assert "summary.md" in files

    state = __import__("json").loads((tmp_path / "trackers.json").read_text())
    client, run = mlflow_run(tmp_path, state["mlflow"])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [(1, 0.5),
                                                                                                      (2, 0.75)]
    assert run.data.params["env.name"] == "math" and run.data.params["trainer.loggers"] == '["jsonl", "wandb", "mlflow"]'
    assert run.data.tags["checkpoint/step_2"] == str(tmp_path / "checkpoints" / "step_2")
    assert {"mine", "math", "grpo"} <= set(run.data.tags) and run.info.status == "FINISHED"
    assert run.info.run_name == tmp_path.name
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.json", "summary.md"}

    # a resumed run continues both runs (ids from DIR/trackers.json)
    again = Trackers.open(["wandb", "mlflow"], tmp_path, config, TrackingConfig(), resume=True)
    assert [t.run_id for t in again.trackers] == [state["wandb"], state["mlflow"]]
    again.log(3, {"step": 3, "kind": "train", "reward/mean": 1.0})
    again.close()
    assert [m.step for m in client.get_metric_history(state["mlflow"], "reward/mean")] == [1, 2, 3]


class _Broken:
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def log(self, step, metrics, kind):
        self.calls += 1
        raise RuntimeError("dashboard down")

    def close(self):
        pass


def test_a_failing_tracker_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    # start failure: an MLflow URI whose scheme no store serves
    trackers = Trackers.open(["mlflow"], tmp_path, {}, TrackingConfig(mlflow_uri="nosuchscheme://x"), resume=False)
    assert trackers.trackers == []
    err = capsys.readouterr().err
    assert err.count("warning: tracker mlflow could not start") == 1 and "the run goes on" in err
    # a failure while logging: warned once, then the tracker is off
    broken = _Broken()
    trackers = Trackers([broken])
    for step in range(3):
        trackers.log(step, {"reward/mean": 1.0})
    trackers.close()
    assert broken.calls == 1 and capsys.readouterr().err.count("warning: tracker broken failed in log") == 1


def test_trainer_tensorboard_is_refused_with_its_replacement():
    with pytest.raises(ConfigError, match=r"'trainer.tensorboard' was replaced: .*trainer.loggers=\[jsonl\]"):
        load_config(["model=tiny", "env=choose_item", "trainer.tensorboard=false"], check=False)
    with pytest.raises(ConfigError, match="unknown \\['neptune'\\]; valid values: jsonl, tensorboard, wandb, mlflow"):
        load_config(["model=tiny", "env=choose_item", "trainer.loggers=[jsonl,neptune]"], check=False)
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config(["model=tiny", "env=choose_item", "trainer.tracking.wandb_mode=cloud"], check=False)


def test_a_dead_wandb_service_is_replaced_not_a_missing_tracker(tmp_path, monkeypatch):
    """W&B keeps one service process per Python process: once it had died (in the full suite, a process that ran
    other work between two runs), every later run's W&B tracker failed to start (MailboxClosedError, "could not
    start") and the run went on without it. A run now starts a fresh service in that case."""
    import psutil
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.setup()  # this process's service, as an earlier run left it
    services = [p for p in psutil.Process().children(recursive=True) if "wandb-core" in " ".join(p.cmdline())]
    assert services
    for p in services:
        p.kill()
    psutil.wait_procs(services, timeout=10)
    config = {"trainer": {"loggers": ["jsonl", "wandb"]}}
    trackers = Trackers.open(["jsonl", "wandb"], tmp_path, config, TrackingConfig(), resume=False, tags=[])
    assert [t.name for t in trackers.trackers] == ["wandb"]
    trackers.log(1, {"step": 1, "kind": "train", "reward/mean": 0.5})
    trackers.finish([])
    assert not [p for p in psutil.Process().children(recursive=True) if "wandb-core" in " ".join(p.cmdline())]


def test_path_safe_names_hand_cases():
    from agent_rl.trackers import path_safe_names

    state = (set(), set(), {})
    got = path_safe_names(["eval/p/success/Algebra", "eval/p/success", "reward/mean", "success/rate"], *state)
    assert got == {"eval/p/success/Algebra": "eval/p/success.Algebra", "eval/p/success": "eval/p/success",
                   "reward/mean": "reward/mean", "success/rate": "success/rate"}
    # a parent first seen after its child: the child keeps its name, the parent is renamed; names are stable
    assert path_safe_names(["a/b", "a/b/c"], *state)["a/b"] == "a/b"
    assert path_safe_names(["x/y/z"], *state) == {"x/y/z": "x/y/z"}
    assert path_safe_names(["x/y"], *state) == {"x/y": "x.y"}
    assert path_safe_names(["x/y", "eval/p/success/Algebra"], *state) == {
        "x/y": "x.y", "eval/p/success/Algebra": "eval/p/success.Algebra"}


def test_mlflow_holds_a_metric_and_its_breakdown(tmp_path, monkeypatch):
    """A panel's success and its per-type breakdown (``eval/p/success`` and ``eval/p/success/<type>``, what the math
    panels log) in one MLflow file store: before, the second name raised ``Not a directory`` and the tracker went off
    for the rest of the run, losing ``reward/mean`` of every step. A resumed run logs the breakdown under the same
    name."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trackers = Trackers.open(["mlflow"], tmp_path, {}, TrackingConfig(), resume=False)
    trackers.log(0, {"step": 0, "kind": "eval", "eval/p/success": 0.5, "eval/p/success/Algebra": 1.0})
    trackers.log(1, {"step": 1, "kind": "train", "reward/mean": 0.25})
    trackers.close()
    state = __import__("json").loads((tmp_path / "trackers.json").read_text())
    again = Trackers.open(["mlflow"], tmp_path, {}, TrackingConfig(), resume=True)
    again.log(2, {"step": 2, "kind": "eval", "eval/p/success": 0.75, "eval/p/success/Algebra": 0.0,
                  "reward/mean": 0.5})
    again.close()
    client, run = mlflow_run(tmp_path, state["mlflow"])
    history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
               for k in ("eval/p/success", "eval/p/success.Algebra", "reward/mean")}
    assert history == {"eval/p/success": [(0, 0.5), (2, 0.75)], "eval/p/success.Algebra": [(0, 1.0), (2, 0.0)],
                       "reward/mean": [(1, 0.25), (2, 0.5)]}


# ------------------------------------------------------------------------------------------ resume
_CRASHED_RUN = """
import sys
from pathlib import Path
from agent_rl.logging import MetricsLogger
from agent_rl.trackers import Trackers, TrackingConfig
out = Path(sys.argv[1])
trackers = Trackers.open(["jsonl", "wandb", "mlflow"], out, {"algo": {"name": "grpo"}}, TrackingConfig(),
                         resume=False)
logger = MetricsLogger(out, total_steps=6, tensorboard=False, progress=False, phase="rl", trackers=trackers)
for step in range(1, 6):  # the crashed run's values: reward/mean = step
    logger.log(step, {"reward/mean": float(step)})
    if step == 3:
        trackers.checkpoint(step, out / "checkpoints" / "step_3")
raise RuntimeError("a crash after step 5, the last checkpoint at step 3")  # nothing closes the trackers
"""


def test_a_resume_replaces_the_replayed_steps_in_every_tracker(tmp_path, monkeypatch, capsys):
    """A crash after step 5 with the last checkpoint at step 3, then ``trainer.resume=auto``: metrics.jsonl holds
    the re-run's values at steps 4 and 5; MLflow held both runs' values there and W&B ignored the re-run's steps
    up to its last one ("less than the current step"). Every tracker now holds what metrics.jsonl holds."""
    import json
    import os
    import subprocess
    import sys

    from agent_rl.logging import MetricsLogger, read_metrics

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _CRASHED_RUN, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1 and "a crash after step 5" in done.stderr, done.stderr[-3000:]
    crashed = json.loads((tmp_path / "trackers.json").read_text())

    trackers = Trackers.open(["jsonl", "wandb", "mlflow"], tmp_path, {"algo": {"name": "grpo"}}, TrackingConfig(),
                             resume=True)
    logger = MetricsLogger(tmp_path, total_steps=6, start_step=4, tensorboard=False, progress=False, phase="rl",
                           trackers=trackers)
    for step in range(4, 7):  # the re-run's values: 10 + step
        logger.log(step, {"reward/mean": 10.0 + step})
    logger.close()
    trackers.close()

    want = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0), (6, 16.0)]
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == want

    # MLflow: the run trackers.json names holds exactly those values; the crashed run is soft-deleted, intact
    state = json.loads((tmp_path / "trackers.json").read_text())
    assert state["wandb"] == crashed["wandb"] and state["mlflow"] != crashed["mlflow"]
    client, run = mlflow_run(tmp_path, state["mlflow"])
    assert [(m.step, m.value) for m in client.get_metric_history(state["mlflow"], "reward/mean")] == want
    assert run.data.params["algo.name"] == "grpo" and run.info.run_name == tmp_path.name
    assert run.data.tags["checkpoint/step_3"] == str(tmp_path / "checkpoints" / "step_3")
    assert run.data.tags["agent_rl.rewound_from"] == f"{crashed['mlflow']} at step 4"
    assert {a.path for a in client.list_artifacts(state["mlflow"])} == {"config.json"}
    old = client.get_run(crashed["mlflow"])
    assert old.info.lifecycle_stage == "deleted" and old.data.tags["agent_rl.replaced_by"].startswith(state["mlflow"])
    assert [(m.step, m.value) for m in client.get_metric_history(crashed["mlflow"], "reward/mean")] == \
        [(s, float(s)) for s in range(1, 6)]
    experiment = client.get_experiment_by_name("agent_rl").experiment_id
    assert [r.info.run_id for r in client.search_runs([experiment])] == [state["mlflow"]]  # one live run

    # W&B: the resumed segment is the same run rewound to step 3 (its run record's branch point) and holds every
    # re-run step; the crashed segment's steps up to 3 and the rewound one's make metrics.jsonl's history
    first, second = sorted(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    records = wandb_file_records(second)
    run_record, = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run_record.run_id, run_record.branch_point.run, run_record.branch_point.value,
            run_record.branch_point.metric) == (crashed["wandb"], crashed["wandb"], 3, "_step")
    resumed = wandb_history(tmp_path, records)
    assert {s: v["reward/mean"] for s, v in resumed.items()} == {4: 14.0, 5: 15.0, 6: 16.0}
    before = wandb_history(tmp_path, wandb_file_records(first))
    merged = {**{s: v["reward/mean"] for s, v in before.items() if s <= 3}, **{s: v["reward/mean"] for s, v in
                                                                               resumed.items()}}
    assert sorted(merged.items()) == want
    assert "less than the current step" not in capsys.readouterr().err


def test_a_rewind_without_replayed_values_keeps_the_mlflow_run(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trackers = Trackers.open(["mlflow"], tmp_path, {}, TrackingConfig(), resume=False)
    trackers.log(1, {"step": 1, "kind": "train", "reward/mean": 0.5})
    trackers.close()
    state = __import__("json").loads((tmp_path / "trackers.json").read_text())
    again = Trackers.open(["mlflow"], tmp_path, {}, TrackingConfig(), resume=True)
    again.rewind(2)  # the checkpoint was the last step logged: nothing to drop
    again.log(2, {"step": 2, "kind": "train", "reward/mean": 0.75})
    again.close()
    client, run = mlflow_run(tmp_path, state["mlflow"])
    assert run.info.lifecycle_stage == "active" and [t.run_id for t in again.trackers] == []
    assert [(m.step, m.value) for m in client.get_metric_history(state["mlflow"], "reward/mean")] == \
        [(1, 0.5), (2, 0.75)]


def test_a_wandb_server_that_refuses_the_rewind_gets_the_plain_resume(tmp_path, monkeypatch, capsys):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    trackers = Trackers.open(["wandb"], tmp_path, {}, TrackingConfig(), resume=False)
    trackers.log(1, {"step": 1, "kind": "train", "reward/mean": 0.5})
    trackers.close()
    real_init, calls = wandb.init, []

    def init(**kw):
        calls.append({k: kw.get(k) for k in ("id", "resume", "resume_from")})
        if kw.get("resume_from"):
            raise wandb.errors.CommError("rewind is not enabled for this entity")  # a server without the preview
        return real_init(**kw)

    monkeypatch.setattr(wandb, "init", init)
    again = Trackers.open(["wandb"], tmp_path, {}, TrackingConfig(), resume=True)
    run_id = again.trackers[0].run_id
    again.rewind(2)
    again.log(2, {"step": 2, "kind": "train", "reward/mean": 0.75})
    again.close()
    assert [c for c in calls if c["resume_from"]] and calls[-1] == {"id": run_id, "resume": "allow",
                                                                     "resume_from": None}
    err = capsys.readouterr().err
    assert err.count(f"could not rewind run {run_id} to step 1; resumed without a rewind") == 1


@pytest.mark.slow  # two short training runs (tiny model, ChooseItem, in-process envs)
def test_a_resumed_training_run_rewrites_the_replayed_steps_in_both_trackers(tmp_path, monkeypatch):
    """Through ``agent_rl.train``: 3 steps checkpointed each step, the last checkpoint removed (a crash after step 3
    was logged, before it was saved), then ``trainer.resume=auto`` to step 4 replays step 3. MLflow's run (the one
    trackers.json names) and the rewound W&B segment hold metrics.jsonl's values, step 3 once, from the re-run."""
    import json
    import shutil

    from agent_rl.logging import read_metrics
    from agent_rl.train import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "run"
    base = ["model=tiny", "env=choose_item", "env_server.mode=local", "trainer.tasks_per_step=1",
            "rollout.max_turns=1", "engine.max_new_tokens=4", "trainer.progress=false",
            "trainer.loggers=[jsonl,wandb,mlflow]", "trainer.save_every=1", "trainer.eval_every=0",
            f"trainer.output_dir={out}"]
    main([*base, "trainer.total_steps=3"])
    crashed = json.loads((out / "trackers.json").read_text())
    first_rows = {r["step"]: r for r in read_metrics(out / "metrics.jsonl", "train")}
    shutil.rmtree(out / "checkpoints" / "step_3")
    main([*base, "trainer.total_steps=4", "trainer.resume=auto"])
    rows = {r["step"]: r for r in read_metrics(out / "metrics.jsonl", "train")}
    assert sorted(rows) == [1, 2, 3, 4]
    key = next(k for k in rows[3] if k.startswith("time/") and rows[3][k] != first_rows[3][k])  # a re-run value

    state = json.loads((out / "trackers.json").read_text())
    assert state["mlflow"] != crashed["mlflow"] and state["wandb"] == crashed["wandb"]
    client, _ = mlflow_run(out, state["mlflow"])
    for name in (key, "reward/mean"):
        assert [(m.step, m.value) for m in client.get_metric_history(state["mlflow"], name)] == \
            [(s, rows[s][name]) for s in (1, 2, 3, 4)]
    *_, rewound = sorted(out.glob("wandb/offline-run-*/run-*.wandb"))
    records = wandb_file_records(rewound)
    run_record, = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run_record.branch_point.run, run_record.branch_point.value) == (crashed["wandb"], 2)
    history = wandb_history(out, records)
    assert sorted(history) == [3, 4] and history[3][key] == pytest.approx(rows[3][key])
