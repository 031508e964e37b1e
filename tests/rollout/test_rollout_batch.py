"""``build_rollout_batch`` shapes and masks, worked by hand on 2 episodes x 3 turns (both modes); the parser."""

from __future__ import annotations

import pytest
import torch

from agent_rl.algos.credit import turn_tp_mask
from agent_rl.rollout import build_rollout_batch, parse_action
from agent_rl.rollout.batch import segments
from agent_rl.types import Episode, Task, Turn


def turn(prompt: list[int], resp: list[int], lp: list[float], *, invalid: bool = False) -> Turn:
    return Turn(prompt_ids=prompt, response_ids=resp, response_logprobs=lp, action="a", invalid=invalid)


def per_turn_episodes() -> list[Episode]:
    # Episode 0 (group 7, low T=0.3, reward 1): prompts of length 2, 3, 1; responses of length 1, 2, 2.
    e0 = Episode(task=Task("x", group_id=7), temperature=0.3, is_high=False, reward=1.0, won=True, turns=[
        turn([1, 2], [3], [-0.1]),
        turn([1, 2, 3], [4, 5], [-0.2, -0.3]),
        turn([9], [6, 7], [-0.4, -0.5]),
    ])
    # Episode 1 (group 7, high T=1.2, reward 0): prompts 1, 1, 2; responses 3, 1, 1.
    e1 = Episode(task=Task("x", group_id=7), temperature=1.2, is_high=True, reward=0.0, turns=[
        turn([1], [8, 8, 8], [-1.0, -1.1, -1.2]),
        turn([2], [8], [-1.3]),
        turn([2, 3], [8], [-1.4]),
    ])
    return [e0, e1]


