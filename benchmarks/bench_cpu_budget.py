"""Core-seconds of the operations that size the CPU preset (``configs/trainer/cpu.yaml``), with SmolLM2-135M.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_cpu_budget.py [--prompt-len 700] [--new-tokens 48] [--rows 8]

Prints one table: process CPU time (``time.process_time``; one torch thread, so a loaded machine does not inflate it
the way it inflates wall time) and wall time of: loading the converted checkpoint, generating 1 and 4 prompts of
``--prompt-len`` random tokens + ``--new-tokens`` tokens (hf engine), a no-grad forward of ``--rows`` rows, and a
forward + backward of the same rows (the learner's grad pass; its no-grad pass is the forward). A run's cost is
then about (episode-turns x generation per row) + (rows x (forward + forward/backward)) core-seconds.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-len", type=int, default=700, help="tokens per prompt (ALFWorld turn prompts: ~500-800)")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    from agent_rl.engines import get_engine
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    torch.set_num_threads(args.threads)
    rows: list[tuple[str, float, float, int]] = []

    def timed(name: str, units: int, fn) -> None:
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        rows.append((name, time.process_time() - c0, time.perf_counter() - w0, units))
        print(f"  {name}: {rows[-1][1]:.1f} core-s", flush=True)

    holder: dict = {}
    timed("load SmolLM2 (converted)", 1, lambda: holder.update(zip(("model", "tok"), load_policy(
        ModelConfig(name="smollm2")))))
    model, tok = holder["model"], holder["tok"]
    engine = get_engine("hf", model, tok, batch_size=32, seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (args.prompt_len,), generator=g).tolist() for _ in range(4)]
    for n in (1, 4):
        timed(f"generate {n} x ({args.prompt_len} + {args.new_tokens})", n, lambda n=n: engine.generate(
            prompts[:n], [1.0] * n, max_new_tokens=args.new_tokens, top_p=1.0, top_k=0, stop=None, seed=0))
    x = torch.randint(100, 40000, (args.rows, args.prompt_len + args.new_tokens), generator=g)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    timed(f"forward no-grad {args.rows} rows", args.rows, forward)
    timed(f"forward + backward {args.rows} rows", args.rows,
          lambda: model(x).logits.float().logsumexp(-1).mean().backward())
    print(f"\nSmolLM2-135M, {args.threads} thread(s)")
    print(f"{'operation':44s} {'core-s':>8s} {'wall s':>8s} {'core-s/unit':>12s}")
    for name, cpu, wall, units in rows:
        print(f"{name:44s} {cpu:8.1f} {wall:8.1f} {cpu / units:12.2f}")


if __name__ == "__main__":
    main()
