"""README.md's tool env ("Tools", the block after ``readme-tool-env``), run as written: as a module on the path it
plays an episode through ``gymnasium.make`` (invalid calls answered with the reason, a right guess wins) and trains
one TGRL step with ``env=gym env.id=me/Guess-v0 env.action_format=tools env_server.imports=[my_tools_env]``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium

from agent_rl.logging import read_metrics
from agent_rl.train import main
from envs.tools import encode_call

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_module(tmp_path: Path, monkeypatch) -> str:
    text = README.read_text()
    block = re.search(r"<!-- readme-tool-env:[^\n]*\n```python\n(.*?)```", text, re.DOTALL)
    assert block, "README.md lost its tool env block"
    (tmp_path / "my_tools_env.py").write_text(block.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_tools_env", None)
    if "me/Guess-v0" in gymnasium.registry:
        del gymnasium.registry["me/Guess-v0"]
    return "my_tools_env"


def test_readme_tool_env_plays_and_trains(tmp_path, monkeypatch):
    __import__(readme_module(tmp_path, monkeypatch))
    env = gymnasium.make("me/Guess-v0")
    obs, info = env.reset(seed=3)
    assert [t["function"]["name"] for t in info["tools"]] == ["guess"]
    o, r, term, trunc, i = env.step(encode_call("guess", {"number": 500}))
    assert i["invalid_action"] and o == "Invalid tool call: wrong arguments for guess: 500 is greater than the " \
        "maximum of 100 (at number)"
    secret = env.unwrapped.secret
    assert env.step(encode_call("guess", {"number": 1 if secret > 1 else 2}))[0] in ("Higher.", "Lower.")
    assert env.step(encode_call("guess", {"number": secret}))[1:3] == (1.0, True)
    out = tmp_path / "run"
    main(["env=gym", "env.id=me/Guess-v0", "env.action_format=tools", "env_server.imports=[my_tools_env]",
          "env_server.mode=local", "model=tiny", "algo=tgrl", "algo.warmup_steps=0", "trainer.total_steps=1",
          "trainer.tasks_per_step=1", "rollout.max_turns=2", "engine.max_new_tokens=8", "trainer.progress=false",
          "trainer.loggers=[jsonl]", f"trainer.output_dir={out}"])
    (row,) = read_metrics(out / "metrics.jsonl", "train")
    assert row["rollout/episodes"] == 4 and 0.0 <= row["episode/invalid_action_frac"] <= 1.0
