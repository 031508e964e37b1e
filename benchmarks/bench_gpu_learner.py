"""Learner step on a GPU: TGRL (JS on the T1 rows, 4 mini-batches) versus GRPO (1 mini-batch) side by side, on a
randomly initialised model of a real architecture's shape (no weights are downloaded: the shape is what costs).

Prints a table: time of the no-grad pass (old log-probs, entropy, JS), of the optimiser steps, peak GPU memory,
trained tokens per second, and the TGRL/GRPO ratios measured in the same run. Also times the hf engine's generation
on the same model (tokens/s at a TGRL-like temperature mix).

    python benchmarks/bench_gpu_learner.py                     # Qwen2.5-0.5B shape, 64 rows x (384 + 128) tokens
    python benchmarks/bench_gpu_learner.py --shape tiny --device cpu --rows 8   # smoke run anywhere

Memory-bound configurations (issue 24), one learner row each, GRPO, no engine timing:

    python benchmarks/bench_gpu_learner.py --shape qwen2.5-7b --lora-rank 16 --rows 16   # LoRA r16 on a bf16 base
    python benchmarks/bench_gpu_learner.py --shape qwen2.5-1.5b --strategy fsdp --offload --rows 32   # 1 FSDP rank

The model is built directly on the GPU (random init there: a 7B init on CPU takes minutes). ``--lora-rank``: the base
in bf16 and frozen, the adapter through the config keys ``model.lora.rank/alpha/target_modules``
(``agent_rl.lora.apply_lora``), fp32 adapter weights. ``--strategy fsdp``: a one-rank process group (NCCL) and
``agent_rl.distributed.fsdp.FullyShardedDataParallel`` (``--offload``: ``CPUOffloadPolicy``, the shards and the
optimiser step on the CPU). Without CUDA a ``--device cuda`` run prints "skipped: no CUDA" and exits 0.
"""

from __future__ import annotations

import argparse
import time

import torch

from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig
from agent_rl.types import RolloutBatch

SHAPES = {  # Llama-architecture configs of the same sizes (vocab, hidden, layers, heads, kv heads, ffn)
    "qwen2.5-0.5b": dict(vocab_size=151_936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864),
    "qwen2.5-1.5b": dict(vocab_size=151_936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, intermediate_size=8960),
    "qwen2.5-7b": dict(vocab_size=152_064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False),
    "tiny": dict(vocab_size=49_152, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=128),
}


class IdTokenizer:
    """The engine's only tokenizer needs here: eos/pad ids and ``decode`` (no vocabulary files on a bare GPU box).
    Token 0 is EOS; random prompts never contain it, so every row generates its full budget."""

    eos_token_id = 0
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)


