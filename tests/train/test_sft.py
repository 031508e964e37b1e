"""Behaviour cloning (``python -m agent_rl.sft``) on TextWorld coin-collector expert episodes with the tiny model:
the action-token cross-entropy falls, the loss is the hand-computed masked CE, the checkpoint loads as
``model.path``, a resumed run continues; and ``env=textworld`` trains one RL step."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import textworld  # noqa: F401  (installed by scripts/setup.sh's .[all]: absent is a broken install, not a skip)

from agent_rl import sft as sft_mod  # noqa: E402
from agent_rl.config.schema import ConfigError  # noqa: E402
from agent_rl.logging import read_metrics  # noqa: E402
from envs.textworld import games as tw_games  # noqa: E402

pytestmark = pytest.mark.slow  # end to end: real training runs (fast tier: pytest -m 'not slow')

GAMES = [("coin_collector", 1, "train", i) for i in range(2)]
BASE = ["env=textworld", "env.kwargs.family=coin_collector", "env.kwargs.level=1", "env.sampler.num_tasks=2",
        "model=tiny", "env_server.mode=local", "trainer.progress=false", "trainer.loggers=[jsonl]",
        "engine.num_threads=1"]


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory):
    """The session's shared TextWorld games folder, with the 2 coin-collector train games generated."""
    root = tmp_path_factory.getbasetemp() / "textworld_games"
    root.mkdir(exist_ok=True)
    old = os.environ.get("AGENT_RL_TEXTWORLD_GAMES")
    os.environ["AGENT_RL_TEXTWORLD_GAMES"] = str(root)
    tw_games._build(GAMES, root)
    yield root
    if old is None:
        os.environ.pop("AGENT_RL_TEXTWORLD_GAMES", None)
    else:
        os.environ["AGENT_RL_TEXTWORLD_GAMES"] = old


@pytest.fixture(scope="module")
def sft_run(games: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("sft") / "run"
    summary = sft_mod.main([*BASE, "sft.num_episodes=4", "sft.epochs=3", "sft.batch_size=4",
                            f"trainer.output_dir={out}"])
    return out, summary


def test_sft_lowers_action_cross_entropy(sft_run) -> None:
    out, summary = sft_run
    assert summary["collect/success_rate"] == 1.0 and summary["collect/kept_episodes"] == 4
    assert summary["rows"] == 4 and summary["steps"] == 3  # coin collector level 1: one turn ("take coin")
    assert summary["loss_after"] < summary["loss_before"] - 0.5, summary
    records = read_metrics(out / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [("sft", 1), ("sft", 2), ("sft", 3)]
    assert not any("reward/mean" in r for r in records)  # behaviour cloning rows hold no RL names
    assert all(r["sft/loss"] > 0 and r["actor/grad_norm"] > 0 for r in records)
    assert records[-1]["sft/loss"] < records[0]["sft/loss"]
    assert (out / "checkpoints" / "step_3" / "learner.pt").is_file()


def test_rows_are_the_rl_rows_with_the_expert_action(sft_run) -> None:
    """Row = RL prompt (the textworld prompt, rendered by the chat template) + "<action>take coin</action><eos>";
    only the response tokens are in the loss."""
    from agent_rl.models import load_policy
    from agent_rl.config.compose import load_config

    out, _ = sft_run
    batch = torch.load(out / "sft_rows.pt", weights_only=False)["batch"]
    _, tokenizer = load_policy(load_config(["model=tiny"]).model)
    for i in range(batch.num_rows):
        ids = batch.input_ids[i][batch.attention_mask[i].bool()]
        resp = batch.input_ids[i][batch.response_mask[i].bool()]
        assert tokenizer.decode(resp) == "<action>take coin</action>" + tokenizer.eos_token
        prompt = tokenizer.decode(ids[: len(ids) - len(resp)])
        assert "Your task is to:" in prompt and "Admissible actions: [" in prompt and "take coin" in prompt
        assert prompt.rstrip().endswith("assistant")  # the generation prompt of the chat template


def test_loss_is_the_masked_token_cross_entropy(sft_run) -> None:
    """BehaviourCloner.evaluate equals F.cross_entropy of the full model's logits on response tokens only."""
    from agent_rl.config.compose import load_config
    from agent_rl.models import load_policy

    out, summary = sft_run
    batch = torch.load(out / "sft_rows.pt", weights_only=False)["batch"]
    cfg = load_config(["model=tiny", f"model.path={out / 'checkpoints' / 'step_3'}"])
    model, _ = load_policy(cfg.model)  # the checkpoint loads as model.path
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, L, V)
    labels = batch.input_ids[:, 1:].masked_fill(batch.response_mask[:, 1:] == 0, -100)
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100)
    cloner = sft_mod.BehaviourCloner(model, cfg.optim, micro_batch_size=3)
    got = cloner.evaluate(batch)
    assert got["loss"] == pytest.approx(float(expected), abs=1e-4)
    assert got["loss"] == pytest.approx(summary["loss_after"], abs=1e-4)  # the saved weights are the trained ones
    assert got["tokens"] == float(batch.response_mask[:, 1:].sum())


