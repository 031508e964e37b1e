"""A new env describes itself (``envs.families``) and gets evaluation panels, reference rows and the in-training
panel without a line of ``agent_rl/eval``: a user's env (registered here, played in-process) with splits, task
types and an expert, through ``python -m agent_rl.eval``'s code path and ``TrainingEval``."""

from __future__ import annotations

import json

import gymnasium
import pytest

from agent_rl.config.compose import load_config

from agent_rl.config.schema import ConfigError
from agent_rl.eval.runner import build_panels
from agent_rl.eval.runner import main as eval_main
from agent_rl.eval.training import TrainingEval
from agent_rl.progress import Progress
from envs import families
from envs.families import EnvFamily
from envs.spaces import TextSpace

ENV_ID = "tests/Countdown-v0"
SIZES = {"train": 20, "held": 6}


class CountdownEnv(gymnasium.Env):
    """Task ``{"part": split, "i": i}``: say ``go`` ``1 + i % 3`` times (the expert does; ``stop`` loses). The task
    type is ``short`` / ``long`` by the number of steps."""

    def __init__(self, expert: bool = False) -> None:
        self.expert = expert
        self.observation_space = TextSpace(256)
        self.action_space = TextSpace(256)

    def _info(self) -> dict:
        info = {"admissible_actions": ["go", "stop"], "task_type": "short" if self.need == 1 else "long",
                "task_id": f"{self.part}/{self.i}", "won": self.left == 0}
        if self.expert:
            info["expert_action"] = "go"
        return info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        self.part, self.i = options.get("part", "train"), int(options.get("i", 0))
        if self.part not in SIZES:
            raise ValueError(f"unknown part {self.part!r}")
        self.need = self.left = 1 + self.i % 3
        return f"say go {self.left} times", self._info()

    def step(self, action):
        if action == "go":
            self.left -= 1
        done = self.left == 0 or action == "stop"
        return f"{self.left} to go", float(self.left == 0), done, False, self._info()


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=CountdownEnv, max_episode_steps=5)

FAMILY = EnvFamily(name="countdown", env_id=ENV_ID, default_split="held", split_key="part", index_key="i",
                   split_aliases={"test": "held"}, split_size=lambda split, root: SIZES[split],
                   task_types=lambda split, root: ["short" if i % 3 == 0 else "long" for i in range(SIZES[split])],
                   expert_kwarg="expert", admissible_actions=True)
BASE = ["env=gym", f"env.id={ENV_ID}", "env.name=countdown", "env_server.mode=local", "model=tiny",
        "trainer.progress=false", "rollout.max_turns=5"]


@pytest.fixture()
def described(monkeypatch):
    monkeypatch.setattr(families, "_REGISTRY", dict(families._REGISTRY))  # this test's registration stays here
    families.register_family(FAMILY)


def test_an_undescribed_env_has_no_panel_and_training_says_so(capsys):
    cfg = load_config([*BASE, "trainer.eval_every=1"])
    with pytest.raises(ValueError, match=f"no evaluation panel for env.id='{ENV_ID}'; panels exist for "):
        build_panels(cfg)
    assert not TrainingEval(cfg, None, Progress(enabled=False)).enabled


@pytest.mark.slow  # two evaluation runs end to end
def test_a_described_env_gets_panels_reference_rows_and_a_held_out_check(described, tmp_path):
    cfg = load_config([*BASE, "eval.num_tasks=3"])
    (panel,) = build_panels(cfg)
    assert (panel.name, panel.size) == ("countdown_held", 6)  # the family's default split, its size
    assert [t.options for t in panel.tasks] == [{"part": "held", "i": i} for i in (0, 2, 4)]  # spread over 6
    assert panel.task_types == ["short", "long", "long"]
    assert [p.name for p in build_panels(cfg, split="test,train")] == ["countdown_test", "countdown_train"]
    assert build_panels(cfg, split="test")[0].tasks[0].options == {"part": "held", "i": 0}  # the alias

    out = tmp_path / "ev"
    eval_main([*BASE, "policy=expert", "eval.num_tasks=3", f"eval.output_dir={out}"])
    res = json.loads((out / "eval" / "countdown_held.json").read_text())
    # the expert says go 1 + i % 3 times: tasks 0, 2, 4 take 1, 3, 2 turns, all won
    assert res["success"] == 1.0 and [e["turns"] for e in res["episodes"]] == [1, 3, 2]
    assert res["per_task_type"] == {"long": {"success": 1.0, "games": 2, "episodes": 2},
                                    "short": {"success": 1.0, "games": 1, "episodes": 1}}
    assert [e["task_id"] for e in res["episodes"]] == ["held/0", "held/2", "held/4"]
    eval_main([*BASE, "policy=random", "eval.num_tasks=3", f"eval.output_dir={out}"])
    assert json.loads((out / "eval" / "countdown_held.json").read_text())["policy"] == "random"

    # the in-training panel is held out: training on the panel's split is refused (by the family's split key)
    with pytest.raises(ConfigError, match="trainer.eval_panel='held' is the training split/dataset 'held'"):
        TrainingEval(load_config([*BASE, "trainer.eval_every=1", "env.sampler.options.part=held"]), tmp_path,
                     Progress(enabled=False))
    assert TrainingEval(load_config([*BASE, "trainer.eval_every=1", "env.sampler.options.part=train"]), tmp_path,
                        Progress(enabled=False)).enabled
