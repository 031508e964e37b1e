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

from tests.distributed.ranks import close_ranks, start_ranks
from tests.distributed.test_ray import _batch  # noqa: E402

pytestmark = pytest.mark.slow  # Ray actors on a local cluster

MODEL = ModelConfig(name="tiny", lora=LoRAConfig(rank=4, alpha=8.0))
ALGO = AlgoConfig(name="grpo", adv_estimator="grpo", group_size=4, micro_batch_size=3)
OPTIM = OptimConfig(lr=1e-4, lora_lr=1e-3, eps=1e-6, max_grad_norm=1.0, warmup=0)
#: merged weights after 2 steps, DDP (all-reduced adapter gradients) vs one process: summation order only
ATOL = 2e-5


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


def _ranks(strategy: str) -> list:
    spec = LearnerSpec(model=MODEL, algo=ALGO, optim=OPTIM, credit=CreditConfig(), device="cpu", seed=0,
                       strategy=strategy)
    return start_ranks(2, spec)


@pytest.mark.timeout(900)
def test_lora_fsdp_ranks_match_the_single_learner_and_resume_both_ways(ray_cluster, tmp_path):
    """trainer.learner_strategy=fsdp with LoRA: 2 FSDP ranks make the single learner's 2 updates (merged weights
    within ATOL, the same grad norms); their gathered weights are merged under plain names; their sharded
    checkpoint holds adapter/ and resumes on one learner (2 -> 1), and the single learner's plain LoRA checkpoint
    resumes on 2 FSDP ranks (1 -> 2), each continuing like the single learner."""
    from agent_rl.learner.checkpoint import load_checkpoint, save_checkpoint

    plain, tok = load_policy(ModelConfig(name="tiny"))
    batches = [_batch(copy.deepcopy(plain), tok, groups=4, seed=s) for s in (0, 1, 2)]
    seed_everything(0)
    model, tok = load_policy(MODEL, train=True)
    single = Learner(model, tok, ALGO, OPTIM, credit=CreditConfig(), device="cpu", seed=0)
    ref = [single.update(b, step=i + 1, total_steps=10) for i, b in enumerate(batches[:2])]
    plain_ckpt = save_checkpoint(tmp_path / "single_step_2", single.model, tok, single, {"step": 2})
    after2 = {k: v.clone() for k, v in merged_state_dict(single.model).items()}
    ref3 = single.update(batches[2], step=3, total_steps=10)
    after3 = {k: v.clone() for k, v in merged_state_dict(single.model).items()}

    ranks = _ranks("fsdp")
    try:
        got = [ray.get([r.update.remote(s, i + 1, 10) for r, s in zip(ranks, shard_batch(b, 2))], timeout=240)
               for i, b in enumerate(batches[:2])]
        weights = ray.get([r.get_weights.remote() for r in ranks])
        sharded = tmp_path / "fsdp_step_2"
        ray.get([r.save.remote(str(sharded), {"step": 2}) for r in ranks], timeout=240)
    finally:
        close_ranks(ranks)
    assert weights[1] is None and set(weights[0]) == set(plain.state_dict())  # merged, plain names, rank 0 only
    for name, w in weights[0].items():
        torch.testing.assert_close(w, after2[name], atol=ATOL, rtol=0, msg=name)
    for r, m in zip(ref, got):
        assert m[0]["actor/grad_norm"] == pytest.approx(r["actor/grad_norm"], rel=1e-4)
    # the sharded checkpoint: merged transformers folder (= the gathered weights) + adapter/
    from safetensors.torch import load_file

    assert (sharded / "adapter" / "adapter_model.safetensors").is_file()
    folder = load_file(str(sharded / "model.safetensors"))
    assert set(folder) == set(weights[0])
    for name, w in weights[0].items():
        torch.testing.assert_close(folder[name], w, atol=0, rtol=0, msg=name)
    # 2 -> 1: one LoRA learner resumes it (adapter from adapter/, AdamW moments from the shards), then step 3
    seed_everything(5)  # another adapter init: everything must come from the checkpoint
    m2, _ = load_policy(MODEL, train=True)
    one = Learner(m2, tok, ALGO, OPTIM, credit=CreditConfig(), device="cpu", seed=0)
    load_checkpoint(sharded, m2, one, restore_rng=False)
    one3 = one.update(batches[2], step=3, total_steps=10)
    assert one3["actor/grad_norm"] == pytest.approx(ref3["actor/grad_norm"], rel=1e-4)
    for name, w in merged_state_dict(m2).items():
        torch.testing.assert_close(w, after3[name], atol=ATOL, rtol=0, msg=name)
    # 1 -> 2: the single learner's plain LoRA checkpoint on 2 FSDP ranks, then step 3 as the single learner's
    ranks = _ranks("fsdp")
    try:
        ray.get([r.load.remote(str(plain_ckpt)) for r in ranks], timeout=240)
        got3 = ray.get([r.update.remote(s, 3, 10) for r, s in zip(ranks, shard_batch(batches[2], 2))], timeout=240)
        w3 = ray.get([r.get_weights.remote() for r in ranks])[0]
    finally:
        close_ranks(ranks)
    assert got3[0]["actor/grad_norm"] == pytest.approx(ref3["actor/grad_norm"], rel=1e-4)
    for name, w in w3.items():
        torch.testing.assert_close(w, after3[name], atol=ATOL, rtol=0, msg=name)


@pytest.mark.timeout(900)
def test_lora_fsdp_ray_run_writes_two_rows_an_adapter_and_exports(ray_cluster, tmp_path):
    """The issue's two acceptance commands in one: 2 FSDP ranks on the Ray backend with model.lora.rank=8 (rollout
    workers load the merged weights) -> 2 training rows at the adapter's rate, checkpoints/step_2/adapter/ beside
    the merged folder, and ``agent_rl.export`` merges the adapter into the rebuilt base to the same weights."""
    from safetensors.torch import load_file

    from agent_rl.export import export_checkpoint
    from agent_rl.logging import read_metrics
    from agent_rl.train import main

    out = tmp_path / "run"
    main(["env=choose_item", "model=tiny", "algo=grpo", "trainer.backend=ray", "trainer.num_learners=2",
          "trainer.learner_strategy=fsdp", "model.lora.rank=8", "trainer.total_steps=2", "trainer.tasks_per_step=2",
          f"trainer.output_dir={out}", "env_server.mode=local", "rollout.num_workers=1", "trainer.learner_cpus=0.5",
          "rollout.worker_cpus=0.5", "trainer.progress=false", "trainer.loggers=[jsonl]",
          "trainer.save_episodes=none"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/lr"] == pytest.approx(3e-3) for r in rows)
    ckpt = out / "checkpoints" / "step_2"
    assert (ckpt / "adapter" / "adapter_model.safetensors").is_file() and (ckpt / "distcp").is_dir()
    exported = load_file(str(export_checkpoint(ckpt, tmp_path / "export") / "model.safetensors"))
    saved = load_file(str(ckpt / "model.safetensors"))
    assert exported.keys() == saved.keys()
    for name, w in saved.items():
        torch.testing.assert_close(exported[name], w, atol=1e-5, rtol=0, msg=name)
