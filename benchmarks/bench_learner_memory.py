"""Per-rank learner memory of ``trainer.learner_strategy=ddp`` vs ``fsdp`` (and one process), counted as tensor bytes.

Each strategy runs ``--ranks`` processes (torch.multiprocessing, gloo on CPU) that build the model and a
:class:`agent_rl.learner.Learner`, wrap it (``DataParallel`` / ``FullyShardedDataParallel``), make one GRPO update on
their share of a synthetic batch (whole groups, random tokens) and report, after the update:
``params`` / ``grads`` / ``optimizer`` = bytes of the rank's trainable parameters, their gradients and the AdamW
moments (local shards for FSDP; ``agent_rl.distributed.fsdp.learner_memory``), their sum, bytes per model parameter,
the process's RSS and peak RSS (which also hold the Python runtime, the tokenizer, the allocator's cache and the
model as loaded before sharding), and for FSDP the weight gather's largest transient full tensor and rank 0's CPU copy.

``--activations``: bytes the grad pass keeps for backward per token (``torch.autograd.graph.saved_tensors_hooks``
over one trunk forward of a ``--seq`` token row, the learner's way: hidden states only, logits are recomputed per
chunk), with and without ``model.gradient_checkpointing``.

    python benchmarks/bench_learner_memory.py --model tiny
    python benchmarks/bench_learner_memory.py --model smollm2 --activations --seq 512 1024 3072
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_rl.learner import AlgoConfig, Learner, OptimConfig  # noqa: E402
from agent_rl.learner.config import ModelConfig  # noqa: E402
from agent_rl.models import load_policy  # noqa: E402
from agent_rl.rollout import build_rollout_batch  # noqa: E402
from agent_rl.types import Episode, Task, Turn  # noqa: E402

MiB = 2 ** 20


def synthetic_batch(vocab: int, groups: int, group_size: int, prompt: int, response: int, seed: int = 0):
    """A GRPO batch of ``groups`` x ``group_size`` one-turn episodes of random tokens, rewards 0/1 within a group."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for gi in range(groups):
        task = Task(env_id="synthetic", options={"i": gi}, group_id=gi)
        for k in range(group_size):
            ids = torch.randint(10, vocab - 1, (prompt + response,), generator=g).tolist()
            turn = Turn(prompt_ids=ids[:prompt], response_ids=ids[prompt:], response_logprobs=[-1.0] * response,
                        action="x")
            eps.append(Episode(task=task, temperature=1.0, is_high=False, turns=[turn], reward=float(k % 2)))
    return build_rollout_batch(eps, pad_token_id=0, mode="turn")


def _rank(rank: int, world: int, port: int, strategy: str, model_name: str, args: dict, q) -> None:
    import torch.distributed as dist

    from agent_rl.distributed.data_parallel import DataParallel, shard_batch
    from agent_rl.distributed.fsdp import FullyShardedDataParallel, learner_memory
    from agent_rl.memory import peak_rss_bytes, rss_bytes

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if strategy != "single":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model, tok = load_policy(ModelConfig(name=model_name))
    n_params = sum(p.numel() for p in model.parameters())
    learner = Learner(model, tok, AlgoConfig(name="grpo", micro_batch_size=args["micro"]), OptimConfig(lr=1e-5),
                      device="cpu")
    if strategy == "ddp":
        learner.data_parallel = DataParallel(learner)
    elif strategy == "fsdp":
        learner.data_parallel = FullyShardedDataParallel(learner)
    batch = synthetic_batch(len(tok), args["groups"], args["group_size"], args["prompt"], args["response"])
    shard = batch if strategy == "single" else shard_batch(batch, world)[rank]
    learner.update(shard, step=1, total_steps=1)
    mem = learner_memory(learner)
    mem.update(rss=rss_bytes(), peak_rss=peak_rss_bytes(), n_params=n_params)
    if strategy == "fsdp":
        learner.data_parallel.full_state_dict()
        mem.update({f"sync_{k}": v for k, v in learner.data_parallel.last_gather.items()})
    q.put((rank, mem))
    if strategy != "single":
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_strategy(strategy: str, model_name: str, ranks: int, args: dict) -> list[dict]:
    world = 1 if strategy == "single" else ranks
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, strategy, model_name, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    out = sorted((q.get(timeout=1800) for _ in procs), key=lambda x: x[0])
    for p in procs:
        p.join()
    return [m for _, m in out]


def activations(model_name: str, seqs: list[int]) -> list[tuple[int, bool, float]]:
    """(seq, gradient_checkpointing, saved bytes per token) of one trunk forward in train mode (fp32 on CPU)."""
    from agent_rl.learner.learner import policy_trunk

    rows = []
    for ckpt in (False, True):
        model, _ = load_policy(ModelConfig(name=model_name, gradient_checkpointing=ckpt))
        model.train()
        trunk, _ = policy_trunk(model)
        for seq in seqs:
            saved: dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            ids = torch.randint(10, 1000, (1, seq))
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                h = trunk(input_ids=ids, use_cache=False).last_hidden_state
            act = sum(v for k, v in saved.items() if k not in params)
            rows.append((seq, ckpt, act / seq))
            del h
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--strategies", default="single,ddp,fsdp")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--response", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--activations", action="store_true")
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 3072])
    a = ap.parse_args(argv)
    args = {"groups": a.groups, "group_size": a.group_size, "prompt": a.prompt, "response": a.response,
            "micro": a.micro}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"model={a.model} ranks={a.ranks} batch: {a.groups} groups x {a.group_size}, {a.prompt}+{a.response} tokens")
    print("| strategy | rank | params MiB | grads MiB | AdamW MiB | total MiB | bytes/param | RSS MiB | peak RSS MiB "
          "| sync: max gathered MiB / rank-0 copy MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for strategy in a.strategies.split(","):
        for r, m in enumerate(run_strategy(strategy, a.model, a.ranks, args)):
            sync = (f"{m['sync_max_gathered'] / MiB:.1f} / {m['sync_rank0_copy'] / MiB:.1f}" if "sync_max_gathered" in m
                    else "-")
            print(f"| {strategy} | {r} | {m['params'] / MiB:.1f} | {m['grads'] / MiB:.1f} | {m['optimizer'] / MiB:.1f} "
                  f"| {m['total'] / MiB:.1f} | {m['total'] / m['n_params']:.2f} | {m['rss'] / MiB:.0f} "
                  f"| {m['peak_rss'] / MiB:.0f} | {sync} |", flush=True)
    if a.activations:
        print("\n| seq tokens | gradient checkpointing | saved activations per token (KiB, fp32) |")
        print("|---|---|---|")
        for seq, ckpt, per_tok in activations(a.model, a.seq):
            print(f"| {seq} | {ckpt} | {per_tok / 1024:.1f} |", flush=True)


if __name__ == "__main__":
    main()
