"""hf engine, continuous batching: with more rows than ``batch_size``, waiting rows take finished rows' places at
once, and every row samples the same tokens as in the plain loop (batches one after the other) for the same seeds.
Tiny random Llama in float64 (so no near-tie flips in the float32 cast), CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.engines import HFEngine
from agent_rl.learner.config import ModelConfig
from agent_rl.models import load_policy

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny64():
    model, tok = load_policy(ModelConfig(name="tiny"))
    return copy.deepcopy(model).double(), tok


def _prompts(tok, n: int) -> list[list[int]]:
    return [list(tok.apply_chat_template([{"role": "user", "content": "go " * (1 + (5 * i) % 11)}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False))
            for i in range(n)]


class _Forwards:
    """Counts the model's forward calls and the rows each one carried."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[int] = []
        self.handle = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        self.calls.append(int(kwargs["input_ids"].shape[0]))


def _engines(model, tok, vocab: int, **kw) -> tuple[HFEngine, HFEngine]:
    # every 6th id ends a response: rows finish at scattered steps, so places free up mid-batch
    eos = list(range(3, vocab, 6))
    return (HFEngine(model, tok, batch_size=3, eos_token_ids=eos, continuous_batching=True, **kw),
            HFEngine(model, tok, batch_size=3, eos_token_ids=eos, continuous_batching=False, **kw))


@pytest.mark.timeout(600)
def test_continuous_batching_samples_the_plain_loops_tokens(tiny64):
    """10 rows, batch_size 3, temperatures mixed (a greedy row, one with a repetition penalty), top_k on: the same
    tokens, log-probs and finish reasons as the plain loop; newcomers joined a running batch (more prefills than the
    plain loop's 4) and fewer decode forwards were run."""
    model, tok = tiny64
    prompts = _prompts(tok, 10)
    temps = [1.0, 1.3, 0.0, 0.7, 1.0, 1.2, 0.9, 1.0, 1.1, 0.8]
    pens = [1.0] * 10
    pens[4] = 1.3
    seeds = [100 + i for i in range(10)]
    cont, plain = _engines(model, tok, model.config.vocab_size)
    counts = {}
    for name, engine in (("cont", cont), ("plain", plain)):
        fw = _Forwards(model)
        try:
            out = engine.generate(prompts, temps, max_new_tokens=12, row_seeds=seeds, repetition_penalties=pens,
                                  top_k=50)
        finally:
            fw.handle.remove()
        counts[name] = (out, fw.calls)
    (a, calls_a), (b, calls_b) = counts["cont"], counts["plain"]
    lengths = [len(g.token_ids) for g in b]
    assert len(set(lengths)) > 2 and {g.finish_reason for g in b} == {"stop", "length"}  # scattered finishes
    for ga, gb in zip(a, b):
        assert ga.token_ids == gb.token_ids
        assert ga.finish_reason == gb.finish_reason
        assert ga.logprobs == pytest.approx(gb.logprobs, abs=1e-9)
    assert a[2].token_ids == HFEngine(model, tok, eos_token_ids=list(range(3, model.config.vocab_size, 6))).generate(
        prompts[2:3], [0.0], max_new_tokens=12, top_k=50)[0].token_ids  # the greedy row as alone
    # the plain loop runs ceil(10 / 3) = 4 prefills; continuous batching prefills newcomers as places free up
    # (every forward carries at most batch_size rows) and needs fewer forwards over all
    assert max(calls_a) <= 3 and max(calls_b) <= 3
    assert len(calls_a) < len(calls_b)
    assert sum(len(g.token_ids) for g in a) == cont.stats()["decode_tokens"]


@pytest.mark.timeout(600)
def test_continuous_batching_with_kept_caches(tiny64):
    """Second turns reusing kept caches (``episode_ids``) under continuous batching: the same tokens as the plain
    loop, and the reuse counted."""
    model, tok = tiny64
    prompts = _prompts(tok, 7)
    temps = [1.0] * 7
    ids = [f"ep{i}" for i in range(7)]
    results = []
    for engine in _engines(model, tok, model.config.vocab_size):
        first = engine.generate(prompts, temps, max_new_tokens=8, row_seeds=list(range(7)), episode_ids=ids)
        second_prompts = [p + g.token_ids + p[-3:] for p, g in zip(prompts, first)]
        second = engine.generate(second_prompts, temps, max_new_tokens=8, row_seeds=list(range(10, 17)),
                                 episode_ids=ids)
        assert sum(g.cached_tokens for g in second) > 0
        results.append((first, second))
    for turn in (0, 1):
        for ga, gb in zip(results[0][turn], results[1][turn]):
            assert ga.token_ids == gb.token_ids
            assert ga.cached_tokens == gb.cached_tokens
            assert ga.logprobs == pytest.approx(gb.logprobs, abs=1e-9)


@pytest.mark.timeout(600)
def test_bench_hf_continuous_runs(tmp_path):
    """``benchmarks/bench_hf_continuous.py`` on the tiny model: both modes measured, the same tokens."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "benchmarks/bench_hf_continuous.py", "--model", "tiny", "--rows", "5",
                           "--batch-size", "2", "--max-new-tokens", "4", "--rounds", "1", "--threads", "1",
                           "--out", str(tmp_path)], cwd=repo, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["same_tokens"] is True
    for mode in ("on", "off"):
        assert res["modes"][mode]["tokens"] > 0 and res["modes"][mode]["tokens_per_s"] > 0
    assert res["speedup_tokens_per_s"] > 0
