"""The TGRL / TP-Schedule cases of algorithms.md through ``Learner.update`` on hand-built per-turn batches (tiny
random Llama, CPU): what the learner trains is read from ``Learner.last_token_stats``."""

from __future__ import annotations

import math

import pytest
import torch

from agent_rl import algos
from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig, ScheduleConfig
from agent_rl.learner.learner import group_mini_batches
from agent_rl.types import Generation
from learner_helpers import build_batch

SQ3 = math.sqrt(3.0) / 2


def _batch(tok, rewards, highs, turns, resp_len=10, groups=1):
    """Per-turn batch: per group, episode k has ``turns[k]`` turn rows of ``resp_len`` response tokens each."""
    rows, ep = [], 0
    gen = torch.Generator().manual_seed(0)
    for g in range(groups):
        for k, (r, hi, n_turns) in enumerate(zip(rewards, highs, turns)):
            for turn in range(n_turns):
                prompt = torch.randint(5, 200, (4 + turn,), generator=gen).tolist()
                resp = torch.randint(5, 200, (resp_len,), generator=gen).tolist()
                rows.append(dict(prompt=prompt, gen=Generation(resp, [0.0] * resp_len, "", "length"),
                                 temperature=1.2 if hi else 0.3, group=g, episode=ep, is_high=hi, turn=turn,
                                 num_turns=n_turns, reward=r))
            ep += 1
    return build_batch(rows, tok.pad_token_id)


def _learner(tiny, credit="js", level="token", schedule="none", value=None, lr=1e-3, **algo):
    model, tok = tiny
    cfg = AlgoConfig(**{"name": "tgrl", "warmup_steps": 0, **algo})
    return Learner(model, tok, cfg, OptimConfig(lr=lr, weight_decay=0.0),
                   credit=CreditConfig(name=credit, level=level), schedule=ScheduleConfig(kind=schedule, value=value))


def test_js_weights_are_normalised_per_episode_in_the_learner(tiny):
    """Per-turn mode: the trained advantages of a high episode equal A_i * w_t with w normalised over the episode's
    turn rows together (mean 1 over the episode, not over each turn)."""
    _, tok = tiny
    batch = _batch(tok, [0.0, 1.0, 0.0, 0.0], [False, True, True, True], [2, 3, 2, 2])
    learner = _learner(tiny, js_quantile_clip=False)
    learner.update(batch, step=1, total_steps=10)
    st = learner.last_token_stats
    rm = batch.response_mask > 0
    want = algos.tgrl_advantages(batch.rewards, batch.group_index, batch.is_high, st["js"], batch.response_mask,
                                 episode_index=batch.episode_index, quantile_clip=False)
    torch.testing.assert_close(st["advantages"], want, atol=1e-6, rtol=1e-6)
    # episode 1 (the winner, 3 turn rows): A = 1.5, token weights mean 1 over its 30 tokens, not over each turn
    rows = (batch.episode_index == 1).nonzero().flatten()
    adv = st["advantages"][rows][rm[rows]]
    assert float(adv.mean()) == pytest.approx(1.5, abs=1e-5)
    per_turn = [float(st["advantages"][r][rm[r]].mean()) for r in rows]
    assert max(per_turn) - min(per_turn) > 1e-3  # credit moves between turns
    assert (st["advantages"][batch.episode_index == 0] == 0).all()  # the low episode


def test_uniform_credit_under_tgrl_in_the_learner(tiny):
    """algo=tgrl credit=uniform, group [low 1 | high 1, 0, 0]: low rows 0, high rows +0.866, -0.866, -0.866."""
    _, tok = tiny
    batch = _batch(tok, [1.0, 1.0, 0.0, 0.0], [False, True, True, True], [2, 1, 2, 1])
    learner = _learner(tiny, credit="uniform")
    learner.update(batch, step=1, total_steps=10)
    st = learner.last_token_stats
    rm = batch.response_mask > 0
    want_ep = torch.tensor([0.0, SQ3, -SQ3, -SQ3])
    for r in range(batch.num_rows):
        torch.testing.assert_close(st["advantages"][r][rm[r]],
                                   want_ep[batch.episode_index[r]].expand(int(rm[r].sum())), atol=1e-5, rtol=0)
    assert torch.equal(st["loss_mask"] > 0, rm)  # low rows stay in the denominator