def test_per_turn_rows_by_hand():
    b = build_rollout_batch(per_turn_episodes(), pad_token_id=0, mode="turn")
    # 6 rows; lengths 3, 5, 3, 4, 2, 3 -> L = 5.
    assert b.input_ids.shape == (6, 5)
    assert b.input_ids.tolist() == [
        [1, 2, 3, 0, 0],
        [1, 2, 3, 4, 5],
        [9, 6, 7, 0, 0],
        [1, 8, 8, 8, 0],
        [2, 8, 0, 0, 0],
        [2, 3, 8, 0, 0],
    ]
    assert b.attention_mask.tolist() == [
        [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert b.response_mask.tolist() == [
        [0, 0, 1, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]
    assert b.engine_logprobs[1].tolist() == pytest.approx([0, 0, 0, -0.2, -0.3])
    assert b.engine_logprobs[3].tolist() == pytest.approx([0, -1.0, -1.1, -1.2, 0])
    assert b.temperature.tolist() == pytest.approx([0.3] * 3 + [1.2] * 3)
    assert b.group_index.tolist() == [0] * 6  # group id 7 remapped to 0
    assert b.episode_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert b.is_high.tolist() == [False] * 3 + [True] * 3
    assert b.turn_index.tolist() == [0, 1, 2, 0, 1, 2]
    assert b.num_turns.tolist() == [3] * 6
    assert b.rewards.tolist() == [1.0] * 3 + [0.0] * 3
    assert b.episode_rewards.tolist() == [1.0, 0.0]
    assert b.episode_group_index.tolist() == [0, 0]
    assert b.episode_is_high.tolist() == [False, True]
    assert b.input_ids.dtype == torch.long and b.response_mask.dtype == torch.float32


def test_trajectory_rows_by_hand():
    # Full-trajectory turns: each prompt = the conversation so far (prev prompt + prev response + observation ids).
    e0 = Episode(task=Task("x", group_id=3), temperature=1.0, is_high=False, reward=0.5, turns=[
        turn([1, 2], [3], [-0.1]),
        turn([1, 2, 3, 9], [4, 5], [-0.2, -0.3]),
        turn([1, 2, 3, 9, 4, 5, 9, 9], [6], [-0.4]),
    ])
    e1 = Episode(task=Task("x", group_id=4), temperature=1.0, is_high=False, reward=1.0, turns=[
        turn([1], [7, 7], [-1.0, -1.1]),
        turn([1, 7, 7, 9], [8], [-1.2]),
        turn([1, 7, 7, 9, 8, 9], [6], [-1.3]),
    ])
    b = build_rollout_batch([e0, e1], pad_token_id=0, mode="trajectory")
    assert b.input_ids.tolist() == [[1, 2, 3, 9, 4, 5, 9, 9, 6], [1, 7, 7, 9, 8, 9, 6, 0, 0]]
    # responses at 2; 4-5; 8 (row 0) and 1-2; 4; 6 (row 1); observation tokens (9) and prompt carry 0.
    assert b.response_mask.tolist() == [[0, 0, 1, 0, 1, 1, 0, 0, 1], [0, 1, 1, 0, 1, 0, 1, 0, 0]]
    assert b.engine_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, 0, -0.2, -0.3, 0, 0, -0.4])
    assert b.engine_logprobs[1].tolist() == pytest.approx([0, -1.0, -1.1, 0, -1.2, 0, -1.3, 0, 0])
    assert b.attention_mask.sum(1).tolist() == [9, 7]
    assert b.group_index.tolist() == [0, 1] and b.episode_index.tolist() == [0, 1]
    # one row per episode: turn-level credit sees no turns inside it (turn 0 of 1; it was 0 of 3, and the turn-level
    # TP mask, which keeps turn k of K iff k >= floor(K S) or k = K - 1, dropped both rows at S = 0.5)
    assert b.turn_index.tolist() == [0, 0] and b.num_turns.tolist() == [1, 1]
    assert turn_tp_mask(b.turn_index, b.num_turns, 0.5).tolist() == [1.0, 1.0]
    assert b.rewards.tolist() == [0.5, 1.0]


def test_trajectory_rows_per_segment():
    """A gateway episode whose program rewrote its history (``Turn.segment``): one row per segment, by hand; the
    segment's turns extend each other, the new segment's prompt does not extend the old one."""
    ep = Episode(task=Task("x", group_id=0), temperature=1.0, is_high=True, reward=2.0, turns=[
        turn([1, 2], [3], [-0.1]),
        turn([1, 2, 3, 9], [4, 5], [-0.2, -0.3]),
        turn([8, 8], [6], [-0.4]),  # segment 1: the history rewritten
    ])
    for t, seg in zip(ep.turns, (0, 0, 1)):
        t.segment = seg
    assert [list(r) for r in segments(ep)] == [[0, 1], [2]]
    b = build_rollout_batch([ep], pad_token_id=0, mode="trajectory")
    assert b.input_ids.tolist() == [[1, 2, 3, 9, 4, 5], [8, 8, 6, 0, 0, 0]]
    assert b.response_mask.tolist() == [[0, 0, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0]]
    assert b.engine_logprobs[1].tolist() == pytest.approx([0, 0, -0.4, 0, 0, 0])
    assert b.episode_index.tolist() == [0, 0] and b.turn_index.tolist() == [0, 1] and b.num_turns.tolist() == [2, 2]
    assert b.rewards.tolist() == [2.0, 2.0] and b.episode_rewards.tolist() == [2.0]
    ep.turns[2].segment = 0  # the same turns claimed as one segment: refused, never merged
    with pytest.raises(ValueError, match="extend each other"):
        build_rollout_batch([ep], pad_token_id=0, mode="trajectory")


def test_an_envs_info_never_splits_a_trajectory_row():
    """An env's step info is the env's: an env that writes ``info["segment"]`` does not cut its episode's row."""
    ep = Episode(task=Task("x", group_id=0), temperature=1.0, is_high=False, reward=1.0, turns=[
        turn([1, 2], [3], [-0.1]),
        turn([1, 2, 3, 9], [4, 5], [-0.2, -0.3]),
    ])
    ep.turns[1].info["segment"] = 7
    b = build_rollout_batch([ep], pad_token_id=0, mode="trajectory")
    assert b.num_rows == 1 and b.input_ids.tolist() == [[1, 2, 3, 9, 4, 5]]


def test_failed_episode_and_bad_mode_rejected():
    eps = per_turn_episodes()
    eps[1].failure = "env: down"
    with pytest.raises(ValueError, match="failed"):
        build_rollout_batch(eps, pad_token_id=0)
    with pytest.raises(ValueError, match="valid"):
        build_rollout_batch(per_turn_episodes(), pad_token_id=0, mode="rows")


def test_trajectory_turns_must_extend():
    ep = per_turn_episodes()[0]  # per-turn prompts do not extend each other
    with pytest.raises(ValueError, match="extend"):
        build_rollout_batch([ep], pad_token_id=0, mode="trajectory")


@pytest.mark.parametrize("text, action, ok", [
    ("<think>look around</think><action>go to desk 1</action>", "go to desk 1", True),
    ("<action>open  drawer\n2</action> trailing", "open drawer 2", True),
    ("<action>a</action><action>b</action>", "b", True),  # the last complete tag wins
    ("<think>x</think><action>take mug 1 from desk 1", "take mug 1 from desk 1", True),  # cut by stop/budget
    ("just text", "just text", False),
    ("<action></action>", "", False),
    ("", "", False),
])
def test_parse_action(text, action, ok):
    parsed = parse_action(text)
    assert (parsed.action, parsed.well_formed) == (action, ok)


def test_parse_action_caps_length():
    assert len(parse_action("<action>" + "x" * 1000 + "</action>", max_chars=100).action) == 100
