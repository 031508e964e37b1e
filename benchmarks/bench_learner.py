"""Learner step: TGRL versus GRPO on the same batch (time and peak memory; issue 4 goal: ratio <= 1.10 for both), and
(``--options``) the update's options side by side on the same multi-turn episodes.

Usage::

    python benchmarks/bench_learner.py [--model smollm2|tiny] [--rows 8] [--prompt-len 192] [--response-len 64]
                                       [--steps 2] [--threads 1]
    python benchmarks/bench_learner.py --options [--model smollm2|tiny] [--groups 2] [--turns 3] [--steps 2]
                                       [--budget-rows 4] [--json OUT]

``--options``: one process, one model, one set of synthetic multi-turn episodes (``--groups`` TGRL groups of 1 T0 + 3
T1 episodes; episode e has 2..``--turns`` turns; a task prompt of ``--task-len`` tokens, observations of
``--obs-len`` +- 50 %, responses of ``--response-len`` +- 50 %, random ids; turn k's prompt is the conversation so far,
as in trajectory mode), rows built by ``agent_rl.rollout.build_rollout_batch``. Each option is a fresh learner on a
copy of the same weights, TGRL after warm-up (JS credit), one mini-batch, one epoch, one untimed step then ``--steps``
timed ones (the minimum is reported):

- ``trajectory rows`` (one row per episode, observations masked) versus ``per-turn rows`` (one row per turn, each
  re-reading its whole prompt) on the same episodes;
- ``micro=4`` (``algo.micro_batch_size=4``, today's fixed row count) versus ``tokens=N``
  (``algo.micro_batch_tokens``, N = ``--budget-rows`` x the batch's mean row length);
- ``fp32`` versus ``bf16`` (``Learner(mixed_precision="bf16")``: CPU autocast of the forward, fp32 master weights);
  ``lp_err`` is the mean / max |log-prob - fp32 log-prob| of the no-grad pass over the response tokens;
- ``lora r=16`` (``model.lora.rank=16``, ``agent_rl.lora``) when that module is there.

Columns: ``rows``, ``tokens`` (attended tokens of the rows: what one pass reads), ``trained`` (response tokens),
``step_s`` (``Learner.update`` wall), ``cpu_s`` (its process CPU time: steadier than the wall on a shared machine),
``tok/s`` = tokens / step_s, ``trained/s`` = trained / step_s (the same work for every option on these episodes, so the
comparable throughput).

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


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from agent_rl.learner import AlgoConfig, CreditConfig, Learner, ModelConfig, OptimConfig
    from agent_rl.memory import peak_rss_bytes, rss_bytes
    from agent_rl.models import load_policy

    name = _model_name(args.model)
    model, tok = load_policy(ModelConfig(name=name))
    algo = AlgoConfig(name=args.algo, warmup_steps=0, micro_batch_size=args.micro, logits_chunk_size=args.chunk,
                      compile_js=args.compile_js)
    credit = CreditConfig(name="js" if algo.is_tgrl else "uniform")  # the presets' credit (algo=tgrl: js)
    learner = Learner(model, tok, algo, OptimConfig(lr=1e-6), credit=credit)
    batch = _synthetic_batch(len(tok), args.rows, args.prompt_len, args.response_len)
    base_rss = rss_bytes() / 2**30
    learner.update(batch, step=1, total_steps=100)  # untimed: allocator warm-up, optimizer state
    steps, nograd = [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        learner.evaluate(batch, with_js=args.algo == "tgrl")
        nograd.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        learner.update(batch, step=i + 2, total_steps=100)
        steps.append(time.perf_counter() - t0)
    peak = peak_rss_bytes() / 2**30
    print(json.dumps({"model": name, "step_s": min(steps), "nograd_s": min(nograd), "peak_rss_gib": peak,
                      "peak_delta_gib": peak - base_rss}))


def _episodes(vocab: int, groups: int, max_turns: int, task_len: int, obs_len: int, response_len: int,
              seed: int = 0) -> list:
    """Synthetic TGRL episodes (1 T0 + 3 T1 per group) whose turn prompts extend each other (trajectory-mode
    token-in/token-out: prompt_k = prompt_(k-1) + response_(k-1) + observation_k), random ids, mixed rewards."""
    import random

    from agent_rl.types import Episode, Task, Turn

    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(100, vocab) for _ in range(n)]  # noqa: E731
    vary = lambda n: max(1, rng.randint(n // 2, n + n // 2))  # noqa: E731
    episodes = []
    for g in range(groups):
        task = Task(env_id="synthetic", group_id=g)
        for slot in range(4):
            e = len(episodes)
            prompt, turns = ids(task_len), []
            for _k in range(2 + e % max(1, max_turns - 1)):
                response = ids(vary(response_len))
                turns.append(Turn(prompt_ids=list(prompt), response_ids=response,
                                  response_logprobs=[-1.0] * len(response), action="a"))
                prompt = prompt + response + ids(vary(obs_len))
            reward = float((e + g) % 2)
            episodes.append(Episode(task=task, temperature=1.2 if slot else 0.3, is_high=slot > 0, turns=turns,
                                    reward=reward, won=reward > 0))
    return episodes


def options_table(args: argparse.Namespace) -> list[dict]:
    """The ``--options`` rows (module docstring); printed as a table, and written to ``--json`` when given."""
    import copy

    import torch

    torch.set_num_threads(args.threads)
    from agent_rl.learner import AlgoConfig, CreditConfig, Learner, ModelConfig, OptimConfig
    from agent_rl.models import load_policy
    from agent_rl.rollout import build_rollout_batch

    name = _model_name(args.model)
    base, tok = load_policy(ModelConfig(name=name))
    episodes = _episodes(len(tok), args.groups, args.turns, args.task_len, args.obs_len, args.response_len)
    batches = {mode: build_rollout_batch(episodes, pad_token_id=tok.pad_token_id, mode=mode)
               for mode in ("trajectory", "turn")}
    try:
        from agent_rl.learner.config import LoRAConfig
        from agent_rl.lora import apply_lora
    except ImportError:  # LoRA not in this tree
        apply_lora = None
    options = []
    for mode in ("trajectory", "turn"):
        mean_len = float(batches[mode].attention_mask.sum(-1).float().mean())
        budget = int(args.budget_rows * mean_len)
        options += [(mode, "micro=4", "fp32", 0, 0), (mode, f"tokens={budget}", "fp32", budget, 0),
                    (mode, "micro=4", "bf16", 0, 0)]
    if apply_lora is not None:
        options.append(("trajectory", "micro=4", "fp32", 0, 16))
    skip = {s for s in args.skip.split(",") if s}
    options = [o for o in options if not (("bf16" in skip and o[2] == "bf16") or ("tokens" in skip and o[3])
                                          or ("lora" in skip and o[4]))]
    reference: dict[str, torch.Tensor] = {}
    results = []
    for mode, split, precision, budget, rank in options:
        batch = batches[mode]
        model = copy.deepcopy(base)
        if rank:
            model = apply_lora(model, LoRAConfig(rank=rank))
        algo = AlgoConfig(name=args.algo, warmup_steps=0, micro_batch_size=4, micro_batch_tokens=budget,
                          logits_chunk_size=args.chunk)
        learner = Learner(model, tok, algo, OptimConfig(lr=1e-6), credit=CreditConfig(name="js" if algo.is_tgrl
                                                                                           else "uniform"),
                          mixed_precision="bf16" if precision == "bf16" else "no")
        rm = batch.response_mask > 0
        lp = learner.evaluate(batch).logprobs[rm]  # before any update: the same weights for every option
        if precision == "fp32" and not rank:
            reference.setdefault(mode, lp)
        err = (lp - reference[mode]).abs() if mode in reference else None
        learner.update(batch, step=1, total_steps=100)  # untimed: allocator warm-up, optimizer state
        steps, cpu = [], []
        for i in range(args.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            learner.update(batch, step=i + 2, total_steps=100)
            steps.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        wall = min(steps)
        tokens, trained = int(batch.attention_mask.sum()), int(rm.sum())
        row = {"model": name, "rows": mode, "split": split, "precision": precision, "lora_rank": rank,
               "n_rows": batch.num_rows, "tokens": tokens, "trained": trained, "step_s": wall, "cpu_s": min(cpu),
               "tok_per_s": tokens / wall, "trained_per_s": trained / wall,
               "lp_err_mean": float(err.mean()) if err is not None else None,
               "lp_err_max": float(err.max()) if err is not None else None}
        results.append(row)
        label = f"{'per-turn' if mode == 'turn' else 'trajectory'} rows, {split}, {precision}" + (
            f", lora r={rank}" if rank else "")
        print(f"{label:<42}{row['n_rows']:>5}{tokens:>8}{trained:>8}{wall:>9.2f}{min(cpu):>8.2f}{tokens / wall:>9.0f}"
              f"{trained / wall:>10.0f}   " + (f"{row['lp_err_mean']:.1e} / {row['lp_err_max']:.1e}"
                                               if err is not None else "-"), flush=True)
        del learner, model
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


def _model_name(name: str) -> str:
    from agent_rl.models import find_smollm2_gguf, models_cache_dir

    if name == "auto":
        converted = (models_cache_dir() / "smollm2-135m-instruct" / "config.json").is_file()
        return "smollm2" if converted or find_smollm2_gguf() is not None else "tiny"
    return name


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
    parser.add_argument("--options", action="store_true", help="the update's options side by side (docstring)")
    parser.add_argument("--groups", type=int, default=2, help="--options: TGRL groups (4 episodes each)")
    parser.add_argument("--turns", type=int, default=3, help="--options: turns of the longest episodes (>= 2)")
    parser.add_argument("--task-len", type=int, default=64, help="--options: task prompt tokens")
    parser.add_argument("--obs-len", type=int, default=24, help="--options: observation tokens per turn (+- 50%%)")
    parser.add_argument("--budget-rows", type=float, default=4.0,
                        help="--options: algo.micro_batch_tokens = this x the mean row length")
    parser.add_argument("--json", default="", help="--options: write the rows to this file")
    parser.add_argument("--skip", default="", help="--options: comma list of bf16, tokens, lora to leave out")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--algo", default="grpo", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.options:
        if args.algo == "grpo" and "--algo" not in sys.argv:
            args.algo = "tgrl"
        print(f"model={_model_name(args.model)} algo={args.algo} groups={args.groups} turns<={args.turns} "
              f"task={args.task_len} obs~{args.obs_len} response~{args.response_len} threads={args.threads} "
              f"steps={args.steps}")
        print(f"{'option':<42}{'rows':>5}{'tokens':>8}{'trained':>8}{'step_s':>9}{'cpu_s':>8}{'tok/s':>9}{'trained/s':>10}"
              "   lp_err mean / max")
        options_table(args)
        return
    results = {}
    for algo in ("grpo", "tgrl"):
        cmd = [sys.executable, __file__, "--worker", "1", "--algo", algo] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            if k not in ("worker", "algo", "compile_js", "options")] + (["--compile-js"] if args.compile_js else [])
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