def test_forking_relaxed_threshold_in_the_learner(tiny):
    """credit=forking at S: trained tokens are exactly those with old-policy entropy >= S * (80th percentile over the
    batch's action tokens)."""
    _, tok = tiny
    batch = _batch(tok, [1.0, 1.0, 0.0, 0.0], [True, True, True, True], [2, 1, 2, 1])
    for s in (1.0, 0.5):
        learner = _learner(tiny, credit="forking", value=s, name="grpo")
        m = learner.update(batch, step=1, total_steps=10)
        st = learner.last_token_stats
        rm = batch.response_mask > 0
        h = st["entropy"][rm].double()
        eps = torch.quantile(h, 0.8)
        want = (st["entropy"].double() >= s * eps) & rm
        assert torch.equal(st["loss_mask"] > 0, want)
        assert m["credit/trained_token_frac"] == pytest.approx(float(want.sum()) / float(rm.sum()))
    assert m["credit/trained_token_frac"] > 0.2  # S = 0.5 widens the static 20%


def test_tp_over_the_trajectory_in_the_learner(tiny):
    """credit=tp, 3 turns of 10 action tokens, S = 0.5: turn 0 untrained, turn 1 tokens 5..9, turn 2 all; with
    credit.kwargs.scope=turn tokens 5..9 of each turn."""
    model, tok = tiny
    batch = _batch(tok, [1.0, 0.0], [True, True], [3, 3])
    cfg = AlgoConfig(name="grpo", group_size=2)
    for scope, want_counts in (("trajectory", [0, 5, 10]), ("turn", [5, 5, 5])):
        learner = Learner(model, tok, cfg, OptimConfig(lr=1e-3), schedule=ScheduleConfig(value=0.5),
                          credit=CreditConfig(name="tp", kwargs={"scope": scope}))
        learner.update(batch, step=1, total_steps=10)
        mask = learner.last_token_stats["loss_mask"]
        rm = batch.response_mask > 0
        for r in range(3):
            kept = mask[r][rm[r]]
            assert int(kept.sum()) == want_counts[r], (scope, r)
            if scope == "trajectory" and r == 1:
                assert kept.tolist() == [0.0] * 5 + [1.0] * 5


def test_group_mini_batches_split_whole_groups():
    group = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7])
    chunks = group_mini_batches(group, 4, torch.Generator().manual_seed(0))
    assert len(chunks) == 4
    assert sorted(torch.cat(chunks).tolist()) == list(range(13))
    seen = set()
    for c in chunks:
        gs = set(group[c].tolist())
        assert len(gs) == 2 and not (gs & seen)  # 8 groups -> 2 whole groups per mini-batch
        seen |= gs
    assert len(group_mini_batches(group[:3], 4, torch.Generator())) == 1  # capped at the number of groups


def test_mini_batches_make_the_clip_bind(tiny):
    """Reference recipe: 4 mini-batches of whole groups, one epoch; with a deliberately large lr the policy moves
    between optimiser steps, so mini-batches 2..4 see ratio != 1: actor/clipfrac > 0 and approx_kl > 0. With one
    mini-batch the ratio is exactly 1 (clipfrac 0)."""
    _, tok = tiny
    batch = _batch(tok, [1.0, 0.0, 0.0, 1.0], [False, True, True, True], [2, 1, 2, 1], groups=4)
    m1 = _learner(tiny, credit="uniform", lr=0.05, num_mini_batches=1).update(batch, step=1, total_steps=10)
    assert m1["actor/optimizer_steps"] == 1.0
    assert m1["actor/clipfrac"] == 0.0 and abs(m1["actor/approx_kl"]) < 1e-9
    m4 = _learner(tiny, credit="uniform", lr=0.05, num_mini_batches=4).update(batch, step=1, total_steps=10)
    assert m4["actor/optimizer_steps"] == 4.0
    assert m4["actor/clipfrac"] > 0 and m4["actor/approx_kl"] > 0


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.6)])
def test_learner_logprobs_match_a_truncating_sampler(tiny, top_k, top_p):
    """engine.top_k / top_p: the learner recomputes the engine's log-probs under the same truncation (within 1e-4),
    while the full-softmax log-probs differ."""
    from agent_rl.engines import get_engine

    model, tok = tiny
    engine = get_engine("hf", model, tok)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"pick item {i}"}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for i in range(4)]
    temps = [0.3, 1.2, 1.2, 1.2]
    gens = engine.generate([list(p) for p in prompts], temps, max_new_tokens=8, top_k=top_k, top_p=top_p, seed=0)
    rows = [dict(prompt=list(p), gen=g, temperature=t, group=0, episode=i, is_high=i > 0, turn=0, num_turns=1,
                 reward=float(i % 2)) for i, (p, g, t) in enumerate(zip(prompts, gens, temps))]
    batch = build_batch(rows, tok.pad_token_id)
    rm = batch.response_mask > 0
    cfg = AlgoConfig(name="tgrl", warmup_steps=0)
    same = Learner(model, tok, cfg, OptimConfig(), top_k=top_k, top_p=top_p).evaluate(batch).logprobs
    assert float((same - batch.engine_logprobs).abs()[rm].max()) < 1e-4
    full = Learner(model, tok, cfg, OptimConfig()).evaluate(batch).logprobs
    assert float((full - batch.engine_logprobs).abs()[rm].max()) > 1e-3


