"""hf engine KV reuse across turns (``engine.kv_reuse``): multi-turn episodes whose prompt k+1 = prompt k + response k
+ new observation tokens, batched with episodes of other lengths, some ending early and one joining late. Against a
full prefill of every prompt (``kv_reuse=False``) the sampled tokens are identical (same row seeds, float64 so a
near-tie cannot flip) and the log-probs equal a plain full forward within 1e-4 (float32); eviction under a small
``kv_reuse_max_tokens``, a prompt that does not start with the kept ids, a weight sync and an in-place weight change
keep the tokens exact; the orchestrator passes episode ids and ends them. Tiny random Llama; SmolLM2 (slow)."""

from __future__ import annotations

import asyncio
import copy
import random

import pytest
import torch

from agent_rl.engines import HFEngine
from agent_rl.learner.config import AlgoConfig, ModelConfig
from agent_rl.models import load_policy

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelConfig(name="tiny"))


@pytest.fixture(scope="module")
def tiny64(tiny):
    model, tok = tiny
    return copy.deepcopy(model).double(), tok


def _first_prompts(tok, n: int) -> list[list[int]]:
    return [list(tok.apply_chat_template([{"role": "user", "content": "look " * (1 + 4 * i)}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False))
            for i in range(n)]


def _full_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].double()  # (R, V): the logits predicting each token
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


# episode i: lives during turns [start, end); temperatures mix greedy, low and high rows
STARTS, ENDS = [0, 0, 0, 0, 1, 0], [4, 2, 3, 1, 4, 4]
TEMPS = [1.0, 0.0, 1.2, 0.7, 1.0, 1.3]


def play(engine: HFEngine, tok, *, episode_ids: bool = True, turns: int = 4, max_new_tokens: int = 6,
         check_end: bool = True) -> list[dict]:
    """Multi-turn episodes through ``engine`` (trajectory prompts, seeded observation tokens): one record per
    (turn, episode) with its prompt, tokens, log-probs and cached tokens."""
    rng = random.Random(0)
    prompts = _first_prompts(tok, len(STARTS))
    records = []
    for k in range(turns):
        live = [i for i in range(len(STARTS)) if STARTS[i] <= k < ENDS[i]]
        gens = engine.generate([prompts[i] for i in live], [TEMPS[i] for i in live], max_new_tokens=max_new_tokens,
                               row_seeds=[1000 * i + k for i in live],
                               episode_ids=[f"ep{i}" for i in live] if episode_ids else None)
        for i, g in zip(live, gens):
            records.append(dict(turn=k, ep=i, prompt=prompts[i], tokens=g.token_ids, logprobs=g.logprobs,
                                cached=g.cached_tokens, temperature=TEMPS[i]))
            obs = [rng.randrange(200, 3000) for _ in range(rng.randrange(2, 12))]  # the new observation's tokens
            prompts[i] = prompts[i] + g.token_ids + obs
            if ENDS[i] == k + 1 and episode_ids:
                engine.end_episode(f"ep{i}")
        assert engine.cached_tokens <= engine.kv_reuse_max_tokens
    if check_end and episode_ids:
        assert engine.cached_tokens == 0 and engine.cached_episodes == []  # every episode ended
    return records


def test_reuse_samples_exactly_the_tokens_of_a_full_prefill(tiny64):
    """float64: identical tokens and log-probs (1e-9) with and without reuse, in forward batches of 4 (episodes of
    different cache lengths share a forward); a continuing episode reuses everything but its last sampled token;
    the counters add up."""
    model, tok = tiny64
    reuse = HFEngine(model, tok, batch_size=4)
    full = HFEngine(model, tok, batch_size=4, kv_reuse=False)
    a, b = play(reuse, tok), play(full, tok)
    assert [(r["turn"], r["ep"]) for r in a] == [(r["turn"], r["ep"]) for r in b]
    for ra, rb in zip(a, b):
        assert ra["prompt"] == rb["prompt"] and ra["tokens"] == rb["tokens"], (ra["turn"], ra["ep"])
        assert max(abs(x - y) for x, y in zip(ra["logprobs"], rb["logprobs"])) < 1e-9
        assert rb["cached"] == 0
    prev = {}
    for r in a:
        if r["ep"] in prev:  # everything fed at the previous turn: its prompt and response but the last token
            p = prev[r["ep"]]
            assert r["cached"] == len(p["prompt"]) + len(p["tokens"]) - 1 > 0
        else:
            assert r["cached"] == 0
        prev[r["ep"]] = r
    prompt_tokens = sum(len(r["prompt"]) for r in a)
    sa, sb = reuse.stats(), full.stats()
    assert sa["prefill_tokens"] + sa["kv_reuse_tokens"] == sb["prefill_tokens"] == prompt_tokens
    assert sa["kv_reuse_tokens"] == sum(r["cached"] for r in a) > sa["prefill_tokens"]
    assert sa["decode_tokens"] == sb["decode_tokens"] == sum(len(r["tokens"]) for r in a)


