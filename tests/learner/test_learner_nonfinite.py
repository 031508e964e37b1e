"""The learner never applies a non-finite update: a NaN/inf advantage on a trained token, a non-finite loss or a
non-finite gradient skips the step (no ``optimizer.step``, no scheduler step): the parameters AND the optimiser state
(moments, step counts, lr) are exactly what they were, ``actor/skipped_nonfinite`` is 1 and the cause is named; a
finite step afterwards trains as usual. Under data parallelism (DDP and FSDP, 2 gloo ranks in processes of their
own) a non-finite value on one rank skips on every rank alike, without a hang. Tiny random Llama, CPU, fp32."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig
from agent_rl.rollout import build_rollout_batch
from agent_rl.types import Episode, Task, Turn


def make_batch(rewards: list[float], vocab: int = 200, seed: int = 0):
    """Groups of 2 one-turn episodes (``rewards`` in episode order, 2 per group) of random prompt/response ids; the
    batch is built from them directly (a batch made by hand never crosses the rollout's reward doors)."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for e, r in enumerate(rewards):
        prompt = torch.randint(3, vocab, (5,), generator=g).tolist()
        resp = torch.randint(3, vocab, (4 + e % 3,), generator=g).tolist()
        turn = Turn(prompt_ids=prompt, response_ids=resp, response_logprobs=[-1.0] * len(resp), action="a",
                    reward=0.0, terminated=True)
        eps.append(Episode(task=Task("e", group_id=e // 2), temperature=1.0, is_high=False, turns=[turn], reward=0.0))
    batch = build_rollout_batch(eps, pad_token_id=0)
    batch.episode_rewards = torch.tensor(rewards, dtype=torch.float32)  # (E,) what a broken door would have let in
    batch.rewards = batch.episode_rewards[batch.episode_index]  # (E,) -> (B,)
    return batch


def make_learner(model, tok, **algo) -> Learner:
    return Learner(model, tok, AlgoConfig(**{"name": "grpo", **algo}), OptimConfig(lr=1e-2, weight_decay=0.0),
                   credit=CreditConfig(name="uniform"))


def snapshot(learner: Learner) -> tuple[dict, dict, dict]:
    return (copy.deepcopy(learner.model.state_dict()), copy.deepcopy(learner.optimizer.state_dict()),
            copy.deepcopy(learner.scheduler.state_dict()))


def assert_same(a, b) -> None:
    """Two (params, optimiser, scheduler) snapshots are identical, bit for bit."""
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=False)


def assert_moved(a, b) -> None:
    assert any(not torch.equal(a[0][k], b[0][k]) for k in a[0])


GOOD = [1.0, 0.0, 0.0, 1.0]


def test_nonfinite_advantages_skip_the_step(tiny, bad=math.nan):
    # a NaN reward gives its group NaN advantages (an inf one: the estimators' equal-group rule answers 0)
    model, tok = tiny
    learner = make_learner(model, tok, num_mini_batches=2, ppo_epochs=2)
    m = learner.update(make_batch(GOOD), step=1, total_steps=10)  # a first step: the optimiser has state
    assert m["actor/skipped_nonfinite"] == 0.0 and learner.skip_cause is None
    before = snapshot(learner)
    m = learner.update(make_batch([1.0, 0.0, bad, 1.0]), step=2, total_steps=10)  # group 1 only: mini-batch 2
    assert m["actor/skipped_nonfinite"] == 1.0 and m["actor/optimizer_steps"] == 0.0
    assert math.isnan(m["actor/grad_norm"])  # no optimiser step: no norm (null in metrics.jsonl), not 0
    assert "advantages" in learner.skip_cause
    assert_same(before, snapshot(learner))
    m = learner.update(make_batch(GOOD, seed=1), step=3, total_steps=10)  # the run goes on
    assert m["actor/skipped_nonfinite"] == 0.0 and math.isfinite(m["actor/grad_norm"])
    after = snapshot(learner)
    assert_moved(before, after)
    assert all(torch.isfinite(p).all() for p in after[0].values())


@pytest.mark.parametrize("where", ["grad", "loss"])
def test_nonfinite_gradient_or_loss_skips_the_step(tiny, where):
    model, tok = tiny
    learner = make_learner(model, tok)
    learner.update(make_batch(GOOD), step=1, total_steps=10)
    before = snapshot(learner)
    param = learner.params[-1]
    if where == "grad":  # a finite loss whose gradient overflows
        handle = param.register_hook(lambda g: g * math.inf)
    else:  # the loss itself overflows: its backward is non-finite too
        micro = learner._micro_loss
        learner._micro_loss = lambda *a, **k: (lambda out: (out[0] * math.inf, out[1]))(micro(*a, **k))
    m = learner.update(make_batch(GOOD, seed=1), step=2, total_steps=10)
    assert m["actor/skipped_nonfinite"] == 1.0
    assert ("gradient" if where == "grad" else "loss") in learner.skip_cause, learner.skip_cause
    assert_same(before, snapshot(learner))
    if where == "grad":
        handle.remove()
    else:
        learner._micro_loss = micro
    m = learner.update(make_batch(GOOD, seed=1), step=3, total_steps=10)
    assert m["actor/skipped_nonfinite"] == 0.0
    assert_moved(before, snapshot(learner))


def test_a_later_optimiser_step_going_nonfinite_stops_the_step_there(tiny):
    # ppo_epochs=2: the first optimiser step is finite and applied, the second's gradient overflows: it and the rest
    # of the step are not applied (no optimiser step, no scheduler step after it)
    model, tok = tiny
    learner = make_learner(model, tok, ppo_epochs=3)
    calls = {"n": 0}

    def hook(g):
        calls["n"] += 1
        return g * math.inf if calls["n"] >= 2 else g

    learner.params[-1].register_hook(hook)
    m = learner.update(make_batch(GOOD), step=1, total_steps=10)
    assert m["actor/skipped_nonfinite"] == 1.0 and m["actor/optimizer_steps"] == 2.0
    assert "optimiser step 2" in learner.skip_cause
    assert learner.scheduler.state_dict()["last_epoch"] == 1  # one scheduler step: the applied one
    assert all(s["step"] == 1 for s in learner.optimizer.state_dict()["state"].values())
    assert all(torch.isfinite(p).all() for p in learner.model.state_dict().values())


# ------------------------------------------------------------------------------------------------ data parallel
class InfGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by inf (a finite loss whose gradient overflows)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * math.inf


def _rank(rank: int, world: int, port: int, kind: str, bad: str, out: dict) -> None:
    import torch.distributed as dist

    from agent_rl.distributed.data_parallel import DataParallel, init_process_group
    from agent_rl.distributed.fsdp import FullyShardedDataParallel
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tok = load_policy(ModelConfig(name="tiny"))
    init_process_group(rank, world, "127.0.0.1", port, backend="gloo")
    try:
        learner = make_learner(model, tok)
        learner.data_parallel = (FullyShardedDataParallel if kind == "fsdp" else DataParallel)(learner)
        learner.update(make_batch(GOOD, seed=rank), step=1, total_steps=10)

        def state():
            full = learner.data_parallel.full_state_dict() if kind == "fsdp" else learner.model.state_dict()
            opt = learner.optimizer.state_dict()["state"]
            return ({k: v.detach().clone() for k, v in (full or {}).items()},
                    [{k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                      for k, v in s.items()} for s in opt.values()])

        before = state()
        rewards = [1.0, 0.0, math.nan, 1.0] if bad == "advantages" and rank == 1 else GOOD
        if bad == "grad" and rank == 1:  # a finite loss whose gradient overflows, on this rank only
            micro = learner._micro_loss
            learner._micro_loss = lambda *a, **k: (lambda out: (InfGrad.apply(out[0]), out[1]))(micro(*a, **k))
        m = learner.update(make_batch(rewards, seed=10 + rank), step=2, total_steps=10)
        after = state()
        same = all(torch.equal(before[0][k], after[0][k]) for k in before[0]) and all(
            torch.equal(a[k], b[k]) for a, b in zip(before[1], after[1]) for k in a)
        out[rank] = (m["actor/skipped_nonfinite"], learner.skip_cause, same)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
@pytest.mark.parametrize("bad", ["advantages", "grad"])
def test_a_nonfinite_value_on_one_rank_skips_on_every_rank(kind, bad):
    from agent_rl.runtime import free_port

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(2, free_port(), kind, bad, out), nprocs=2, join=True, start_method="spawn")
        got = dict(out)
    assert [got[r][0] for r in (0, 1)] == [1.0, 1.0], got
    assert all(got[r][2] for r in (0, 1)), got  # parameters and optimiser state unchanged on both ranks
    for r in (0, 1):  # the same decision and cause on both: the all-reduced advantages check, or the global norm
        assert ("advantages" if bad == "advantages" else "gradient") in got[r][1], got
