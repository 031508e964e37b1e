"""The hf engine's continuous batching against its plain loop (a benchmark, not a test).

    python benchmarks/bench_hf_continuous.py --model smollm2 --rows 32 --batch-size 8 --max-new-tokens 48
    python benchmarks/bench_hf_continuous.py --mode on  ...     # one mode only (for whole-process timings)

``--rows`` chat prompts (a mix of one-word questions and requests for a paragraph, so the responses end at scattered
lengths, as an agent's actions do) at T = 1, each with its own row seed, through ``HFEngine.generate`` with at most
``--batch-size`` rows decoded together: ``continuous_batching=True`` (a finished row's place goes to a waiting row at
once) and ``False`` (the plain loop: batches one after the other). ``--eos-every K`` makes every K-th token id end
a response too: the random tiny model never samples its EOS, so this gives it scattered lengths. ``--mode both`` (default) alternates the two
``--rounds`` times (A B A B) in one process after one warm-up call and checks that both sampled the same tokens;
per mode: generated tokens, wall seconds, CPU seconds (the process, all threads), tokens/s and tokens per CPU-second
(medians over the rounds), the decode forwards (model calls) of a call, and the load average before and after.
Results: ``--out/results.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

QUESTIONS = ["Name one primary colour.", "What is 2 + 3? Answer with the number only.",
             "Write a paragraph about the history of bread.", "Say yes or no: is ice cold?",
             "Explain in detail how a bicycle works.", "Give a one-word synonym of happy.",
             "Describe your ideal weekend in several sentences.", "What is the capital of France?"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=("both", "on", "off"), default="both")
    ap.add_argument("--eos-every", type=int, default=0,
                    help="K > 0: every K-th token id also ends a response (scattered lengths from the random tiny "
                         "model, which never samples its EOS); 0: the model's own EOS")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    from agent_rl.engines import HFEngine
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    torch.set_num_threads(args.threads)
    model, tok = load_policy(ModelConfig(name=args.model))
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                            add_generation_prompt=True, tokenize=True, return_dict=False))
               for i in range(args.rows)]
    temps = [1.0] * args.rows
    modes = {"on": True, "off": False} if args.mode == "both" else {args.mode: args.mode == "on"}
    eos = None
    if args.eos_every > 0:
        from agent_rl.engines.base import default_eos_token_ids

        eos = sorted(set(default_eos_token_ids(model, tok)) | set(range(0, model.config.vocab_size, args.eos_every)))
    engines = {m: HFEngine(model, tok, batch_size=args.batch_size, continuous_batching=c, eos_token_ids=eos)
               for m, c in modes.items()}
    calls = {"n": 0}
    model.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))

    def one(mode: str, seeds: list[int]) -> dict:
        calls["n"] = 0
        t0, c0 = time.perf_counter(), time.process_time()
        gens = engines[mode].generate(prompts, temps, max_new_tokens=args.max_new_tokens, row_seeds=seeds)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        tokens = sum(len(g.token_ids) for g in gens)
        return {"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "forwards": calls["n"],
                "token_ids": [g.token_ids for g in gens]}

    load_before = os.getloadavg()
    for mode in modes:  # warm-up
        one(mode, list(range(args.rows)))
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        seeds = [1000 * (r + 1) + i for i in range(args.rows)]
        for mode in modes:
            runs[mode].append(one(mode, seeds))
            x = runs[mode][-1]
            print(f"round {r} {mode:3s}: {x['tokens']} tokens in {x['wall_s']:.2f} s wall, {x['cpu_s']:.2f} CPU-s, "
                  f"{x['forwards']} forwards", flush=True)
    load_after = os.getloadavg()
    same = None
    if len(modes) == 2:
        same = all(a["token_ids"] == b["token_ids"] for a, b in zip(runs["on"], runs["off"]))
    res = {"model": args.model, "eos_every": args.eos_every, "rows": args.rows, "batch_size": args.batch_size,
           "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "threads": args.threads,
           "load_before": load_before, "load_after": load_after, "same_tokens": same, "modes": {}}
    for mode, xs in runs.items():
        res["modes"][mode] = {
            "tokens": statistics.median(x["tokens"] for x in xs),
            "wall_s": statistics.median(x["wall_s"] for x in xs),
            "cpu_s": statistics.median(x["cpu_s"] for x in xs),
            "tokens_per_s": statistics.median(x["tokens"] / x["wall_s"] for x in xs),
            "tokens_per_cpu_s": statistics.median(x["tokens"] / x["cpu_s"] for x in xs),
            "forwards": statistics.median(x["forwards"] for x in xs)}
    if len(modes) == 2:
        on, off = res["modes"]["on"], res["modes"]["off"]
        res["speedup_tokens_per_s"] = on["tokens_per_s"] / off["tokens_per_s"]
        res["speedup_tokens_per_cpu_s"] = on["tokens_per_cpu_s"] / off["tokens_per_cpu_s"]
    print(json.dumps({k: v for k, v in res.items()}, indent=2))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
