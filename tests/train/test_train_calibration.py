"""``algo.calibration=probe`` end to end (algorithms.md 3b; tiny model, ChooseItem, in-process envs): the
``calibration`` row before the first ``train`` row, the chosen pair trained with, the probe's episodes never
trained on or stored, a resume that does not probe again, ``algo=tgrl_small``'s groups, and the refusals at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl.calibration import GROUP_ID_BASE, STATE_KEY
from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.episodes import load_episodes
from agent_rl.logging import read_metrics
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs

PROBE = ["algo.calibration=probe", "algo.calibration.tasks=2", "algo.calibration.samples=2",
         "algo.calibration.t_low=[0.3]", "algo.calibration.t_high=[0.8,1.2]"]
ARGS = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.tasks_per_step=2", "rollout.max_turns=2",
        "engine.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.save_episodes=all"]


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_probe_row_choice_and_episodes_never_trained(tmp_path: Path) -> None:
    out = tmp_path / "run"
    main([*ARGS, "algo=tgrl", "algo.warmup_steps=2", *PROBE, "trainer.total_steps=2", f"trainer.output_dir={out}"])
    lines = rows(out)
    kinds = [r["kind"] for r in lines]
    assert kinds.count("calibration") == 1 and kinds.index("calibration") < kinds.index("train")
    cal = lines[kinds.index("calibration")]
    assert [(p["t_low"], p["t_high"]) for p in cal["pairs"]] == [(0.3, 0.8), (0.3, 1.2)]
    for pair in cal["pairs"]:
        assert set(pair) >= {"t_low", "t_high", "gain_std", "pos", "var", "ext", "elig", "score"}
        assert 0.0 <= pair["ext"] <= 1.0 and 0.0 <= pair["elig"] <= 1.0
    chosen = cal["chosen"]
    assert (chosen["t_low"], chosen["t_high"]) in [(0.3, 0.8), (0.3, 1.2)]
    best = max(p["score"] for p in cal["pairs"])
    assert next(p for p in cal["pairs"] if (p["t_low"], p["t_high"]) == (chosen["t_low"], chosen["t_high"])
                )["score"] == best
    assert cal["episodes"] == 2 * 3 * 2 and cal["configured"] == {"t_low": 0.3, "t_high": 1.2}
    train = read_metrics(out / "metrics.jsonl", "train")
    assert [r["tgrl/t_high"] for r in train] == [chosen["t_high"]] * 2
    # step 1 is the warm-up (every episode at T1), step 2 samples T0 and T1: the chosen pair, nothing else
    assert {round(ep["temperature"], 6) for ep in load_episodes(out, 1)} == {chosen["t_high"]}
    assert {round(ep["temperature"], 6) for ep in load_episodes(out, 2)} == {chosen["t_low"], chosen["t_high"]}
    # the probe's episodes are in no step's rows: each step's batch holds its own 2 groups' turns (per-turn rows)
    for r in train:
        eps = load_episodes(out, r["step"])
        assert len(eps) == 2 * 4 and all(ep["group"] < GROUP_ID_BASE for ep in eps)
        assert r["batch/rows"] == sum(ep["num_turns"] for ep in eps)
        assert r["rollout/episodes"] == 8
    # the checkpoint keeps the choice and the configured temperatures in its config
    extra = json.loads((out / "checkpoints" / "step_2" / "extra.json").read_text())
    assert extra[STATE_KEY]["chosen"] == chosen
    assert (extra["config"]["algo"]["t_low"], extra["config"]["algo"]["t_high"]) == (0.3, 1.2)
    summary = (out / "summary.md").read_text()
    assert f"calibration: T0={chosen['t_low']:g}, T1={chosen['t_high']:g} chosen by the probe" in summary
    assert "| T_low | T_high | gain_std | pos | var | ext | elig | score | chosen |" in summary
    # the viewer's overview shows the same table, the chosen pair marked
    from fastapi.testclient import TestClient

    from agent_rl.viewer import create_app

    page = TestClient(create_app(out)).get("/")
    assert page.status_code == 200 and 'id="calibration"' in page.text
    assert page.text.count("<td>chosen</td>") == 1


def test_resume_does_not_probe_again_and_keeps_the_pair(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    common = [*ARGS, "algo=tgrl", "algo.warmup_steps=0", *PROBE, f"trainer.output_dir={out}"]
    main([*common, "trainer.total_steps=1"])
    capfd.readouterr()
    main([*common, "trainer.total_steps=2", "trainer.resume=auto"])
    err = capfd.readouterr().err
    assert "restored from" in err and "calibration (algorithms.md 3b): probe" not in err
    lines = rows(out)
    assert [r["kind"] for r in lines].count("calibration") == 1
    chosen = next(r for r in lines if r["kind"] == "calibration")["chosen"]
    train = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in train] == [1, 2]
    assert [r["tgrl/t_high"] for r in train] == [chosen["t_high"]] * 2
    assert {round(ep["temperature"], 6) for ep in load_episodes(out, 2)} == {chosen["t_low"], chosen["t_high"]}


def test_tgrl_small_runs_groups_of_8_with_the_probe(tmp_path: Path) -> None:
    out = tmp_path / "run"
    main([*ARGS, "algo=tgrl_small", "algo.warmup_steps=0", *PROBE[1:], "trainer.total_steps=1",
          f"trainer.output_dir={out}"])
    assert [r["kind"] for r in rows(out)].count("calibration") == 1
    eps = load_episodes(out, 1)
    assert len(eps) == 2 * 8
    chosen = next(r for r in rows(out) if r["kind"] == "calibration")["chosen"]
    temps = sorted(round(ep["temperature"], 6) for ep in eps)
    assert temps == sorted([chosen["t_low"]] * 4 + [chosen["t_high"]] * 12)  # 2 + 6 per group


def test_tgrl_small_preset() -> None:
    cfg = load_config(["algo=tgrl_small", "env=choose_item", "model=tiny"])
    a = cfg.algo
    assert (a.name, a.n_low, a.n_high, a.group_size, a.std, cfg.credit.name, a.calibration.mode) == (
        "tgrl", 2, 6, 8, "population", "uniform", "probe")
    assert (cfg.optim.warmup, cfg.optim.warmup_unit, a.warmup_steps) == (10, "rl_step", 20)


@pytest.mark.parametrize("overrides, match", [
    (["algo=tgrl", "algo.calibration=probe", "algo.calibration.t_low=[1.2]", "algo.calibration.t_high=[0.8,1.0]"],
     "no candidate pair with T_high > T_low"),
    (["algo=tgrl", "algo.calibration=probe", "algo.calibration.t_high=[0.0,1.0]"], "> 0"),
    (["algo=tgrl", "algo.calibration=probe", "algo.calibration.t_low=[-0.3]"], "> 0"),
    (["algo=tgrl", "algo.calibration=probe", "algo.calibration.samples=0"], "samples=0 must be >= 1"),
    (["algo=grpo", "algo.calibration=probe"], "algo.name=grpo samples at one temperature"),
    (["algo=tampo", "algo.calibration=probe"], "algo.name=tampo samples at one temperature"),
    (["algo=tgrl", "algo.calibration=probe", "algo.t_high=auto"], "choose one"),
    (["algo=tgrl", "algo.calibration=sometimes"], "algo.calibration.mode='sometimes' is not valid"),
])
def test_refusals_at_load(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(["env=choose_item", "model=tiny", *overrides])


def test_the_probe_does_not_depend_on_how_its_groups_are_split_into_rounds(tmp_path: Path) -> None:
    """The probe plays in rounds of about a step's episodes; a row's sample is keyed by its group id, so rounds of
    1 group (tasks_per_step=1) and of 2 give the same records, statistics and choice."""
    cals, records = [], []
    for n in (1, 2):
        out = tmp_path / f"run{n}"
        main([*ARGS, "algo=tgrl", "algo.warmup_steps=0", *PROBE, "trainer.total_steps=1", "algo.calibration.samples=4",
              f"trainer.tasks_per_step={n}", f"trainer.output_dir={out}"])
        cals.append(next(r for r in rows(out) if r["kind"] == "calibration"))
        records.append(json.loads((out / "checkpoints" / "step_1" / "extra.json").read_text())[STATE_KEY]["records"])
    assert len(records[0]) == 2 * 3 and records[0] == records[1]  # every (task, T): the same rewards and formats
    assert len({json.dumps(r["rewards"]) + str(r["format_rate"]) for r in records[0]}) > 1  # not all alike
    assert cals[0]["pairs"] == cals[1]["pairs"] and cals[0]["chosen"] == cals[1]["chosen"]
