"""LoRA (Hu et al. 2021, arXiv:2106.09685) on a frozen base policy, with Hugging Face ``peft``.

``model.lora.rank > 0`` (:class:`agent_rl.learner.config.LoRAConfig`) wraps the policy the learner trains with
``peft.get_peft_model``: every target ``nn.Linear`` W (d_out, d_in) becomes ``y = W x + (alpha / r) B A x`` with
A (r, d_in) (peft's default init: Kaiming-uniform) and B (d_out, r) (zeros, so the wrapped model starts equal to the
base), W frozen. Only A and B require grad, so the learner's optimizer holds only them.

What each part of the project sees:

- the learner: the peft model (``policy_trunk`` unwraps it; its reference policy for the KL term is the same model
  under ``disable_adapter()``: no second copy);
- the engines: :func:`base_module` (the transformers model inside, whose target layers compute W x + s B A x live:
  the hf engine generates with it as it is) or, when weights are copied out (vLLM's sync, the Ray rollout workers,
  the checkpoint's HF folder), :func:`merged_state_dict`: plain transformers names with W + s B A merged in;
- a vLLM server that applies the adapter itself (``engine.lora_sync=adapter``): :func:`base_state_dict` (W alone)
  once at its start, then :func:`save_adapter` (the adapter in peft's layout) at every sync;
- checkpoints: ``step_N/adapter/`` as peft saves it (``adapter_config.json`` + ``adapter_model.safetensors``) next to
  the merged HF folder (:func:`save_policy`), so ``model.path=.../step_N`` loads a plain model.

``peft`` is imported only when LoRA is on (the ``train`` extra installs it); :func:`is_lora` never imports it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: the adapter's name inside the peft model (peft's default).
ADAPTER_NAME = "default"
#: sub-folder of a checkpoint that holds the adapter (peft's ``save_pretrained`` layout).
ADAPTER_DIR = "adapter"


def is_lora(model: Any) -> bool:
    """True when ``model`` is a peft model (``peft.PeftModel``). Never imports peft: a model cannot be one unless
    peft was imported."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def base_module(model: nn.Module) -> nn.Module:
    """The transformers model of ``model``: for a peft model the wrapped causal LM (``get_base_model()``), whose
    target layers carry the adapter (its forward is the adapted policy's); any other model is returned as it is."""
    return model.get_base_model() if is_lora(model) else model


def linear_module_names(model: nn.Module) -> list[str]:
    """Sorted leaf names (the last dotted component) of the ``nn.Linear`` modules of ``model``: the names
    ``model.lora.target_modules`` may use (peft matches a plain name against the end of each module's path)."""
    return sorted({name.rsplit(".", 1)[-1] for name, mod in base_module(model).named_modules()
                   if isinstance(mod, nn.Linear) and name})


def check_targets(model: nn.Module, target_modules: list[str] | tuple[str, ...]) -> None:
    """Refuse LoRA target modules that ``model`` does not have.

    Raises:
        ValueError: a name of ``target_modules`` matches no ``nn.Linear`` of ``model`` (the message names the
            missing ones and the available ones, :func:`linear_module_names`); or one adapts a weight tied to another
            parameter (``lm_head`` of a tied-embedding model: :func:`tied_targets` says why it is refused).
    """
    available = linear_module_names(model)
    missing = [t for t in target_modules if t not in available]
    name = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if missing:
        raise ValueError(f"model.lora.target_modules {missing} are not modules of this model ({name}); its linear "
                         f"modules are {available} (lm_head is the output projection, usually not adapted)")
    tied = tied_targets(model, target_modules)
    if tied:
        pairs = "; ".join(f"{path} (its weight is tied to {', '.join(others)})" for path, others in tied.items())
        raise ValueError(
            f"model.lora.target_modules adapts {pairs} in this model ({name}, tie_word_embeddings=True): a merged W + (alpha / r) B A cannot be written into the one shared matrix "
            "without moving the embedding too (peft #2018), so the rollout workers, vLLM and the checkpoint would "
            "not play the policy the learner trains. Leave those modules out of model.lora.target_modules")


