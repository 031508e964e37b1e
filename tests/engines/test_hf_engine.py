"""hf engine: per-row temperature log-probs against a plain full forward, stop/EOS handling, padding invariance,
sampling options, registry errors. Tiny random Llama, fp32, CPU."""

from __future__ import annotations

import pytest
import torch

from agent_rl.engines import EngineConfig, HFEngine, get_engine
from agent_rl.engines.vllm import vllm_build
from agent_rl.learner.config import ModelConfig
from agent_rl.models import load_policy

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelConfig(name="tiny"))


def _prompts(tok, n: int) -> list[list[int]]:
    return [list(tok.apply_chat_template([{"role": "user", "content": "go " * (1 + 3 * i)}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False))
            for i in range(n)]


def _full_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()  # (R, V): logits predicting each response token
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_logprobs_at_row_temperature_match_full_forward(tiny):
    model, tok = tiny
    prompts = _prompts(tok, 4)
    temps = [0.3, 1.2, 1.2, 0.7]
    gens = get_engine("hf", model, tok, batch_size=3).generate(prompts, temps, max_new_tokens=10, seed=3)
    assert len(gens) == 4
    for p, g, t in zip(prompts, gens, temps):
        assert len(g.token_ids) == len(g.logprobs) == 10 and g.finish_reason == "length"
        ref = _full_logprobs(model, p, g.token_ids, t)
        assert float((torch.tensor(g.logprobs) - ref).abs().max()) < 1e-4
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)


def test_greedy_is_padding_and_batch_invariant(tiny):
    """T = 0 is greedy; a prompt alone and the same prompt left-padded in a batch give the same tokens; top_k=1
    sampling at T = 1 equals greedy."""
    model, tok = tiny
    prompts = _prompts(tok, 3)
    engine = HFEngine(model, tok)
    alone = engine.generate(prompts[:1], [0.0], max_new_tokens=8)[0]
    batched = engine.generate(prompts, [0.0, 0.0, 0.0], max_new_tokens=8)[0]
    assert alone.token_ids == batched.token_ids
    topk1 = engine.generate(prompts, [1.0, 1.0, 1.0], max_new_tokens=8, top_k=1, seed=0)[0]
    assert topk1.token_ids == alone.token_ids
    ids = torch.tensor([prompts[0] + alone.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompts[0]) - 1:-1]
    assert logits.argmax(-1).tolist() == alone.token_ids


def test_seed_reproducible_and_temperature_spreads(tiny):
    model, tok = tiny
    prompts = _prompts(tok, 2) * 4
    engine = HFEngine(model, tok)
    a = engine.generate(prompts, [1.2] * 8, max_new_tokens=6, seed=11)
    b = engine.generate(prompts, [1.2] * 8, max_new_tokens=6, seed=11)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({tuple(g.token_ids) for g in a}) > 1


def test_stop_string_and_eos(tiny):
    """Generation stops on a stop string (kept in the text, the completing token kept) and on an EOS id (the EOS
    token is part of token_ids, not of the text)."""
    model, tok = tiny
    prompts = _prompts(tok, 1)
    engine = HFEngine(model, tok)
    ref = engine.generate(prompts, [1.0], max_new_tokens=10, seed=5)[0]  # sampled: varied tokens
    stop = tok.decode(ref.token_ids[3:5])  # a string the output contains at tokens 3-4
    g = engine.generate(prompts, [1.0], max_new_tokens=10, stop=[stop], seed=5)[0]
    assert g.finish_reason == "stop" and stop in g.text
    assert g.token_ids == ref.token_ids[:len(g.token_ids)] and len(g.token_ids) <= 5
    j = _first_new(ref.token_ids)
    eos_engine = HFEngine(model, tok, eos_token_ids=[ref.token_ids[j]])
    e = eos_engine.generate(prompts, [1.0], max_new_tokens=10, seed=5)[0]
    assert e.finish_reason == "stop" and e.token_ids == ref.token_ids[:j + 1]


def _first_new(ids: list[int]) -> int:
    """Index of the first token (after the first) that did not occur before it."""
    return next(j for j in range(1, len(ids)) if ids[j] not in ids[:j])


def test_finished_rows_leave_the_batch_without_changing_others(tiny):
    """Rows that stop early are dropped from the cache; the remaining rows' tokens are unchanged."""
    model, tok = tiny
    prompts = _prompts(tok, 3)
    engine = HFEngine(model, tok)
    ref = engine.generate(prompts, [0.0] * 3, max_new_tokens=8)
    j = _first_new(ref[1].token_ids)
    eos_engine = HFEngine(model, tok, eos_token_ids=[ref[1].token_ids[j]])
    out = eos_engine.generate(prompts, [0.0] * 3, max_new_tokens=8)
    assert out[1].finish_reason == "stop" and out[1].token_ids == ref[1].token_ids[:j + 1]
    for i in (0, 2):
        n = len(out[i].token_ids)
        assert out[i].token_ids == ref[i].token_ids[:n]


def test_registry_and_argument_errors(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="valid names"):
        get_engine("hff", model, tok)
    with pytest.raises(ValueError):
        HFEngine(model, tok).generate([[1, 2]], [1.0, 1.0], max_new_tokens=2)
    with pytest.raises(ValueError):
        EngineConfig(top_p=0.0)
    if not torch.cuda.is_available() and vllm_build() is None:  # where vLLM is installed: tests/engines/test_vllm_*
        with pytest.raises(RuntimeError, match="CUDA"):
            get_engine("vllm", model, tok, model_path="x")


