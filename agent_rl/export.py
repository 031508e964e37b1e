"""``python -m agent_rl.export CKPT OUT``: a plain Hugging Face folder (config, safetensors weights, generation
config, tokenizer) from any checkpoint ``CKPT`` (``DIR/checkpoints/step_N``), for serving or evaluation elsewhere.

- A LoRA checkpoint (``CKPT/adapter/``, ``model.lora.rank > 0``): the base model the run trained on is rebuilt from
  the run's ``model.*`` (saved in ``CKPT/extra.json``; ``agent_rl.models.load_policy``), the adapter loaded onto it
  with peft (``PeftModel.from_pretrained``) and merged (``merge_and_unload``: W + (alpha / r) B A), and the result
  checked against the merged weights the checkpoint folder holds (they must agree: a different base, e.g. a changed
  hub revision, is refused). The learner's files and the adapter are not copied.
- Any other checkpoint: its weights, configs and tokenizer files are copied (``learner.pt``, ``rng.pt``,
  ``extra.json`` and sub-folders are not).

``OUT`` must not exist (or be an empty folder); it is written under a temporary name beside it and renamed into
place. Exit code 2 with the reason on stderr for a missing or incomplete checkpoint, an existing ``OUT``, or an
adapter that does not reproduce the checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from agent_rl.learner.checkpoint import latest_checkpoint
from agent_rl.learner.config import ModelConfig
from agent_rl.lora import ADAPTER_DIR
from agent_rl.models import load_policy

#: files of a checkpoint folder that are training state, not the model (never exported).
STATE_FILES = ("learner.pt", "rng.pt", "extra.json", "sharded.json")  # (an fsdp run's distcp/ is a folder: skipped)
#: largest |exported - checkpoint| weight difference accepted for a LoRA export, relative to max(1, |W|max) of the
#: tensor: peft's merge and the checkpoint's merge (``agent_rl.lora.merged_state_dict``) compute the same sum,
#: in the weights' dtype (bf16 rounding ~ 2**-8 relative).
MERGE_TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}


def _check_checkpoint(ckpt: Path) -> None:
    if not ckpt.exists():
        raise FileNotFoundError(f"no checkpoint at {ckpt}")
    if not ckpt.is_dir():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint folder (DIR/checkpoints/step_N)")
    weights = list(ckpt.glob("*.safetensors"))
    if not weights or not (ckpt / "config.json").is_file():
        inside = latest_checkpoint(ckpt)
        hint = f"; the newest checkpoint under it is {inside}" if inside else ""
        what = "no *.safetensors weights" if not weights else "no config.json"
        raise FileNotFoundError(f"{ckpt} is not a complete checkpoint ({what}; a checkpoint is "
                                f"DIR/checkpoints/step_N){hint}")


def _run_model_config(ckpt: Path) -> ModelConfig:
    """The run's ``model.*`` from ``ckpt/extra.json`` (``runtime.checkpoint_extra``), LoRA off (the base)."""
    extra_file = ckpt / "extra.json"
    saved = json.loads(extra_file.read_text()).get("config", {}).get("model") if extra_file.is_file() else None
    if not saved:
        raise FileNotFoundError(f"checkpoint {ckpt} has an adapter but no run config (extra.json 'config.model'): "
                                "the base model it adapts is unknown")
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    kwargs = {k: v for k, v in saved.items() if k in names and k != "lora"}
    return ModelConfig(**kwargs)


def _merged_lora_model(ckpt: Path):
    """The base of the run rebuilt, the checkpoint's adapter merged into it; checked against the folder's weights."""
    import torch
    from peft import PeftModel  # deferred: optional dependency (the train extra)
    from safetensors.torch import load_file

    model_cfg = _run_model_config(ckpt)
    base, _ = load_policy(model_cfg)
    merged = PeftModel.from_pretrained(base, str(ckpt / ADAPTER_DIR)).merge_and_unload()
    saved: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        saved.update(load_file(str(f)))
    mine = merged.state_dict()
    tol = MERGE_TOLERANCE[model_cfg.dtype]
    bad = []
    for name, tensor in saved.items():
        if name not in mine:
            bad.append(f"{name} (not in the merged model)")
            continue
        ref = tensor.float()
        diff = float((mine[name].float() - ref).abs().max()) if ref.numel() else 0.0
        if diff > tol * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0):
            bad.append(f"{name} (max |diff| {diff:.3g})")
    if bad:
        raise ValueError(f"the adapter of {ckpt} merged into the base model.{'path' if model_cfg.path else 'name'}="
                         f"{model_cfg.path or model_cfg.name} does not reproduce the checkpoint's merged weights: "
                         f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}; the base differs from the run's")
    return merged


def export_checkpoint(ckpt: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the plain Hugging Face folder of checkpoint ``ckpt`` to ``out`` (module docstring); returns ``out``.

    Raises:
        FileNotFoundError: no checkpoint at ``ckpt``, or an incomplete one (no weights, no config.json; a LoRA
            checkpoint without the run's config). FileExistsError: ``out`` exists and is not an empty folder.
        ValueError: the adapter merged into the rebuilt base does not reproduce the checkpoint's weights.
    """
    ckpt, out = Path(ckpt), Path(out)
    _check_checkpoint(ckpt)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not empty: choose a new export folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        if (ckpt / ADAPTER_DIR).is_dir():
            from transformers import AutoTokenizer

            model = _merged_lora_model(ckpt)
            model.save_pretrained(tmp, safe_serialization=True)
            AutoTokenizer.from_pretrained(ckpt).save_pretrained(tmp)
            if (ckpt / "generation_config.json").is_file():  # the run's EOS ids, as the checkpoint has them
                shutil.copy2(ckpt / "generation_config.json", tmp / "generation_config.json")
        else:
            for f in ckpt.iterdir():
                if f.is_file() and f.name not in STATE_FILES:
                    shutil.copy2(f, tmp / f.name)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_rl.export", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint folder, DIR/checkpoints/step_N")
    parser.add_argument("out", help="the new Hugging Face folder (must not exist)")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kind = "LoRA adapter merged into its base" if (Path(args.checkpoint) / ADAPTER_DIR).is_dir() else "weights copied"
    print(f"exported {args.checkpoint} -> {out} ({kind}); load it with model.path={out} or from_pretrained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
