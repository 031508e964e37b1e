"""LoRA (``model.lora.rank > 0``) on Ray learner ranks: 2 data-parallel ranks train the same adapter as the single
learner (the ranks build their model through the same ``load_policy(train=True)``; only adapter parameters are
trainable, so only they are all-reduced and stepped), and ``get_weights`` hands rollout workers the merged weights
under plain transformers names."""

from __future__ import annotations

import copy

import pytest
import torch

import ray  # installed by scripts/setup.sh's .[all]: absent is a broken install, not a skip

peft = pytest.importorskip("peft")

from agent_rl.distributed.actors import LearnerRank, LearnerSpec  # noqa: E402
from agent_rl.distributed.data_parallel import shard_batch  # noqa: E402
from agent_rl.learner import AlgoConfig, Learner, OptimConfig  # noqa: E402
from agent_rl.learner.config import CreditConfig, LoRAConfig, ModelConfig  # noqa: E402
from agent_rl.lora import merged_state_dict  # noqa: E402
from agent_rl.models import load_policy  # noqa: E402
from agent_rl.runtime import seed_everything  # noqa: E402

from tests.distributed.test_ray import _batch  # noqa: E402

pytestmark = pytest.mark.slow  # Ray actors on a local cluster

MODEL = ModelConfig(name="tiny", lora=LoRAConfig(rank=4, alpha=8.0))
ALGO = AlgoConfig(name="grpo", adv_estimator="grpo", group_size=4, micro_batch_size=3)
OPTIM = OptimConfig(lr=1e-4, lora_lr=1e-3, eps=1e-6, max_grad_norm=1.0, warmup=0)
#: merged weights after 2 steps, DDP (all-reduced adapter gradients) vs one process: summation order only
ATOL = 2e-5


@pytest.fixture(scope="module")
def ray_cluster():
    """A local 2-CPU Ray cluster for this module; always shut down."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.timeout(600)
def test_lora_ddp_ranks_match_the_single_learner(ray_cluster):
    plain, tok = load_policy(ModelConfig(name="tiny"))
    batches = [_batch(copy.deepcopy(plain), tok, groups=4, seed=s) for s in (0, 1)]
    seed_everything(0)  # as LearnerRank.setup: the adapter's A is drawn after seeding
    model, tok = load_policy(MODEL, train=True)
    single = Learner(model, tok, ALGO, OPTIM, credit=CreditConfig(), device="cpu", seed=0)
    init = {k: v.clone() for k, v in merged_state_dict(model).items()}
    ref = [single.update(b, step=i + 1, total_steps=10) for i, b in enumerate(batches)]

    spec = LearnerSpec(model=MODEL, algo=ALGO, optim=OPTIM, credit=CreditConfig(), device="cpu", seed=0)
    Rank = ray.remote(num_cpus=1)(LearnerRank)
    ranks = [Rank.remote(r, 2, spec) for r in range(2)]
    try:
        addr, port = ray.get(ranks[0].address.remote())
        assert set(ray.get([r.setup.remote(addr, port) for r in ranks], timeout=240)) == {"gloo"}
        got = []
        for i, b in enumerate(batches):
            shards = shard_batch(b, 2)
            got.append(ray.get([r.update.remote(s, i + 1, 10) for r, s in zip(ranks, shards)], timeout=240))
        weights = ray.get(ranks[0].get_weights.remote())
        lrs = ray.get([r.lr.remote() for r in ranks])
    finally:
        ray.get([r.shutdown.remote() for r in ranks])
        for r in ranks:
            ray.kill(r)
    assert lrs == [pytest.approx(1e-3)] * 2  # optim.lora_lr on every rank
    mine = merged_state_dict(single.model)
    assert set(weights) == set(plain.state_dict())  # plain names: what rollout workers load_state_dict
    moved = 0.0
    for name, w in weights.items():
        torch.testing.assert_close(w, mine[name], atol=ATOL, rtol=0, msg=name)
        moved = max(moved, float((mine[name] - init[name]).abs().max()))
    assert moved > 1e-4  # the adapter steps moved the merged weights
    for r, m in zip(ref, got):
        assert m[0]["actor/grad_norm"] == pytest.approx(r["actor/grad_norm"], rel=1e-4)
        assert sum(x["actor/pg_loss"] for x in m) / 2 == pytest.approx(r["actor/pg_loss"], rel=1e-4, abs=1e-6)
