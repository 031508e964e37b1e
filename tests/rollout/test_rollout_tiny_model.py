"""Orchestrator with the real HF engine and the tiny model on ChooseItem through LocalEnvPool (both modes): per-episode
temperature on every row, prompts rendered with the chat template, sampled ids kept as sampled, and the batch's
engine log-probs aligned with the model's own log-probs of those tokens at the row's temperature."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agent_rl.engines import get_engine
from agent_rl.learner.config import AlgoConfig, ModelConfig
from agent_rl.models import load_policy
from agent_rl.rollout import RolloutConfig, RolloutOrchestrator, TaskSampler, TaskSamplerConfig, build_rollout_batch
from agent_rl.rollout import get_prompt

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def policy():
    model, tok = load_policy(ModelConfig(name="tiny"))
    return model.eval(), tok


def rollout(policy, mode: str):
    from agent_rl.envclient import LocalEnvPool

    model, tok = policy
    engine = get_engine("hf", model, tok, seed=0)
    cfg = RolloutConfig(mode=mode, max_turns=3, stop=["</action>"])
    sampler = TaskSampler("agent_rl/ChooseItem-v0", TaskSamplerConfig(kind="seed"), seed=0)

    async def go():
        pool = LocalEnvPool()
        try:
            orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), cfg, max_new_tokens=6, seed=0)
            return await orch.collect(sampler.sample, 2, AlgoConfig(name="tgrl", warmup_steps=0), step=1)
        finally:
            await pool.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["turn", "trajectory"])
def test_tiny_model_rollout_rows(policy, mode):
    model, tok = policy
    res = rollout(policy, mode)
    assert len(res.episodes) == 8 and res.dropped_groups == 0
    assert [ep.temperature for ep in res.episodes] == [0.3, 1.2, 1.2, 1.2] * 2
    for ep in res.episodes:
        assert 1 <= len(ep.turns) <= 3
        for k, turn in enumerate(ep.turns):
            assert 1 <= len(turn.response_ids) <= 6 and len(turn.response_logprobs) == len(turn.response_ids)
            text = tok.decode(turn.prompt_ids)
            assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
            if mode == "turn" and k > 0:  # history of the previous turn, rendered by the chat template
                assert f"[Action {k}]" in text and f"[Observation {k}]" in text
    batch = build_rollout_batch(res.episodes, pad_token_id=tok.pad_token_id, mode=mode)
    rows_per_ep = [len(ep.turns) if mode == "turn" else 1 for ep in res.episodes]
    assert batch.num_rows == sum(rows_per_ep)
    expected_t = [ep.temperature for ep, n in zip(res.episodes, rows_per_ep) for _ in range(n)]
    assert batch.temperature.tolist() == pytest.approx(expected_t)
    # Alignment: model log-probs of the batch's response tokens at the row temperature == engine log-probs.
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()  # (B, L, V)
    logp = torch.log_softmax(logits[:, :-1] / batch.temperature[:, None, None], dim=-1)  # predicts tokens 1..L-1
    token_logp = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, L-1)
    mask = batch.response_mask[:, 1:] > 0
    assert mask.sum() == sum(len(t.response_ids) for ep in res.episodes for t in ep.turns)
    diff = (token_logp[mask] - batch.engine_logprobs[:, 1:][mask]).abs().max().item()
    assert diff < 1e-4