def test_reuse_logprobs_equal_a_full_recompute(tiny):
    """float32, the engine's normal precision: every turn's log-probs under reuse equal a plain forward over the
    whole prompt + response within 1e-4."""
    model, tok = tiny
    records = play(HFEngine(model, tok, batch_size=3), tok)
    assert sum(r["cached"] > 0 for r in records) >= 8
    for r in records:
        ref = _full_logprobs(model, r["prompt"], r["tokens"], r["temperature"])
        assert float((torch.tensor(r["logprobs"], dtype=torch.float64) - ref).abs().max()) < 1e-4


def test_eviction_keeps_tokens_exact_and_memory_bounded(tiny64):
    """A bound below the episodes' total evicts whole episodes, least recently used first; evicted episodes
    prefill from scratch; the tokens are those of the full prefill."""
    model, tok = tiny64
    full = play(HFEngine(model, tok, kv_reuse=False), tok)
    small = HFEngine(model, tok, batch_size=2, kv_reuse_max_tokens=150)
    bounded = play(small, tok)
    assert [r["tokens"] for r in bounded] == [r["tokens"] for r in full]
    assert small.stats()["evicted_episodes"] > 0
    unbounded = HFEngine(model, tok, batch_size=2)
    play(unbounded, tok)
    assert 0 < small.stats()["kv_reuse_tokens"] < unbounded.stats()["kv_reuse_tokens"]
    assert any(r["cached"] == 0 and r["turn"] > STARTS[r["ep"]] for r in bounded)  # an evicted one prefilled again


def test_lru_order_and_single_episode_over_the_bound(tiny64):
    model, tok = tiny64
    engine = HFEngine(model, tok, kv_reuse_max_tokens=100)
    p = _first_prompts(tok, 3)  # 25, 29, 33 tokens
    engine.generate(p[:2], [0.0, 0.0], max_new_tokens=4, episode_ids=["a", "b"])
    engine.generate(p[2:], [0.0], max_new_tokens=4, episode_ids=["c"])
    kept = {"a": len(p[0]) + 3, "b": len(p[1]) + 3, "c": len(p[2]) + 3}
    assert sum(kept.values()) > 100 and kept["b"] + kept["c"] <= 100
    assert engine.cached_episodes == ["b", "c"] and engine.cached_tokens == kept["b"] + kept["c"]  # "a" was oldest
    long_prompt = p[0] * 5  # alone over the bound: never kept
    engine.generate([long_prompt], [0.0], max_new_tokens=2, episode_ids=["d"])
    assert "d" not in engine.cached_episodes and engine.cached_tokens <= 100


def test_a_prompt_that_does_not_extend_the_kept_ids_reuses_only_the_common_prefix(tiny64):
    model, tok = tiny64
    engine, full = HFEngine(model, tok), HFEngine(model, tok, kv_reuse=False)
    p = _first_prompts(tok, 2)
    g = engine.generate(p, [1.0, 1.0], max_new_tokens=5, row_seeds=[1, 2], episode_ids=["x", "y"])
    nxt = [p[0] + g[0].token_ids + [500, 501], p[1] + g[1].token_ids + [502]]
    nxt[0][10] = nxt[0][10] + 1  # a changed token in the middle: the first 10 are reused
    nxt[1][0] = nxt[1][0] + 1  # a changed first token: nothing is reused
    a = engine.generate(nxt, [1.0, 1.0], max_new_tokens=5, row_seeds=[3, 4], episode_ids=["x", "y"])
    b = full.generate(nxt, [1.0, 1.0], max_new_tokens=5, row_seeds=[3, 4])
    assert [x.cached_tokens for x in a] == [10, 0]
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    # the same prompt again (nothing new to feed): all but its last token is reused
    same = engine.generate([nxt[0]], [1.0], max_new_tokens=5, row_seeds=[3], episode_ids=["x"])[0]
    assert same.cached_tokens == len(nxt[0]) - 1 and same.token_ids == a[0].token_ids