@pytest.mark.gpu
def test_hf_engine_on_cuda_matches_full_forward(tiny):
    model, tok = tiny
    model = model.to("cuda")
    prompts = _prompts(tok, 2)
    gens = HFEngine(model, tok).generate(prompts, [0.3, 1.2], max_new_tokens=6, seed=0)
    for p, g, t in zip(prompts, gens, [0.3, 1.2]):
        ids = torch.tensor([p + g.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1:-1].float()
        ref = torch.log_softmax(logits / t, -1).gather(-1, ids[0, len(p):, None])[:, 0].cpu()
        assert float((torch.tensor(g.logprobs) - ref).abs().max()) < 1e-3


def test_repetition_penalty_per_row(tiny):
    """Penalty 1.0 changes nothing; a huge penalty on one row makes that row avoid every id it has seen, while the
    other row of the same call is unchanged."""
    model, tok = tiny
    prompts = _prompts(tok, 2)
    engine = HFEngine(model, tok)
    ref = engine.generate(prompts, [0.0, 0.0], max_new_tokens=6)
    same = engine.generate(prompts, [0.0, 0.0], max_new_tokens=6, repetition_penalties=[1.0, 1.0])
    assert [g.token_ids for g in same] == [g.token_ids for g in ref]
    pen = engine.generate(prompts, [0.0, 0.0], max_new_tokens=6, repetition_penalties=[1.0, 1e6])
    assert pen[0].token_ids == ref[0].token_ids
    ids = pen[1].token_ids
    assert len(set(ids)) == len(ids) and not set(ids) & set(prompts[1])


def test_row_seeds_make_sampling_independent_of_the_batch(tiny):
    """With ``row_seeds`` a row samples the same tokens (log-probs within float rounding) alone, in a batch of 4, in
    the reverse order, split into forward batches of 2 and next to other rows; a greedy row is unchanged, and
    different row seeds give different samples. (A shared generator over the batch fails this: the noise of a row
    then depends on the rows drawn before it.)"""
    model, tok = tiny
    prompts = _prompts(tok, 4)
    temps = [1.0, 1.2, 0.0, 0.7]
    seeds = [11, 12, 13, 14]
    engine = HFEngine(model, tok)
    kw = dict(max_new_tokens=8)
    alone = [engine.generate([p], [t], row_seeds=[s], **kw)[0] for p, t, s in zip(prompts, temps, seeds)]
    batched = engine.generate(prompts, temps, row_seeds=seeds, **kw)
    rev = engine.generate(prompts[::-1], temps[::-1], row_seeds=seeds[::-1], **kw)[::-1]
    split = HFEngine(model, tok, batch_size=2).generate(prompts, temps, row_seeds=seeds, **kw)
    extra = _prompts(tok, 6)[4:]
    mixed = engine.generate([extra[0], *prompts, extra[1]], [1.3, *temps, 1.3], row_seeds=[7, *seeds, 8], **kw)[1:5]
    for other in (batched, rev, split, mixed):
        for a, b in zip(alone, other):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert alone[2].token_ids == engine.generate(prompts[2:3], [0.0], **kw)[0].token_ids  # greedy: no seed needed
    reseeded = engine.generate(prompts, temps, row_seeds=[21, 22, 23, 24], **kw)
    assert [g.token_ids for i, g in enumerate(reseeded) if i != 2] != [g.token_ids for i, g in enumerate(alone)
                                                                        if i != 2]
    with pytest.raises(ValueError, match="row seeds"):
        engine.generate(prompts, temps, row_seeds=seeds[:3], **kw)


def test_call_seed_streams_are_per_row_whatever_the_forward_batch_size(tiny):
    """Without row seeds, row i of a call samples with ``row_seed(seed, i)``: the same tokens whatever the engine's
    forward batch size (prompts are sorted by length and cut into batches), and exactly as ``row_seeds`` given
    explicitly."""
    from agent_rl.engines import row_seed

    model, tok = tiny
    prompts = _prompts(tok, 4)
    temps = [1.2] * 4
    a = HFEngine(model, tok, batch_size=32).generate(prompts, temps, max_new_tokens=6, seed=5)
    b = HFEngine(model, tok, batch_size=1).generate(prompts, temps, max_new_tokens=6, seed=5)
    c = HFEngine(model, tok).generate(prompts, temps, max_new_tokens=6, row_seeds=[row_seed(5, i) for i in range(4)])
    assert [g.token_ids for g in a] == [g.token_ids for g in b] == [g.token_ids for g in c]


def test_exponential_race_samples_the_truncated_tempered_distribution():
    """``_sample_from_logits`` draws token v with probability softmax(truncate(z) / T)_v: 20000 rows (one generator
    each) of the same logits; the frequencies match within 5 standard errors, a token cut by top_k never appears,
    and the reported log-prob is that of the distribution sampled from."""
    from agent_rl.engines.hf import _sample_from_logits

    n = 20000
    z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    logits = z.repeat(n, 1)
    temps = torch.full((n,), 1.5)
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    tokens, logps = _sample_from_logits(logits, temps, 1.0, 4, gens)
    p = torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, float("-inf")]) / 1.5, -1)
    freq = torch.bincount(tokens, minlength=5).double() / n
    se = (p * (1 - p) / n).sqrt().double()
    assert freq[4] == 0
    assert bool(((freq - p.double()).abs() <= 5 * se + 1e-12).all()), (freq, p)
    assert torch.allclose(logps, p.log()[tokens], atol=1e-6)
