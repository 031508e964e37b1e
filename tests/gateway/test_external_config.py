"""``env=external``'s config: what cannot run is refused at load time with the key to set."""

from __future__ import annotations

import pytest

from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError

BASE = ["env=external", "model=tiny", "env.external.program=tests.gateway.programs:calculator_tools"]


def test_external_config(tmp_path):
    cfg = load_config(BASE + ["env.external.tasks=agent_rl/Math-v0"])
    assert cfg.env.id == "agent_rl/Math-v0" and cfg.env_server.mode == "http"  # the env id's server runs
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "1 + 1"}\n')
    cfg = load_config(BASE + [f"env.external.tasks={tasks}"])
    assert cfg.env_server.mode == "local"  # a task file needs no env server
    with pytest.raises(ConfigError, match="env.external.program=MODULE:FUNCTION"):
        load_config(["env=external", "model=tiny"])
    # full-trajectory rows (one per segment) and the Ray backend load (tests/gateway/test_gateway.py,
    # test_train_external.py train them)
    cfg = load_config(BASE + ["rollout.mode=trajectory", "trainer.backend=ray"])
    assert cfg.rollout.mode == "trajectory" and cfg.trainer.backend == "ray"
    with pytest.raises(ConfigError, match="does not fork groups"):
        load_config(BASE + ["rollout.fork.points=1", "rollout.fork.siblings=2"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(BASE + [f"env.external.tasks={tmp_path / 'missing.jsonl'}"])
    with pytest.raises(ConfigError, match="exclusive"):
        load_config(BASE + ["env.external.command=python x.py"])
    with pytest.raises(ConfigError, match="MODULE:FUNCTION"):
        load_config(["env=external", "model=tiny", "env.external.program=nocolon"])
