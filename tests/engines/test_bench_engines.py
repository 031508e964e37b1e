"""``benchmarks/bench_engines.py`` runs as documented on the hf engine (the main suite has no vLLM): one engine
start measures every batch size of ``--batch``, and its sampled log-probs are the learner's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_engines_measures_each_batch_size(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/bench_engines.py", "--engines", "hf", "--model", "tiny",
                           "--batch", "3,1", "--max-new-tokens", "4", "--rounds", "1", "--syncs", "1",
                           "--threads", "1", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "results.json").read_text())
    hf = result["results"]["hf"]
    assert hf["tokens_per_s_b1"] > 0 and hf["tokens_per_s_b3"] > 0 and "tokens_per_s" not in hf
    assert hf["logprob_diff"] < 1e-4 and hf["logprob_diff_after_sync"] < 1e-4
    assert "batch 1, round 1" in proc.stdout and "batch 3, round 1" in proc.stdout
    assert proc.stdout.index("batch 1, round 1") < proc.stdout.index("batch 3, round 1")
