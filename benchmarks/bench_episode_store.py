"""Episode store: bytes on disk and write/read time per step for ALFWorld-sized episodes (docs/viewer.md, disk use).
Prints a table; asserts nothing.

    python benchmarks/bench_episode_store.py                         # 8 and 32 episodes x 30 turns x 40 tokens
    python benchmarks/bench_episode_store.py --episodes 8 --turns 50 --tokens 256   # ALFWorld's worst case

Episodes are synthetic (ALFWorld-like observation and response text, the SmolLM2 tokenizer, a ~2,000-character
first prompt) and the per-token numbers random normal float32 (full-length decimals: the largest files).
Times are wall seconds; the machine may be shared.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OBS = ("You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 1, a butterknife 2, a cup 1, "
       "a dishsponge 1, and a egg 2.")
RESPONSE = ("<think>I need to find a mug. The countertop might have one; let me go there and look carefully before "
            "I try the cabinets, drawers and the shelves on the other side of the room.</think>"
            "<action>go to countertop 1</action>")


def measure(tokenizer, n_episodes: int, n_turns: int, n_tokens: int) -> dict[str, float]:
    import torch

    from agent_rl.episodes import load_episodes, write_episodes
    from agent_rl.rollout.batch import build_rollout_batch
    from agent_rl.types import Episode, Task, Turn

    text = (RESPONSE + " ") * (1 + n_tokens // 40)
    rid = tokenizer.encode(text, add_special_tokens=False)[:n_tokens]
    prompt = tokenizer.encode("You are in the middle of a room. " * 60, add_special_tokens=False)
    eps = []
    for e in range(n_episodes):
        ep = Episode(task=Task("agent_rl/ALFWorld-v0", {"split": "train", "index": e // 4}, group_id=e // 4),
                     temperature=1.2 if e % 4 else 0.3, is_high=e % 4 > 0, task_type="pick_and_place")
        ep.turns = [Turn(prompt_ids=prompt, response_ids=rid, response_logprobs=[-0.5] * len(rid),
                         action="go to countertop 1", observation=OBS) for _ in range(n_turns)]
        eps.append(ep)
    batch = build_rollout_batch(eps, pad_token_id=0)
    gen = torch.Generator().manual_seed(0)
    shape = batch.input_ids.shape
    stats = {k: torch.randn(shape, generator=gen) for k in ("advantages", "old_logprobs", "entropy", "js")}
    stats["loss_mask"] = (torch.rand(shape, generator=gen) > 0.3).float()
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        path = write_episodes(d, 1, eps, tokenizer=tokenizer, batch=batch, token_stats=stats)
        write_s = time.perf_counter() - t0
        size = path.stat().st_size
        t0 = time.perf_counter()
        load_episodes(d, 1)
        read_s = time.perf_counter() - t0
    tokens = n_episodes * n_turns * len(rid)
    return {"episodes": n_episodes, "turns": n_turns, "tokens/turn": len(rid), "MB": size / 1e6,
            "KB/episode": size / n_episodes / 1e3, "B/token": size / tokens, "write_s": write_s, "read_s": read_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()

    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    _, tokenizer = load_policy(ModelConfig(name="tiny"))  # the SmolLM2 tokenizer
    rows = [measure(tokenizer, n, args.turns, args.tokens) for n in args.episodes]
    keys = list(rows[0])
    print(" | ".join(f"{k:>11}" for k in keys))
    for row in rows:
        print(" | ".join(f"{row[k]:>11.3g}" if isinstance(row[k], float) else f"{row[k]:>11}" for k in keys))


if __name__ == "__main__":
    main()
