"""Issue 23 on the Ray backend: the acceptance command with trainer.max_staleness=1 (1 learner rank, 1 rollout
worker that keeps playing while the learner updates)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # a local Ray cluster and real training


def test_acceptance_command_ray_k1(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    from test_async import ACCEPTANCE, check_async_rows

    from agent_rl.train import main

    out = tmp_path / "run"
    main([*ACCEPTANCE, "trainer.backend=ray", f"trainer.output_dir={out}"])
    rows = check_async_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["async/staleness_max"] == 0.0 and max(r["async/staleness_max"] for r in rows[1:]) == 1.0
    assert all(r["rollout/worker_restarts"] == 0.0 for r in rows)
    log = (out / "weight_versions.jsonl").read_text().splitlines()
    versions = [json.loads(line)["weight_version"] for line in log]
    assert versions and set(versions) <= {0, 1, 2}
