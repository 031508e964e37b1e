"""The behaviour-cloning warm start of an RL run (``trainer.warm_start``, issue 35; agent_rl/warm_start.py).

Fast: ``auto`` resolves to bc only for the embedded default on an env with an expert, ``bc`` without an expert is
refused at load with the reason, the phase rows of metrics.jsonl are read apart (two step-0 panels stay two rows),
a restart drops only its own phase's rows, ALFWorld's CPU preset and its panel of one task type, and the summary's
``learning signal:`` line. Slow (tiny model, TextWorld coin collector level 1, local envs): one run is ``sft`` rows
then ``train`` rows in one metrics.jsonl with the warm start's checkpoints under ``checkpoints/warm_start/``, and a
run killed in either phase resumes there with the numbers of the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.logging import MetricsLogger, drop_records_from, read_metrics
from agent_rl.report import learning_signal, signal_line, summarize_run, write_summary


# ------------------------------------------------------------------------------------------------ config
def test_auto_is_bc_only_for_the_embedded_default_on_an_env_with_an_expert() -> None:
    assert load_config(["env=alfworld"]).trainer.warm_start == "dagger"  # a state expert (tests/train/test_dagger.py)
    assert load_config(["env=textworld"]).trainer.warm_start == "bc"
    assert load_config(["env=alfworld", "model=tiny"]).trainer.warm_start == "none"  # another model: zero-shot
    assert load_config(["env=math"]).trainer.warm_start == "none"  # no expert: untouched
    assert load_config(["env=alfworld", "trainer.warm_start=none"]).trainer.warm_start == "none"
    assert load_config(["env=alfworld", "model=tiny", "trainer.warm_start=bc"]).trainer.warm_start == "bc"


def test_bc_on_an_env_without_an_expert_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"trainer.warm_start=bc clones the env's expert, but agent_rl/Math-v0 has "
                                          r"none: its family \(math, envs.families\) describes no expert"):
        load_config(["env=math", "trainer.warm_start=bc"])
    with pytest.raises(ConfigError, match="describes no env family"):  # an env without a description
        load_config(["env=choose_item", "trainer.warm_start=bc"])
    with pytest.raises(ConfigError,
                       match=r"trainer.warm_start='clone' is not valid; valid values: auto, bc, dagger, none"):
        load_config(["trainer.warm_start=clone"])


def test_alfworld_cpu_preset_is_its_own_and_its_panel_holds_only_the_trained_type(monkeypatch) -> None:
    import torch

    from agent_rl.eval.runner import build_panels
    from agent_rl.train import with_device_preset
    from envs.alfworld.data import list_games

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert with_device_preset(["algo=tgrl"])[0] == ["algo=tgrl", "trainer=cpu_alfworld"]  # alfworld is the default
    assert with_device_preset(["env=textworld"])[0] == ["env=textworld", "trainer=cpu"]
    cfg = load_config(["env=alfworld", "algo=tgrl", "trainer=cpu_alfworld"])
    assert (cfg.trainer.warm_start, cfg.rollout.mode, cfg.engine.kv_reuse, cfg.algo.warmup_steps) == \
        ("dagger", "trajectory", True, 2)  # TGRL's warm-up: step 1 (the steps s < 2)
    # TGRL's temperatures calibrated by a probe sized to about one RL step (algorithms.md 3b); other algos: off
    cal = cfg.algo.calibration
    assert (cal.mode, cal.t_low, cal.t_high, cal.tasks, cal.samples) == ("probe", [0.3], [0.7, 1.0, 1.2], 2, 2)
    assert load_config(["env=alfworld", "algo=grpo", "trainer=cpu_alfworld"]).algo.calibration.mode == "off"
    assert cfg.env.kwargs["task_types"] == ["pick_and_place_simple"]
    # the invalid-action penalty reaches the env (its InvalidActionPenalty wrapper), in training and in panels
    assert cfg.rollout.invalid_penalty == 0.1 and cfg.env_kwargs["invalid_action_penalty"] == 0.1
    assert cfg.env.sampler.num_tasks == len(list_games("train", ["pick_and_place_simple"]))  # 790: every index valid
    try:
        [panel] = build_panels(cfg, num_tasks=cfg.trainer.eval_tasks)
    except FileNotFoundError:
        pytest.skip("no ALFWorld data")
    games = list_games("valid_unseen", ["pick_and_place_simple"])
    assert panel.size == len(games) == 24 and len(panel.tasks) == 8
    assert set(panel.task_types) == {"pick_and_place_simple"}
    assert [t.options["index"] for t in panel.tasks] == [i * 24 // 8 for i in range(8)]


# ------------------------------------------------------------------------------------------------ phase rows
def _log_two_phases(out: Path) -> None:
    ws = MetricsLogger(out, total_steps=2, tensorboard=False, progress=False, phase="warm_start")
    ws.log(0, {"eval/p/success": 0.0}, kind="eval")
    ws.log(1, {"sft/loss": 2.0}, kind="sft")
    ws.log(2, {"sft/loss": 1.0, "eval/p/success": 0.25}, kind="sft")
    ws.close()
    rl = MetricsLogger(out, total_steps=2, tensorboard=False, progress=False, phase="rl")
    rl.log(0, {"eval/p/success": 0.5}, kind="eval")
    rl.log(1, {"reward/mean": 0.1})
    rl.log(2, {"reward/mean": 0.2, "eval/p/success": 0.75})
    rl.close()


def test_read_metrics_keeps_two_step_zero_panels_and_orders_by_phase(tmp_path: Path) -> None:
    _log_two_phases(tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"], r["phase"]) for r in rows] == [
        ("eval", 0, "warm_start"), ("sft", 1, "warm_start"), ("sft", 2, "warm_start"), ("eval", 2, "warm_start"),
        ("eval", 0, "rl"), ("train", 1, "rl"), ("train", 2, "rl"), ("eval", 2, "rl")]
    assert [r["eval/p/success"] for r in read_metrics(tmp_path / "metrics.jsonl", "eval")] == [0.0, 0.25, 0.5, 0.75]


def test_a_restarted_phase_drops_only_its_own_rows(tmp_path: Path) -> None:
    _log_two_phases(tmp_path)
    path = tmp_path / "metrics.jsonl"
    assert drop_records_from(path, 2, "rl") == 2  # the RL step-2 train and eval rows
    assert [(r["kind"], r["step"]) for r in read_metrics(path)][-2:] == [("eval", 0), ("train", 1)]
    assert len(read_metrics(path, "sft")) == 2 and len(read_metrics(path, "eval")) == 3
    MetricsLogger(tmp_path, total_steps=2, start_step=1, tensorboard=False, progress=False, phase="rl").close()
    assert [(r["kind"], r["step"]) for r in read_metrics(path)] == [("eval", 0), ("sft", 1), ("sft", 2), ("eval", 2)]


def test_legacy_rows_without_a_phase_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 0, "kind": "eval", "eval/p/success": 0.1}, {"step": 1, "kind": "train", "reward/mean": 0.0},
        {"step": 1, "kind": "eval", "eval/p/success": 0.2}, {"step": 1, "kind": "eval", "eval/p/success": 0.3}]))
    assert [(r["kind"], r["step"], r.get("eval/p/success")) for r in read_metrics(path)] == [
        ("eval", 0, 0.1), ("train", 1, None), ("eval", 1, 0.3)]  # the later row of a repeated step wins


# ------------------------------------------------------------------------------------------------ the signal line
def test_summary_says_how_many_steps_had_a_learning_signal(tmp_path: Path) -> None:
    steps = [{"kind": "train", "step": s, "rollout/groups": 3.0, "rollout/groups_equal_frac": f,
              "actor/grad_norm": g} for s, f, g in [(1, 1.0, 0.0), (2, 2 / 3, 0.4), (3, 1.0, 0.0), (4, 0.0, 1.1)]]
    signal = learning_signal(steps)
    assert signal == {"steps": 4, "measured": 4, "with_signal": 2, "no_signal": 2, "grad_norm_positive": 2,
                      "with_success_signal": None}
    line = signal_line(signal)
    assert line == ("learning signal: 2 of 4 RL step(s) had a group with unequal rewards; 2 of 4 (50%) had no "
                    "learning signal (all rewards equal); actor/grad_norm > 0 in 2 of 4")
    # with the success split (rollout/groups_mixed_success_frac): step 2's signal was shaping only, step 4's wins
    shaped = [{**r, "rollout/groups_mixed_success_frac": m} for r, m in zip(steps, (0.0, 0.0, 0.0, 1 / 3))]
    assert signal_line(learning_signal(shaped)) == line + (
        "; 1 of 4 had a group with both won and lost episodes (the rest of the signal is reward shaping, e.g. "
        "rollout.invalid_penalty)")
    dead = signal_line(learning_signal([{**r, "rollout/groups_equal_frac": 1.0, "actor/grad_norm": 0.0}
                                        for r in steps]))
    assert dead.endswith("this run trained nothing: no learning signal (all rewards equal) at every step")
    text = write_summary(summarize_run(steps, tmp_path), tmp_path / "summary.md")
    assert any(ln.startswith("learning signal: 2 of 4") for ln in text.splitlines())
    assert "What happened:" in text and "2 of 4 RL steps had a learning signal" in text


# ------------------------------------------------------------------------------------------------ end to end
from tests.train.test_sft import BASE, games  # noqa: E402,F401  (the shared TextWorld games fixture)

RUN = [*BASE, "algo=grpo", "trainer.warm_start=bc", "sft.num_episodes=4", "sft.epochs=2", "sft.batch_size=2",
       "trainer.total_steps=2", "trainer.tasks_per_step=1", "algo.group_size=2", "trainer.save_every=1",
       "rollout.max_turns=2", "engine.max_new_tokens=8", "trainer.save_episodes=none"]


def _rows(out: Path) -> list[tuple]:
    return [(r["kind"], r["step"], r.get("sft/loss"), r.get("reward/mean"), r.get("actor/entropy"))
            for r in read_metrics(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def uninterrupted(games: Path, tmp_path_factory: pytest.TempPathFactory):
    from agent_rl.train import main

    out = tmp_path_factory.mktemp("ws") / "run"
    main([*RUN, f"trainer.output_dir={out}"])
    return out


@pytest.mark.slow
def test_one_run_is_sft_rows_then_train_rows(uninterrupted: Path, capsys) -> None:
    out = uninterrupted
    rows = read_metrics(out / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in rows] == [("sft", 1), ("sft", 2), ("sft", 3), ("sft", 4),
                                                      ("train", 1), ("train", 2)]
    assert all(r["actor/grad_norm"] > 0 for r in rows if r["kind"] == "sft")
    assert rows[0]["collect/success_rate"] == 1.0
    done = json.loads((out / "checkpoints" / "warm_start" / "done.json").read_text())
    assert done["checkpoint"] == "checkpoints/warm_start/step_4" and done["steps"] == 4
    assert sorted(p.name for p in (out / "checkpoints" / "warm_start").glob("step_*")) == ["step_3", "step_4"]
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_1", "step_2"]
    extra = json.loads((out / "checkpoints" / "step_2" / "extra.json").read_text())
    assert extra["config"]["model"]["path"] == str(out / "checkpoints" / "warm_start" / "step_4")
    summary = (out / "summary.md").read_text()
    assert any(line.startswith("learning signal: ") for line in summary.splitlines())
    assert "- warm-start (behaviour cloning) steps: 4" in summary


class Killed(RuntimeError):
    """The process dying in an update (after the previous step's checkpoint)."""


def _crash_at(monkeypatch, cls, step: int) -> None:
    real = cls.update

    async def update(self, batch, s):
        if s == step:
            raise Killed(f"killed at step {s}")
        return await real(self, batch, s)

    monkeypatch.setattr(cls, "update", update)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["warm_start", "rl"])