def test_sync_and_in_place_weight_changes_drop_caches(tiny64):
    """Caches hold one policy version (algorithms.md section 7): ``sync_weights`` drops them, and so does an in-place
    change of the parameters without a sync (an optimizer step), after which the tokens are the new weights' own."""
    model, tok = tiny64
    model = copy.deepcopy(model)
    engine = HFEngine(model, tok)
    p = _first_prompts(tok, 2)
    g = engine.generate(p, [1.0, 1.0], max_new_tokens=5, row_seeds=[1, 2], episode_ids=["x", "y"])
    assert engine.cached_tokens > 0
    engine.sync_weights(model)
    assert engine.cached_tokens == 0 and engine.cached_episodes == []
    nxt = [q + x.token_ids + [600, 601] for q, x in zip(p, g)]
    again = engine.generate(nxt, [1.0, 1.0], max_new_tokens=5, row_seeds=[3, 4], episode_ids=["x", "y"])
    assert [x.cached_tokens for x in again] == [0, 0] and engine.cached_tokens > 0
    with torch.no_grad():  # an optimizer step on the shared module, no sync
        for prm in model.parameters():
            prm.mul_(1.5)
    nxt2 = [q + x.token_ids + [602] for q, x in zip(nxt, again)]
    after = engine.generate(nxt2, [1.0, 1.0], max_new_tokens=5, row_seeds=[5, 6], episode_ids=["x", "y"])
    ref = HFEngine(model, tok, kv_reuse=False).generate(nxt2, [1.0, 1.0], max_new_tokens=5, row_seeds=[5, 6])
    assert [x.cached_tokens for x in after] == [0, 0]
    assert [x.token_ids for x in after] == [x.token_ids for x in ref]


def test_end_episode_while_in_flight_and_argument_errors(tiny64):
    model, tok = tiny64
    engine = HFEngine(model, tok)
    p = _first_prompts(tok, 2)
    engine.store.in_flight.add("x")  # as if its generate call were running in the batcher's thread
    engine.end_episode("x")
    engine.store.in_flight.discard("x")
    engine.store.ended.pop("x", None)  # (ids are never reused; this test reuses one)
    engine.generate(p[:1], [0.0], max_new_tokens=2, episode_ids=["x"])
    assert engine.cached_episodes == ["x"]
    engine.end_episode("x")
    engine.end_episode("never-seen")
    assert engine.cached_tokens == 0
    with pytest.raises(ValueError, match="twice"):
        engine.generate(p, [0.0, 0.0], max_new_tokens=2, episode_ids=["x", "x"])
    with pytest.raises(ValueError, match="episode ids"):
        engine.generate(p, [0.0, 0.0], max_new_tokens=2, episode_ids=["x"])
    with pytest.raises(ValueError, match="kv_reuse_max_tokens"):
        HFEngine(model, tok, kv_reuse_max_tokens=0)
    from agent_rl.engines import EngineConfig

    with pytest.raises(ValueError, match="kv_reuse_max_tokens"):
        EngineConfig(kv_reuse_max_tokens=0)


def _orchestrated(model, tok, kv_reuse: bool, mode: str):
    from agent_rl.envclient import LocalEnvPool
    from agent_rl.rollout import RolloutConfig, RolloutOrchestrator, TaskSampler, TaskSamplerConfig, get_prompt

    # shared_prefill off: the counts below are those of the kept caches alone (test_equal_prompts_are_prefilled_once)
    engine = HFEngine(model, tok, kv_reuse=kv_reuse, batch_size=3, shared_prefill=False)
    cfg = RolloutConfig(mode=mode, max_turns=4, stop=["</action>"])
    sampler = TaskSampler("agent_rl/ChooseItem-v0", TaskSamplerConfig(kind="seed"), seed=0)

    async def go():
        pool = LocalEnvPool()
        try:
            orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), cfg, max_new_tokens=8, seed=0)
            return await orch.collect(sampler.sample, 2, AlgoConfig(name="tgrl", warmup_steps=0), step=1)
        finally:
            await pool.aclose()

    return asyncio.run(go()), engine


