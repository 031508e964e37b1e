"""Learner step time and peak memory: TGRL versus GRPO on the same batch (issue 4 goal: ratio <= 1.10 for both).

Usage::

    python benchmarks/bench_learner.py [--model smollm2|tiny] [--rows 8] [--prompt-len 192] [--response-len 64]
                                       [--steps 2] [--threads 1]

Each algorithm runs in its own subprocess (peak RSS is a per-process high-water mark, so the two cannot share one),
on the same synthetic batch: ``rows`` rows of ``prompt-len`` random prompt tokens + ``response-len`` response tokens,
grouped 1 low (T0 = 0.3) + 3 high (T1 = 1.2) per group with mixed 0/1 rewards. TGRL runs after warm-up (JS computed
in the no-grad pass for the high rows, low rows zeroed); GRPO trains every row. A worker does one untimed step, then
``--steps`` timed steps (the minimum is reported), and reports:

- ``step_s``: ``Learner.update`` wall time;
- ``--compile-js``: ``algo.compile_js`` (the compile happens in the untimed step);
- ``nograd_s``: the no-grad pass alone (old log-probs + entropy [+ JS for TGRL]), i.e. where JS is paid;
- ``peak_rss_gib`` / ``peak_delta_gib``: process peak RSS (``ru_maxrss``) and its increase over the RSS after the
  model, learner and batch are built (the learner's working memory).

Model: the embedded SmolLM2-135M when converted (``python scripts/prepare_default_model.py``), else the tiny random
model (printed). TGRL's grad pass skips the low rows (advantage 0, they only count in the denominator), so its step
can be faster than GRPO's; ``nograd`` isolates the JS cost.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _synthetic_batch(vocab: int, rows: int, prompt_len: int, response_len: int, seed: int = 0):
    import torch

    from agent_rl.types import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    seq = prompt_len + response_len
    input_ids = torch.randint(100, vocab, (rows, seq), generator=g)
    response_mask = torch.zeros(rows, seq)
    response_mask[:, prompt_len:] = 1
    groups = torch.arange(rows) // 4
    is_high = torch.arange(rows) % 4 != 0
    rewards = (torch.arange(rows) % 2).float()  # mixed outcomes in every group
    return RolloutBatch(
        input_ids=input_ids, attention_mask=torch.ones(rows, seq, dtype=torch.long), response_mask=response_mask,
        engine_logprobs=torch.zeros(rows, seq), temperature=torch.where(is_high, 1.2, 0.3),
        group_index=groups, episode_index=torch.arange(rows), is_high=is_high,
        turn_index=torch.zeros(rows, dtype=torch.long), num_turns=torch.ones(rows, dtype=torch.long),
        rewards=rewards, episode_rewards=rewards, episode_group_index=groups, episode_is_high=is_high)


def _rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from agent_rl.learner import AlgoConfig, CreditConfig, Learner, ModelConfig, OptimConfig
    from agent_rl.models import find_smollm2_gguf, load_policy, models_cache_dir

    name = args.model
    if name == "auto":
        converted = (models_cache_dir() / "smollm2-135m-instruct" / "config.json").is_file()
        name = "smollm2" if converted or find_smollm2_gguf() is not None else "tiny"
    model, tok = load_policy(ModelConfig(name=name))
    algo = AlgoConfig(name=args.algo, warmup_steps=0, micro_batch_size=args.micro, logits_chunk_size=args.chunk,
                      compile_js=args.compile_js)
    credit = CreditConfig(name="js" if algo.is_tgrl else "uniform")  # the presets' credit (algo=tgrl: js)
    learner = Learner(model, tok, algo, OptimConfig(lr=1e-6), credit=credit)
    batch = _synthetic_batch(len(tok), args.rows, args.prompt_len, args.response_len)
    base_rss = _rss_gib()
    learner.update(batch, step=1, total_steps=100)  # untimed: allocator warm-up, optimizer state
    steps, nograd = [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        learner.evaluate(batch, with_js=args.algo == "tgrl")
        nograd.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        learner.update(batch, step=i + 2, total_steps=100)
        steps.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(json.dumps({"model": name, "step_s": min(steps), "nograd_s": min(nograd), "peak_rss_gib": peak,
                      "peak_delta_gib": peak - base_rss}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="auto", help="smollm2 | tiny | auto (smollm2 when available)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=192)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--micro", type=int, default=4, help="algo.micro_batch_size")
    parser.add_argument("--chunk", type=int, default=1024, help="algo.logits_chunk_size (tokens per logits chunk)")
    parser.add_argument("--compile-js", action="store_true", help="algo.compile_js (compiled in the untimed step)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--algo", default="grpo", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = {}
    for algo in ("grpo", "tgrl"):
        cmd = [sys.executable, __file__, "--worker", "1", "--algo", algo] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            if k not in ("worker", "algo", "compile_js")] + (["--compile-js"] if args.compile_js else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results[algo] = json.loads(out.strip().splitlines()[-1])
    g, t = results["grpo"], results["tgrl"]
    print(f"model={g['model']} rows={args.rows} prompt={args.prompt_len} response={args.response_len} "
          f"micro={args.micro} chunk={args.chunk} threads={args.threads} steps={args.steps} compile_js={args.compile_js}")
    print(f"{'metric':<16}{'grpo':>10}{'tgrl':>10}{'tgrl/grpo':>11}")
    for key in ("step_s", "nograd_s", "peak_rss_gib", "peak_delta_gib"):
        ratio = t[key] / g[key] if g[key] > 0 else float("nan")
        print(f"{key:<16}{g[key]:>10.3f}{t[key]:>10.3f}{ratio:>11.3f}")


if __name__ == "__main__":
    main()
