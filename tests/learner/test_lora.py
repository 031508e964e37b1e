"""LoRA (``model.lora.*``, ``agent_rl.lora``) through the real peft library on the tiny random Llama (CPU): frozen
base, adapter-only optimizer, the merged weights, the adapter-disabled KL reference, one GRPO step against a
hand-rolled LoRA + AdamW step, checkpoints (``step_N/adapter/``, resume) and ``python -m agent_rl.export``."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft")

from agent_rl.config.compose import load_config  # noqa: E402

from agent_rl.config.schema import ConfigError  # noqa: E402
from agent_rl.learner import AlgoConfig, Learner, OptimConfig  # noqa: E402
from agent_rl.learner.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from agent_rl.learner.config import LORA_DEFAULT_TARGETS, LoRAConfig, ModelConfig  # noqa: E402
from agent_rl.lora import (apply_lora, base_module, check_targets, is_lora, linear_module_names,  # noqa: E402
                           merged_state_dict)
from agent_rl.types import Generation  # noqa: E402
from learner_helpers import build_batch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RANK, ALPHA = 4, 8.0
SCALE = ALPHA / RANK


def _lora(tiny, *, seed: int = 0, random_b: bool = True, targets=LORA_DEFAULT_TARGETS):
    """The tiny model wrapped with a rank-4 adapter; ``random_b``: B drawn N(0, 0.02) instead of peft's zeros, so
    the adapter changes the outputs (a merge or a disabled adapter that went wrong would show)."""
    model, tok = tiny
    torch.manual_seed(seed)
    pm = apply_lora(model, LoRAConfig(rank=RANK, alpha=ALPHA, target_modules=list(targets)))
    if random_b:
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return pm, tok


def _batch(tok, rewards=(1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0), group_size=4, resp_len=6, seed=0):
    """Single-turn GRPO batch: episode i in group i // group_size, random prompt / response ids, T = 1."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i, r in enumerate(rewards):
        prompt = torch.randint(5, 200, (3 + i % 3,), generator=gen).tolist()
        resp = torch.randint(5, 200, (resp_len - i % 2,), generator=gen).tolist()
        rows.append(dict(prompt=prompt, gen=Generation(resp, [0.0] * len(resp), "", "length"), temperature=1.0,
                         group=i // group_size, episode=i, is_high=False, turn=0, num_turns=1, reward=r))
    return build_batch(rows, tok.pad_token_id)


def _grpo(**kw) -> AlgoConfig:
    return AlgoConfig(name="grpo", adv_estimator="grpo", group_size=4, micro_batch_size=3, **kw)


def _named(model, pred):
    return {n: p.detach().clone() for n, p in model.named_parameters() if pred(n)}


# ---------------------------------------------------------------------------------------------- config
def test_lora_config_refusals():
    with pytest.raises(ValueError, match="rank=-1"):
        LoRAConfig(rank=-1)
    with pytest.raises(ValueError, match="alpha"):
        LoRAConfig(rank=8, alpha=0)
    with pytest.raises(ValueError, match="dropout"):
        LoRAConfig(rank=8, dropout=1.0)
    with pytest.raises(ValueError, match="non-empty"):
        LoRAConfig(rank=8, target_modules=[])
    with pytest.raises(ConfigError, match="model.lora.rank=-2"):
        load_config(["model=tiny", "model.lora.rank=-2"])
    cfg = load_config(["model=tiny", "model.lora.rank=8"])
    assert cfg.model.lora.rank == 8 and cfg.model.lora.target_modules == list(LORA_DEFAULT_TARGETS)
    # optim.lora_lr = 0: 10 x optim.lr (the presets' 1e-6 -> 1e-5); set: itself (model=tiny's preset: 3e-3)
    assert OptimConfig(lr=1e-6).for_lora().lr == pytest.approx(1e-5)
    assert OptimConfig(lr=1e-6, lora_lr=2e-5).for_lora().lr == 2e-5
    assert cfg.optim.lora_lr == 3e-3 and cfg.optim.for_lora().lr == 3e-3
    assert load_config(["model=smollm2", "model.lora.rank=8"], check=False).optim.for_lora().lr == pytest.approx(1e-5)
    with pytest.raises(ValueError, match="lora_lr"):
        OptimConfig(lora_lr=-1.0)


def test_default_targets_are_the_tiny_models_modules(tiny):
    """model=tiny (a Llama) has every default target; lm_head is the only linear module left out."""
    names = linear_module_names(tiny[0])
    assert set(LORA_DEFAULT_TARGETS) <= set(names)
    assert set(names) - set(LORA_DEFAULT_TARGETS) == {"lm_head"}


def test_unknown_target_modules_are_refused_with_the_available_ones(tiny):
    with pytest.raises(ValueError, match=r"\['qkv_proj'\].*q_proj"):
        check_targets(tiny[0], ["q_proj", "qkv_proj"])
    with pytest.raises(ValueError, match="qkv_proj"):
        apply_lora(tiny[0], LoRAConfig(rank=2, target_modules=["qkv_proj"]))


def test_run_policy_refuses_unknown_targets_at_load(tmp_path):
    from agent_rl.progress import Progress
    from agent_rl.runtime import load_run_policy

    cfg = load_config(["model=tiny", "model.lora.rank=4", "model.lora.target_modules=[c_attn]",
                       f"trainer.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"c_attn.*linear modules are .*'down_proj'"):
        load_run_policy(cfg, Progress(enabled=False), train=True)


# ---------------------------------------------------------------------------------------------- training
def test_lora_base_weights_frozen(tiny):
    """After an update the base weights are bit-for-bit unchanged, every adapter matrix has moved, and the optimizer
    holds exactly the adapter's parameters."""
    pm, tok = _lora(tiny)
    learner = Learner(pm, tok, _grpo(), OptimConfig(lr=1e-3, weight_decay=0.0))
    adapter_ids = {id(p) for n, p in pm.named_parameters() if "lora_" in n}
    opt_ids = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert opt_ids == adapter_ids and len(adapter_ids) == 2 * 7 * 2  # A and B, 7 targets, 2 layers
    assert learner.lr == pytest.approx(1e-2)  # optim.lora_lr = 0: 10 x optim.lr
    base0, lora0 = _named(pm, lambda n: "lora_" not in n), _named(pm, lambda n: "lora_" in n)
    learner.update(_batch(tok), step=1, total_steps=1)
    base1, lora1 = _named(pm, lambda n: "lora_" not in n), _named(pm, lambda n: "lora_" in n)
    assert base0.keys() == base1.keys() and all(torch.equal(base0[k], base1[k]) for k in base0)
    moved = [k for k in lora0 if not torch.equal(lora0[k], lora1[k])]
    assert sorted(moved) == sorted(lora0)


def test_merged_model_logprobs_equal_the_peft_models(tiny):
    """The plain Llama loaded with ``merged_state_dict`` (W + s B A) gives the peft model's log-probs; the merge is
    not a no-op (the base model's differ)."""
    pm, tok = _lora(tiny)
    inner = base_module(pm)
    plain = type(inner)(inner.config)  # a fresh plain Llama, then every merged weight (strict)
    plain.load_state_dict(merged_state_dict(pm), strict=True)
    batch = _batch(tok)
    rm = batch.response_mask.bool()
    learner = Learner(pm, tok, _grpo(), OptimConfig())
    lp_peft = learner.evaluate(batch).logprobs
    lp_merged = Learner(plain, tok, _grpo(), OptimConfig()).evaluate(batch).logprobs
    torch.testing.assert_close(lp_merged[rm], lp_peft[rm], atol=1e-5, rtol=0)
    with pm.disable_adapter():
        lp_base = learner.evaluate(batch).logprobs
    assert (lp_base[rm] - lp_peft[rm]).abs().max() > 1e-3
    # the merged names are the plain model's and the layers the adapter touched differ from the base
    merged = merged_state_dict(pm)
    assert set(merged) == set(plain.state_dict())
    q = "model.layers.0.self_attn.q_proj.weight"
    layer = base_module(pm).model.layers[0].self_attn.q_proj
    want = layer.base_layer.weight + SCALE * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    torch.testing.assert_close(merged[q], want, atol=1e-6, rtol=0)


def test_merge_of_a_gathered_state_dict_equals_peft_merge(tiny):
    """``merge_lora_state_dict`` (for a full state gathered from shards, under the peft model's own names) gives
    what peft's own merge gives (``merged_state_dict``), and passes a state without LoRA entries through."""
    from agent_rl.lora import merge_lora_state_dict

    pm, _ = _lora(tiny)
    gathered = {k: v.detach().clone() for k, v in pm.state_dict().items()}
    assert any(k.startswith("base_model.model.") and ".lora_A." in k for k in gathered)
    got, want = merge_lora_state_dict(gathered, pm), merged_state_dict(pm)
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=0, msg=k)
    plain = {k: v for k, v in want.items()}
    assert merge_lora_state_dict(plain, pm) is plain


def test_save_adapter_writes_what_peft_saves_and_peft_loads_it(tiny, tmp_path):
    """``save_adapter`` of the transformers model inside a peft model (what the engines hold) writes peft's own
    layout: the same keys and tensors as ``PeftModel.save_pretrained``, a config peft reads back, and
    ``PeftModel.from_pretrained`` on a fresh base gives the adapted policy's logits; ``base_state_dict`` is the
    plain model's names with W alone (the adapted layers' weights are the base's, not merged)."""
    from safetensors.torch import load_file

    from agent_rl.lora import adapter_config, base_state_dict, save_adapter

    pm, tok = _lora(tiny)
    inner = base_module(pm)
    plain = type(inner)(inner.config)
    assert adapter_config(inner).r == RANK and adapter_config(pm).r == RANK and adapter_config(plain) is None
    size = save_adapter(inner, tmp_path / "ours")
    pm.save_pretrained(str(tmp_path / "peft"), safe_serialization=True)
    ours = load_file(str(tmp_path / "ours" / "adapter_model.safetensors"))
    theirs = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    assert ours.keys() == theirs.keys() and len(ours) == 2 * 7 * inner.config.num_hidden_layers
    assert all(k.startswith("base_model.model.") and (".lora_A.weight" in k or ".lora_B.weight" in k) for k in ours)
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], atol=0, rtol=0, msg=k)
    assert size == (tmp_path / "ours" / "adapter_model.safetensors").stat().st_size
    saved = json.loads((tmp_path / "ours" / "adapter_config.json").read_text())
    assert saved["r"] == RANK and saved["lora_alpha"] == ALPHA and set(saved["target_modules"]) == set(
        LORA_DEFAULT_TARGETS)
    fresh = type(inner)(inner.config)
    fresh.load_state_dict(base_state_dict(pm), strict=True)
    q = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(base_state_dict(pm)[q], inner.model.layers[0].self_attn.q_proj.base_layer.weight)
    loaded = peft.PeftModel.from_pretrained(fresh, str(tmp_path / "ours")).eval()
    x = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, pm.eval()(x).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no LoRA adapter"):
        save_adapter(plain, tmp_path / "none")


def test_kl_reference_is_the_adapter_disabled_model(tiny):
    """kl_coef > 0 with LoRA: no second copy; the reference log-probs are the base model's, so the KL is 0 before
    the first update (peft's B = 0 init), and the policy moves away from the reference after it."""
    base_copy = copy.deepcopy(tiny[0])
    pm, tok = _lora(tiny, random_b=False)
    learner = Learner(pm, tok, _grpo(kl_coef=0.5), OptimConfig(lr=1e-3, weight_decay=0.0))
    assert learner.ref_model is None and learner.ref_is_base
    batch = _batch(tok)
    rm = batch.response_mask.bool()
    old = learner.evaluate(batch)
    torch.testing.assert_close(old.ref_logprobs[rm], old.logprobs[rm], atol=0, rtol=0)
    m = learner.update(batch, step=1, total_steps=2)
    assert m["actor/kl_ref"] == pytest.approx(0.0, abs=1e-7)
    after = learner.evaluate(batch)
    base_lp = Learner(base_copy, tok, _grpo(), OptimConfig()).evaluate(batch).logprobs
    torch.testing.assert_close(after.ref_logprobs[rm], base_lp[rm], atol=1e-6, rtol=0)
    assert (after.logprobs[rm] - after.ref_logprobs[rm]).abs().max() > 1e-4
    m2 = learner.update(batch, step=2, total_steps=2)
    assert m2["actor/kl_ref"] > 0


def _hand_rolled_lora_step(base, batch, A0, B0, *, lr, betas, eps, wd, max_norm):
    """One GRPO step (ppo_clip, token_mean, one mini-batch, one epoch) of a LoRA written out here: every target
    Linear computes ``x W^T + s (x A^T) B^T`` with W frozen, then grad clip and AdamW (Loshchilov & Hutter) by
    hand. Returns the updated ``{module path: (A, B)}``."""
    model = copy.deepcopy(base).requires_grad_(False)
    A = {k: a.clone().requires_grad_(True) for k, a in A0.items()}
    B = {k: b.clone().requires_grad_(True) for k, b in B0.items()}
    mods = dict(model.named_modules())
    for path in A:
        lin = mods[path]
        lin.forward = (lambda x, lin=lin, a=A[path], b=B[path]:
                       torch.nn.functional.linear(x, lin.weight) + SCALE * ((x @ a.T) @ b.T))
    # GRPO advantages: (R - mean_g) / (sample std_g + 1e-6), each episode's rows
    R, g = batch.episode_rewards.double(), batch.episode_group_index
    adv_ep = torch.zeros_like(R)
    for gi in g.unique():
        sel = g == gi
        adv_ep[sel] = (R[sel] - R[sel].mean()) / (R[sel].std(unbiased=True) + 1e-6)
    adv = adv_ep.float()[batch.episode_index]  # (B,)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, L, V)
    logp_all = torch.log_softmax(logits[:, :-1] / batch.temperature[:, None, None], -1)
    logp = logp_all.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, L-1): token c predicted at c-1
    mask = batch.response_mask[:, 1:]
    ratio = torch.exp(logp - logp.detach())  # one step on the sampling policy: ratio 1, its gradient grad logp
    loss = -(adv[:, None] * ratio * mask).sum() / mask.sum()
    params = [t for k in A for t in (A[k], B[k])]
    grads = torch.autograd.grad(loss, params)
    norm = torch.sqrt(sum((gr ** 2).sum() for gr in grads))
    coef = min(1.0, max_norm / (float(norm) + 1e-6))
    out = []
    for p, gr in zip(params, grads):
        gr = gr * coef
        m = (1 - betas[0]) * gr  # first AdamW step from zero moments
        v = (1 - betas[1]) * gr * gr
        m_hat, v_hat = m / (1 - betas[0]), v / (1 - betas[1])
        out.append(p.detach() * (1 - lr * wd) - lr * m_hat / (v_hat.sqrt() + eps))
    return {k: (out[2 * i], out[2 * i + 1]) for i, k in enumerate(A)}


