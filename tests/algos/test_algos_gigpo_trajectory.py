"""GiGPO on full-trajectory rows (``gigpo_token_advantages``): hand-computed values and equality, token for token,
with GiGPO on per-turn rows of the same episodes (``build_rollout_batch`` in both modes)."""

import random

import pytest
import torch

from agent_rl.algos import compute_advantages, gigpo_token_advantages
from agent_rl.rollout.batch import build_rollout_batch
from agent_rl.types import Episode, Task, Turn


def test_gigpo_token_advantages_hand():
    # test_gigpo_hand's group (test_algos_advantages.py), as three trajectory rows: episode A (R 1) on observations
    # [10, 20, 30], B (R 0) on [10, 20], C (R 1) on [10]; per-turn values there:
    #   A [1.064021, 1.284456, 0.577350], B [-2.304876, -1.861806], C [1.240855]
    rewards = torch.tensor([1.0, 0.0, 1.0])
    groups = torch.zeros(3, dtype=torch.long)
    keys = torch.tensor([[10, 20, 30], [10, 20, -1], [10, -1, -1]])
    # columns: prompt, turn 0 x2, observation, turn 1, observation, turn 2, pad
    token_turn = torch.tensor([[-1, 0, 0, -1, 1, -1, 2, -1],
                               [-1, 0, 0, -1, 1, 1, -1, -1],
                               [-1, -1, 0, -1, -1, -1, -1, -1]])
    mask = (token_turn >= 0).float()
    got = gigpo_token_advantages(rewards, groups, keys, token_turn, torch.arange(3), mask)
    a, b, c = [1.064021, 1.284456, 0.577350], [-2.304876, -1.861806], [1.240855]
    want = torch.tensor([[0, a[0], a[0], 0, a[1], 0, a[2], 0],
                         [0, b[0], b[0], 0, b[1], b[1], 0, 0],
                         [0, 0, c[0], 0, 0, 0, 0, 0]])
    assert got.shape == (3, 8) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=3e-6, rtol=0)
    # a masked token outside its episode's turns is an error, not a silent 0
    bad = token_turn.clone()
    bad[2, 4], mask2 = 1, mask.clone()
    mask2[2, 4] = 1.0  # episode C has no turn 1
    with pytest.raises(ValueError, match="not one of its episode's turns"):
        gigpo_token_advantages(rewards, groups, keys, bad, torch.arange(3), mask2)
    with pytest.raises(ValueError, match=r"turn_obs_key must be \(E=3, K\)"):
        gigpo_token_advantages(rewards, groups, keys[:2], token_turn, torch.arange(3), mask)


def _episodes(rng: random.Random, n_groups: int = 3, group_size: int = 4, with_segments: bool = False
              ) -> list[Episode]:
    """Random trajectory-consistent episodes: each turn's prompt is the conversation so far; observations come from
    a small set, so anchor states repeat inside a group. With ``with_segments`` one episode has two segments (a
    gateway episode whose program rewrote its history)."""
    out = []
    for g in range(n_groups):
        for i in range(group_size):
            two_segments = with_segments and g == 0 and i == 0
            k_turns = rng.randint(3, 4) if two_segments else rng.randint(1, 4)
            seg_at = 2 if two_segments else None
            prompt, turns = [1, 2, 3], []
            for k in range(k_turns):
                if k == seg_at:
                    prompt = [1, 2, 9]  # the new segment's prompt does not extend the last one
                resp = [rng.randint(10, 50) for _ in range(rng.randint(1, 3))]
                obs = f"room {rng.randint(0, 2)}"
                turns.append(Turn(prompt_ids=list(prompt), response_ids=resp, response_logprobs=[-0.5] * len(resp),
                                  action="go", observation=obs,
                                  segment=int(seg_at is not None and k >= seg_at)))
                prompt = prompt + resp + [60 + rng.randint(0, 2)]
            reward = float(rng.random() < 0.5)
            out.append(Episode(task=Task(env_id="x", group_id=g), temperature=1.0, is_high=False, turns=turns,
                               reward=reward, won=reward > 0))
    return out


@pytest.mark.parametrize("seed,with_segments", [(0, False), (1, False), (2, True), (3, True)])
def test_gigpo_trajectory_rows_equal_turn_rows(seed, with_segments):
    """Invariant: for every episode e and turn k, the value per-turn GiGPO gives turn k's row equals the value on
    turn k's response tokens of e's trajectory row(s)."""
    rng = random.Random(seed)
    episodes = _episodes(rng, with_segments=with_segments)
    turn_b = build_rollout_batch(episodes, pad_token_id=0, mode="turn")
    traj_b = build_rollout_batch(episodes, pad_token_id=0, mode="trajectory")
    a_turn = compute_advantages("gigpo", turn_b.episode_rewards[turn_b.episode_index], turn_b.group_index,
                                episode_index=turn_b.episode_index, turn_index=turn_b.turn_index,
                                obs_key=turn_b.obs_key)
    ex = traj_b.extras
    a_traj = gigpo_token_advantages(traj_b.episode_rewards, traj_b.episode_group_index, ex["episode_turn_obs_key"],
                                    ex["token_turn"], traj_b.episode_index, traj_b.response_mask)
    assert bool((a_turn != 0).any()), "a group with unequal returns must give a nonzero advantage"
    rm = traj_b.response_mask > 0
    checked = 0
    for r in range(turn_b.num_rows):
        e, k = int(turn_b.episode_index[r]), int(turn_b.turn_index[r])
        at = rm & (ex["token_turn"] == k) & (traj_b.episode_index == e)[:, None]
        assert int(at.sum()) == len(episodes[e].turns[k].response_ids)
        torch.testing.assert_close(a_traj[at], a_turn[r].float().expand(int(at.sum())), atol=1e-6, rtol=0)
        checked += int(at.sum())
    assert checked == int(rm.sum())  # every trained token was compared
    assert bool((a_traj[~rm] == 0).all())
    if with_segments:
        assert traj_b.num_rows > len(episodes)  # the two-segment episode has two rows


def test_trajectory_batch_keeps_per_episode_keys_whole_when_rows_are_selected():
    """``episode_turn_obs_key`` is per episode (E, K): row selection (mini-batches) keeps it whole; ``token_turn``
    (B, L) goes with the rows."""
    episodes = _episodes(random.Random(5))
    b = build_rollout_batch(episodes, pad_token_id=0, mode="trajectory")
    sub = b.select_rows(torch.tensor([3, 1]))
    assert torch.equal(sub.extras["episode_turn_obs_key"], b.extras["episode_turn_obs_key"])
    assert torch.equal(sub.extras["token_turn"], b.extras["token_turn"][[3, 1]])
    assert b.extras["episode_turn_obs_key"].shape == (len(episodes), max(len(ep.turns) for ep in episodes))