def tied_targets(model: nn.Module, target_modules: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """``{module path: [other parameter names of the same tensor]}`` for the ``nn.Linear`` modules of ``model`` that
    ``target_modules`` adapts (leaf name match, as peft's) and whose weight is shared with another parameter: on a
    ``tie_word_embeddings=True`` model (SmolLM2, Qwen2.5 0.5B/1.5B) ``lm_head.weight`` is ``model.embed_tokens.weight``.

    Why such targets are refused rather than merged (:func:`check_targets`): a tied model stores one matrix for the
    input embedding E and the output head, so the adapted policy (head E + s B A, embedding E) has no tied
    representation. ``merged_state_dict`` would give two entries for one tensor and ``load_state_dict`` keeps
    whichever comes last (the embedding moves by s B A: logits off by 5.5 on SmolLM2, 1.4 on the tests' tiny tied
    Llama); vLLM's tied architectures skip ``lm_head.weight`` on load (the adapter is lost); peft's own
    ``merge_and_unload`` unties the model and flips ``config.tie_word_embeddings`` (a different architecture with a
    vocab x hidden matrix more). peft's ``LoraConfig(ensure_weight_tying=True)`` (installed 0.21's
    ``BaseTuner._check_tied_modules``) ties adapters only when the embedding itself is adapted (``embed_tokens`` in
    targets, not a linear module here) or for ``modules_to_save``, so it does not cover a head-only LoRA either.
    Untied models (``tie_word_embeddings=False``) may adapt ``lm_head``: it is an ordinary linear layer there."""
    inner = base_module(model)
    names_of: dict[int, list[str]] = {}
    for pname, p in inner.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(pname)
    wanted = set(target_modules)
    out: dict[str, list[str]] = {}
    for path, mod in inner.named_modules():
        if not (isinstance(mod, nn.Linear) and path and path.rsplit(".", 1)[-1] in wanted):
            continue
        others = [n for n in names_of.get(id(mod.weight), []) if n != f"{path}.weight"]
        if others:
            out[path] = others
    return out


def apply_lora(model: nn.Module, lora: Any) -> nn.Module:
    """Wrap ``model`` with a LoRA adapter (``peft.get_peft_model``) as ``lora`` (a ``LoRAConfig``: rank, alpha,
    dropout, target_modules) says; the base weights are frozen, only the adapter's A and B require grad.

    The adapter's A matrices are drawn from torch's global RNG (peft's Kaiming-uniform init): seed before calling
    for a reproducible adapter. B starts at zero, so the wrapped model computes exactly the base model's outputs.

    Raises:
        ValueError: target modules the model does not have (:func:`check_targets`), ``lora.rank < 1``.
    """
    if lora.rank < 1:
        raise ValueError(f"model.lora.rank={lora.rank}: apply_lora needs rank >= 1 (0 means LoRA off)")
    check_targets(model, lora.target_modules)
    import peft  # deferred: optional dependency (the train extra)

    config = peft.LoraConfig(task_type="CAUSAL_LM", r=int(lora.rank), lora_alpha=float(lora.alpha),
                             lora_dropout=float(lora.dropout), target_modules=list(lora.target_modules),
                             bias="none")
    return peft.get_peft_model(model, config, adapter_name=ADAPTER_NAME)


def _lora_layers(module: nn.Module) -> dict[str, nn.Module]:
    """``{module path: peft LoRA layer}`` of the LoRA-adapted layers inside ``module`` (empty when peft is not
    imported or nothing is adapted)."""
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer  # deferred: optional dependency

    return {name: mod for name, mod in module.named_modules() if isinstance(mod, LoraLayer)}


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under plain transformers names, with each adapter merged: ``W + (alpha / r) B A``.

    For a model without LoRA layers this is ``model.state_dict()`` (the same tensors). For a peft model, or the
    transformers model inside one (:func:`base_module`), every adapted layer's ``<path>.base_layer.weight`` becomes
    ``<path>.weight`` = W + ``layer.get_delta_weight(adapter)`` (a new tensor in W's dtype; peft's own merge, the
    one ``merge_and_unload`` applies), the ``lora_*`` entries are dropped, and every other entry is the model's own
    tensor (no copy): ``LlamaForCausalLM().load_state_dict(merged_state_dict(peft_model))`` gives the adapted
    policy as a plain model. The model is not changed (the merge is computed beside it; the project never merges
    an adapter into W in place, which would count it twice here).
    """
    inner = base_module(model)
    layers = _lora_layers(inner)
    state = inner.state_dict()
    if not layers:
        return state
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = tensor
    for path, layer in layers.items():
        base = layer.get_base_layer()
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_A:
                continue
            key = f"{path}.weight"
            out[key] = out[key].detach() + layer.get_delta_weight(adapter).to(base.weight.dtype)
    return out


@torch.no_grad()
def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base weights W of ``model`` under plain transformers names, the adapters left out (for a server
    that applies the adapter itself: ``engine.lora_sync=adapter``): every ``<path>.base_layer.weight`` becomes
    ``<path>.weight``, the ``lora_*`` entries are dropped; the model's own tensors (no copy). A model without LoRA
    layers: ``model.state_dict()``."""
    inner = base_module(model)
    if not _lora_layers(inner):
        return inner.state_dict()
    return {k.replace(".base_layer.", "."): v for k, v in inner.state_dict().items() if ".lora_" not in k}


def adapter_config(model: nn.Module) -> Any:
    """peft's ``LoraConfig`` of the adapter of ``model`` (a peft model or the transformers model inside one, which
    peft gives the same ``peft_config``), or None when it has no LoRA layers."""
    inner = base_module(model)
    configs = getattr(inner, "peft_config", None)
    if not _lora_layers(inner) or not isinstance(configs, dict) or ADAPTER_NAME not in configs:
        return None
    return configs[ADAPTER_NAME]


@torch.no_grad()
def save_adapter(model: nn.Module, folder: str | Path, dtype: torch.dtype | None = None) -> int:
    """Write the adapter of ``model`` (a peft model or the transformers model inside one) into ``folder`` as peft's
    ``save_pretrained`` lays it out: ``adapter_config.json`` and ``adapter_model.safetensors`` with keys
    ``base_model.model.<path>.lora_A.weight`` / ``lora_B.weight`` (peft's ``get_peft_model_state_dict``: the
    adapter name removed), on CPU, floating tensors in ``dtype`` (None: as they are). vLLM's LoRA loader reads this
    layout (``/v1/load_lora_adapter``). Returns the bytes of the weights file.

    Raises:
        ValueError: ``model`` has no LoRA adapter.
    """
    from peft import get_peft_model_state_dict  # deferred: optional dependency
    from safetensors.torch import save_file

    config = adapter_config(model)
    if config is None:
        raise ValueError("save_adapter: the model has no LoRA adapter (model.lora.rank=0)")
    inner = base_module(model)
    state = {}
    for key, tensor in get_peft_model_state_dict(inner, adapter_name=ADAPTER_NAME).items():
        t = tensor.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        state[key if key.startswith(PEFT_PREFIX) else PEFT_PREFIX + key] = t.contiguous()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(folder))
    target = folder / "adapter_model.safetensors"
    save_file(state, str(target), metadata={"format": "pt"})
    return target.stat().st_size


