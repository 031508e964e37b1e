"""Rollout benchmark: fraction of rollout wall time during which generation waits on envs, with N concurrent
episodes (goal < 10% at 32), through the real orchestrator, engine and env client.

    python benchmarks/bench_rollout.py --env alfworld --model smollm2 --episodes 32 --turns 5 --max-new-tokens 48
    python benchmarks/bench_rollout.py --env choose_item --model tiny --mode local

``env_wait_frac`` = 1 - (engine busy time) / (rollout wall time): everything that is not generation (env resets at
the start, env steps on the critical path, batching waits). ``after_first`` excludes the time before the first
generation (the unavoidable first reset). Groups are TGRL groups (1 episode at T0 + 3 at T1 of one task).

KV reuse across turns (``--kv-reuse-table``): one rollout step per (env, model), trajectory mode (``--modes``), with
``engine.kv_reuse=false`` then ``true`` on the same tasks and seeds, side by side: prefill tokens, decode tokens,
reused tokens, tokens/s, rollout wall and the process's CPU time of the step (less sensitive than the wall to other
jobs on a shared machine), and whether both played token-identical episodes.

    python benchmarks/bench_rollout.py --kv-reuse-table --envs textworld,alfworld --models tiny,smollm2 \
        --episodes 4 --turns 10 --max-new-tokens 16 --threads 1

Measured table: docs/training.md, "KV reuse across turns". SmolLM2 without reuse on 10-turn ALFWorld episodes (prompts
up to 4k tokens) is the slow part: about 85k prefill tokens per step.
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

    from agent_rl.config.compose import load_config
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


async def bench_kv_reuse(args: argparse.Namespace) -> list[dict[str, object]]:
    """Rows of the KV reuse table (module docstring): per env and model, reuse off then on."""
    import torch

    from agent_rl.config.compose import load_config
    from agent_rl.engines import engine_kwargs, get_engine
    from agent_rl.learner.config import AlgoConfig
    from agent_rl.models import load_policy
    from agent_rl.rollout import GroupSpec, RolloutOrchestrator, TaskSampler, get_prompt, group_temperatures
    from agent_rl.runtime import open_env_pool

    torch.set_num_threads(args.threads)
    temps = group_temperatures(AlgoConfig(name="tgrl", warmup_steps=0), step=1)
    rows: list[dict[str, object]] = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for env, mode in [(e, m) for e in args.envs.split(",") for m in args.modes.split(",")]:
        base = [f"env={env}", "env_server.mode=local", f"rollout.mode={mode}", f"rollout.max_turns={args.turns}",
                f"engine.max_new_tokens={args.max_new_tokens}", f"engine.batch_size={args.episodes}"]
        cfg0 = load_config(base)
        tasks = TaskSampler(cfg0.env.id, cfg0.env.sampler, env_kwargs=cfg0.env_kwargs, seed=0).sample(
            max(1, args.episodes // len(temps)))
        async with open_env_pool(cfg0, out) as pool:
            for name in args.models.split(","):
                model, tok = load_policy(load_config([*base, f"model={name}"]).model)
                played: dict[bool, list] = {}
                for reuse in (False, True):
                    cfg = load_config([*base, f"model={name}", f"engine.kv_reuse={str(reuse).lower()}"])
                    engine = get_engine("hf", model, tok, **engine_kwargs(cfg))
                    orch = RolloutOrchestrator(pool, engine, get_prompt(cfg.env.prompt), cfg.rollout,
                                               max_new_tokens=cfg.engine.max_new_tokens, seed=0)
                    if not rows or (rows[-1]["env"], rows[-1]["mode"]) != (env, mode):  # warm-up once per env: games loaded, workers started
                        await orch.run_groups([GroupSpec(tasks[0], temps[:1])], seed_key=10**6)
                    t0, c0 = time.perf_counter(), time.process_time()
                    res = await orch.run_groups([GroupSpec(t, temps) for t in tasks], seed_key=1)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    m = res.metrics
                    played[reuse] = [[(t.prompt_ids, t.response_ids) for t in ep.turns] for ep in res.episodes]
                    rows.append({
                        "env": env, "mode": mode, "model": name, "kv_reuse": reuse, "episodes": len(res.episodes),
                        "turns": sum(len(e.turns) for e in res.episodes),
                        "prompt_tokens_max": max((len(t.prompt_ids) for e in res.episodes for t in e.turns), default=0),
                        "prefill_tokens": int(m["throughput/prefill_tokens"]),
                        "decode_tokens": int(m["throughput/decode_tokens"]),
                        "kv_reuse_tokens": int(m["throughput/kv_reuse_tokens"]),
                        "tokens_per_s": m["throughput/tokens_per_s"], "generate_s": m["time/generate_s"],
                        "rollout_s": wall, "cpu_s": cpu,
                    })
                    print(f"  {env} {mode} {name} kv_reuse={reuse}: {rows[-1]}", flush=True)
                rows[-1]["same_tokens"] = rows[-2]["same_tokens"] = played[True] == played[False]
                del model
    return rows


def print_kv_table(rows: list[dict[str, object]]) -> None:
    cols = ["env", "mode", "model", "kv_reuse", "episodes", "turns", "prompt_tokens_max", "prefill_tokens", "decode_tokens",
            "kv_reuse_tokens", "tokens_per_s", "generate_s", "rollout_s", "cpu_s", "same_tokens"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    print("\n| env | mode | model | prefill cut (off / on) | rollout wall speed-up (off / on) | generate speed-up | CPU time "
          "speed-up |")
    print("|---|---|---|---|---|---|---|")
    for off, on in zip(rows[::2], rows[1::2]):
        print(f"| {on['env']} | {on['mode']} | {on['model']} | {off['prefill_tokens'] / max(on['prefill_tokens'], 1):.1f}x | "
              f"{off['rollout_s'] / max(on['rollout_s'], 1e-9):.2f}x | "
              f"{off['generate_s'] / max(on['generate_s'], 1e-9):.2f}x | {off['cpu_s'] / max(on['cpu_s'], 1e-9):.2f}x |")


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
    p.add_argument("--kv-reuse-table", action="store_true", help="KV reuse on/off table (module docstring)")
    p.add_argument("--envs", default="textworld,alfworld", help="--kv-reuse-table: env configs")
    p.add_argument("--models", default="tiny,smollm2", help="--kv-reuse-table: models")
    p.add_argument("--modes", default="trajectory", help="--kv-reuse-table: rollout modes (trajectory,turn)")
    args = p.parse_args()
    if args.kv_reuse_table:
        rows = asyncio.run(bench_kv_reuse(args))
        print(f"\nKV reuse: episodes={args.episodes} turns<={args.turns} max_new_tokens={args.max_new_tokens} "
              f"threads={args.threads} (one rollout step each, trajectory mode, env in-process)")
        print_kv_table(rows)
        return
    r = asyncio.run(bench(args))
    print(f"\nrollout: env={args.env} model={args.model} mode={args.mode} episodes={args.episodes} "
          f"turns<={args.turns} max_new_tokens={args.max_new_tokens} threads={args.threads}")
    print("| " + " | ".join(r) + " |")
    print("|" + "---|" * len(r))
    print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    print(f"goal env_wait_frac < 0.10: {'met' if r['env_wait_frac'] < 0.10 else 'NOT met'}")


if __name__ == "__main__":
    main()