@pytest.mark.parametrize("mode", ["trajectory", "turn"])
def test_orchestrator_episodes_identical_with_and_without_reuse(tiny64, mode):
    """The real orchestrator on ChooseItem: with reuse the episodes are token for token those without; the step's
    metrics count prefill, decode and reused tokens (prefill + reused = all prompt tokens); every episode's cache is
    dropped when it ends."""
    model, tok = tiny64
    (on, eng_on), (off, _) = _orchestrated(model, tok, True, mode), _orchestrated(model, tok, False, mode)
    turns_on = [(t.prompt_ids, t.response_ids) for ep in on.episodes for t in ep.turns]
    turns_off = [(t.prompt_ids, t.response_ids) for ep in off.episodes for t in ep.turns]
    assert turns_on == turns_off and len(turns_on) > len(on.episodes)  # some episodes last several turns
    prompt_tokens = sum(len(p) for p, _ in turns_on)
    m, m0 = on.metrics, off.metrics
    assert m["throughput/prefill_tokens"] + m["throughput/kv_reuse_tokens"] == prompt_tokens
    assert m0["throughput/prefill_tokens"] == prompt_tokens and m0["throughput/kv_reuse_tokens"] == 0
    assert m["throughput/decode_tokens"] == m0["throughput/decode_tokens"] == sum(len(r) for _, r in turns_on)
    assert m["throughput/kv_reuse_tokens"] > 0
    if mode == "trajectory":  # every later turn reuses all but the last sampled token of the turn before
        later = [(ep.turns[k - 1], ep.turns[k]) for ep in on.episodes for k in range(1, len(ep.turns))]
        assert m["throughput/kv_reuse_tokens"] == sum(len(a.prompt_ids) + len(a.response_ids) - 1 for a, _ in later)
    assert eng_on.cached_tokens == 0 and eng_on.cached_episodes == []


