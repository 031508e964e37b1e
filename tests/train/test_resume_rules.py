"""Issue 34: the resume rule of every config key is declared on its dataclass field (``agent_rl.resume_rules``) and
read by one function (``agent_rl.resume``): every key has one, the table is the one of the code before the move
(recorded at cd94af9 from ``RESUME_MAY_CHANGE`` / ``RESUME_APPLIED``) except the two token-identical engine options
that table forgot, and a run made with ``engine.kv_reuse=true`` resumes with ``engine.kv_reuse=false``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent_rl.config.compose import config_dict, load_config
from agent_rl.logging import read_metrics
from agent_rl.resume import RESUME_APPLIED, compare_for_resume, may_change_on_resume, resume_rule, resume_rules, rules_of
from agent_rl.resume_rules import MAY_CHANGE, MUST_MATCH, applied
from agent_rl.train import main

FIXTURE = Path(__file__).parent / "fixtures" / "resume_rules_cd94af9.json"
FORGOTTEN = {"engine.kv_reuse", "engine.kv_reuse_max_tokens"}  # token-identical: may change (issue 34)
#: keys added after the recording, with their rule: TAMPO's meta-policy and the temperature schedule (issue 38) choose
#: the sampling temperatures, so a resume must keep them (a resumed run draws what an uninterrupted one would)
ADDED = {**{f"algo.tampo.{k}": "must match" for k in ("temps", "norm", "norm_tau", "ema_alpha", "top_p", "scope",
                                                       "warmup_steps")},
         "rollout.temperature_schedule": "must match"}
#: keys removed after the recording: trainer.tensorboard became the tensorboard entry of trainer.loggers (issue 39)
REMOVED = {"trainer.tensorboard"}


def _recorded() -> dict[str, str]:
    return {k: v for k, v in json.loads(FIXTURE.read_text()).items() if k not in REMOVED}


def test_every_config_key_declares_a_resume_rule():
    rules = resume_rules()  # raises TypeError naming any key without one
    assert set(_recorded()) <= set(rules)  # keys added later resolve too (their group's rule)
    assert all(r is not None and r[0] in ("may change", "applied", "must match") for r in rules.values())
    assert all(how for rule, how in rules.values() if rule == "applied")  # each applied key names its code


@dataclass
class _Inner:
    a: int = 0
    b: int = field(default=0, metadata=MAY_CHANGE)


@dataclass
class _Root:
    declared: _Inner = field(default_factory=_Inner, metadata=MUST_MATCH)
    bare: _Inner = field(default_factory=_Inner)
    c: float = field(default=0.0, metadata=applied("somewhere"))


def test_a_field_without_a_rule_in_a_group_without_one_is_found():
    assert rules_of(_Root) == {"declared.a": ("must match", ""), "declared.b": ("may change", ""),
                              "bare.a": None, "bare.b": ("may change", ""), "c": ("applied", "somewhere")}


def test_the_rules_are_the_table_of_the_code_before_except_the_forgotten_engine_options():
    before = _recorded()
    assert resume_rule("trainer.loggers")[0] == "may change"
    now = {k: r[0] for k, r in resume_rules().items()}
    assert {k: now[k] for k in ADDED} == ADDED
    changed = {k for k in before if before[k] != now.get(k)}
    assert changed == FORGOTTEN and all(now[k] == "may change" for k in FORGOTTEN)
    assert all(before[k] == "must match" for k in FORGOTTEN)  # what refused the resume
    assert set(RESUME_APPLIED) >= {k for k, v in before.items() if v == "applied"}
    assert resume_rule("env.kwargs.max_turns") == resume_rule("env.kwargs") == ("must match", "")
    assert may_change_on_resume("env_server.urls") and not may_change_on_resume("algo.name")


def test_a_kv_reuse_flip_is_accepted_by_the_compare():
    saved = load_config(["model=tiny", "env=choose_item", "env_server.mode=local", "engine.kv_reuse=true"])
    cfg = load_config(["model=tiny", "env=choose_item", "env_server.mode=local", "engine.kv_reuse=false",
                       "engine.kv_reuse_max_tokens=100"])
    assert compare_for_resume(config_dict(saved), cfg) == [
        "resume: engine.kv_reuse: True -> False (may change)",
        "resume: engine.kv_reuse_max_tokens: 32768 -> 100 (may change)"]


@pytest.mark.slow
def test_the_cli_resumes_a_kv_reuse_run_with_kv_reuse_off(tmp_path):
    out = tmp_path / "D"
    base = ["model=tiny", "env=choose_item", "env_server.mode=local", "trainer.tasks_per_step=1",
            "rollout.max_turns=1", "engine.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[jsonl]",
            "algo=grpo", "trainer=default", f"trainer.output_dir={out}"]
    main([*base, "trainer.total_steps=1", "engine.kv_reuse=true"])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-m", "agent_rl.train", *base, "trainer.total_steps=2",
                           "trainer.resume=auto", "engine.kv_reuse=false"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resume: engine.kv_reuse: True -> False (may change)" in proc.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2]
