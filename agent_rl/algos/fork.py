"""Forked groups' step-group advantages (spec and hand-computed example: docs/algorithms_impl.md, "Forked
groups").

A task's G base episodes keep their group advantage; from a base b at fork turn t, K siblings replay b's turns
0..t-1 and sample onward. b and its siblings from (b, t) form a step group S(b, t) that shares the state at turn t
exactly, so its returns give a state baseline. Token-level: a base token of turn k gets the group advantage before
b's first fork turn, the step-group advantage of the latest fork turn t <= k from there; a sibling token of turn
k >= t gets its step-group advantage, its replayed turns k < t get 0 (their ``response_mask`` is 0 too).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._groups import as_float, check_1d, check_2d
from .advantages import compute_advantages
from .registry import as_name

__all__ = ["fork_advantages", "FORK_ESTIMATORS"]

#: outcome estimators with a per-group baseline: the ones a step group can use (reinforce_pp whitens over the batch,
#: gigpo and GAE bring their own step or critic credit).
FORK_ESTIMATORS = ("grpo", "drgrpo", "rloo")


@torch.no_grad()
def fork_advantages(name: Any, episode_rewards: Tensor, episode_group_index: Tensor, fork_base: Tensor,
                    fork_turn: Tensor, token_turn: Tensor, episode_index: Tensor, response_mask: Tensor,
                    **kwargs: Any) -> Tensor:
    """Token advantages of a batch with forked groups (docs/algorithms_impl.md, "Forked groups").

    Args:
        name: the outcome estimator (``algo.adv_estimator``), one of :data:`FORK_ESTIMATORS`.
        episode_rewards: (E,) float, R of each episode. episode_group_index: (E,) long, its task group.
        fork_base: (E,) long, for a sibling the episode index (0..E-1) of its base, -1 for a base episode.
        fork_turn: (E,) long, a sibling's fork turn t >= 1 (its turns 0..t-1 were replayed), -1 for a base.
        token_turn: (B, T) long, the 0-based turn each response token belongs to (any value where the mask is 0).
        episode_index: (B,) long, each row's episode (0..E-1).
        response_mask: (B, T) 0/1.
        **kwargs: passed to the estimator (``std``, ``eps``).
    Returns:
        (B, T) float32 advantages, 0 where ``response_mask`` is 0 and on a sibling's replayed turns.
    Raises:
        ValueError: an estimator without a per-group baseline, bad shapes, a sibling whose base is a sibling, out of
            range or in another group, or a fork turn < 1.
    """
    est = as_name(name)
    if est not in FORK_ESTIMATORS:
        raise ValueError(f"forked groups need an estimator with a per-group baseline ({', '.join(FORK_ESTIMATORS)}); "
                         f"got algo.adv_estimator={est}")
    r = as_float(episode_rewards)
    check_1d("episode_rewards", r)
    e = r.shape[0]
    for nm, x in (("episode_group_index", episode_group_index), ("fork_base", fork_base), ("fork_turn", fork_turn)):
        check_1d(nm, x, e)
    check_2d("response_mask", response_mask)
    check_2d("token_turn", token_turn, tuple(response_mask.shape))
    check_1d("episode_index", episode_index, response_mask.shape[0])
    base_of, turn_of = fork_base.long(), fork_turn.long()
    group = episode_group_index.long()
    is_base = base_of < 0
    sib = (~is_base).nonzero().flatten()  # (n_sib,)
    bases_of_sib = base_of[sib]
    if sib.numel():
        if bool((bases_of_sib >= e).any()) or bool((~is_base[bases_of_sib.clamp(0, e - 1)]).any()):
            raise ValueError("fork_base must name a base episode (fork_base -1) of the batch")
        if bool((group[bases_of_sib] != group[sib]).any()):
            raise ValueError("a sibling and its base must be in the same group")
        if bool((turn_of[sib] < 1).any()):
            raise ValueError("a sibling's fork_turn must be >= 1 (turn 0 is the reset state: a base episode)")
    ep_adv = torch.zeros(e, dtype=torch.float64, device=r.device)  # the advantage of each episode's own group
    base_rows = is_base.nonzero().flatten()
    ep_adv[base_rows] = compute_advantages(est, r[base_rows].double(), group[base_rows], **kwargs)
    # step groups: one per (base, fork turn); members = its siblings + the base
    pairs = torch.stack([bases_of_sib, turn_of[sib]], dim=1)  # (n_sib, 2)
    keys, sg_of_sib = (torch.unique(pairs, dim=0, return_inverse=True) if sib.numel()
                       else (pairs, torch.zeros(0, dtype=torch.long, device=r.device)))
    n_sg = keys.shape[0]
    values = torch.cat([r[sib].double(), r[keys[:, 0]].double()])  # siblings, then each step group's base
    labels = torch.cat([sg_of_sib, torch.arange(n_sg, device=r.device)])
    a_step = compute_advantages(est, values, labels, **kwargs) if values.numel() else values
    ep_adv[sib] = a_step[:sib.numel()]
    base_step = a_step[sib.numel():]  # (n_sg,) the base's advantage in each of its step groups
    # tokens: each row starts from its episode's own-group value (bases) or its step-group value (siblings)
    row_ep = episode_index.long()
    turn = token_turn.long()
    adv = ep_adv[row_ep][:, None].expand(turn.shape).clone()  # (B, T)
    row_fork_turn = turn_of[row_ep]  # (B,) -1 for base rows
    adv = torch.where((row_fork_turn[:, None] >= 0) & (turn < row_fork_turn[:, None]), torch.zeros_like(adv), adv)
    for s in torch.argsort(keys[:, 1]).tolist() if n_sg else []:  # ascending fork turn: the latest fork wins
        b, t = int(keys[s, 0]), int(keys[s, 1])
        at = (row_ep == b)[:, None] & (turn >= t)
        adv = torch.where(at, base_step[s], adv)
    return torch.where(response_mask > 0, adv, torch.zeros_like(adv)).float()