def test_equal_prompts_are_prefilled_once(tiny64):
    """Shared prefill: G equal prompts (and one other) in one call: one forward row for the equal ones, the others
    get copies (cached_tokens = the prompt, counted as reused); the tokens equal those of an engine without reuse,
    which prefills every row (float64: no near-tie can flip)."""
    model, tok = tiny64
    a = list(tok.apply_chat_template([{"role": "user", "content": "pick the sock"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False))
    b = a[:-3] + a[-2:]
    prompts, seeds = [a, b, a, a, a], [11, 12, 13, 14, 15]
    on, off = HFEngine(model, tok), HFEngine(model, tok, shared_prefill=False)
    g_on = on.generate(prompts, [1.0] * 5, max_new_tokens=6, row_seeds=seeds)
    g_off = off.generate(prompts, [1.0] * 5, max_new_tokens=6, row_seeds=seeds)
    assert [g.token_ids for g in g_on] == [g.token_ids for g in g_off]
    for x, y in zip(g_on, g_off):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-9)
    assert [g.cached_tokens for g in g_on] == [0, 0, len(a), len(a), len(a)]
    assert on.stats()["prefill_tokens"] == len(a) + len(b) and on.stats()["kv_reuse_tokens"] == 3 * len(a)
    assert off.stats()["prefill_tokens"] == 4 * len(a) + len(b) and off.stats()["kv_reuse_tokens"] == 0


@pytest.mark.slow
def test_smollm2_reuse_is_exact():
    """SmolLM2-135M: float64 tokens identical with and without reuse over 4 turns (episodes ending at different
    turns, one joining late); float32 log-probs under reuse equal a full recompute within 1e-4."""
    model, tok = load_policy(ModelConfig(name="smollm2"))
    model64 = copy.deepcopy(model).double()
    a = play(HFEngine(model64, tok, batch_size=4), tok, max_new_tokens=5)
    b = play(HFEngine(model64, tok, batch_size=4, kv_reuse=False), tok, max_new_tokens=5)
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    assert sum(r["cached"] > 0 for r in a) >= 8
    del model64
    records = play(HFEngine(model, tok, batch_size=4), tok, max_new_tokens=5)
    for r in records:
        ref = _full_logprobs(model, r["prompt"], r["tokens"], r["temperature"])
        assert float((torch.tensor(r["logprobs"], dtype=torch.float64) - ref).abs().max()) < 1e-4


def _data_copy(model):  # an in-place write through ``.data``: the parameters' version counters do not move
    with torch.no_grad():
        for prm in model.parameters():
            prm.data.copy_(prm.data * 1.5)


def _vector_to_parameters(model):  # rebinds every ``param.data`` to a slice of one vector (torch's own utility)
    vec = torch.nn.utils.parameters_to_vector(model.parameters())
    torch.nn.utils.vector_to_parameters(vec * 1.5, model.parameters())


def _one_element(model):  # the smallest write: one weight of one layer, through ``.data``
    w = model.model.layers[1].self_attn.v_proj.weight
    w.data[0, 0] += 0.5


def _data_rebind(model):
    for prm in model.parameters():
        prm.data = prm.data.clone() * 1.5


@pytest.mark.parametrize("write", [_data_copy, _vector_to_parameters, _one_element, _data_rebind],
                         ids=lambda f: f.__name__.strip("_"))
def test_caches_follow_writes_the_version_counters_do_not_see(tiny, write):
    """vllm #9744's kind: after ``p.data.copy_(...)`` or ``vector_to_parameters`` (no ``_version`` bump, no sync) the
    engine reused 42 of 49 cached tokens of the old weights and its log-probs were off by 1.1-1.5 nats. The kept
    caches are keyed by a fingerprint of the weights' bits: nothing is reused, and tokens and log-probs are a fresh
    engine's on the new weights (float32, the learner's dtype)."""
    model, tok = tiny
    model = copy.deepcopy(model)
    engine = HFEngine(model, tok)
    p = _first_prompts(tok, 2)
    g = engine.generate(p, [1.0, 1.0], max_new_tokens=6, row_seeds=[1, 2], episode_ids=["x", "y"])
    nxt = [q + x.token_ids + [600, 601] for q, x in zip(p, g)]
    write(model)
    after = engine.generate(nxt, [1.0, 1.0], max_new_tokens=6, row_seeds=[3, 4], episode_ids=["x", "y"])
    fresh = HFEngine(model, tok, kv_reuse=False).generate(nxt, [1.0, 1.0], max_new_tokens=6, row_seeds=[3, 4])
    assert [x.cached_tokens for x in after] == [0, 0]
    assert [x.token_ids for x in after] == [x.token_ids for x in fresh]
    for a, f in zip(after, fresh):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(f.logprobs), atol=1e-5, rtol=0)
    # the caches kept after the write are the new weights' and are reused again
    nxt2 = [q + x.token_ids + [602] for q, x in zip(nxt, after)]
    again = engine.generate(nxt2, [1.0, 1.0], max_new_tokens=3, row_seeds=[5, 6], episode_ids=["x", "y"])
    assert [x.cached_tokens for x in again] == [len(q) - 2 for q in nxt2]  # all but the unfed last token and 602


def test_weights_fingerprint_moves_with_every_bit_and_only_then():
    from agent_rl.engines.hf import weights_fingerprint

    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        torch.manual_seed(0)
        m = torch.nn.Linear(1500, 1000).to(dtype)  # 1.5 M weights: two fingerprint chunks
        f0 = weights_fingerprint(m)
        assert weights_fingerprint(m) == f0  # a pure function of the bits (and storage)
        w = m.weight.data.view(-1)
        a, b = w[3].clone(), w[(1 << 20) + 3].clone()  # same position in two chunks
        w[3], w[(1 << 20) + 3] = b, a
        assert weights_fingerprint(m) != f0  # a swap moves it
        w[3], w[(1 << 20) + 3] = a, b
        assert weights_fingerprint(m) == f0
        w[7] = torch.nextafter(w[7], torch.tensor(float("inf"), dtype=dtype))  # one ulp of one weight
        assert weights_fingerprint(m) != f0