def build_model(shape: str, device: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random model of ``shape``, initialised on ``device`` itself (``with torch.device(device)``), in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = {"tie_word_embeddings": True, **SHAPES[shape]}
    cfg = LlamaConfig(**kw, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype)
    model.config.use_cache = False
    return model


def run_memory_bound(args, batch: RolloutBatch) -> dict[str, float]:
    """One GRPO learner (LoRA on a bf16 base, or one FSDP rank with optional CPU offload): step time, trained
    tokens/s, peak GPU memory, process RSS."""
    import os
    import resource

    algo = AlgoConfig(name="grpo", micro_batch_size=args.micro)
    if args.lora_rank > 0:
        from agent_rl.learner.config import LoRAConfig
        from agent_rl.lora import apply_lora

        model = apply_lora(build_model(args.shape, args.device, torch.bfloat16),
                           LoRAConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank))
        for p in model.parameters():  # fp32 adapter (trained), bf16 frozen base
            if p.requires_grad:
                p.data = p.data.float()
    else:
        model = build_model(args.shape, args.device)
    learner = Learner(model, IdTokenizer(), algo, OptimConfig(lr=1e-6), device=args.device)
    if args.strategy == "fsdp":
        import torch.distributed as dist

        from agent_rl.distributed.fsdp import FullyShardedDataParallel

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo", rank=0, world_size=1)
        learner.data_parallel = FullyShardedDataParallel(learner, offload=args.offload)
    learner.update(batch, step=1, total_steps=10)  # warm-up
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        learner.update(batch, step=step + 2, total_steps=10)
        sync(args.device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else float("nan")
    trainable = sum(p.numel() for p in learner.params)
    if args.strategy == "fsdp":
        import torch.distributed as dist

        dist.destroy_process_group()
    step_s = sum(times) / len(times)
    return {"step_s": step_s, "tok_per_s": float(batch.response_mask.sum()) / step_s, "peak_gib": peak,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "params": sum(p.numel() for p in model.parameters()), "trainable": trainable}


def build_batch(rows: int, prompt_len: int, response_len: int, vocab: int) -> RolloutBatch:
    """A TGRL-shaped batch: groups of 4 episodes (1 at T0 = 0.3, 3 at T1 = 1.2), one row each, random tokens."""
    g = torch.Generator().manual_seed(0)
    length = prompt_len + response_len
    input_ids = torch.randint(10, vocab, (rows, length), generator=g)
    attention_mask = torch.ones(rows, length, dtype=torch.long)
    response_mask = torch.zeros(rows, length)
    response_mask[:, prompt_len:] = 1
    k = torch.arange(rows) % 4
    is_high = k > 0
    group = torch.arange(rows) // 4
    rewards = (torch.rand(rows, generator=g) > 0.5).float()
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask,
        engine_logprobs=torch.zeros(rows, length), temperature=torch.where(is_high, 1.2, 0.3),
        group_index=group, episode_index=torch.arange(rows), is_high=is_high, turn_index=torch.zeros(rows, dtype=torch.long),
        num_turns=torch.ones(rows, dtype=torch.long), rewards=rewards, episode_rewards=rewards,
        episode_group_index=group, episode_is_high=is_high)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_learner(name: str, algo: AlgoConfig, args, batch: RolloutBatch) -> dict[str, float]:
    model = build_model(args.shape, args.device)
    credit = CreditConfig(name="js" if algo.is_tgrl else "uniform")  # the presets' credit (algo=tgrl: js)
    learner = Learner(model, IdTokenizer(), algo, OptimConfig(lr=1e-6), credit=credit, device=args.device)
    learner.update(batch, step=1, total_steps=10)  # warm-up (allocator, kernels)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times, evals = [], []
    for step in range(args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        learner.evaluate(batch, with_js=algo.is_tgrl)
        sync(args.device)
        evals.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        metrics = learner.update(batch, step=step + 2, total_steps=10)
        sync(args.device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else float("nan")
    tokens = float(batch.response_mask.sum())
    del learner, model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    step_s = sum(times) / len(times)
    return {"name": name, "step_s": step_s, "no_grad_s": sum(evals) / len(evals), "peak_gib": peak,
            "tok_per_s": tokens / step_s, "opt_steps": metrics["actor/optimizer_steps"],
            "clipfrac": metrics["actor/clipfrac"], "js_mean": metrics["credit/js_mean"]}


def run_engine(args) -> dict[str, float]:
    from agent_rl.engines import get_engine

    model = build_model(args.shape, args.device)
    engine = get_engine("hf", model, IdTokenizer())
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, SHAPES[args.shape]["vocab_size"], (args.prompt_len,), generator=g).tolist()
               for _ in range(args.rows)]
    temps = [0.3 if i % 4 == 0 else 1.2 for i in range(args.rows)]
    engine.generate(prompts[:4], temps[:4], max_new_tokens=4, seed=0)  # warm-up
    sync(args.device)
    t0 = time.perf_counter()
    gens = engine.generate(prompts, temps, max_new_tokens=args.gen_tokens, seed=0)
    sync(args.device)
    dt = time.perf_counter() - t0
    n = sum(len(x.token_ids) for x in gens)
    return {"gen_tokens": n, "gen_s": dt, "gen_tok_per_s": n / dt}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=64, help="rows (episodes; groups of 4)")
    p.add_argument("--prompt-len", type=int, default=384)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--micro", type=int, default=8, help="algo.micro_batch_size")
    p.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    p.add_argument("--gen-tokens", type=int, default=64, help="tokens generated per row in the engine timing")
    p.add_argument("--lora-rank", type=int, default=0, help="> 0: one GRPO row, LoRA of this rank on a bf16 base")
    p.add_argument("--strategy", default="single", choices=["single", "fsdp"], help="fsdp: one FSDP rank")
    p.add_argument("--offload", action="store_true", help="with --strategy fsdp: CPUOffloadPolicy")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA")
        return
    batch = build_batch(args.rows, args.prompt_len, args.response_len, SHAPES[args.shape]["vocab_size"])
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device {dev} | shape {args.shape} | {args.rows} rows x ({args.prompt_len} + {args.response_len}) tokens "
          f"| micro-batch {args.micro} | torch {torch.__version__}")
    if args.lora_rank > 0 or args.strategy == "fsdp":
        what = f"LoRA rank {args.lora_rank}, bf16 base" if args.lora_rank > 0 else "full fine-tuning, fp32 masters"
        if args.strategy == "fsdp":
            what += f", fsdp 1 rank{' + CPU offload' if args.offload else ''}"
        r = run_memory_bound(args, batch)
        print("\n| run | params | trainable | step s | trained tok/s | peak GPU GiB | peak RSS GiB |")
        print("|---|---|---|---|---|---|---|")
        print(f"| grpo, {what} | {r['params'] / 1e6:.1f}M | {r['trainable'] / 1e6:.2f}M | {r['step_s']:.3f} "
              f"| {r['tok_per_s']:.0f} | {r['peak_gib']:.2f} | {r['peak_rss_gib']:.2f} |")
        return
    rows = [
        run_learner("grpo, 1 mini-batch", AlgoConfig(name="grpo", micro_batch_size=args.micro), args, batch),
        run_learner("tgrl, 4 mini-batches (JS on T1 rows)", AlgoConfig(name="tgrl", warmup_steps=0,
                                                                        num_mini_batches=4,
                                                                        micro_batch_size=args.micro), args, batch),
    ]
    print("\n| run | step s | no-grad pass s | peak GiB | trained tok/s | optimiser steps | clipfrac | JS mean |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['step_s']:.3f} | {r['no_grad_s']:.3f} | {r['peak_gib']:.2f} | {r['tok_per_s']:.0f} "
              f"| {r['opt_steps']:.0f} | {r['clipfrac']:.4f} | {r['js_mean']:.4f} |")
    g, t = rows
    print(f"\nTGRL / GRPO, same run: step time {t['step_s'] / g['step_s']:.2f}x, no-grad pass (with JS) "
          f"{t['no_grad_s'] / g['no_grad_s']:.2f}x, peak memory {t['peak_gib'] / g['peak_gib']:.2f}x")
    e = run_engine(args)
    print(f"hf engine: {e['gen_tokens']} tokens in {e['gen_s']:.2f} s = {e['gen_tok_per_s']:.0f} tok/s "
          f"({args.rows} rows, T0/T1 mix, batch {args.rows})")


if __name__ == "__main__":
    main()
