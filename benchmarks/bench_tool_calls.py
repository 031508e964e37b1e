"""SmolLM2's zero-shot valid-action rate with native tool calls (``env.action_format=tools``) vs ``<action>`` text.

For each env (ALFWorld valid_unseen, WebShop test) and each action format, the embedded SmolLM2-135M-Instruct plays
the same tasks greedily through the training orchestrator (the prompts, parsers and envs of a real run) and every
turn is counted:

- *well formed*: text: the reply has an ``<action>`` tag (or a ReAct ``Action:`` line); tools: the reply holds a tool
  call that parses and that the env's schemas accept (no ``info["tool_error"]``);
- *valid action*: the env accepted the action (``1 - episode/invalid_action_frac``: in tools mode also a call whose
  command is not admissible is invalid, as in text mode).

    OMP_NUM_THREADS=2 python benchmarks/bench_tool_calls.py --tasks 6 --max-turns 5 --out /tmp/tool_calls.json

Prints a table; asserts nothing. The numbers in docs/tools.md come from it.
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

SPLITS = {"alfworld": ("valid_unseen", 134), "webshop": ("val", 500)}


def measure(env: str, action_format: str, args: argparse.Namespace, model, tokenizer) -> dict:
    from agent_rl.config.compose import load_config
    from agent_rl.engines import get_engine
    from agent_rl.envclient import LocalEnvPool
    from agent_rl.rollout import GroupSpec, RolloutOrchestrator, get_prompt, parse_action
    from agent_rl.types import Task

    cfg = load_config([f"env={env}", "model=smollm2", f"env.action_format={action_format}", "env_server.mode=local",
                       f"rollout.max_turns={args.max_turns}", f"engine.max_new_tokens={args.max_new_tokens}"],
                      check=False)
    split, size = SPLITS[env]
    kwargs = cfg.make_env_kwargs(args.max_turns)
    tasks = [Task(cfg.env.id, options={"split": split, "index": i * size // args.tasks}, group_id=g,
                  env_kwargs=kwargs) for g, i in enumerate(range(args.tasks))]
    engine = get_engine("hf", model, tokenizer, seed=0)

    async def go():
        pool = LocalEnvPool(max_workers=2)
        try:
            orch = RolloutOrchestrator(pool, engine, get_prompt(cfg.env.prompt), cfg.rollout,
                                       max_new_tokens=args.max_new_tokens, seed=0, action_format=action_format,
                                       tool_call_format=cfg.model.tool_call_format)
            return await orch.run_groups([GroupSpec(t, [(0.0, False)]) for t in tasks])
        finally:
            await pool.aclose()

    t0 = time.perf_counter()
    res = asyncio.run(go())
    wall = time.perf_counter() - t0
    turns = [t for ep in res.episodes for t in ep.turns]
    if action_format == "tools":
        formed = [("tool_error" not in t.info) for t in turns]
    else:
        formed = [parse_action(tokenizer.decode(t.response_ids, skip_special_tokens=True)).well_formed
                  for t in turns]
    n = max(len(turns), 1)
    return {"env": env, "action_format": action_format, "episodes": len(res.episodes),
            "dropped_groups": res.dropped_groups, "turns": len(turns),
            "well_formed_rate": sum(formed) / n, "valid_action_rate": 1 - sum(t.invalid for t in turns) / n,
            "success": sum(ep.won for ep in res.episodes) / max(len(res.episodes), 1),
            "response_truncated": sum(t.response_truncated for t in turns) / n, "wall_s": round(wall, 1),
            "examples": [tokenizer.decode(t.response_ids, skip_special_tokens=True)[:300] for t in turns[:3]],
            "observations": [t.observation[:200] for t in turns[:3]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["alfworld", "webshop"])
    ap.add_argument("--formats", nargs="+", default=["text", "tools"])
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    model, tokenizer = load_policy(ModelConfig(name="smollm2"))
    model.eval()
    rows = []
    for env in args.envs:
        for fmt in args.formats:
            row = measure(env, fmt, args, model, tokenizer)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("examples", "observations")}), flush=True)
    print(f"\n{'env':10s} {'format':7s} {'turns':>5s} {'well formed':>11s} {'valid action':>12s} {'success':>7s}")
    for r in rows:
        print(f"{r['env']:10s} {r['action_format']:7s} {r['turns']:5d} {r['well_formed_rate']:11.2f} "
              f"{r['valid_action_rate']:12.2f} {r['success']:7.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
