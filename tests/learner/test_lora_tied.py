"""LoRA merges are exact on every path weights leave the learner by (peft #2018): the learner's peft model, the Ray
rollout worker's copy (``merged_state_dict`` on CPU loaded into a plain model), FSDP's gathered merge
(``merge_lora_state_dict``), the checkpoint folder (``save_policy`` -> ``from_pretrained``), ``python -m
agent_rl.export`` (peft's ``merge_and_unload``) and the tensors the vLLM sync hands over (``state_for_vllm``,
tied head left out as vLLM ties it itself). Over target sets on a tied-embedding tiny Llama (SmolLM2's and Qwen2.5
0.5B/1.5B's layout) and an untied one; a set that adapts a tied weight (``lm_head`` of a tied model) is refused at
load with the reason. Built locally, no hub downloads."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

peft = pytest.importorskip("peft")

from agent_rl.config.compose import load_config  # noqa: E402
from agent_rl.config.schema import ConfigError  # noqa: E402
from agent_rl.learner.config import LORA_DEFAULT_TARGETS, LoRAConfig, ModelConfig  # noqa: E402
from agent_rl.lora import apply_lora, check_targets, merge_lora_state_dict, merged_state_dict, save_policy  # noqa: E402

#: largest |logit| difference accepted between the learner's model and a merged copy (float32 rounding of
#: W + s B A against W x + s B A x; measured ~1e-6 on these models).
EXACT = 1e-4


def _tiny(tok, *, tied: bool, seed: int = 0):
    """A 2-layer random Llama on the tiny tokenizer, embeddings tied or not (``tie_word_embeddings``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=tied, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def _adapted(model, targets, seed=0):
    """``model`` with a rank-4 adapter on ``targets`` whose B is random (peft's zeros would hide a wrong merge)."""
    torch.manual_seed(seed)
    pm = apply_lora(model, LoRAConfig(rank=4, alpha=8.0, target_modules=list(targets)))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return pm.eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _plain(like, state, strict=True):
    """A fresh plain model of ``like``'s config with ``state`` loaded (what a Ray rollout worker does)."""
    fresh = type(like)(copy.deepcopy(like.config)).eval()
    fresh.load_state_dict(state, strict=strict)
    return fresh


SETS = [  # (tied embeddings, target modules)
    (True, ["q_proj", "v_proj"]),
    (True, LORA_DEFAULT_TARGETS),
    (False, ["q_proj", "v_proj"]),
    (False, [*LORA_DEFAULT_TARGETS, "lm_head"]),
    (False, ["lm_head"]),
]


@pytest.mark.parametrize("tied,targets", SETS, ids=[f"{'tied' if t else 'untied'}-{'+'.join(s)}" for t, s in SETS])
def test_every_copy_of_the_merged_weights_gives_the_learners_logits(tiny_base, tmp_path, tied, targets):
    from transformers import AutoModelForCausalLM

    from agent_rl.engines.vllm import state_for_vllm
    from agent_rl.export import export_checkpoint

    tok = tiny_base[1]
    base = _tiny(tok, tied=tied)
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    pm = _adapted(copy.deepcopy(base), targets)
    inner = pm.get_base_model()
    ids = torch.randint(5, len(tok), (2, 12), generator=torch.Generator().manual_seed(3))
    want = _logits(pm, ids)
    assert (want - _logits(base, ids)).abs().max() > 1e-2  # the adapter changes the policy
    copies = {}
    # the Ray rollout worker: TrainerRank.get_weights (CPU copies of merged_state_dict) -> load_state_dict
    copies["ray_worker"] = _plain(inner, {k: v.detach().to("cpu", copy=True) for k, v in merged_state_dict(pm).items()})
    # FSDP rank 0's gathered full state under the peft model's names, merged
    gathered = {k: v.detach().clone() for k, v in pm.state_dict().items()}
    copies["fsdp_gathered"] = _plain(inner, merge_lora_state_dict(gathered, pm))
    # the checkpoint's plain HF folder
    save_policy(pm, tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    copies["checkpoint"] = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    # python -m agent_rl.export (peft's merge_and_unload onto the rebuilt base)
    model_cfg = dataclasses.asdict(ModelConfig(name="tiny", path=str(base_dir), dtype="float32"))
    (tmp_path / "ckpt" / "extra.json").write_text(json.dumps({"step": 1, "config": {"model": model_cfg}}))
    copies["export"] = AutoModelForCausalLM.from_pretrained(export_checkpoint(tmp_path / "ckpt", tmp_path / "out"))
    # the vLLM sync's tensors (a tied head is left out: vLLM ties it to the embedding itself, as a plain tied model)
    vllm_state = state_for_vllm(pm, torch.float32)
    assert ("lm_head.weight" in vllm_state) == (not tied)
    copies["vllm_sync"] = _plain(inner, vllm_state, strict=not tied)
    if tied:  # vLLM's CPU build gets the tied model untied (tie_word_embeddings=false, lm_head.weight a copy)
        untied = copy.deepcopy(inner.config)
        untied.tie_word_embeddings = False
        cpu_vllm = type(inner)(untied).eval()
        cpu_vllm.load_state_dict(state_for_vllm(pm, torch.float32, untie=True), strict=True)
        gap = float((_logits(cpu_vllm, ids) - want).abs().max())
        assert gap < EXACT, gap
    gaps = {name: float((_logits(m, ids) - want).abs().max()) for name, m in copies.items()}
    assert all(g < EXACT for g in gaps.values()), gaps
    for name, m in copies.items():  # a tied model stays tied (one matrix): nothing moved the embedding apart
        if tied:
            assert m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr(), name
            torch.testing.assert_close(m.get_input_embeddings().weight, base.get_input_embeddings().weight,
                                       atol=0, rtol=0)


def test_a_target_tied_to_another_weight_is_refused_with_the_reason(tiny_base):
    """peft #2018: ``lm_head`` adapted on a tied model merges W + s B A into the one matrix the embedding shares, so
    a plain model loaded with it moves the embedding (logits off by 5.5 on SmolLM2). Refused by name, with why."""
    tok = tiny_base[1]
    for targets in (["lm_head"], [*LORA_DEFAULT_TARGETS, "lm_head"]):
        with pytest.raises(ValueError, match=r"lm_head.*tied.*embed_tokens.*tie_word_embeddings"):
            check_targets(_tiny(tok, tied=True), targets)
        with pytest.raises(ValueError, match=r"lm_head.*tied"):
            apply_lora(_tiny(tok, tied=True), LoRAConfig(rank=4, target_modules=targets))
    check_targets(_tiny(tok, tied=False), ["lm_head"])  # untied: an ordinary linear layer


def test_run_policy_refuses_a_tied_head_at_load(tiny_base, tmp_path):
    """Config load (``load_run_policy``: learners and rollout workers alike) refuses the tied target set."""
    from agent_rl.progress import Progress
    from agent_rl.runtime import load_run_policy

    tok = tiny_base[1]
    _tiny(tok, tied=True).save_pretrained(tmp_path / "tied")
    tok.save_pretrained(tmp_path / "tied")
    for train in (True, False):
        cfg = load_config([f"model.path={tmp_path / 'tied'}", "model.lora.rank=4",
                           "model.lora.target_modules=[q_proj,lm_head]", f"trainer.output_dir={tmp_path}"])
        with pytest.raises(ConfigError, match=r"lm_head.*tied"):
            load_run_policy(cfg, Progress(enabled=False), train=train)
