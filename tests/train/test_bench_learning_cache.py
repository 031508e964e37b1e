"""``benchmarks/bench_learning.py --eval-cache``: a panel is played once per policy and settings, and any change
of the policy's files or of what the panel plays with is a different entry."""
import argparse
import importlib.util
import os
from pathlib import Path

import pytest

from agent_rl.config.compose import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "benchmarks" / "bench_learning.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cfg(path: Path, *extra: str):
    return load_config(["env=textworld", "model=tiny", f"model.path={path}", *extra])


def test_panel_key_follows_policy_files_and_settings(bench, tmp_path):
    ck = tmp_path / "step_2"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"0")
    cfg = _cfg(ck)
    key = bench.panel_key(cfg, None, 50, "test", 0.0)
    assert key == bench.panel_key(cfg, None, 50, "test", 0.0)
    assert key == bench.panel_key(_cfg(ck, "algo=tgrl"), None, 50, "test", 0.0)  # the algorithm is not the policy
    assert key != bench.panel_key(cfg, None, 20, "test", 0.0)
    assert key != bench.panel_key(cfg, None, 50, "test", 1.0)
    assert key != bench.panel_key(_cfg(ck, "rollout.max_turns=7"), None, 50, "test", 0.0)
    assert key != bench.panel_key(_cfg(ck, "env.kwargs.level=4"), None, 50, "test", 0.0)
    other = tmp_path / "step_4"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"0")
    assert key != bench.panel_key(cfg, other, 50, "test", 0.0)  # a checkpoint instead of the start
    st = (ck / "model.safetensors").stat()
    os.utime(ck / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # overwritten weights
    assert key != bench.panel_key(cfg, None, 50, "test", 0.0)


def test_cached_evaluate_plays_once(bench, tmp_path, monkeypatch):
    ck = tmp_path / "step_2"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"0")
    played = []

    def fake_evaluate(cfg, checkpoint, panel, split, temperature=0.0, stats=None):
        played.append((checkpoint, panel))
        stats.update(success=0.25 * len(played), invalid_frac=0.5, mean_turns=3.0, wall_s=1.0)
        return stats["success"]

    monkeypatch.setattr(bench, "evaluate", fake_evaluate)
    args = argparse.Namespace(eval_cache=str(tmp_path / "panels.json"), panel=8, split="test")
    cfg = _cfg(ck)
    st: dict = {}
    assert bench.cached_evaluate(cfg, None, args, stats=st) == 0.25
    assert bench.cached_evaluate(cfg, None, args) == 0.25 and len(played) == 1  # read, not replayed
    assert st["invalid_frac"] == 0.5
    assert bench.cached_evaluate(cfg, ck, args) == 0.25 and len(played) == 1  # the same policy, named directly
    args.panel = 9
    assert bench.cached_evaluate(cfg, None, args) == 0.5 and len(played) == 2
    no_cache = argparse.Namespace(eval_cache="", panel=8, split="test")
    assert bench.cached_evaluate(cfg, None, no_cache) == 0.75 and len(played) == 3


@pytest.mark.parametrize("select", ["js", "uniform"])
def test_a_panel_never_forks(bench, select):
    """A run's ``rollout.fork`` does not reach the panel: it plays exactly its games (forks under ``budget=extra``
    would add sibling episodes to the count; ``select=js`` refused the panel's engine, which has no T0/T1)."""
    cfg = load_config(["env=choose_item", "model=tiny", "algo=tgrl", "rollout.max_turns=2", "engine.max_new_tokens=4",
                       "rollout.fork.points=1", "rollout.fork.siblings=3", "rollout.fork.budget=extra",
                       f"rollout.fork.select={select}"])
    assert cfg.rollout.fork.enabled
    stats: dict = {}
    success = bench.evaluate(cfg, None, 3, "test", temperature=1.0, stats=stats)
    assert len(stats["episodes"]) == 3 and [e["index"] for e in stats["episodes"]] == [0, 1, 2]
    assert success == sum(e["won"] for e in stats["episodes"]) / 3
