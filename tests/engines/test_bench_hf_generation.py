"""``benchmarks/bench_hf_generation.py`` runs as documented (tiny model): every variant on the same rows; the float32
variants sample the tokens of ``before`` (shared prefill and growing caches change no token), and the counters
show the shared prefill (one prompt prefilled per group)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_hf_generation_variants(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/bench_hf_generation.py", "--model", "tiny", "--prompts", "2",
                           "--group", "3", "--max-new-tokens", "4", "--rounds", "1", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    s = res["summary"]
    assert set(s) == {"before", "shared_prefill", "default", "bfloat16"} and res["rows"] == 6
    for name in ("shared_prefill", "default"):
        assert s[name]["same_tokens_as_before"] is True, name
        assert s[name]["tokens_per_cpu_s"] > 0 and s[name]["vs_before"] > 0
    before, shared = res["rounds"]["before"][0], res["rounds"]["shared_prefill"][0]
    assert before["kv_reuse_tokens"] == 0 and shared["kv_reuse_tokens"] > 0
    assert shared["prefill_tokens"] + shared["kv_reuse_tokens"] == before["prefill_tokens"]
    # two distinct prompts, three rows each: two of every three prompt prefills are copies
    assert shared["kv_reuse_tokens"] == 2 * shared["prefill_tokens"]