#: key prefix of a peft model's own ``state_dict()`` (``PeftModel`` -> ``LoraModel`` -> the causal LM).
PEFT_PREFIX = "base_model.model."


@torch.no_grad()
def merge_lora_state_dict(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """:func:`merged_state_dict` for a state dict gathered elsewhere: ``state`` holds the tensors of LoRA model
    ``model`` under its own names (``PeftModel.state_dict()``, with or without the ``base_model.model.`` prefix,
    e.g. FSDP's gathered full state on rank 0, CPU tensors); returns plain transformers names with every adapted
    layer's weight replaced by W + s B A (s = the layer's ``scaling``, alpha / r), computed in float32 and cast
    back to W's dtype; ``lora_*`` entries dropped. ``model`` supplies only the adapted layers and their scalings
    (its parameters may be sharded). A state without LoRA entries is returned as it is."""
    scalings = {path: layer.scaling[ADAPTER_NAME] for path, layer in _lora_layers(base_module(model)).items()
                if ADAPTER_NAME in getattr(layer, "lora_A", {})}
    if not scalings or not any(".lora_" in k for k in state):
        return state
    plain = {(k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k): v for k, v in state.items()}
    out = {k.replace(".base_layer.", "."): v for k, v in plain.items() if ".lora_" not in k}
    for path, scale in scalings.items():
        a = plain[f"{path}.lora_A.{ADAPTER_NAME}.weight"].float()  # (r, d_in)
        b = plain[f"{path}.lora_B.{ADAPTER_NAME}.weight"].float()  # (d_out, r)
        w = out[f"{path}.weight"]
        out[f"{path}.weight"] = (w.float() + scale * (b @ a)).to(w.dtype)
    return out


def save_policy(model: nn.Module, folder: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """Write ``model`` as a plain transformers folder (``save_pretrained``: config, safetensors weights) into
    ``folder``; for a peft model the weights are :func:`merged_state_dict`'s and the adapter is saved as well, as
    peft saves it, under ``folder/adapter/`` (``adapter_config.json``, ``adapter_model.safetensors``).

    ``state``: the model's full state dict under its own names, gathered elsewhere (FSDP rank 0's CPU copy; the
    model's parameters are then shards and are not read): written instead of the model's own tensors (a LoRA
    model's merged with :func:`merge_lora_state_dict`, its adapter taken from it)."""
    folder = Path(folder)
    if not is_lora(model):
        if state is None:
            model.save_pretrained(folder, safe_serialization=True)
        else:
            model.save_pretrained(folder, state_dict=state, safe_serialization=True)
        return
    inner = base_module(model)
    merged = merged_state_dict(model) if state is None else merge_lora_state_dict(state, model)
    inner.save_pretrained(folder, state_dict=merged, safe_serialization=True)
    extra = {} if state is None else {"state_dict": state}
    model.save_pretrained(folder / ADAPTER_DIR, safe_serialization=True, **extra)


def adapter_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """The adapter weights of checkpoint ``folder`` under the peft model's own parameter names (peft saves them
    without the adapter name: ``...q_proj.lora_A.weight`` -> ``base_model.model....q_proj.lora_A.default.weight``),
    for loaders that set parameters by name (FSDP's ``set_model_state_dict``).

    Raises:
        FileNotFoundError: no ``folder/adapter/adapter_model.safetensors``.
    """
    from safetensors.torch import load_file

    weights = Path(folder) / ADAPTER_DIR / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"checkpoint {folder} has no LoRA adapter ({weights}): it was not written by a run "
                                "with model.lora.rank > 0")
    out = {}
    for key, tensor in load_file(str(weights)).items():
        head, sep, tail = key.rpartition(".")
        out[f"{head}.{ADAPTER_NAME}.{tail}" if ".lora_" in key else key] = tensor
    return out


def load_adapter(model: nn.Module, folder: str | Path) -> None:
    """Load the adapter weights of checkpoint ``folder`` (``folder/adapter/adapter_model.safetensors``) into peft
    model ``model`` in place.

    Raises:
        FileNotFoundError: no adapter there (a checkpoint of a run without LoRA, or an incomplete one).
        ValueError: the adapter does not fit ``model`` (other rank, alpha or target modules than the saved
            ``adapter_config.json``; missing or unexpected adapter weights).
    """
    import json

    from peft import set_peft_model_state_dict  # deferred: optional dependency
    from safetensors.torch import load_file

    adir = Path(folder) / ADAPTER_DIR
    weights, config_file = adir / "adapter_model.safetensors", adir / "adapter_config.json"
    if not (weights.is_file() and config_file.is_file()):
        raise FileNotFoundError(f"checkpoint {folder} has no LoRA adapter ({adir}/adapter_model.safetensors and "
                                "adapter_config.json): it was not written by a run with model.lora.rank > 0")
    saved = json.loads(config_file.read_text())
    mine = model.peft_config[ADAPTER_NAME]
    diffs = [f"{k}: saved {saved.get(k)!r}, this run {v!r}" for k, v in
             (("r", mine.r), ("lora_alpha", mine.lora_alpha),
              ("target_modules", sorted(mine.target_modules)))
             if (sorted(saved.get(k) or []) if k == "target_modules" else saved.get(k)) != v]
    if diffs:
        raise ValueError(f"the adapter of checkpoint {folder} does not fit this run's model.lora: {'; '.join(diffs)}")
    result = set_peft_model_state_dict(model, load_file(str(weights)), adapter_name=ADAPTER_NAME)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"the adapter of checkpoint {folder} does not match the model: missing={missing} "
                         f"unexpected={list(result.unexpected_keys)}")
