"""``build_rollout_batch``: episodes -> one padded :class:`~agent_rl.types.RolloutBatch` (the one place rows are made).

Per-turn mode (``mode="turn"``): every turn of every episode is a row, ``prompt_ids + response_ids``; only the
response positions carry ``response_mask`` 1. Full-trajectory mode (``mode="trajectory"``): one row per episode, the
last turn's prompt (which, in that mode, is the whole conversation so far: first prompt, responses, observation
tokens) plus the last response; every turn's response positions carry mask 1, observation tokens 0. A gateway
episode (``agent_rl.gateway``) whose program rewrote its history has several segments, whose turns do not extend
each other: one row per segment (:func:`segments`), in order, with ``turn_index`` the segment and ``num_turns`` their
number (an orchestrated episode: 0 and 1, one row).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from agent_rl.types import Episode, RolloutBatch, fork_base_indices
from envs.numbers import checked_reward

MODES = ("turn", "trajectory")


def observation_key(text: str) -> int:
    """Stable 63-bit key of an observation text (blake2b; identical across processes and runs, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") & (2 ** 63 - 1)


def _obs_keys(ep: Episode) -> list[int]:
    """Per turn, the key of the observation it acted on: turn k > 0 acted on turn k-1's observation; turn 0 on the
    task's initial state, which every episode of a group shares (same task instance and seed): key 0."""
    return [0] + [observation_key(t.observation) for t in ep.turns[:-1]]


def _trained(ep: Episode, k: int) -> float:
    """1.0 if turn ``k`` of ``ep`` is trained: not a forked sibling's replayed turn (``rollout.fork``: those are
    copies of the base's, trained once, on the base)."""
    return 0.0 if ep.fork is not None and k < ep.fork.turn else 1.0


def segments(ep: Episode) -> list[range]:
    """The turn ranges of ``ep``'s full-trajectory rows: runs of consecutive turns with the same ``Turn.segment`` (a
    gateway episode's segments, ``agent_rl.gateway``: a request that did not extend the conversation starts a new
    one); an orchestrated episode has one, all its turns."""
    starts = [k for k in range(len(ep.turns)) if k == 0 or ep.turns[k].segment != ep.turns[k - 1].segment]
    return [range(a, b) for a, b in zip(starts, starts[1:] + [len(ep.turns)])]


def _trajectory_row(ep: Episode, turns: range) -> tuple[list[int], list[float], list[float], list[int], list[int]]:
    """(ids, response_mask, logprobs, policy versions, token turns) of the full-trajectory row of ``ep``'s turns
    ``turns`` (one segment); turn k's response starts at len(turn_k.prompt_ids).

    Raises:
        ValueError: a turn of the segment whose prompt is not the conversation so far."""
    last = ep.turns[turns[-1]]
    ids = list(last.prompt_ids) + list(last.response_ids)
    mask = [0.0] * len(ids)
    logp = [0.0] * len(ids)
    version = [-1] * len(ids)
    turn_of = [-1] * len(ids)
    for k in turns:
        turn = ep.turns[k]
        start = len(turn.prompt_ids)
        if ids[start:start + len(turn.response_ids)] != list(turn.response_ids):
            raise ValueError("full-trajectory turns must extend each other (turn prompt = conversation so far)")
        for j, lp in enumerate(turn.response_logprobs):
            mask[start + j] = _trained(ep, k)
            logp[start + j] = float(lp)
            version[start + j] = int(turn.policy_version)
            turn_of[start + j] = k
    return ids, mask, logp, version, turn_of


def fork_extras(episodes: Sequence[Episode]) -> dict[str, torch.Tensor]:
    """``episode_fork_base`` (E,) long: a forked sibling's base (its index in ``episodes``: the episode of slot
    ``fork.base_slot`` among its group's base episodes), -1 for a base; ``episode_fork_turn`` (E,) long: the
    sibling's fork turn, -1 for a base (``agent_rl.algos.fork_advantages``).

    Raises:
        ValueError: a sibling whose group has no base episode of that slot."""
    found = fork_base_indices(list(episodes))
    base, turn = [], []
    for e, ep in enumerate(episodes):
        if ep.fork is not None and e not in found:
            raise ValueError(f"episode {e} is a fork of slot {ep.fork.base_slot}, which its group does not hold")
        base.append(found.get(e, -1))
        turn.append(ep.fork.turn if ep.fork is not None else -1)
    return {"episode_fork_base": torch.tensor(base, dtype=torch.long),
            "episode_fork_turn": torch.tensor(turn, dtype=torch.long)}


_Row = tuple[list[int], list[float], list[float], list[int], list[int]]
"""One batch row before padding: ids, response mask, engine log-probs, policy versions, each token's turn."""


def _episode_rows(episodes: Sequence[Episode], mode: str
                  ) -> tuple[list[_Row], list[tuple[float, int, int, bool, int, int, float]], dict[int, int]]:
    """The rows of ``episodes`` in ``mode`` (one per turn, or per trajectory segment), each row's metadata
    ``(temperature, group, episode, is_high, turn or segment, turns or segments, reward)``, and ``{task group id:
    group index}`` in order of first appearance (:func:`build_rollout_batch`; its errors)."""
    group_ids: dict[int, int] = {}
    rows: list[_Row] = []
    meta: list[tuple[float, int, int, bool, int, int, float]] = []  # temp, group, episode, high, turn, K, reward
    for e, ep in enumerate(episodes):
        if ep.failure is not None or not ep.turns:
            raise ValueError(f"episode {e} failed or has no turns ({ep.failure!r}); it must not be trained on")
        checked_reward(ep.reward, f"episode {e}'s reward")  # the orchestrators fail such an episode before this
        g = group_ids.setdefault(ep.task.group_id, len(group_ids))
        k_turns = len(ep.turns)
        if mode == "turn":
            for k, turn in enumerate(ep.turns):
                n_p, n_r = len(turn.prompt_ids), len(turn.response_ids)
                rows.append((list(turn.prompt_ids) + list(turn.response_ids), [0.0] * n_p + [_trained(ep, k)] * n_r,
                             [0.0] * n_p + [float(x) for x in turn.response_logprobs],
                             [-1] * n_p + [int(turn.policy_version)] * n_r, [-1] * n_p + [k] * n_r))
                meta.append((ep.temperature, g, e, ep.is_high, k, k_turns, ep.reward))
        else:
            parts = segments(ep)
            for s, turns in enumerate(parts):
                rows.append(_trajectory_row(ep, turns))
                meta.append((ep.temperature, g, e, ep.is_high, s, len(parts), ep.reward))
    return rows, meta, group_ids


def _pad_rows(rows: list[_Row], pad_token_id: int) -> tuple[torch.Tensor, ...]:
    """``rows`` right-padded to the longest (L): input_ids (B, L) long (``pad_token_id`` past a row), attention_mask
    (B, L) long, response_mask and engine_logprobs (B, L) float, policy_versions and token_turn (B, L) long (-1
    past a row)."""
    n_rows, length = len(rows), max(len(r[0]) for r in rows)
    input_ids = torch.full((n_rows, length), pad_token_id, dtype=torch.long)  # (B, L)
    attention_mask = torch.zeros(n_rows, length, dtype=torch.long)
    response_mask = torch.zeros(n_rows, length, dtype=torch.float32)
    engine_logprobs = torch.zeros(n_rows, length, dtype=torch.float32)
    policy_versions = torch.full((n_rows, length), -1, dtype=torch.long)
    token_turn = torch.full((n_rows, length), -1, dtype=torch.long)
    for i, (ids, mask, logp, version, turn_of) in enumerate(rows):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, :n] = 1
        response_mask[i, :n] = torch.tensor(mask)
        engine_logprobs[i, :n] = torch.tensor(logp)
        policy_versions[i, :n] = torch.tensor(version, dtype=torch.long)
        token_turn[i, :n] = torch.tensor(turn_of, dtype=torch.long)
    return input_ids, attention_mask, response_mask, engine_logprobs, policy_versions, token_turn


