"""What a forked sibling's start costs (``rollout.fork``, issue 40): replaying the base's actions against copying the
game's state, on TextWorld.

A sibling forked at turn t of its base needs the env at the base's state after t actions. agent_rl replays them on a
fresh session (a reset and t steps, each checked against the base's turn). The alternative an env could offer is a
state copy (``clone_state`` / ``set_state``); TextWorld has one, ``copy()`` of its running game (a new Z-machine
interpreter set to the same memory, plus copies of TextWorld's quest trackers). Because the fork turn is chosen
after the base episode ends (``select=entropy|js|divergence`` read the whole episode), a copy would have to be taken
at every turn of every base, and one more for each sibling. This measures, on one game (the walkthrough's actions):
a reset, a step, a ``clone_state()`` (TextWorld's ``copy()`` of the game at its current state), and the resident
memory one kept copy adds.

    OMP_NUM_THREADS=1 python benchmarks/bench_fork_restore.py --family coin_collector --level 5 --copies 20

``--rollout-groups N`` then plays N forked groups (2 bases, 1 fork turn x 4 siblings, a random-move policy seeded
by each row's seed) through the orchestrator twice, ``rollout.fork.restore=replay`` and ``=state`` (the siblings
start from a snapshot taken after every base turn, ``TextWorldEnv.clone_state``), and prints what starting the
siblings cost each route: ``fork/replay_s`` (replays, or restores), ``fork/snapshot_s``, their sum, the rollout's wall
seconds, and whether both routes played the same episodes.

Prints tables and JSON; asserts nothing. (ALFWorld keeps its game state inside the fast_downward PDDL library,
which has no copy: a sibling can only replay there.)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_mb() -> float:
    """Resident memory of this process now (``/proc/self/statm``), MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="coin_collector")
    ap.add_argument("--level", type=int, default=5)
    ap.add_argument("--games", type=int, default=3, help="games 0..N-1 of the train split")
    ap.add_argument("--copies", type=int, default=20, help="copies kept to measure their memory")
    ap.add_argument("--rollout-groups", type=int, default=0, help="also play N forked groups by each route")
    args = ap.parse_args()
    import gymnasium

    import envs  # noqa: F401  (registers the ids)

    resets, steps, copies = [], [], []
    env = gymnasium.make("agent_rl/TextWorld-v0", family=args.family, level=args.level).unwrapped
    for index in range(args.games):
        t0 = time.perf_counter()
        _, info = env.reset(seed=0, options={"index": index})
        resets.append(time.perf_counter() - t0)
        for action in info["walkthrough"][:-1]:  # stop before the winning move: the game stays running
            t0 = time.perf_counter()
            env.step(action)
            steps.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            state = env.clone_state()  # TextWorld's own copy of the running game (interpreter + trackers)
            copies.append(time.perf_counter() - t0)
            state["game"].close()
    before = rss_mb()
    kept = [env.clone_state()["game"] for _ in range(args.copies)]
    per_copy = (rss_mb() - before) / max(len(kept), 1)
    for game in kept:
        game.close()
    env.close()
    ms = {name: 1000 * statistics.mean(v) for name, v in (("reset", resets), ("step", steps), ("copy", copies))}
    row = {"family": args.family, "level": args.level, "games": args.games, "steps_timed": len(steps),
           "reset_ms": round(ms["reset"], 2), "step_ms": round(ms["step"], 2), "copy_ms": round(ms["copy"], 2),
           # one copy to start a sibling costs as many replayed steps as this, before the copies of every base turn
           "copy_over_step": round(ms["copy"] / ms["step"], 1), "copy_mb": round(per_copy, 2)}
    print(" | ".join(row))
    print(" | ".join(str(v) for v in row.values()))
    print(json.dumps(row))
    if args.rollout_groups:
        routes = {route: play_routes(args, route) for route in ("replay", "state")}
        same = routes["replay"].pop("episodes") == routes["state"].pop("episodes")
        for route, r in routes.items():
            r.update(route=route, same_episodes=same)
        keys = list(routes["replay"])
        print(" | ".join(keys))
        for r in routes.values():
            print(" | ".join(str(r[k]) for k in keys))
        print(json.dumps(list(routes.values())))


class _Bytes:
    """ids = UTF-8 bytes + 3 (0 pad, 1 eos): the policy below needs no model."""

    pad_token_id, eos_token_id, eos_token, chat_template = 0, 1, "", None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + 3 for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


class _RandomMoves:
    """Answers every row with a move drawn by ``random.Random(row seed)``: the env side is what is measured."""

    moves = ("go north", "go south", "go east", "go west", "take coin", "look")

    def __init__(self) -> None:
        self.tokenizer = _Bytes()

    def generate(self, prompts, temperatures, *, max_new_tokens, top_p=1.0, top_k=0, stop=None, seed=None,
                 row_seeds=None):
        import random

        from agent_rl.types import Generation

        out = []
        for i, _ in enumerate(prompts):
            rs = row_seeds[i] if row_seeds is not None else seed
            ids = self.tokenizer.encode(f"<action>{random.Random(rs).choice(self.moves)}</action>")
            out.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text=self.tokenizer.decode(ids),
                                  finish_reason="stop"))
        return out


def play_routes(args: argparse.Namespace, route: str) -> dict:
    """One forked rollout of ``args.rollout_groups`` TextWorld groups with ``rollout.fork.restore=route``."""
    import asyncio

    from agent_rl.envclient import LocalEnvPool
    from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, get_prompt
    from agent_rl.rollout.config import ForkConfig
    from agent_rl.types import Task

    kwargs = {"family": args.family, "level": args.level}
    pool = LocalEnvPool(max_workers=4, mode="thread")
    cfg = RolloutConfig(mode="trajectory", max_turns=10, fork=ForkConfig(points=1, siblings=4, restore=route))
    orch = RolloutOrchestrator(pool, _RandomMoves(), get_prompt("textworld"), cfg, max_new_tokens=32, seed=3)
    specs = [GroupSpec(Task("agent_rl/TextWorld-v0", {"split": "train", "index": g % args.games}, group_id=g,
                            seed=g, env_kwargs=kwargs), [(1.0, False)] * 2) for g in range(args.rollout_groups)]

    async def go():
        try:
            return await orch.run_groups(specs, seed_key=1)
        finally:
            await pool.aclose()

    t0 = time.perf_counter()
    res = asyncio.run(go())
    wall = time.perf_counter() - t0
    m = res.metrics
    start_s = m["fork/replay_s"] + m["fork/snapshot_s"]
    return {"groups": args.rollout_groups, "siblings": int(m["fork/extra_episodes"]),
            "replayed_turns": int(m["fork/replayed_turns"]), "snapshots": int(m["fork/snapshots"]),
            "replay_or_restore_s": round(m["fork/replay_s"], 2), "snapshot_s": round(m["fork/snapshot_s"], 2),
            "sibling_start_s": round(start_s, 2), "rollout_wall_s": round(wall, 2),
            "episodes": [(ep.fork, [(t.action, t.observation) for t in ep.turns]) for ep in res.episodes]}


if __name__ == "__main__":
    main()