def test_fork_episode_shares_the_prefix_and_keeps_tokens_exact(tiny64):
    """``fork_episode`` (rollout.fork, issue 40): siblings start from the base's kept cache, so their first prompt
    (a prefix of the base's conversation plus nothing new) is prefilled once for all; tokens equal a full prefill."""
    model, tok = tiny64
    engine, full = HFEngine(model, tok), HFEngine(model, tok, kv_reuse=False)
    p = _first_prompts(tok, 1)[0]
    g = engine.generate([p], [1.0], max_new_tokens=5, row_seeds=[1], episode_ids=["base"])[0]
    fork_prompt = p + g.token_ids[:2]  # the state at the fork: a prefix of what the base kept
    for sib in ("s1", "s2"):
        engine.fork_episode("base", sib)
    engine.end_episode("base")  # the siblings' copies outlive it
    a = engine.generate([fork_prompt] * 2, [1.0, 1.0], max_new_tokens=5, row_seeds=[7, 8], episode_ids=["s1", "s2"])
    b = full.generate([fork_prompt] * 2, [1.0, 1.0], max_new_tokens=5, row_seeds=[7, 8])
    assert [x.cached_tokens for x in a] == [len(fork_prompt) - 1] * 2
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    engine.fork_episode("gone", "s3")  # an unknown or ended source: nothing kept
    assert "s3" not in engine.cached_episodes


def test_growing_cache_holds_what_dynamic_cache_holds_and_grows_in_blocks():
    """``growing_cache``: per update the same keys/values as transformers' DynamicCache, bit for bit, through a
    prefill, single-token decode steps, a row subset (``batch_select_indices``) and more steps; the buffer moves only
    when it is full or replaced (amortised), not at every token."""
    from transformers import DynamicCache

    from agent_rl.engines.hf_cache import GROW_BLOCK, growing_cache

    gen = torch.Generator().manual_seed(0)
    ours, ref = growing_cache(), DynamicCache()
    moves, last_ptr = 0, None

    def step(n: int, b: int) -> None:
        nonlocal moves, last_ptr
        k, v = torch.randn(b, 3, n, 8, generator=gen), torch.randn(b, 3, n, 8, generator=gen)
        got, want = ours.update(k, v, 0), ref.update(k, v, 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        ptr = ours.layers[0]._kbuf.data_ptr()
        moves += ptr != last_ptr
        last_ptr = ptr

    step(20, 4)  # a prefill of 20 columns: the buffer holds 20 + GROW_BLOCK
    for _ in range(GROW_BLOCK):
        step(1, 4)
    assert moves == 1  # 64 decode steps fit the first buffer
    step(1, 4)
    assert moves == 2  # full: one move, with room again
    keep = torch.tensor([0, 2, 2])
    ours.batch_select_indices(keep)
    ref.batch_select_indices(keep)
    assert torch.equal(ours.layers[0].keys, ref.layers[0].keys)
    for _ in range(10):
        step(1, 3)
    assert moves == 3  # the replaced rows moved into a buffer once, then 10 steps in place
    assert ours.get_seq_length() == ref.get_seq_length() == 20 + GROW_BLOCK + 11


def test_engine_tokens_equal_those_of_plain_dynamic_caches(tiny64, monkeypatch):
    """The engine with its growing caches samples the tokens and log-probs it samples with transformers' plain
    DynamicCache (float64; continuous batching, reuse across calls and finished rows leaving the batch included)."""
    from transformers import DynamicCache

    import agent_rl.engines.hf_cache as hf_cache

    model, tok = tiny64

    def run():
        engine = HFEngine(model, tok, batch_size=3)
        prompts = [list(tok.apply_chat_template([{"role": "user", "content": "go " * (1 + 2 * i)}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False))
                   for i in range(5)]
        ids = [f"e{i}" for i in range(5)]
        first = engine.generate(prompts, [1.0] * 5, max_new_tokens=9, row_seeds=list(range(5)), episode_ids=ids)
        again = [p + g.token_ids + [tok.eos_token_id] + p[-4:] for p, g in zip(prompts, first)]
        second = engine.generate(again, [0.8] * 5, max_new_tokens=7, row_seeds=list(range(5, 10)), episode_ids=ids)
        return [(g.token_ids, g.logprobs, g.cached_tokens) for g in first + second]

    ours = run()
    monkeypatch.setattr(hf_cache, "growing_cache", lambda past=None: DynamicCache(ddp_cache_data=past))
    plain = run()
    assert [t for t, _, _ in ours] == [t for t, _, _ in plain]
    assert [c for _, _, c in ours] == [c for _, _, c in plain] and sum(c for _, _, c in ours) > 0
    for (_, a, _), (_, b, _) in zip(ours, plain):
        assert a == pytest.approx(b, abs=1e-12)
