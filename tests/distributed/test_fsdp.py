"""``trainer.learner_strategy=fsdp``: FSDP2 learner ranks (gloo, Ray actors as the DDP tests) make the update of DDP
ranks and of the single learner; sharded checkpoints resume with another rank count and strategy; the Ray run of
the acceptance command; memory per rank (tensor bytes) is about half of DDP's with 2 ranks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import ray  # installed by scripts/setup.sh's .[all]: absent is a broken install, not a skip

from agent_rl.config.compose import load_config

from agent_rl.config.schema import ConfigError
from agent_rl.distributed.actors import LearnerSpec
from agent_rl.distributed.data_parallel import shard_batch
from agent_rl.learner import AlgoConfig, Learner, OptimConfig
from agent_rl.learner.checkpoint import IncompleteCheckpoint, load_checkpoint, missing_state, save_checkpoint
from agent_rl.learner.config import CreditConfig, ModelConfig
from agent_rl.logging import read_metrics
from agent_rl.models import load_policy

from tests.distributed.ranks import close_ranks, start_ranks
from tests.distributed.test_ray import _batch

pytestmark = pytest.mark.slow  # Ray actors on a local cluster (fast tier: pytest -m 'not slow')

#: parameters after 2 steps: FSDP (reduce-scatter, per-shard clip norm partials) vs DDP vs one process differ only in
#: float summation order; lr 1e-4 and eps 1e-6 as the DDP test, so an order-level gradient difference moves a weight
#: by far less than this.
ATOL = 2e-5


ALGO = AlgoConfig(name="tgrl", micro_batch_size=3, warmup_steps=0)
OPTIM = OptimConfig(lr=1e-4, eps=1e-6, max_grad_norm=1.0, warmup=0)
CREDIT = CreditConfig(name="js")


def _ranks(n: int, strategy: str, model: ModelConfig | None = None, **spec_kwargs) -> list:
    spec = LearnerSpec(model=model or ModelConfig(name="tiny"), algo=ALGO, optim=OPTIM, credit=CREDIT, device="cpu",
                       seed=0, strategy=strategy, **spec_kwargs)
    return start_ranks(n, spec)


def _weights(ranks: list) -> dict[str, torch.Tensor]:
    """Rank 0's full weights (every rank takes part in a sharded gather; only rank 0 returns a copy)."""
    out = ray.get([r.get_weights.remote() for r in ranks])
    if ray.get(ranks[0].memory.remote()).get("sync_max_gathered") is not None:
        assert all(w is None for w in out[1:])  # FSDP: never a full copy on the other ranks
    return out[0]


def _update(ranks: list, batch, step: int) -> list[dict[str, float]]:
    shards = shard_batch(batch, len(ranks))
    return ray.get([r.update.remote(s, step, 10) for r, s in zip(ranks, shards)], timeout=240)


@pytest.fixture(scope="module")
def batches():
    model, tok = load_policy(ModelConfig(name="tiny"))
    return [_batch(copy.deepcopy(model), tok, groups=4, seed=s) for s in (0, 1)]