def test_lora_grpo_step_matches_a_hand_rolled_lora_step(tiny):
    """Learner.update on the peft model == the hand-rolled LoRA GRPO + AdamW step (same A0, B0, batch, lr =
    optim.lora_lr) on every adapter matrix, within 1e-5 (the step moves them by ~lr = 1e-2)."""
    base = copy.deepcopy(tiny[0])
    pm, tok = _lora(tiny)
    inner = base_module(pm)
    layers = {n: m for n, m in inner.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    A0 = {n: m.lora_A["default"].weight.detach().clone() for n, m in layers.items()}
    B0 = {n: m.lora_B["default"].weight.detach().clone() for n, m in layers.items()}
    optim = OptimConfig(lr=1e-4, lora_lr=1e-2, weight_decay=0.01, max_grad_norm=1.0)
    learner = Learner(pm, tok, _grpo(), optim)
    batch = _batch(tok)
    learner.update(batch, step=1, total_steps=1)
    want = _hand_rolled_lora_step(base, batch, A0, B0, lr=1e-2, betas=optim.betas, eps=optim.eps, wd=0.01,
                                  max_norm=1.0)
    assert len(want) == 14
    worst = 0.0
    for n, m in layers.items():
        a, b = m.lora_A["default"].weight.detach(), m.lora_B["default"].weight.detach()
        torch.testing.assert_close(a, want[n][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(b, want[n][1], atol=1e-5, rtol=0)
        worst = max(worst, float((b - B0[n]).abs().max()))
    assert worst > 5e-3  # the step did move B by about lr


def test_behaviour_cloning_trains_the_adapter_only(tiny):
    """agent_rl.sft's cloner on a LoRA model: adapter-only AdamW at optim.lora_lr, base unchanged, loss down."""
    from agent_rl.sft import BehaviourCloner

    pm, tok = _lora(tiny)
    cloner = BehaviourCloner(pm, OptimConfig(lr=1e-3, weight_decay=0.0), micro_batch_size=4)
    assert cloner.lr == pytest.approx(1e-2)
    assert {id(p) for p in cloner.params} == {id(p) for n, p in pm.named_parameters() if "lora_" in n}
    batch = _batch(tok)
    base0 = _named(pm, lambda n: "lora_" not in n)
    before = cloner.evaluate(batch)["loss"]
    for _ in range(5):
        cloner.train_step(batch, torch.arange(batch.num_rows))
    assert cloner.evaluate(batch)["loss"] < before
    base1 = _named(pm, lambda n: "lora_" not in n)
    assert all(torch.equal(base0[k], base1[k]) for k in base0)


# ---------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_holds_the_adapter_and_merged_weights_and_resume_restores_them(tiny, tiny_base, tmp_path):
    pm, tok = _lora(tiny)
    learner = Learner(pm, tok, _grpo(), OptimConfig(lr=1e-3))
    batch = _batch(tok)
    learner.update(batch, step=1, total_steps=3)
    ckpt = save_checkpoint(tmp_path / "checkpoints" / "step_1", pm, tok, learner, {"step": 1})
    adapter = ckpt / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "adapter_config.json").is_file()
    saved_cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert saved_cfg["r"] == RANK and saved_cfg["lora_alpha"] == ALPHA
    assert sorted(saved_cfg["target_modules"]) == sorted(LORA_DEFAULT_TARGETS)
    # the folder is a plain transformers model of the merged weights
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(ckpt)
    merged = merged_state_dict(pm)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(v, merged[k], atol=0, rtol=0)
    # resume into a fresh LoRA model (another adapter init): adapter and AdamW moments restored
    pm2, _ = _lora((copy.deepcopy(tiny_base[0]), tok), seed=7)
    learner2 = Learner(pm2, tok, _grpo(), OptimConfig(lr=1e-3))
    load_checkpoint(ckpt, pm2, learner2)
    a1, a2 = _named(pm, lambda n: "lora_" in n), _named(pm2, lambda n: "lora_" in n)
    assert a1.keys() == a2.keys() and all(torch.equal(a1[k], a2[k]) for k in a1)
    st1, st2 = learner.optimizer.state_dict()["state"], learner2.optimizer.state_dict()["state"]
    assert st1.keys() == st2.keys() and all(torch.equal(st1[i]["exp_avg"], st2[i]["exp_avg"]) for i in st1)
    # both continue identically
    m1 = learner.update(batch, step=2, total_steps=3)
    m2 = learner2.update(batch, step=2, total_steps=3)
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], abs=1e-7)
    a1, a2 = _named(pm, lambda n: "lora_" in n), _named(pm2, lambda n: "lora_" in n)
    assert all(torch.allclose(a1[k], a2[k], atol=1e-7, rtol=0) for k in a1)


