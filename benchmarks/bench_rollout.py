"""Rollout benchmark: fraction of rollout wall time during which generation waits on envs, with N concurrent
episodes (goal < 10% at 32), through the real orchestrator, engine and env client.

    python benchmarks/bench_rollout.py --env alfworld --model smollm2 --episodes 32 --turns 5 --max-new-tokens 48
    python benchmarks/bench_rollout.py --env choose_item --model tiny --mode local

``env_wait_frac`` = 1 - (engine busy time) / (rollout wall time): everything that is not generation (env resets at
the start, env steps on the critical path, batching waits). ``after_first`` excludes the time before the first
generation (the unavoidable first reset). Groups are TGRL groups (1 episode at T0 + 3 at T1 of one task).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def bench(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from agent_rl.config import load_config
    from agent_rl.engines import get_engine
    from agent_rl.learner.config import AlgoConfig
    from agent_rl.models import load_policy
    from agent_rl.rollout import GroupSpec, RolloutOrchestrator, TaskSampler, get_prompt, group_temperatures
    from agent_rl.runtime import open_env_pool

    torch.set_num_threads(args.threads)
    cfg = load_config([f"env={args.env}", f"model={args.model}", f"env_server.mode={args.mode}",
                       f"rollout.max_turns={args.turns}", f"engine.max_new_tokens={args.max_new_tokens}",
                       *([f"env_server.urls=[{args.url}]"] if args.url else [])])
    model, tok = load_policy(cfg.model)
    engine = get_engine(cfg.engine.name, model, tok, batch_size=args.episodes, seed=0)
    generate, t_start = engine.generate, time.perf_counter()

    def logged_generate(prompts, temperatures, **kw):  # progress: one line per engine call
        t = time.perf_counter()
        out = generate(prompts, temperatures, **kw)
        print(f"  [{t - t_start:7.1f} s] generate batch={len(prompts):3d} took {time.perf_counter() - t:6.2f} s",
              flush=True)
        return out

    engine.generate = logged_generate
    sampler = TaskSampler(cfg.env.id, cfg.env.sampler, env_kwargs=cfg.env_kwargs, seed=0)
    temps = group_temperatures(AlgoConfig(name="tgrl", warmup_steps=0), step=1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    async with open_env_pool(cfg, out) as pool:
        orch = RolloutOrchestrator(pool, engine, get_prompt(cfg.env.prompt), cfg.rollout,
                                   max_new_tokens=cfg.engine.max_new_tokens, seed=0)
        if args.warmup:  # one small rollout first: server workers spawned, games loaded once
            await orch.run_groups([GroupSpec(t, temps[:1]) for t in sampler.sample(1)])
            print(f"  warm-up done at {time.perf_counter() - t_start:.1f} s; measuring", flush=True)
        t0 = time.perf_counter()
        res = await orch.run_groups([GroupSpec(t, temps) for t in sampler.sample(args.episodes // len(temps))])
        end = time.perf_counter()
    b = orch.last_batcher
    assert b is not None
    after = end - (b.first_start or t0)
    m = res.metrics
    return {
        "episodes": len(res.episodes), "turns": sum(len(e.turns) for e in res.episodes),
        "wall_s": m["time/rollout_s"], "generate_s": m["time/generate_s"],
        "env_wait_frac": m["time/env_wait_frac"], "after_first": max(0.0, 1 - b.busy_s / after),
        "gen_calls": len(b.batch_sizes), "mean_batch": sum(b.batch_sizes) / max(len(b.batch_sizes), 1),
        "tokens_per_s": m["throughput/tokens_per_s"], "dropped": m["rollout/dropped_groups"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="alfworld")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--mode", default="http", choices=["http", "local"])
    p.add_argument("--url", default="", help="an already running env server (default: start one)")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out", default="/tmp/bench_rollout")
    args = p.parse_args()
    r = asyncio.run(bench(args))
    print(f"\nrollout: env={args.env} model={args.model} mode={args.mode} episodes={args.episodes} "
          f"turns<={args.turns} max_new_tokens={args.max_new_tokens} threads={args.threads}")
    print("| " + " | ".join(r) + " |")
    print("|" + "---|" * len(r))
    print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    print(f"goal env_wait_frac < 0.10: {'met' if r['env_wait_frac'] < 0.10 else 'NOT met'}")


if __name__ == "__main__":
    main()
