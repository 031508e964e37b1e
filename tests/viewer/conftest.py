"""Fixtures of the viewer tests: one tiny training run (train.main, save_episodes=all) made once per session, with
the learner's batch and token tensors captured at the moment the trainer stores them; a hand-made hostile run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from viewer_helpers import HOSTILE_ACTION, HOSTILE_OBS, TINY_RUN, ByteTokenizer, make_episode


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{"dir": run dir, "metrics": {step: train row}, "steps": {step: {"episodes", "batch", "token_stats"}}} of a
    2-step tiny TGRL run on ChooseItem, captured when the trainer hands them to the store."""
    import agent_rl.episodes as store
    from agent_rl import loop
    from agent_rl.logging import metrics_by_step
    from agent_rl.train import main

    out = tmp_path_factory.mktemp("viewer") / "tiny-run"
    captured: dict[int, dict[str, Any]] = {}
    original = store.save_step_episodes

    def spy(run_dir, step, episodes, setting, *, tokenizer, batch, token_stats, seed=0):  # noqa: ANN001
        captured[step] = dict(episodes=list(episodes), batch=batch, setting=setting,
                              token_stats={k: v.clone() for k, v in token_stats.items()})
        return original(run_dir, step, episodes, setting, tokenizer=tokenizer, batch=batch,
                        token_stats=token_stats, seed=seed)

    mp = pytest.MonkeyPatch()
    mp.setattr(loop, "save_step_episodes", spy)  # the name the training loop calls
    try:
        main([*TINY_RUN, f"trainer.output_dir={out}"])
    finally:
        mp.undo()
    metrics = metrics_by_step(out / "metrics.jsonl", "train")
    return {"dir": out, "metrics": metrics, "steps": captured}


@pytest.fixture()
def hostile_run(tmp_path: Path) -> Path:
    """A run dir with one step of hand-made episodes whose observation, action, task type and prompt are HTML."""
    from agent_rl.episodes import write_episodes

    tok = ByteTokenizer()
    eps = [make_episode(tok, 0, is_high=False, responses=[f"<action>{HOSTILE_ACTION}</action>", "é ok"],
                        observations=[HOSTILE_OBS, "done"], won=True, task_type="<i>type</i>",
                        prompt="<script>alert('prompt')</script>"),
           make_episode(tok, 0, is_high=True, responses=["go"], observations=["nothing"], won=False)]
    run = tmp_path / "hostile<run>"
    run.mkdir()
    (run / "config.yaml").write_text("trainer:\n  note: <script>alert('config')</script>\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    write_episodes(run, 1, eps, tokenizer=tok)
    return run