def _batch_extras(episodes: Sequence[Episode], mode: str, token_turn: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch's ``extras`` (:func:`build_rollout_batch`'s Returns); ``token_turn`` (B, L) from :func:`_pad_rows`."""
    extras = {
        "episode_won": torch.tensor([ep.won for ep in episodes], dtype=torch.bool),
        "response_lengths": torch.tensor([len(t.response_ids) for ep in episodes for t in ep.turns]),
    }
    if mode == "turn":
        extras["obs_key"] = torch.tensor([k for ep in episodes for k in _obs_keys(ep)], dtype=torch.long)
    else:  # GiGPO on trajectory rows (algos.gigpo_token_advantages): each turn's key, each token's turn
        k_max = max(len(ep.turns) for ep in episodes)
        extras["episode_turn_obs_key"] = torch.tensor([_obs_keys(ep) + [-1] * (k_max - len(ep.turns))
                                                       for ep in episodes], dtype=torch.long)
    if mode == "trajectory" or any(ep.fork is not None for ep in episodes):
        extras["token_turn"] = token_turn
    if any(ep.fork is not None for ep in episodes):
        extras.update(fork_extras(episodes))
    return extras


def build_rollout_batch(episodes: Sequence[Episode], *, pad_token_id: int, mode: str = "turn") -> RolloutBatch:
    """Pad the rows of finished episodes into a :class:`RolloutBatch`.

    Args:
        episodes: E episodes, none failed (``episode.failure is None``) and each with >= 1 turn; groups are the
            episodes' ``task.group_id`` values (remapped to 0..num_groups-1 in order of first appearance).
        pad_token_id: id written in padded positions (attention_mask and response_mask 0 there).
        mode: ``turn`` (B = total turns) or ``trajectory`` (B = E, or more: one row per segment of a gateway
            episode, :func:`segments`).

    Returns:
        RolloutBatch with input_ids/attention_mask (B, L) long, response_mask/engine_logprobs (B, L) float,
        policy_versions (B, L) long (each response token's ``Turn.policy_version``, -1 elsewhere), per-row
        temperature/group_index/episode_index/is_high/turn_index/num_turns/rewards (B,) (``turn_index``/``num_turns``:
        the turn k of K in per-turn mode; in full-trajectory mode the row's segment and the episode's segments, 0
        and 1 for an orchestrated episode: turn-level credit sees no turns inside a row), and per-episode
        episode_rewards/episode_group_index/episode_is_high (E,). L = longest row. ``rewards`` broadcasts
        ``episode.reward`` (already including any invalid-action penalty) to the episode's rows. ``extras``:
        ``episode_won`` (E,) bool (the env's ``won``; the learner's TGRL success rates), ``response_lengths`` (one per
        turn, in episode order; equals the rows only in per-turn mode), and in per-turn mode ``obs_key`` (B,) long:
        the observation each turn acted on (:func:`observation_key`; GiGPO's anchor states); in full-trajectory
        mode ``episode_turn_obs_key`` (E, K) long, the same keys per episode and turn (-1 past its last turn), and
        ``token_turn`` (B, L) long, the turn of each response token (-1 elsewhere). With forked siblings
        (``Episode.fork``, ``rollout.fork``): their replayed turns carry ``response_mask`` 0, and ``extras`` adds
        :func:`fork_extras` and ``token_turn`` (in either mode).

    Raises:
        ValueError: unknown mode, a failed or empty episode, no episodes; ``envs.numbers.RewardError`` (a
            ValueError) for an episode reward that is NaN, inf or beyond float32.
    """
    if mode not in MODES:
        raise ValueError(f"unknown rollout mode {mode!r}; valid: {list(MODES)}")
    if not episodes:
        raise ValueError("build_rollout_batch needs at least one episode")
    rows, meta, group_ids = _episode_rows(episodes, mode)
    input_ids, attention_mask, response_mask, engine_logprobs, policy_versions, token_turn = \
        _pad_rows(rows, pad_token_id)
    temp, grp, epi, high, turn, num, rew = zip(*meta)
    extras = _batch_extras(episodes, mode, token_turn)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        engine_logprobs=engine_logprobs,
        temperature=torch.tensor(temp, dtype=torch.float32),
        group_index=torch.tensor(grp, dtype=torch.long),
        episode_index=torch.tensor(epi, dtype=torch.long),
        is_high=torch.tensor(high, dtype=torch.bool),
        turn_index=torch.tensor(turn, dtype=torch.long),
        num_turns=torch.tensor(num, dtype=torch.long),
        rewards=torch.tensor(rew, dtype=torch.float32),
        episode_rewards=torch.tensor([ep.reward for ep in episodes], dtype=torch.float32),
        episode_group_index=torch.tensor([group_ids[ep.task.group_id] for ep in episodes], dtype=torch.long),
        episode_is_high=torch.tensor([ep.is_high for ep in episodes], dtype=torch.bool),
        policy_versions=policy_versions,
        extras=extras,
    )
