"""Learner ranks as Ray actors for the parity tests (one place to start and stop them)."""

from __future__ import annotations

import ray

from agent_rl.distributed.actors import LearnerRank, LearnerSpec


def start_ranks(n: int, spec: LearnerSpec) -> list:
    """``n`` :class:`LearnerRank` actors (1 CPU each) joined in one gloo process group; returns their handles."""
    Rank = ray.remote(num_cpus=1)(LearnerRank)
    ranks = [Rank.remote(r, n, spec) for r in range(n)]
    addr, port = ray.get(ranks[0].address.remote())
    assert set(ray.get([r.setup.remote(addr, port) for r in ranks], timeout=240)) == {"gloo"}
    return ranks


def close_ranks(ranks: list) -> None:
    """Shut the ranks' process group down and kill the actors."""
    ray.get([r.shutdown.remote() for r in ranks])
    for r in ranks:
        ray.kill(r)