def test_a_cloning_step_gives_the_freed_heap_back_before_and_after(sft_run, monkeypatch) -> None:
    """The learner's memory fix (``agent_rl.memory.release_free_heap`` around the activations) in the cloning step
    too: without it a SmolLM2 cloning run (8 trajectory rows a micro-batch) grew to 24 GB and was OOM-killed."""
    from agent_rl.config.compose import load_config
    from agent_rl.models import load_policy

    out, _ = sft_run
    batch = torch.load(out / "sft_rows.pt", weights_only=False)["batch"]
    cfg = load_config(["model=tiny"])
    model, _ = load_policy(cfg.model)
    calls: list[str] = []
    monkeypatch.setattr(sft_mod, "release_free_heap", lambda: calls.append("trim") or 0)
    cloner = sft_mod.BehaviourCloner(model, cfg.optim, micro_batch_size=2)
    original = cloner.optimizer.step
    monkeypatch.setattr(cloner.optimizer, "step", lambda *a, **k: (calls.append("step"), original(*a, **k))[1])
    cloner.train_step(batch, torch.arange(min(4, batch.num_rows)))
    assert calls == ["trim", "step", "trim"]


def test_resume_continues_on_the_saved_rows(sft_run) -> None:
    out, _ = sft_run
    rows_mtime = (out / "sft_rows.pt").stat().st_mtime
    with pytest.raises(ConfigError, match="already holds a run"):
        sft_mod.main([*BASE, "sft.num_episodes=4", "sft.epochs=4", "sft.batch_size=4", f"trainer.output_dir={out}"])
    summary = sft_mod.main([*BASE, "sft.num_episodes=4", "sft.epochs=4", "sft.batch_size=4",
                            f"trainer.output_dir={out}", "trainer.resume=auto"])
    assert summary["steps"] == 4 and (out / "sft_rows.pt").stat().st_mtime == rows_mtime
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "sft")] == [1, 2, 3, 4]
    assert (out / "checkpoints" / "step_4").is_dir()


def test_bad_sft_key_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="sft.num_episodes"):
        sft_mod.load_sft_config(["model=tiny", "sft.num_episodez=3"])
    with pytest.raises(ConfigError):
        sft_mod.load_sft_config(["model=tiny", "sft.epochs=0"])


def test_textworld_one_rl_step(games: Path, tmp_path: Path) -> None:
    from agent_rl.train import main

    out = tmp_path / "rl"
    main([*BASE, "algo=tgrl", "algo.warmup_steps=0", "trainer.total_steps=1", "trainer.tasks_per_step=1",
          "rollout.max_turns=2", "engine.max_new_tokens=8", f"trainer.output_dir={out}"])
    (rec,) = read_metrics(out / "metrics.jsonl", "train")
    assert rec["episode/turns_mean"] >= 1 and rec["rollout/episodes"] == 4
    assert (out / "checkpoints" / "step_1").is_dir()


def test_sft_with_lora_trains_the_adapter_and_resumes_it(games: Path, tmp_path: Path) -> None:
    """Behaviour cloning with ``model.lora.rank=4``: the adapter's learning rate (model=tiny's optim.lora_lr),
    the loss falls, checkpoints hold ``adapter/`` beside a plain transformers folder, and a resume continues."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora"
    args = [*BASE, "sft.num_episodes=4", "sft.batch_size=4", "model.lora.rank=4", f"trainer.output_dir={out}"]
    summary = sft_mod.main([*args, "sft.epochs=3"])
    assert summary["loss_after"] < summary["loss_before"], summary
    records = read_metrics(out / "metrics.jsonl", "sft")
    assert [r["actor/lr"] for r in records] == [pytest.approx(3e-3)] * 3
    ckpt = out / "checkpoints" / "step_3"
    assert (ckpt / "adapter" / "adapter_model.safetensors").is_file()
    assert not any("lora_" in k for k in AutoModelForCausalLM.from_pretrained(ckpt).state_dict())
    summary = sft_mod.main([*args, "sft.epochs=4", "trainer.resume=auto"])
    assert summary["steps"] == 4 and [r["step"] for r in read_metrics(out / "metrics.jsonl", "sft")] == [1, 2, 3, 4]


def _prompts(out: Path) -> list[str]:
    batch = torch.load(out / "sft_rows.pt", weights_only=False)["batch"]
    return [str(batch.input_ids[i][batch.attention_mask[i].bool() & ~batch.response_mask[i].bool()].tolist())
            for i in range(batch.num_rows)]


def test_sft_plays_the_task_file_rows(sft_run, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``env.tasks=FILE`` reaches behaviour cloning (it used to be ignored: the expert played ``env.sampler``'s
    games): a file holding only train game 1 gives rows of game 1 alone, where the sampler's 2 games give 2 prompts."""
    assert len(set(_prompts(sft_run[0]))) == 2  # the env.sampler run above: games 0 and 1
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"split": "train", "index": 1}\n')
    out = tmp_path / "file"
    summary = sft_mod.main([*BASE, f"env.tasks={tasks}", "sft.num_episodes=3", "sft.epochs=1", "sft.batch_size=3",
                            "trainer.curriculum=pass_rate", f"trainer.output_dir={out}", "trainer.progress=true"])
    assert summary["rows"] == 3 and summary["collect/success_rate"] == 1.0
    prompts = _prompts(out)
    assert len(set(prompts)) == 1 and prompts[0] in set(_prompts(sft_run[0]))
    err = capsys.readouterr().err
    assert "tasks: 1 rows from" in err  # the task file's description (rows, columns, first row)
    # the command's phases are named as cloning, never as RL's steps
    assert "cloning: expert episodes" in err and "cloning: update 1/1" in err and "RL step" not in err
