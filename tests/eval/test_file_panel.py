"""eval.tasks=PATH: a task file is the panel (rows spread evenly, each a task's reset options); the training file
itself is refused as a panel."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("datasets")

from agent_rl.config.compose import load_config  # noqa: E402
from agent_rl.config.schema import ConfigError  # noqa: E402
from agent_rl.eval.runner import build_panels  # noqa: E402
from agent_rl.eval.training import TrainingEval  # noqa: E402
from agent_rl.progress import Progress  # noqa: E402


def test_file_panel(tmp_path):
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i}+1?", "final": str(i + 1)}) + "\n" for i in range(10)))
    cfg = load_config(["env=math", "model=tiny", f"eval.tasks={path}", "eval.num_tasks=4",
                       "env.task_fields.problem=question", "env.task_fields.answer=final"], check=False)
    panel, = build_panels(cfg)
    assert panel.name == "math_held_out" and panel.size == 10
    # spread(10, 4) = 0, 2, 5, 7
    assert [t.options for t in panel.tasks] == [{"problem": f"{i}+1?", "answer": str(i + 1)} for i in (0, 2, 5, 7)]
    assert [t.group_id for t in panel.tasks] == [0, 1, 2, 3]
    same = load_config(["env=math", "model=tiny", f"eval.tasks={path}", f"env.tasks={path}", "trainer.eval_every=1",
                        "env.task_fields.problem=question", "env.task_fields.answer=final"], check=False)
    with pytest.raises(ConfigError, match="is the training file env.tasks"):
        TrainingEval(same, tmp_path, Progress(enabled=False))
    missing = load_config(["env=math", "model=tiny", f"eval.tasks={tmp_path / 'nope.jsonl'}",
                           "trainer.eval_every=1"], check=False)
    with pytest.raises(ConfigError, match="eval.tasks=.*does not exist"):
        TrainingEval(missing, tmp_path, Progress(enabled=False))
