"""hf engine with a precision of its own (``engine.dtype``, ``HFEngine(dtype=...)``): a cast copy of the learner's
module that samples, refreshed by ``sync_weights``; the learner's module untouched; token JS from the learner's
module; the config's refusals. Tiny random Llama, float32 learner, bfloat16 engine, CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.config.compose import load_config
from agent_rl.engines import HFEngine
from agent_rl.engines.config import engine_kwargs
from agent_rl.learner.config import ModelConfig
from agent_rl.logging import read_metrics
from agent_rl.models import load_policy
from agent_rl.train import main
from tests.engines.test_hf_engine import _full_logprobs, _prompts

torch.set_num_threads(1)


@pytest.fixture()
def tiny():
    return load_policy(ModelConfig(name="tiny"))


def _cast(model, dtype):
    return copy.deepcopy(model).to(dtype).eval()


def test_bfloat16_engine_samples_with_a_cast_copy_and_leaves_the_learner_alone(tiny):
    model, tok = tiny
    model.lm_head.weight.grad = torch.ones_like(model.lm_head.weight)  # a learner mid-step: its gradients stay
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = HFEngine(model, tok, dtype="bfloat16")
    assert engine.model is not model and engine.policy is model
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in engine.model.parameters())
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    assert torch.equal(model.lm_head.weight.grad, torch.ones_like(model.lm_head.weight))
    assert all(p.grad is None for p in engine.model.parameters())
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, before[k].to(v.dtype)), k  # the cast of the learner's weights, bit for bit
    prompts, temps = _prompts(tok, 3), [0.7, 1.0, 1.2]
    gens = engine.generate(prompts, temps, max_new_tokens=8, seed=5)
    ref_model = _cast(model, torch.bfloat16)
    gaps_bf16, gaps_fp32 = [], []
    for p, g, t in zip(prompts, gens, temps):
        lp = torch.tensor(g.logprobs)
        gaps_bf16.append(float((lp - _full_logprobs(ref_model, p, g.token_ids, t)).abs().max()))
        gaps_fp32.append(float((lp - _full_logprobs(model, p, g.token_ids, t)).abs().max()))
    # the log-probs are the bfloat16 policy's (up to bfloat16's batch/cache rounding), not the float32 one's
    assert max(gaps_bf16) < 0.05, gaps_bf16
    assert max(gaps_fp32) > max(gaps_bf16), (gaps_fp32, gaps_bf16)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # generation wrote nothing into the learner's weights
    assert model.training  # its mode is its own


def test_sync_weights_refreshes_the_copy_and_drops_the_caches(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, dtype=torch.bfloat16)
    copy_module = engine.model
    prompt = _prompts(tok, 1)
    engine.generate(prompt, [1.0], max_new_tokens=4, seed=1, episode_ids=["e"])
    assert engine.cached_episodes == ["e"]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # an update
    stale = {k: v.clone() for k, v in engine.model.state_dict().items()}
    assert any(not torch.equal(v, model.state_dict()[k].to(v.dtype)) for k, v in stale.items())
    engine.sync_weights(model, 1)
    assert engine.model is copy_module and engine.cached_episodes == []  # refreshed in place, caches dropped
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, model.state_dict()[k].to(torch.bfloat16)), k
    # another module (other keys or shapes) is copied anew, in the engine's dtype
    other, _ = load_policy(ModelConfig(name="tiny", tiny_hidden_size=32))
    engine.sync_weights(other)
    assert engine.model is not copy_module and engine.policy is other
    assert engine.model.config.hidden_size == 32
    assert all(p.dtype == torch.bfloat16 for p in engine.model.parameters())


def test_token_js_scores_with_the_learners_module(tiny):
    model, tok = tiny
    prompt = _prompts(tok, 1)[0]
    turns = [(prompt, [100, 200, 300])]
    shared = HFEngine(model, tok).token_js(turns, 0.3, 1.2)
    own = HFEngine(model, tok, dtype="bfloat16").token_js(turns, 0.3, 1.2)
    assert own == shared


def test_same_dtype_shares_the_module_and_unknown_dtypes_are_refused(tiny):
    model, tok = tiny
    assert HFEngine(model, tok, dtype="float32").model is model
    assert HFEngine(model, tok).model is model
    with pytest.raises(ValueError, match="dtype='int8'"):
        HFEngine(model, tok, dtype="int8")


def test_auto_behaviour_correction_is_tis_when_the_sampler_rounds():
    from agent_rl.learner.config import AlgoConfig, resolve_behaviour_correction

    assert resolve_behaviour_correction(AlgoConfig(), 0) == "none"
    assert resolve_behaviour_correction(AlgoConfig(), 0, sampler_rounds=True) == "tis"
    assert resolve_behaviour_correction(AlgoConfig(), 1) == "tis"
    assert resolve_behaviour_correction(AlgoConfig(behaviour_correction="none"), 0, sampler_rounds=True) == "none"


def test_config_passes_engine_dtype_and_refuses_what_cannot_work():
    cfg = load_config(["model=tiny", "engine.dtype=bfloat16"])
    assert engine_kwargs(cfg)["dtype"] == "bfloat16"
    assert engine_kwargs(load_config(["model=tiny"]))["dtype"] == "float32"  # "" = model.dtype
    with pytest.raises(ValueError, match="engine.dtype='fp8'"):
        load_config(["model=tiny", "engine.dtype=fp8"])
    with pytest.raises(ValueError, match="engine.sync_check_tol"):
        load_config(["model=tiny", "engine=vllm_server", "engine.dtype=bfloat16"])
    for ok in (["engine.sync_check_tol=0.5"], ["engine.sync_check=false"]):  # past that check (no servers here)
        try:
            load_config(["model=tiny", "engine=vllm_server", "engine.dtype=bfloat16", *ok])
        except ValueError as exc:
            assert "sync_check_tol" not in str(exc), exc


def test_a_run_trains_float32_weights_while_a_bfloat16_engine_samples(tmp_path):
    main(["env=choose_item", "model=tiny", "algo=grpo", "env_server.mode=local", "trainer.total_steps=2",
          "trainer.tasks_per_step=4", "rollout.max_turns=1", "engine.max_new_tokens=4", "trainer.save_every=1000",
          "trainer.progress=false", "trainer.loggers=[jsonl]", "engine.num_threads=1", "engine.dtype=bfloat16",
          f"trainer.output_dir={tmp_path}"])
    rows = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert len(rows) == 2
    # the sampler is the rounded policy: algo.behaviour_correction=auto weights the loss by TIS (Yao et al. 2025)
    assert all(0 < r["async/behaviour_weight_mean"] <= 2.0 for r in rows), rows
    # the learner's float32 log-probs against the bfloat16 engine's: a gap, finite and small (rounding, not a bug)
    gaps = [r["actor/engine_logprob_diff"] for r in rows if "actor/engine_logprob_diff" in r]
    assert gaps and all(0 < g < 0.1 for g in gaps), gaps


def test_asynchronous_rollouts_use_the_engines_copy_as_their_separate_weights(tmp_path):
    """``trainer.max_staleness=1``: the hf engine must sample with weights the update does not touch. With a dtype
    of its own its cast copy is those weights, so the backend makes no second float32 copy; the run trains."""
    from agent_rl.local import LocalBackend
    from agent_rl.progress import Progress

    args = ["env=choose_item", "model=tiny", "algo=grpo", "env_server.mode=local", "trainer.max_staleness=1",
            "trainer.total_steps=2", "trainer.tasks_per_step=2", "trainer.progress=false",
            "trainer.loggers=[jsonl]", "engine.dtype=bfloat16", f"trainer.output_dir={tmp_path}"]
    backend = LocalBackend(load_config(args), tmp_path, Progress(enabled=False))
    assert backend.learner.behaviour_correction == "tis"
    engine = backend.engine.engine  # inside the VersionedEngine
    assert backend.engine_model is None and engine.policy is backend.model and engine.model is not backend.model
    assert all(p.dtype == torch.bfloat16 for p in engine.model.parameters())
    backend.learner.optimizer.zero_grad()
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(0.01)
    backend.load_engine(1)  # the update's weights reach the copy under the versioned engine's lock
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, backend.model.state_dict()[k].to(torch.bfloat16)), k
    main(args)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == [1, 2]