@pytest.mark.timeout(600)
def test_fsdp_matches_single_learner(ray_cluster, batches, tmp_path):
    """2 FSDP ranks == 2 DDP ranks == one learner after 2 steps (every parameter within ATOL, grad norm and pg_loss
    equal); the FSDP ranks really hold half of each parameter; their sharded checkpoint resumes 2 -> 1 (a single
    learner) and the single learner's plain checkpoint resumes 1 -> 2 (FSDP), each continuing within ATOL."""
    fsdp = _ranks(2, "fsdp")
    init = _weights(fsdp)
    model, tok = load_policy(ModelConfig(name="tiny"))
    for name, p in model.state_dict().items():  # same seed: the ranks start from the single learner's weights
        torch.testing.assert_close(init[name], p, atol=0, rtol=0)
    single = Learner(model, tok, ALGO, OPTIM, credit=CREDIT, device="cpu", seed=0)
    ref = [single.update(b, step=i + 1, total_steps=10) for i, b in enumerate(batches)]
    got = [_update(fsdp, b, i + 1) for i, b in enumerate(batches)]
    w_fsdp = _weights(fsdp)
    mem = ray.get([r.memory.remote() for r in fsdp])
    ckpt = tmp_path / "fsdp_step_2"
    ray.get([r.save.remote(str(ckpt), {"step": 2}) for r in fsdp])
    close_ranks(fsdp)

    ddp = _ranks(2, "ddp")
    got_ddp = [_update(ddp, b, i + 1) for i, b in enumerate(batches)]
    w_ddp = _weights(ddp)
    close_ranks(ddp)

    moved = 0.0
    for name, p in single.model.state_dict().items():
        torch.testing.assert_close(w_fsdp[name], p, atol=ATOL, rtol=0, msg=name)
        torch.testing.assert_close(w_ddp[name], p, atol=ATOL, rtol=0, msg=name)
        moved = max(moved, float((p - init[name]).abs().max()))
    assert moved > 5e-5  # the steps did move the weights
    for r, f, d in zip(ref, got, got_ddp):
        for m in (f, d):  # the clipped global grad norm (across shards) and the whole batch's loss
            assert m[0]["actor/grad_norm"] == pytest.approx(r["actor/grad_norm"], rel=1e-4)
            assert m[1]["actor/grad_norm"] == m[0]["actor/grad_norm"]
            assert sum(x["actor/pg_loss"] for x in m) / 2 == pytest.approx(r["actor/pg_loss"], rel=1e-4, abs=1e-6)
            assert m[0]["actor/optimizer_steps"] == r["actor/optimizer_steps"]
    # each FSDP rank holds its half of every parameter, gradient and AdamW moment (ceil(rows / 2) rows of dim 0)
    n_params = sum(p.numel() for p in single.params)
    for m in mem:
        assert 0.45 * 4 * n_params < m["params"] < 0.55 * 4 * n_params
        assert m["optimizer"] == pytest.approx(2 * m["params"], rel=1e-3)  # exp_avg + exp_avg_sq (+ 4-byte steps)
    assert mem[0]["sync_max_gathered"] == max(p.numel() * 4 for p in single.params)  # one parameter at a time

    # the sharded checkpoint: a transformers folder beside the DCP shards, complete, refused without them
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "distcp" / ".metadata").is_file()
    assert missing_state(ckpt) == []
    hf, _ = load_policy(ModelConfig(name="tiny", path=str(ckpt)))  # model.path=.../step_N works
    for name, p in hf.state_dict().items():
        torch.testing.assert_close(p, w_fsdp[name], atol=0, rtol=0)

    # 2 -> 1: a single learner resumes the FSDP checkpoint (moments from DCP) and continues like the single run
    m1, _ = load_policy(ModelConfig(name="tiny"))
    resumed = Learner(m1, tok, ALGO, OPTIM, credit=CREDIT, device="cpu", seed=0)
    assert load_checkpoint(ckpt, m1, resumed) == {"step": 2}
    for (k, a), b in zip(resumed.optimizer.state.items(), single.optimizer.state.values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], atol=1e-9, rtol=1e-3)
    plain = tmp_path / "single_step_2"
    save_checkpoint(plain, single.model, tok, single, {"step": 2})
    third = batches[0]
    r3 = single.update(third, step=3, total_steps=10)
    resumed.update(third, step=3, total_steps=10)
    for name, p in single.model.state_dict().items():
        torch.testing.assert_close(m1.state_dict()[name], p, atol=ATOL, rtol=0, msg=name)

    # 1 -> 2: FSDP ranks resume the single learner's plain checkpoint (each keeps its shard of the moments)
    fsdp = _ranks(2, "fsdp")
    assert ray.get([r.load.remote(str(plain)) for r in fsdp]) == [{"step": 2}] * 2
    got3 = _update(fsdp, third, 3)
    w3 = _weights(fsdp)
    # and the sharded checkpoint into 2 FSDP ranks again (the DCP shards as written)
    ray.get([r.load.remote(str(ckpt)) for r in fsdp])
    w_back = _weights(fsdp)
    close_ranks(fsdp)
    for name, p in single.model.state_dict().items():
        torch.testing.assert_close(w3[name], p, atol=ATOL, rtol=0, msg=name)
        torch.testing.assert_close(w_back[name], w_fsdp[name], atol=0, rtol=0, msg=name)
    assert got3[0]["actor/grad_norm"] == pytest.approx(r3["actor/grad_norm"], rel=1e-4)

    # no silent resume without the optimizer shards
    import shutil

    shutil.rmtree(ckpt / "distcp")
    assert missing_state(ckpt) == ["distcp"]
    with pytest.raises(IncompleteCheckpoint, match=r"has no distcp \(the optimizer shards"):
        load_checkpoint(ckpt, m1, resumed)


