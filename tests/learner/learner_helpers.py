"""Helpers of the learner tests (a uniquely named module: several test folders have a conftest.py)."""

from __future__ import annotations

import torch

from agent_rl.engines import get_engine
from agent_rl.types import RolloutBatch


def build_batch(rows: list[dict], pad_id: int) -> RolloutBatch:
    """Right-padded ``RolloutBatch`` from rows ``{prompt, gen: Generation, temperature, group, episode, is_high,
    turn, num_turns, reward}``; episodes are numbered 0..E-1 in ``episode``."""
    seq = max(len(r["prompt"]) + len(r["gen"].token_ids) for r in rows)
    bsz = len(rows)
    input_ids = torch.full((bsz, seq), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(bsz, seq, dtype=torch.long)
    response_mask = torch.zeros(bsz, seq)
    engine_logprobs = torch.zeros(bsz, seq)
    for i, r in enumerate(rows):
        p, g = r["prompt"], r["gen"]
        n = len(p) + len(g.token_ids)
        input_ids[i, :n] = torch.tensor(p + g.token_ids)
        attention_mask[i, :n] = 1
        response_mask[i, len(p):n] = 1
        engine_logprobs[i, len(p):n] = torch.tensor(g.logprobs)
    n_ep = max(r["episode"] for r in rows) + 1
    ep_rewards, ep_group, ep_high = torch.zeros(n_ep), torch.zeros(n_ep, dtype=torch.long), torch.zeros(n_ep, dtype=torch.bool)
    for r in rows:
        ep_rewards[r["episode"]] = r["reward"]
        ep_group[r["episode"]] = r["group"]
        ep_high[r["episode"]] = r["is_high"]
    col = lambda k, dt: torch.tensor([r[k] for r in rows], dtype=dt)  # noqa: E731
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask,
        engine_logprobs=engine_logprobs, temperature=col("temperature", torch.float32),
        group_index=col("group", torch.long), episode_index=col("episode", torch.long),
        is_high=col("is_high", torch.bool), turn_index=col("turn", torch.long), num_turns=col("num_turns", torch.long),
        rewards=col("reward", torch.float32), episode_rewards=ep_rewards, episode_group_index=ep_group,
        episode_is_high=ep_high)


def sample_batch(model, tokenizer, *, groups: int = 2, t_low: float = 0.3, t_high: float = 1.2,
                 max_new_tokens: int = 8, seed: int = 0) -> tuple[RolloutBatch, list[dict]]:
    """A TGRL-shaped batch sampled by the hf engine: per group 1 episode at t_low + 3 at t_high; episode e has
    1 + (e % 2) turns; rewards alternate so every group has both outcomes."""
    engine = get_engine("hf", model, tokenizer)
    specs = []
    ep = 0
    for g in range(groups):
        for k in range(4):
            for turn in range(1 + ep % 2):
                text = f"task {g} turn {turn}: pick item {k}" + " please" * (ep % 3)
                prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                       tokenize=True, return_dict=False)
                specs.append(dict(prompt=list(prompt), temperature=t_low if k == 0 else t_high, group=g, episode=ep,
                                  is_high=k > 0, turn=turn, num_turns=1 + ep % 2, reward=float((ep + g) % 2)))
            ep += 1
    gens = engine.generate([s["prompt"] for s in specs], [s["temperature"] for s in specs],
                           max_new_tokens=max_new_tokens, seed=seed)
    for s, gen in zip(specs, gens):
        s["gen"] = gen
    return build_batch(specs, tokenizer.pad_token_id), specs

