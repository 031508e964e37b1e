"""The gateway path against the orchestrator on the same Calculator tasks (tools), and how often a real model's tool
program breaks the prefix.

Orchestrator: ``RolloutOrchestrator`` plays Calculator-v0 in tools mode (the env's tools, hermes calls). Gateway:
``ExternalRollout`` runs ``tests.gateway.programs:calculator_tools`` (the real ``openai`` client; its env steps go
through the gateway's env route) on the same tasks, group temperatures and budgets. Both use the same engine and
in-process envs. Reported per path: wall per episode, generated tokens/s, model calls, prompt tokens reused from the
engine's KV cache, replies holding a ``<tool_call>``, episodes won, and for the gateway ``gateway/prefix_breaks``
(requests that did not extend their episode's segment) and ``gateway/segments`` / ``gateway/attempts``.

    OMP_NUM_THREADS=2 python benchmarks/bench_gateway.py --model smollm2 --tasks 1 --turns 3 --max-new-tokens 48

Also the gateway's own cost per call (``--per-call N``): N sequential chat calls of a growing conversation through
a live gateway (the real ``openai`` client, one token generated each), the wall per call against the engine's busy
time per call; the difference is what the gateway adds (HTTP, the client, rendering, the prefix match, recording).
Per path: ``overhead_per_call_ms`` = (wall - generation time) / calls. Prints a table and JSON; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "2")

ENV = "agent_rl/Calculator-v0"


async def measure(path: str, args: argparse.Namespace, engine) -> dict:
    from agent_rl.envclient import LocalEnvPool
    from agent_rl.gateway import ExternalConfig, ExternalRollout
    from agent_rl.learner.config import AlgoConfig
    from agent_rl.rollout import RolloutConfig, RolloutOrchestrator, TaskSampler, TaskSamplerConfig, get_prompt

    pool = LocalEnvPool()
    cfg = RolloutConfig(max_turns=args.turns, gen_wait_s=args.gen_wait_s)
    if path == "orchestrator":
        orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), cfg, max_new_tokens=args.max_new_tokens,
                                   seed=0, action_format="tools")
    else:
        orch = ExternalRollout(pool, engine, cfg, ExternalConfig(program=f"tests.gateway.programs:{args.program}",
                                                                 tasks=ENV), max_new_tokens=args.max_new_tokens, seed=0)
    sampler = TaskSampler(ENV, TaskSamplerConfig(kind="seed"), seed=0, env_kwargs={"action_format": "tools"})
    t0 = time.perf_counter()
    try:
        res = await orch.collect(sampler.sample, args.tasks, AlgoConfig(name="tgrl", warmup_steps=0), step=1)
        wall = time.perf_counter() - t0
        extra = {k: v for k, v in res.metrics.items() if k.startswith("gateway/")}
    finally:
        await orch.aclose()
        await pool.aclose()
    calls = sum(len(ep.turns) for ep in res.episodes)
    sizes = list(orch.last_batcher.batch_sizes) if orch.last_batcher is not None else []
    tool_replies = sum("<tool_call>" in engine.tokenizer.decode(t.response_ids) for ep in res.episodes for t in ep.turns)
    return {"path": path, "episodes": len(res.episodes), "calls": calls, "wall_s": round(wall, 2),
            "wall_per_episode_s": round(wall / max(len(res.episodes), 1), 2),
            "tokens_per_s": round(res.metrics["throughput/tokens_per_s"], 2),
            "generate_s": round(res.metrics["time/generate_s"], 2),
            "prefill_tokens": res.metrics["throughput/prefill_tokens"],
            "kv_reuse_tokens": res.metrics["throughput/kv_reuse_tokens"],
            "tool_call_replies": tool_replies, "won": sum(ep.won for ep in res.episodes),
            "dropped_groups": res.dropped_groups,
            "overhead_per_call_ms": round(1000 * (wall - res.metrics["time/generate_s"]) / max(calls, 1), 1),
            "mean_batch": round(sum(sizes) / max(len(sizes), 1), 2), "engine_calls": len(sizes),
            **extra}


def per_call(args: argparse.Namespace, engine) -> dict:
    """``args.per_call`` sequential calls of one growing conversation through a live gateway, one token each."""
    import threading

    import openai

    from agent_rl.gateway import ExternalConfig, ExternalRollout
    from agent_rl.rollout import RolloutConfig

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(600)

    orch = ExternalRollout(None, engine, RolloutConfig(max_prompt_tokens=4096),
                           ExternalConfig(program="tests.gateway.programs:no_reward"), max_new_tokens=1, seed=0)
    runner = orch.runner  # the gateway's episode runner (agent_rl.gateway.external.ProgramEpisode)
    run(runner.start())
    run(orch.open_stream(seed_key=0))
    try:
        warm = runner.gateway.open_session(temperature=0.0)
        openai.OpenAI(base_url=f"{runner.base_url}/v1", api_key=warm.api_key, max_retries=0).chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=1)  # warm-up, not timed
        session = runner.gateway.open_session(temperature=0.0)
        client = openai.OpenAI(base_url=f"{runner.base_url}/v1", api_key=session.api_key, max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Count with me: one."}]
        busy0, t0 = orch.stream_counters()["generate_s"], time.perf_counter()
        for i in range(args.per_call):
            reply = client.chat.completions.create(model="x", messages=messages, max_tokens=1)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"and {i + 2}."}]
        wall, busy = time.perf_counter() - t0, orch.stream_counters()["generate_s"] - busy0
        return {"calls": args.per_call, "wall_per_call_ms": round(1000 * wall / args.per_call, 1),
                "engine_per_call_ms": round(1000 * busy / args.per_call, 1),
                "gateway_per_call_ms": round(1000 * (wall - busy) / args.per_call, 1),
                "prefix_breaks": session.prefix_breaks, "prompt_tokens_last": len(session.turns[-1].prompt_ids)}
    finally:
        run(orch.close_stream())
        run(orch.aclose())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tasks", type=int, default=1)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default="")
    ap.add_argument("--per-call", type=int, default=20, help="calls of the per-call measurement (0: none)")
    ap.add_argument("--gen-wait-s", type=float, default=0.02,
                    help="rollout.gen_wait_s: how long the batcher waits for the next prompt before generating")
    ap.add_argument("--program", default="calculator_tools",
                    help="the gateway path's program in tests.gateway.programs (calculator_tools_fewshot: a worked "
                         "tool call in its system message)")
    args = ap.parse_args()
    import torch

    from agent_rl.engines import get_engine
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    model, tok = load_policy(ModelConfig(name=args.model))
    rows = []
    for path in ("orchestrator", "gateway"):
        engine = get_engine("hf", model.eval(), tok, seed=0)
        rows.append(asyncio.run(measure(path, args, engine)))
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r.get(k, "")) for k in keys))
    by = {r["path"]: r for r in rows}
    ratio = by["gateway"]["wall_per_episode_s"] / max(by["orchestrator"]["wall_per_episode_s"], 1e-9)
    print(f"gateway / orchestrator wall per episode: {ratio:.2f}x")
    calls = per_call(args, get_engine("hf", model.eval(), tok, seed=0)) if args.per_call > 0 else {}
    if calls:
        print("per call: " + ", ".join(f"{k} {v}" for k, v in calls.items()))
    result = {"args": vars(args), "rows": rows, "ratio_wall_per_episode": round(ratio, 3), "per_call": calls}
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
