"""Episodes do not depend on env timing: the tiny model on ChooseItem behind a pool whose resets and steps take
random, run-specific latencies, so the generation batcher forms different batches in each run; with the same seed
every episode samples the same tokens (per-row sampling keys, ``agent_rl.rollout.orchestrator`` docstring)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from agent_rl.engines import get_engine
from agent_rl.learner.config import AlgoConfig, ModelConfig
from agent_rl.models import load_policy
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, TaskSampler, TaskSamplerConfig
from agent_rl.rollout import get_prompt, group_temperatures
from rollout_fakes import SimplePool

torch.set_num_threads(1)


class LatencyPool(SimplePool):
    """:class:`SimplePool` whose every reset and step first sleeps U(0, ``max_s``) seconds (``random.Random(seed)``)."""

    def __init__(self, seed: int, max_s: float = 0.03) -> None:
        super().__init__()
        self.rng, self.max_s = random.Random(seed), max_s

    async def reset(self, env_id, **kwargs):
        await asyncio.sleep(self.rng.uniform(0, self.max_s))
        return await super().reset(env_id, **kwargs)

    async def step(self, session_id, action):
        await asyncio.sleep(self.rng.uniform(0, self.max_s))
        return await super().step(session_id, action)


def _play(latency_seed: int, chunks: list[list[int]], gen_batch_size: int = 0):
    """Groups of ``TaskSampler`` positions 0..3 played in ``chunks`` (one ``run_groups`` call each, as rollout
    workers would); returns {(group, slot): episode} and the batch sizes the engine saw."""
    model, tok = load_policy(ModelConfig(name="tiny"))
    engine = get_engine("hf", model, tok)
    cfg = RolloutConfig(max_turns=3, stop=["</action>"], gen_batch_size=gen_batch_size)
    tasks = TaskSampler("agent_rl/ChooseItem-v0", TaskSamplerConfig(kind="seed"), seed=0).sample(4)
    temps = group_temperatures(AlgoConfig(name="tgrl", warmup_steps=0), 1)

    async def go():
        pool = LatencyPool(latency_seed)
        orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), cfg, max_new_tokens=6, seed=0)
        episodes, sizes = {}, []
        try:
            for chunk in chunks:
                res = await orch.run_groups([GroupSpec(tasks[i], temps) for i in chunk], seed_key=1000)
                sizes += orch.last_batcher.batch_sizes
                for j, ep in enumerate(res.episodes):
                    episodes[(ep.task.group_id, j % len(temps))] = ep
        finally:
            await pool.aclose()
        return episodes, sizes

    return asyncio.run(go())


def test_episodes_do_not_depend_on_env_latency_batching_or_worker_split():
    ref, ref_sizes = _play(latency_seed=1, chunks=[[0, 1, 2, 3]])
    runs = [_play(latency_seed=2, chunks=[[0, 1, 2, 3]]),
            _play(latency_seed=3, chunks=[[2, 3], [0, 1]], gen_batch_size=3)]  # two "workers", other group order
    assert len(ref) == 16 and sum(len(ep.turns) for ep in ref.values()) > 16  # multi-turn episodes
    assert any(sizes != ref_sizes for _, sizes in runs)  # the engine really saw different batches
    for episodes, _ in runs:
        assert episodes.keys() == ref.keys()
        for key, ep in ref.items():
            other = episodes[key]
            assert [t.response_ids for t in other.turns] == [t.response_ids for t in ep.turns], key
            assert [t.action for t in other.turns] == [t.action for t in ep.turns]
            assert other.reward == ep.reward and other.temperature == ep.temperature
            for a, b in zip(ep.turns, other.turns):
                assert a.response_logprobs == pytest.approx(b.response_logprobs, abs=1e-5)
    texts = {tuple(t.response_ids) for ep in ref.values() for t in ep.turns}
    assert len(texts) > 8  # sampled, not one repeated answer