@pytest.mark.timeout(600)
def test_fsdp_with_gradient_checkpointing_and_one_sync_per_step_matches_single_learner(ray_cluster, batches):
    """``model.gradient_checkpointing=true`` under FSDP (each layer re-gathered for its recomputation in backward),
    with the gradient reduce-scatter only in each mini-batch's last backward (``sync_every_micro_batch=False``: the
    earlier micro-batches accumulate unsharded): one step of 2 ranks equals the single checkpointing learner's."""
    cfg = ModelConfig(name="tiny", gradient_checkpointing=True)
    ranks = _ranks(2, "fsdp", cfg, fsdp_sync_every_micro_batch=False)
    got = _update(ranks, batches[0], 1)
    w = _weights(ranks)
    close_ranks(ranks)
    model, tok = load_policy(cfg)
    assert model.model.gradient_checkpointing
    single = Learner(model, tok, ALGO, OPTIM, credit=CREDIT, device="cpu", seed=0)
    ref = single.update(batches[0], step=1, total_steps=10)
    for name, p in single.model.state_dict().items():
        torch.testing.assert_close(w[name], p, atol=ATOL, rtol=0, msg=name)
    assert got[0]["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-4)


def test_fsdp_config_refusals():
    """fsdp on the local backend, with a value head, and offload without GPUs are refused at load, with the reason."""
    base = ["env=choose_item", "model=tiny", "algo=grpo"]
    with pytest.raises(ConfigError, match=r"trainer.learner_strategy=fsdp needs a backend with sharded learner "
                                          r"\(trainer.backend=ray\); trainer.backend=local has none"):
        load_config([*base, "trainer.learner_strategy=fsdp"])
    with pytest.raises(ConfigError, match="does not shard the value head of algo=ppo"):
        load_config(["env=choose_item", "model=tiny", "algo=ppo", "trainer.backend=ray",
                     "trainer.learner_strategy=fsdp"])
    with pytest.raises(ConfigError, match="needs trainer.learner_gpus > 0"):
        load_config([*base, "trainer.backend=ray", "trainer.learner_strategy=fsdp", "trainer.fsdp_offload=true"])
    with pytest.raises((ConfigError, ValueError), match="learner_strategy='zero3' is not valid"):
        load_config([*base, "trainer.learner_strategy=zero3"])


@pytest.mark.timeout(900)
def test_fsdp_ray_run_writes_two_rows_and_a_checkpoint(ray_cluster, tmp_path):
    """The acceptance command (2 FSDP ranks on the Ray backend): 2 training rows and checkpoints/step_2, which is
    a sharded checkpoint beside the transformers folder."""
    from agent_rl.train import main

    out = tmp_path / "run"
    main(["env=choose_item", "model=tiny", "algo=grpo", "trainer.backend=ray", "trainer.num_learners=2",
          "trainer.learner_strategy=fsdp", "trainer.total_steps=2", "trainer.tasks_per_step=2",
          f"trainer.output_dir={out}", "env_server.mode=local", "rollout.num_workers=1", "trainer.learner_cpus=0.5",
          "rollout.worker_cpus=0.5", "trainer.progress=false", "trainer.loggers=[jsonl]",
          "trainer.save_episodes=none"])
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    ckpt = out / "checkpoints" / "step_2"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "distcp" / ".metadata").is_file()
    assert json.loads((ckpt / "sharded.json").read_text())["world_size"] == 2


@pytest.mark.timeout(900)  # a hang ceiling, far above the run on a busy machine
def test_one_rank_fsdp_in_process_matches_and_its_checkpoint_marker_is_checked(batches, tmp_path):
    """A one-rank process group in this process (gloo): the FSDP learner (rebuilt AdamW over DTensor shards, root
    hooks on the trunk) makes the single learner's step; the weight gather counts a parameter once; a sharded
    checkpoint without its DCP folder is incomplete (``missing_state``), with it it loads into a plain learner."""
    import torch.distributed as dist

    from agent_rl.distributed.data_parallel import init_process_group
    from agent_rl.distributed.fsdp import FullyShardedDataParallel, decoder_layers, learner_memory
    from agent_rl.learner.checkpoint import save_sharded_checkpoint

    from agent_rl.runtime import free_port as port

    model, tok = load_policy(ModelConfig(name="tiny"))
    single = Learner(copy.deepcopy(model), tok, ALGO, OPTIM, credit=CREDIT, device="cpu", seed=0)
    ref = single.update(batches[0], step=1, total_steps=10)
    assert len(decoder_layers(model)) == 2
    init_process_group(0, 1, "127.0.0.1", port())
    try:
        learner = Learner(model, tok, ALGO, OPTIM, credit=CREDIT, device="cpu", seed=0)
        dp = learner.data_parallel = FullyShardedDataParallel(learner)
        got = learner.update(batches[0], step=1, total_steps=10)
        full = dp.full_state_dict()
        n = sum(p.numel() for p in single.params)
        assert dp.last_gather["rank0_copy"] == 4 * n and learner_memory(learner)["params"] == 4 * n
        assert got["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-5)
        for name, p in single.model.state_dict().items():
            torch.testing.assert_close(full[name], p, atol=1e-6, rtol=0, msg=name)
        ckpt = save_sharded_checkpoint(tmp_path / "step_1", model, tok, learner, {"step": 1}, full)
    finally:
        dist.destroy_process_group()
    assert missing_state(ckpt) == []
    m2, _ = load_policy(ModelConfig(name="tiny"))
    plain = Learner(m2, tok, ALGO, OPTIM, credit=CREDIT, device="cpu", seed=0)
    load_checkpoint(ckpt, m2, plain)
    for a, b in zip(plain.optimizer.state.values(), single.optimizer.state.values()):
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"], atol=1e-7, rtol=1e-4)
    (ckpt / "distcp" / ".metadata").unlink()
    assert missing_state(ckpt) == ["distcp"]
