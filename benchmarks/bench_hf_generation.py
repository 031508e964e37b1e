"""The hf engine's generation, variant against variant, on the rows of ``bench_vs_trl.py`` (a benchmark, not a test):
MATH prompts x G completions at T = 1, the same row seeds for every variant.

    python benchmarks/bench_hf_generation.py --model smollm2 --max-new-tokens 48 --rounds 2 --threads 1 --out DIR
    python benchmarks/bench_hf_generation.py --model tiny --max-new-tokens 4 --rounds 1 --out DIR   # plumbing

Variants (one engine each, all in this process, alternated round by round so a drift of the machine moves them
together):

- ``before``: every row prefilled (``shared_prefill=False``) and transformers' plain ``DynamicCache`` (a
  ``torch.cat`` of every layer's cache at every token): the engine as it was before issue 64's changes;
- ``shared_prefill``: equal prompts of one call prefilled once (``HFEngine(shared_prefill=True)``), plain caches;
- ``default``: shared prefill and the growing caches (``agent_rl.engines.hf_cache.growing_cache``): the engine now;
- ``bfloat16``: the default with ``dtype="bfloat16"`` (``engine.dtype``: a bfloat16 copy of the float32 weights).

Per variant and round: new tokens, the generate call's CPU seconds (``time.process_time``: this process, all its
threads) and wall seconds, and the engine's prefill / reused / decode token counters. ``results.json``: the rounds,
per variant the median tokens per CPU-second and its ratio to ``before``, whether its tokens equal ``before``'s
(float32 variants must; bfloat16 samples another policy), and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("before", "shared_prefill", "default", "bfloat16")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", required=True, help="folder for results.json")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: each of {', '.join(VARIANTS)}")
    for path in (REPO, REPO / "benchmarks"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))

    import torch
    from transformers import DynamicCache

    import agent_rl.engines.hf_cache as hf_cache
    from agent_rl.engines import HFEngine
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy
    from bench_vs_trl import math_tasks

    torch.set_num_threads(args.threads)
    cfg = ModelConfig(name=args.model) if not Path(args.model).exists() else ModelConfig(name="path", path=args.model)
    model, tok = load_policy(cfg)
    model = model.float()
    tasks = math_tasks(tok, args.prompts)
    rows = [t["prompt_ids"] for t in tasks for _ in range(args.group)]
    growing = hf_cache.growing_cache

    def plain(past: Any = None) -> Any:
        return DynamicCache(ddp_cache_data=past)

    setup = {"before": (plain, False, None), "shared_prefill": (plain, True, None), "default": (growing, True, None),
             "bfloat16": (growing, True, "bfloat16")}
    load_before = os.getloadavg()
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    tokens: dict[str, list[list[int]]] = {}
    try:
        for rnd in range(args.rounds):
            for name in variants:
                cache, shared, dtype = setup[name]
                hf_cache.growing_cache = cache
                engine = HFEngine(model, tok, batch_size=len(rows), shared_prefill=shared, dtype=dtype)
                t0, c0 = time.perf_counter(), time.process_time()
                gens = engine.generate(rows, [1.0] * len(rows), max_new_tokens=args.max_new_tokens,
                                       row_seeds=list(range(len(rows))))
                cpu_s, wall_s = time.process_time() - c0, time.perf_counter() - t0
                n = sum(len(g.token_ids) for g in gens)
                tokens.setdefault(name, [g.token_ids for g in gens])
                rounds[name].append({"tokens": n, "cpu_s": cpu_s, "wall_s": wall_s, **engine.stats()})
                print(f"round {rnd} {name}: {n} tokens, {cpu_s:.2f} CPU-s, {n / cpu_s:.1f} tokens/CPU-s", flush=True)
    finally:
        hf_cache.growing_cache = growing
    summary = {}
    for name in variants:
        rate = statistics.median(r["tokens"] / r["cpu_s"] for r in rounds[name])
        summary[name] = {"tokens_per_cpu_s": rate,
                         "same_tokens_as_before": tokens[name] == tokens["before"] if "before" in tokens else None}
    if "before" in summary:
        for name in variants:
            summary[name]["vs_before"] = summary[name]["tokens_per_cpu_s"] / summary["before"]["tokens_per_cpu_s"]
    results = {"model": args.model, "rows": len(rows), "prompts": args.prompts, "group": args.group,
               "max_new_tokens": args.max_new_tokens, "threads": args.threads, "load_before": load_before,
               "load_after": os.getloadavg(), "summary": summary, "rounds": rounds}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    for name, s in summary.items():
        print(f"{name:15s} {s['tokens_per_cpu_s']:.1f} tokens/CPU-s  x{s.get('vs_before', float('nan')):.2f}  "
              f"same tokens as before: {s['same_tokens_as_before']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
