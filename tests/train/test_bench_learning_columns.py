"""``benchmarks/bench_learning.py``'s per-step columns: what each training step generated, cost and trained on,
read from the run's own metrics (the forked-groups table of docs/learning.md is built from them)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "benchmarks" / "bench_learning.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_forked_and_plain_steps_report_generated_turns_and_fork_costs(bench):
    plain = {"step": 1, "rollout/episodes": 16.0, "episode/turns_mean": 4.25, "actor/grad_norm": 0.0,
             "throughput/kv_reuse_tokens": 900.0, "rollout/dropped_groups": 0.0, "time/rollout_s": 30.0,
             "time/update_s": 40.0, "rollout/groups_equal_frac": 0.5, "success/rate": 0.25}
    forked = {"step": 2, "rollout/episodes": 20.0, "episode/turns_mean": 5.0, "fork/generated_turns": 61.0,
              "fork/groups": 3.0, "fork/extra_episodes": 9.0, "fork/filled_episodes": 1.0, "fork/replay_s": 2.5,
              "fork/replayed_turns": 14.0, "fork/replay_mismatch": 0.0, "actor/grad_norm": 1.5}
    cols = bench.per_step_choices([plain, forked])
    # a plain step generated every turn of its episodes: 16 x 4.25; a forked one its own count (prefixes replayed)
    assert cols["generated_turns"] == [68.0, 61.0]
    assert cols["grad_norm"] == [0.0, 1.5]
    assert cols["fork_groups"] == [None, 3.0]
    assert cols["fork_siblings"] == [None, 9.0]
    assert cols["filled_episodes"] == [None, 1.0]
    assert cols["replay_s"] == [None, 2.5]
    assert cols["replayed_turns"] == [None, 14.0]
    assert cols["replay_mismatch"] == [None, 0.0]
    assert cols["kv_reuse_tokens"] == [900.0, None]
    assert cols["dropped_groups"] == [0.0, None]
    assert cols["rollout_s"] == [30.0, None] and cols["update_s"] == [40.0, None]
    assert cols["train_step"] == [1, 2] and cols["groups_equal_frac"] == [0.5, None]


def test_a_step_without_episode_counts_has_no_generated_turns(bench):
    assert bench.per_step_choices([{"step": 1}])["generated_turns"] == [None]
