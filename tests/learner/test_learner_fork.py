"""Forked groups through the trainer path (issue 40): Episodes with ``fork`` -> ``build_rollout_batch`` ->
``Learner.advantages`` / ``update`` give the hand-computed example of docs/algorithms_impl.md ("Forked groups") on
every trained token, the replayed prefix is out of the loss mask, and the records name each sibling's base."""

from __future__ import annotations

import math

import pytest
import torch

from agent_rl.episodes import episode_records
from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig, ScheduleConfig
from agent_rl.rollout import build_rollout_batch
from agent_rl.types import Episode, ForkOrigin, Task, Turn

AG = 1 / math.sqrt(2)
AS_BASE = -(2 / 3) / math.sqrt(1 / 3)  # -1.15470
AS_SIB = (1 / 3) / math.sqrt(1 / 3)  # +0.57735
OBS = [50, 51]


def _episode(responses, reward, fork=None, prefix_of=None):
    """A full-trajectory episode: prompt [40, 41, 42], then per turn its response and the observation ids ``OBS``.
    A sibling copies its base's turns before the fork turn."""
    turns, prompt = [], [40, 41, 42]
    for k, resp in enumerate(responses):
        if prefix_of is not None and k < fork.turn:
            turns.append(prefix_of.turns[k])
        else:
            turns.append(Turn(prompt_ids=list(prompt), response_ids=list(resp), response_logprobs=[-1.0] * len(resp),
                              action=f"a{k}", observation=f"o{k}", terminated=k == len(responses) - 1))
        prompt = prompt + list(turns[-1].response_ids) + OBS
    return Episode(task=Task("agent_rl/TextWorld-v0", group_id=7), temperature=1.0, is_high=False, turns=turns,
                   reward=reward, won=reward > 0, fork=fork)


def example_episodes():
    b0 = _episode([[60, 61], [62, 63]], 1.0)
    b1 = _episode([[70, 71], [72, 73], [74, 75]], 0.0)
    sibs = [_episode([[70, 71], [80 + j, 81], [82, 83 + j]], 1.0, fork=ForkOrigin(1, 1), prefix_of=b1)
            for j in range(2)]
    return [b0, b1, *sibs]


def _learner(model, tok):
    return Learner(model, tok, AlgoConfig(name="grpo"), OptimConfig(lr=1e-3, weight_decay=0.0),
                   credit=CreditConfig(name="uniform"), schedule=ScheduleConfig(kind="none"))


@pytest.mark.parametrize("mode", ["trajectory", "turn"])
def test_hand_example_through_the_learner(tiny, mode):
    model, tok = tiny
    eps = example_episodes()
    batch = build_rollout_batch(eps, pad_token_id=tok.pad_token_id, mode=mode)
    learner = _learner(model, tok)
    out = learner.advantages(batch, learner.evaluate(batch, with_js=False), step=1, total_steps=2)
    want = {0: [AG, AG], 1: [-AG, AS_BASE, AS_BASE], 2: [0.0, AS_SIB, AS_SIB], 3: [0.0, AS_SIB, AS_SIB]}
    for e, ep in enumerate(eps):
        rows = (batch.episode_index == e).nonzero().flatten().tolist()
        for k, turn in enumerate(ep.turns):
            r = rows[k] if mode == "turn" else rows[0]
            start = len(turn.prompt_ids)
            span = slice(start, start + len(turn.response_ids))
            torch.testing.assert_close(out.advantages[r, span], torch.full((2,), want[e][k]), rtol=1e-4, atol=1e-5)
            trained = 0.0 if (ep.fork is not None and k < ep.fork.turn) else 1.0
            assert out.loss_mask[r, span].tolist() == [trained] * 2
    # a whole update runs on it (the learner and the losses unchanged)
    metrics = learner.update(batch, step=1, total_steps=2)
    assert metrics["actor/grad_norm"] > 0


def test_fork_refuses_a_critic(tiny):
    model, tok = tiny
    batch = build_rollout_batch(example_episodes(), pad_token_id=tok.pad_token_id, mode="trajectory")
    learner = _learner(model, tok)
    learner.algo.adv_estimator = "reinforce_pp"
    with pytest.raises(ValueError, match="per-group baseline"):
        learner.advantages(batch, learner.evaluate(batch, with_js=False), step=1, total_steps=2)


def test_records_name_the_base_and_fork_turn(tiny):
    _, tok = tiny
    recs = episode_records(example_episodes(), step=3, tokenizer=tok)
    assert [r.get("fork") for r in recs] == [None, None, {"base": "3-1", "base_slot": 1, "turn": 1},
                                             {"base": "3-1", "base_slot": 1, "turn": 1}]


def test_composes_with_tgrl_js_weights_and_tp_schedule(tiny):
    """algo=tgrl (after warm-up) on the example with every episode at T1: stage 2's JS weights (positive, per
    token) keep each token's sign of the hand example, the replayed prefix stays 0 and out of the loss mask; with
    credit=tp under a schedule the mask only shrinks."""
    model, tok = tiny
    eps = example_episodes()
    for ep in eps:
        ep.is_high = True
    batch = build_rollout_batch(eps, pad_token_id=tok.pad_token_id, mode="trajectory")
    for credit, schedule in (("js", "none"), ("tp", "linear")):
        learner = Learner(model, tok, AlgoConfig(name="tgrl", warmup_steps=0), OptimConfig(lr=1e-3),
                          credit=CreditConfig(name=credit), schedule=ScheduleConfig(kind=schedule))
        out = learner.advantages(batch, learner.evaluate(batch), step=2, total_steps=4)
        want = {0: [1, 1], 1: [-1, -1, -1], 2: [0, 1, 1], 3: [0, 1, 1]}
        for e, ep in enumerate(eps):
            for k, turn in enumerate(ep.turns):
                span = slice(len(turn.prompt_ids), len(turn.prompt_ids) + 2)
                a, m = out.advantages[e, span], out.loss_mask[e, span]
                if want[e][k] == 0:
                    assert float(a.abs().sum()) == 0.0 and float(m.sum()) == 0.0
                else:
                    assert bool(((torch.sign(a) == want[e][k]) | (m == 0)).all()), (credit, e, k, a)
        assert float(out.loss_mask.sum()) <= float(batch.response_mask.sum())