def test_a_run_killed_in_either_phase_resumes_there(phase, uninterrupted: Path, tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    from agent_rl.local import LocalBackend
    from agent_rl.sft import BehaviourCloningBackend
    from agent_rl.train import main

    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _crash_at(m, BehaviourCloningBackend if phase == "warm_start" else LocalBackend, 3 if phase == "warm_start"
                  else 2)
        with pytest.raises(Killed):
            main([*RUN, f"trainer.output_dir={out}"])
    assert (out / "checkpoints" / "warm_start" / "done.json").is_file() == (phase == "rl")
    with pytest.raises(ConfigError, match="already holds a run"):  # a fresh run into it is refused
        main([*RUN, f"trainer.output_dir={out}"])
    capsys.readouterr()
    main([*RUN, f"trainer.output_dir={out}", "trainer.resume=auto"])
    err = capsys.readouterr().err
    if phase == "warm_start":
        assert "resumed from" in err and "checkpoints/warm_start/step_2 at step 3" in err
        assert "reusing the 4 rows" in err
    else:
        assert "warm start" not in err.split("plan:")[-1].split("\n", 1)[1]  # no second warm start
        assert f"resumed from {out}/checkpoints/step_1 at step 2" in err
    assert _rows(out) == _rows(uninterrupted)  # the same rows, each once, with the uninterrupted run's numbers


def test_the_zero_shot_panel_is_played_once_then_read_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    """The warm start's step-0 panel (the unmodified model.*): played and stored the first time, read back the
    second (no env pool, no engine: playing would fail), replayed when a key part changes."""
    import asyncio

    from agent_rl.eval.training import TrainingEval
    from agent_rl.models import load_policy
    from agent_rl.progress import Progress
    from agent_rl.runtime import build_engine, open_env_pool

    monkeypatch.setenv("AGENT_RL_CACHE", str(tmp_path / "cache"))
    over = ["env=alfworld", "model=tiny", "env_server.mode=local", "trainer.eval_every=1", "trainer.eval_tasks=1",
            "eval.max_turns=1", "engine.max_new_tokens=4", "env.kwargs.task_types=[pick_and_place_simple]"]
    cfg = load_config(over)
    try:
        ev = TrainingEval(cfg, tmp_path / "a", Progress(enabled=False))
    except FileNotFoundError:
        pytest.skip("no ALFWorld data")
    model, tok = load_policy(cfg.model)

    async def play() -> list:
        async with open_env_pool(cfg, tmp_path) as pool:
            return await ev.results(0, pool, build_engine(cfg, model, tok), cache=True)

    played = asyncio.run(play())
    assert len(list((tmp_path / "cache" / "panels").glob("*.json"))) == 1
    again = TrainingEval(cfg, tmp_path / "b", Progress(enabled=False))
    got = asyncio.run(again.results(0, None, None, cache=True))
    assert got == json.loads(json.dumps(played))
    assert json.loads((tmp_path / "b" / "eval" / "step_0" / "alfworld_valid_unseen.json").read_text()) == got[0]
    other = TrainingEval(load_config([*over, "engine.max_new_tokens=5"]), tmp_path / "c", Progress(enabled=False))
    with pytest.raises(AttributeError):  # another key: it plays (here on no pool)
        asyncio.run(other.results(0, None, None, cache=True))
