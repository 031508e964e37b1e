"""Issue 23, asynchronous rollouts (algorithms.md section 7): policy versions through the rows, the admission rule
of whole groups with hand-made versions, the synchronous golden runs, partial rollouts and resume under k = 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent_rl.distributed.data_parallel import shard_indices, take_shard
from agent_rl.rollout import build_rollout_batch
from agent_rl.types import Episode, Task, Turn


def _episode(group: int, versions: list[int], *, high: bool = False, reward: float = 0.0) -> Episode:
    """An episode of ``len(versions)`` turns (2 response tokens each) whose turn k was sampled by ``versions[k]``;
    turn k's prompt is the conversation so far (so it is valid in both row modes)."""
    turns, prompt = [], [1, 2]
    for v in versions:
        turns.append(Turn(prompt_ids=list(prompt), response_ids=[5, 6], response_logprobs=[-0.1, -0.2], action="a",
                          policy_version=v))
        prompt = prompt + [5, 6, 3]
    return Episode(task=Task("x", group_id=group), temperature=1.0, is_high=high, turns=turns, reward=reward)


def test_policy_versions_follow_every_response_token_in_both_row_modes_and_shards():
    eps = [_episode(0, [3, 4]), _episode(1, [2])]
    per_turn = build_rollout_batch(eps, pad_token_id=0)
    assert per_turn.policy_versions.dtype == torch.long
    assert per_turn.policy_versions.tolist() == [[-1, -1, 3, 3, -1, -1, -1],
                                                 [-1, -1, -1, -1, -1, 4, 4],
                                                 [-1, -1, 2, 2, -1, -1, -1]]
    traj = build_rollout_batch(eps, pad_token_id=0, mode="trajectory")
    assert traj.policy_versions.tolist() == [[-1, -1, 3, 3, -1, 4, 4], [-1, -1, 2, 2, -1, -1, -1]]
    # -1 exactly where no response token is trained
    assert torch.equal(traj.policy_versions >= 0, traj.response_mask > 0)
    shards = [take_shard(traj, rows, e) for rows, e in shard_indices(traj, 2)]
    assert sorted(s.policy_versions.tolist()[0][2] for s in shards) == [2, 3]
    assert traj.select_rows(torch.tensor([1])).policy_versions.tolist() == [[-1, -1, 2, 2, -1, -1, -1]]
    assert torch.equal(traj.to("cpu").policy_versions, traj.policy_versions)