@pytest.mark.parametrize("mode", ["turn", "trajectory"])
@pytest.mark.parametrize("same_obs,want_turn1", [(True, 2 ** 0.5), (False, 0.5 ** 0.5)])
def test_gigpo_through_the_learner(tiny, same_obs, want_turn1, mode):
    """algo.adv_estimator=gigpo reads each turn's observation key from build_rollout_batch. Group of 2 episodes x
    2 turns, rewards [1, 0]: episode GRPO +-0.7071; step part (gamma 0.95, sparse): turn 0 (shared initial state)
    returns [0.95, 0] -> +-0.7071; turn 1 acted on the observation after turn 0: the same text in both episodes ->
    returns [1, 0] -> +-0.7071 (total +-1.4142), different texts -> anchor groups of one -> 0 (total +-0.7071).
    Full-trajectory mode: the same values on each turn's tokens of the episode's one row."""
    from agent_rl.rollout.batch import build_rollout_batch
    from agent_rl.types import Episode, Task, Turn

    model, tok = tiny
    episodes = []
    for e, reward in enumerate([1.0, 0.0]):
        obs0 = "You are in room A." if same_obs else f"You are in room {'AB'[e]}."
        turns = [Turn(prompt_ids=[5, 6, 7], response_ids=[10 + e, 11], response_logprobs=[0.0, 0.0], action="go",
                      observation=obs0),
                 Turn(prompt_ids=[5, 6, 7, 10 + e, 11, 8], response_ids=[12, 13 + e], response_logprobs=[0.0, 0.0],
                      action="take", observation="done")]
        episodes.append(Episode(task=Task(env_id="x", group_id=0), temperature=1.0, is_high=False, turns=turns,
                                reward=reward, won=reward > 0))
    batch = build_rollout_batch(episodes, pad_token_id=tok.pad_token_id, mode=mode)
    learner = Learner(model, tok, AlgoConfig(name="grpo", adv_estimator="gigpo", group_size=2), OptimConfig(lr=1e-3))
    learner.update(batch, step=1, total_steps=10)
    adv = learner.last_token_stats["advantages"]
    rm = batch.response_mask > 0
    sign = torch.tensor([1.0, 1.0, -1.0, -1.0])  # ep0 turn0, ep0 turn1, ep1 turn0, ep1 turn1
    want = sign * torch.tensor([2 ** 0.5, want_turn1, 2 ** 0.5, want_turn1])
    if mode == "turn":  # rows: ep0 turn0, ep0 turn1, ep1 turn0, ep1 turn1
        for r in range(4):
            torch.testing.assert_close(adv[r][rm[r]], want[r].expand(2), atol=1e-4, rtol=0)
    else:  # rows: ep0, ep1; each row's response tokens are turn 0's two then turn 1's two
        assert batch.num_rows == 2
        for e in range(2):
            torch.testing.assert_close(adv[e][rm[e]], want[2 * e:2 * e + 2].repeat_interleave(2), atol=1e-4, rtol=0)
