"""``agent_rl.memory.release_free_heap``: freed tensors that glibc keeps in a heap it cannot shrink (a live block
above them) go back to the OS (the SmolLM2 run that grew to 13.9 GB: docs/training.md, "Memory on a CPU"). In a fresh
process: glibc's dynamic mmap threshold depends on what the process freed before."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import torch
from agent_rl.memory import memory_metrics, release_free_heap
rss = lambda: memory_metrics("cpu")["perf/cpu_memory_used_gb"] * 1024
big = torch.ones(4 * 2**20)  # 16 MiB: freed, it raises glibc's dynamic mmap threshold to 16 MiB
del big
blocks = [torch.ones(2**18) for _ in range(200)]  # 200 x 1 MiB, written: now from the heap
pin = torch.ones(2**18)  # allocated after them: a live block above them
before = rss()
del blocks
freed = rss()
trimmed = release_free_heap() if sys.argv[1] == "trim" else None
print(json.dumps({"kept_after_free_mib": freed - before + 200, "released_by_trim_mib": freed - rss(),
                  "trimmed": trimmed}))
"""


def _child(mode: str, source: str = CHILD) -> dict:
    """Run ``source`` in a fresh Python (no ``MALLOC_*`` tuning, one thread) and return the JSON of its last line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", source, mode], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux")
def test_release_free_heap_returns_what_free_kept():
    plain = _child("free")
    assert plain["kept_after_free_mib"] > 180  # free() alone: the 200 MiB stay resident under the live block
    got = _child("trim")
    assert got["trimmed"] is True
    assert got["released_by_trim_mib"] > 180  # malloc_trim(0) gives them back


FOLLOW = r"""
import json
import torch
from agent_rl.memory import memory_metrics
before = memory_metrics("cpu")
block = torch.ones(64 * 2**20)  # 256 MiB of float32, written
after = memory_metrics("cpu")
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm: Linux")
def test_memory_metrics_follow_this_process():
    """``perf/`` memory metrics: the resident set grows by what is allocated and touched and the peak is never below
    it (docs/training.md, "Memory on a CPU"). In a fresh process: inside the test run, other threads free and
    allocate between the two readings (a CI run saw the resident set grow by 168 of 256 MiB)."""
    got = _child("follow", FOLLOW)
    before, after = got["before"], got["after"]
    assert after["perf/cpu_memory_used_gb"] - before["perf/cpu_memory_used_gb"] > 0.9 * 0.25
    assert after["perf/max_rss_gb"] >= after["perf/cpu_memory_used_gb"] * 0.99
    assert after["perf/max_rss_gb"] >= before["perf/max_rss_gb"]
    assert "perf/max_memory_allocated_gb" not in after  # CUDA only