def test_checkpoint_refusals(tiny, tiny_base, tmp_path):
    """A LoRA model refuses a checkpoint without an adapter, and an adapter of another rank."""
    plain, tok = copy.deepcopy(tiny_base[0]), tiny_base[1]
    ckpt = save_checkpoint(tmp_path / "plain", plain, tok, None, {"step": 1})
    pm, _ = _lora(tiny)
    with pytest.raises(FileNotFoundError, match="no LoRA adapter"):
        load_checkpoint(ckpt, pm, restore_rng=False)
    lora_ckpt = save_checkpoint(tmp_path / "lora", pm, tok, None, {"step": 1})
    torch.manual_seed(0)
    other = apply_lora(copy.deepcopy(tiny_base[0]), LoRAConfig(rank=2, alpha=ALPHA))
    with pytest.raises(ValueError, match="r: saved 4, this run 2"):
        load_checkpoint(lora_ckpt, other, restore_rng=False)


# ---------------------------------------------------------------------------------------------- export
def test_export_writes_a_merged_folder_with_the_trained_logprobs(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    from agent_rl.export import export_checkpoint

    pm, tok = _lora(tiny)
    learner = Learner(pm, tok, _grpo(), OptimConfig(lr=1e-3))
    batch = _batch(tok)
    learner.update(batch, step=1, total_steps=1)
    extra = {"step": 1, "config": {"model": dataclasses.asdict(ModelConfig(name="tiny"))}}  # as the trainer's
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints" / "step_1", pm, tok, learner, extra)
    out = export_checkpoint(ckpt, tmp_path / "export")
    assert not (out / "adapter").exists() and not (out / "learner.pt").exists()
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert not is_lora(exported)
    rm = batch.response_mask.bool()
    want = learner.evaluate(batch).logprobs
    got = Learner(exported, tok, _grpo(), OptimConfig()).evaluate(batch).logprobs
    torch.testing.assert_close(got[rm], want[rm], atol=1e-5, rtol=0)
    # the export is base + adapter merged from the adapter itself (not a copy of the folder's merged weights)
    sd = exported.state_dict()
    merged = merged_state_dict(pm)
    assert all(torch.allclose(sd[k], merged[k], atol=1e-6, rtol=0) for k in merged)


def test_export_of_a_plain_checkpoint_and_refusals(tiny_base, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.export import export_checkpoint

    model, tok = copy.deepcopy(tiny_base[0]), tiny_base[1]
    ckpt = save_checkpoint(tmp_path / "step_3", model, tok, None, {"step": 3})
    out = export_checkpoint(ckpt, tmp_path / "plain_export")
    sd = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
    assert AutoTokenizer.from_pretrained(out).encode("hello") == tok.encode("hello")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        export_checkpoint(tmp_path / "missing", tmp_path / "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        export_checkpoint(tmp_path / "empty", tmp_path / "y")
    with pytest.raises(FileExistsError):
        export_checkpoint(ckpt, out)
    # the CLI: exit code 2 and the reason on stderr
    proc = subprocess.run([sys.executable, "-m", "agent_rl.export", str(tmp_path / "missing"), str(tmp_path / "z")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no checkpoint" in proc.stderr


# ---------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_train_with_lora_end_to_end(tmp_path):
    """The acceptance command: 2 training rows, ``checkpoints/step_2/adapter/``, a merged folder that loads."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agent_rl.train", "env=choose_item", "model=tiny", "algo=grpo",
           "env_server.mode=local", "model.lora.rank=8", "trainer.total_steps=2", "trainer.tasks_per_step=2",
           f"trainer.output_dir={out}", "trainer.progress=false"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("kind") == "train"]
    assert len(train) == 2
    assert train[0]["actor/lr"] == pytest.approx(3e-3)  # model=tiny's optim.lora_lr
    step2 = out / "checkpoints" / "step_2"
    assert (step2 / "adapter" / "adapter_model.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    assert not any(".lora_" in k or "base_layer" in k
                   for k in AutoModelForCausalLM.from_pretrained(step2).state_dict())
    assert math.isfinite(train[-1]["actor/pg_loss"])
