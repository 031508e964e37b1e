"""The DAgger warm start (``trainer.warm_start=dagger``, agent_rl/dagger.py) and a run that reads as one story.

Fast: beta-mixing by hand; every turn's label is the expert's answer for the state the turn acted on (a scripted
corridor whose expert is a function of the position, ``tests/train/dagger_env.py``), labels the expert gave up on
dropped and counted; rows of several rounds stacked; ``dagger`` refused on TextWorld (no state expert) and
``auto`` -> dagger on ALFWorld; the phase names of the progress line; library progress bars quiet in a log.
Slow (tiny model, the corridor, local envs): one run is ``sft`` rows of rounds 0, 1, 2 then ``train`` rows, its
labelled rows hold the expert's answers state by state, the progress line names each phase on one clock; a run
killed in the middle of a round (in its cloning, or while it labels) resumes there with the uninterrupted run's
numbers."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.dagger import beta, expert_episode_count, label_turns, stack_rows, task_key
from agent_rl.logging import read_metrics
from agent_rl.progress import Progress, step_phase
from agent_rl.types import Episode, Task, Turn
from tests.train.dagger_env import CorridorEnv, expert_for

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ beta-mixing
def test_beta_mixing_by_hand() -> None:
    # beta_i = p^i; the expert plays round(beta_i x n) of a round's n episodes, rounded half up
    assert [beta(0.5, i) for i in range(4)] == [1.0, 0.5, 0.25, 0.125]
    # p = 0.5, n = 8: 8 x 0.5 = 4, x 0.25 = 2, x 0.125 = 1, x 0.0625 = 0.5 -> 1 (half up), x 0.03125 = 0.25 -> 0
    assert [expert_episode_count(0.5, i, 8) for i in range(1, 6)] == [4, 2, 1, 1, 0]
    # p = 0.3, n = 10: 3, 0.9 -> 1, 0.27 -> 0
    assert [expert_episode_count(0.3, i, 10) for i in range(1, 4)] == [3, 1, 0]
    assert [expert_episode_count(0.0, i, 8) for i in range(1, 3)] == [0, 0]  # the policy only
    assert [expert_episode_count(1.0, i, 8) for i in range(1, 3)] == [8, 8]  # the expert only


# ------------------------------------------------------------------------------------------------ labels
def _played(start: int, actions: list[str]) -> tuple[Episode, dict[str, str | None]]:
    """An episode of the corridor from ``options={"index": start}`` playing ``actions`` (the policy's), as the
    orchestrator records it: each turn's info is the env's answer to it; and the reset's label."""
    env = CorridorEnv(expert=True)
    task = Task(env_id="tests/Corridor-v0", options={"index": start}, group_id=start)
    _, info = env.reset(options=task.options)
    ep = Episode(task=task, temperature=0.0, is_high=False)
    for k, action in enumerate(actions):
        _, reward, term, trunc, step_info = env.step(action)
        ep.turns.append(Turn(prompt_ids=[100 + start, k], response_ids=[1], response_logprobs=[0.0], action=action,
                             reward=reward, terminated=term, info=step_info))
        if term:
            break
    return ep, {task_key(task.seed, task.options): info["expert_action"]}


def test_labels_are_the_experts_answers_state_by_state_and_give_ups_are_dropped() -> None:
    # start index 2 -> x = -1; the policy plays left (-2), left (-3: the wall, the expert gives up), right (-2),
    # "jump" (invalid: stays -2), right (-1); the states the turns acted on: -1, -2, -3, -2, -2
    ep, first = _played(2, ["left", "left", "right", "jump", "right"])
    positions = [-1, -2, -3, -2, -2]
    pairs, counts = label_turns([ep], first, gave_up="look")
    want = [(k, expert_for(x)) for k, x in enumerate(positions) if expert_for(x) != "look"]
    assert [(prompt[1], label) for prompt, label in pairs] == want
    assert [label for _, label in pairs] == ["right", "right", "right", "right"]  # turn 2 (x = -3) dropped
    assert counts == {"dagger/labels": 4.0, "dagger/labels_dropped": 1.0, "dagger/labels_agree": 1.0}
    # every pair's prompt is the turn's own (the policy's context), in order
    assert [prompt for prompt, _ in pairs] == [[102, k] for k in (0, 1, 3, 4)]
    # without a gave-up action every label is kept; a second episode's reset label is its own
    ep2, first2 = _played(5, ["stop"])  # x = 2: the expert says left; the policy stopped (lost)
    pairs, counts = label_turns([ep, ep2], {**first, **first2})
    assert [label for _, label in pairs] == ["right", "right", "look", "right", "right", "left"]
    assert counts["dagger/labels_dropped"] == 0.0


def test_a_state_without_an_expert_label_is_an_error() -> None:
    ep, _ = _played(3, ["look"])
    with pytest.raises(RuntimeError, match=r"gave no info\['expert_action'\] for turn 0"):
        label_turns([ep], {})


def test_rows_of_rounds_stack_padded_with_offsets() -> None:
    from agent_rl.dagger import label_rows
    from agent_rl.models import load_policy

    cfg = load_config(["env=choose_item", "model=tiny"])
    _, tok = load_policy(cfg.model)
    a = label_rows([([1, 2, 3], "left"), ([4, 5], "right")], tok, cfg)
    b = label_rows([([6, 7, 8, 9, 10, 11], "stop")], tok, cfg)
    both = stack_rows([a, b], pad_id=0)
    assert both.num_rows == 3 and both.input_ids.shape[1] == max(a.input_ids.shape[1], b.input_ids.shape[1])
    assert both.episode_index.tolist() == [0, 1, 2] and both.group_index.tolist() == [0, 1, 2]
    for row, (src, i) in enumerate([(a, 0), (a, 1), (b, 0)]):  # the same tokens and masks, padding added
        n = src.input_ids.shape[1]
        assert torch.equal(both.input_ids[row, :n], src.input_ids[i])
        assert torch.equal(both.response_mask[row, :n], src.response_mask[i])
        assert both.attention_mask[row, n:].sum() == 0 and both.response_mask[row, n:].sum() == 0


# ------------------------------------------------------------------------------------------------ config
def test_dagger_is_refused_without_a_state_expert_and_auto_picks_it_on_alfworld() -> None:
    with pytest.raises(ConfigError, match=r"trainer.warm_start=dagger .* agent_rl/TextWorld-v0 has no state expert"):
        load_config(["env=textworld", "trainer.warm_start=dagger"])
    with pytest.raises(ConfigError, match=r"trainer.warm_start=dagger .* agent_rl/Math-v0 has none"):
        load_config(["env=math", "trainer.warm_start=dagger"])
    assert load_config(["env=alfworld"]).trainer.warm_start == "dagger"
    assert load_config(["env=textworld"]).trainer.warm_start == "bc"
    assert load_config(["env=alfworld", "trainer.warm_start=bc"]).trainer.warm_start == "bc"
    with pytest.raises(ConfigError, match=r"sft.dagger_beta=1.5 must be in \[0, 1\]"):
        load_config(["sft.dagger_beta=1.5"])


def test_dagger_on_textworld_exits_2_at_load_naming_the_missing_state_expert() -> None:
    proc = subprocess.run([sys.executable, "-m", "agent_rl.train", "env=textworld", "trainer.warm_start=dagger"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("config error: trainer.warm_start=dagger")
    assert "has no state expert" in proc.stderr


# ------------------------------------------------------------------------------------------------ one story
def test_the_progress_line_names_the_phase() -> None:
    buf = io.StringIO()
    p = Progress(stream=buf, interval_s=0.0)
    p.phase(step_phase(p, 1, 4, "rollout"), total=2)
    p.stage = "warm start 2/3"
    p.phase(step_phase(p, 5, 8, "update"))
    p.end()
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("RL step 1/4: rollout: 0/2 episodes")
    assert lines[1].endswith("warm start 2/3: update 5/8 ...")
    assert step_phase(object(), 2, 3, "checkpoint") == "RL step 2/3: checkpoint"  # a display without a stage


def test_library_progress_bars_are_quiet_when_the_output_is_not_a_terminal() -> None:
    """In a child process (the switch is process-wide): transformers' bars (its logging.tqdm, and the plain
    tqdm.auto bar of its GGUF conversion) write nothing to a log after :func:`quiet_library_progress`, and drew
    carriage returns before it."""
    code = """
import io, sys
from transformers.utils import logging as hf_logging
import transformers.modeling_gguf_pytorch_utils as gguf
from agent_rl.progress import quiet_library_progress
before = io.StringIO()
for _ in gguf.tqdm(range(3), file=before): pass
log = io.StringIO()
assert quiet_library_progress(log)
for _ in gguf.tqdm(range(3), file=log): pass
for _ in hf_logging.tqdm(range(3), file=log): pass
print(repr(before.getvalue().count(chr(13))), repr(log.getvalue()))
"""
    from agent_rl.progress import QUIET_ENV

    # the child's own switch only: an in-process run of the CLI earlier in this process set the variables here
    clean_env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=clean_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    drawn, quiet = proc.stdout.split()
    assert int(drawn) > 0 and quiet == "''"


# ------------------------------------------------------------------------------------------------ end to end
RUN = ["env=choose_item", "env.id=tests/Corridor-v0", "env.name=corridor", "env.sampler.kind=index",
       "env.sampler.num_tasks=7", "env_server.imports=[tests.train.dagger_env]",
       "trainer.imports=[tests.train.dagger_env]", "env_server.mode=local", "model=tiny", "trainer=cpu",
       "trainer.warm_start=dagger", "sft.num_episodes=4", "sft.epochs=1", "sft.batch_size=2", "sft.dagger_rounds=2",
       "sft.dagger_episodes=4", "sft.dagger_steps=2", "sft.dagger_beta=0.5", "trainer.total_steps=1",
       "trainer.tasks_per_step=1", "algo=grpo", "algo.group_size=2", "rollout.max_turns=4", "rollout.mode=trajectory",
       "engine.max_new_tokens=8", "trainer.save_every=1", "trainer.save_episodes=none", "trainer.loggers=[jsonl]",
       "engine.num_threads=1", "trainer.eval_every=0"]


#: each round's (first, last) step: round 0 clones the 3 won expert episodes' trajectory rows (index 0 starts at the
#: wall, where the expert gives up: lost) in 2 steps of batch 2; rounds 1 and 2 train sft.dagger_steps=2 each
ROUND_STEPS = {0: (1, 2), 1: (3, 4), 2: (5, 6)}


def _rows(out: Path) -> list[tuple]:
    return [(r["kind"], r["step"], r.get("round"), r.get("sft/loss"), r.get("dagger/labels"),
             r.get("reward/mean"), r.get("actor/entropy")) for r in read_metrics(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    """The command line's run, its stderr a pipe (not a terminal): (run dir, its log)."""
    out = tmp_path_factory.mktemp("dagger") / "run"
    proc = subprocess.run([sys.executable, "-m", "agent_rl.train", *RUN, f"trainer.output_dir={out}",
                           "trainer.progress=true"], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stderr


@pytest.mark.slow
def test_one_run_is_rounds_of_sft_rows_then_train_rows(uninterrupted) -> None:
    out, _ = uninterrupted
    rows = read_metrics(out / "metrics.jsonl")
    assert [(r["kind"], r["step"], r.get("round")) for r in rows] == [
        *(("sft", step, r) for r, (a, b) in ROUND_STEPS.items() for step in range(a, b + 1)), ("train", 1, None)]
    assert rows[0]["collect/episodes"] == 4 and rows[0]["collect/kept_episodes"] == 3
    first = {int(r["round"]): r for r in reversed(rows) if r["kind"] == "sft"}
    assert first[1]["dagger/expert_episodes"] == 2 and first[2]["dagger/expert_episodes"] == 1  # 4 x 0.5, x 0.25
    assert first[1]["dagger/episodes"] == first[2]["dagger/episodes"] == 4
    assert all(r["dagger/labels"] >= 1 and r["dagger/labels_dropped"] >= 0 for r in first.values() if r["round"])
    summary = (out / "summary.md").read_text()
    assert "| 1 (DAgger) | 3-4 | 4 (2) |" in summary and "| 2 (DAgger) | 5-6 | 4 (1) |" in summary
    assert first[1]["sft/rows_aggregate"] == 3 + first[1]["dagger/labels"]  # round 0's rows + round 1's labels
    assert first[2]["sft/rows_aggregate"] == first[1]["sft/rows_aggregate"] + first[2]["dagger/labels"]


@pytest.mark.slow
def test_labelled_rows_hold_the_experts_answer_for_each_state(uninterrupted) -> None:
    from agent_rl.models import load_policy

    out, _ = uninterrupted
    _, tok = load_policy(load_config(["model=tiny"]).model)
    checked = 0
    for r in (1, 2):
        saved = torch.load(out / "checkpoints" / "warm_start" / f"rows_round_{r}.pt", weights_only=False)
        batch, metrics = saved["batch"], saved["metrics"]
        assert batch.num_rows == metrics["dagger/labels"]
        for i in range(batch.num_rows):
            ids = batch.input_ids[i][batch.attention_mask[i].bool()]
            target = batch.response_mask[i][batch.attention_mask[i].bool()].bool()
            prompt, answer = tok.decode(ids[~target]), tok.decode(ids[target], skip_special_tokens=True)
            x = int(re.findall(r"You are at (-?\d+)\.", prompt)[-1])  # the state the turn acted on
            assert answer == f"<action>{expert_for(x)}</action>" and expert_for(x) != "look"
            checked += 1
    assert checked >= 2


@pytest.mark.slow
def test_the_log_is_one_story(uninterrupted) -> None:
    out, err = uninterrupted
    assert "\r" not in err
    stamps = [int(m) * 60 + int(s) for m, s in re.findall(r"^\[(\d\d):(\d\d)\]", err, re.M)]
    assert stamps == sorted(stamps)  # one clock for the whole command
    for phase in ("warm start 1/3: expert episodes", "warm start 1/3: update 1/2", "warm start 2/3: label",
                  "warm start 3/3: update 6/6",
                  "RL step 1/1: rollout", "RL step 1/1: update"):
        assert phase in err, phase
    assert err.index("warm start 3/3") < err.index("RL step 1/1")
    assert re.search(r"^cloning step 6: ce=\S+ acc=\S+", err, re.M) and re.search(r"^RL step 1: R=", err, re.M)
    assert f"config: {out}/config.yaml (the resolved config)" in err
    assert "rollout:\n" not in err and "max_turns:" not in err  # the config is not printed


class Killed(RuntimeError):
    """The process dying (after the previous step's checkpoint)."""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["cloning", "labelling", "ended"])
def test_a_run_killed_in_the_middle_of_a_round_resumes_it(where, uninterrupted, tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    from agent_rl import dagger
    from agent_rl.train import main

    out = tmp_path / "run"
    with monkeypatch.context() as m:
        if where == "cloning":  # round 1's second step (its first is checkpointed: trainer.save_every=1)
            real_update = dagger.DAggerBackend.update

            async def update(self, batch, step):
                if step == ROUND_STEPS[1][1]:
                    raise Killed(f"killed at step {step}")
                return await real_update(self, batch, step)

            m.setattr(dagger.DAggerBackend, "update", update)
        elif where == "labelling":  # round 2 starts labelling (round 1 ended and was checkpointed)
            real_play = dagger.play_round

            async def play_round(cfg, pool, engine, tokenizer, round_index, progress=None):
                if round_index == 2:
                    raise Killed("killed while labelling round 2")
                return await real_play(cfg, pool, engine, tokenizer, round_index, progress)

            m.setattr(dagger, "play_round", play_round)
        else:  # after the last round's checkpoint, before done.json
            from agent_rl import warm_start

            def latest_checkpoint(folder):
                raise Killed("killed before done.json")

            m.setattr(warm_start, "latest_checkpoint", latest_checkpoint)
        with pytest.raises(Killed):
            main([*RUN, f"trainer.output_dir={out}"])
    folder = out / "checkpoints" / "warm_start"
    assert not (folder / "done.json").exists()
    assert (folder / "rows_round_1.pt").exists() and (folder / "rows_round_2.pt").exists() == (where == "ended")
    capsys.readouterr()
    main([*RUN, f"trainer.output_dir={out}", "trainer.resume=auto"])
    err = capsys.readouterr().err
    if where == "cloning":  # round 1's labels are reused, its cloning goes on
        step = ROUND_STEPS[1][1]
        assert f"resumed from {folder}/step_{step - 1} at step {step}" in err and "reusing the" in err
    elif where == "labelling":  # round 2 labels again from round 1's last checkpoint
        step = ROUND_STEPS[2][0]
        assert f"resumed from {folder}/step_{step - 1} at step {step}" in err and "DAgger round 2:" in err
    else:  # nothing left to train; done.json names the last checkpoint and counts every step
        last = ROUND_STEPS[2][1]
        assert "nothing to train" in err
        done = json.loads((folder / "done.json").read_text())
        assert done["checkpoint"] == f"checkpoints/warm_start/step_{last}" and done["steps"] == last
    assert _rows(out) == _rows(uninterrupted[0])  # each row once, with the uninterrupted run's numbers
