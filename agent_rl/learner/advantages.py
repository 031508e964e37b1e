"""The step's advantages (module docstring of ``agent_rl.learner.learner``, step 2): the advantage plan of the step,
the base estimator (episode-level, row-level GiGPO, GAE, or the step groups of forked episodes), then the token
pipeline ``agent_rl.algos.token_advantages``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agent_rl import algos
from agent_rl.learner.config import AlgoConfig, CreditConfig, ScheduleConfig
from agent_rl.learner.outputs import OldPolicyOutputs, StepAdvantages
from agent_rl.types import RolloutBatch


def check_names(algo: AlgoConfig, credit: CreditConfig, schedule: ScheduleConfig) -> None:
    """Check the registry names of the configs (policy loss, estimator unless a critic, credit rule at its level,
    schedule) and the credit's kwargs.

    Raises:
        ValueError: an unknown name (the registry's message lists the valid ones), a credit rule at a level it does
            not define, or ``credit.kwargs.quantile_clip`` (the JS percentile clip is ``algo.js_quantile_clip``).
    """
    algos.get_policy_loss(algo.policy_loss)
    if not algo.uses_critic:
        algos.get_adv_estimator(algo.adv_estimator)
    levels = algos.CREDIT_RULES.meta(credit.name).get("levels", ("token", "turn"))
    if credit.level not in levels:
        raise ValueError(f"credit={credit.name} is not defined at credit.level={credit.level}; "
                         f"it supports {list(levels)}")
    algos.get_schedule(schedule.kind)
    if "quantile_clip" in credit.kwargs:  # one key for one idea
        raise ValueError("credit.kwargs.quantile_clip is not read: the JS percentile clip is algo.js_quantile_clip")


def step_plan(algo: AlgoConfig, credit: CreditConfig, schedule: ScheduleConfig, step: int, total_steps: int
              ) -> algos.AdvantagePlan:
    """The step's advantage plan (``algos.advantage_plan``) at the schedule's strength S: it decides both whether
    the no-grad pass computes JS (``js_strength is not None``) and which pipeline stages run."""
    S = schedule.value if schedule.value is not None else algos.schedule_value(
        schedule.kind, step, total_steps, m=schedule.m,
        s_min_ratio=schedule.s_min_ratio, s_max_ratio=schedule.s_max_ratio)
    return algos.advantage_plan(
        is_tgrl=algo.is_tgrl, warmup=algo.in_warmup(step), credit=credit.name, level=credit.level,
        S=S, scheduled=schedule.kind != "none" or schedule.value is not None, adv_clip=algo.adv_clip,
        low_rows_in_denominator=algo.low_rows_in_denominator)


def credit_inputs(b: RolloutBatch, old: OldPolicyOutputs | None, advantages: Tensor, rm: Tensor) -> Any:
    """The credit pipeline's inputs (``algos.CreditInputs``) of batch ``b``: base ``advantages`` and response mask
    ``rm`` (B, L) or (B,), the old policy's entropy and JS when there was a no-grad pass."""
    return algos.CreditInputs(
        advantages=advantages, response_mask=rm, turn_index=b.turn_index, num_turns=b.num_turns,
        episode_index=b.episode_index, entropy=None if old is None else old.entropy,
        js=None if old is None else old.js, is_high=b.is_high)


def episode_rewards(algo: AlgoConfig, b: RolloutBatch) -> Tensor:
    """(E,) float episode rewards, with DAPO overlong shaping (``algo.dapo_overlong``): each episode gets the mean
    penalty of its turns' lengths.

    Raises:
        ValueError: ``algo.dapo_overlong`` without ``algo.dapo_overlong_max_len > 0``.
    """
    rm = b.response_mask
    ep_rewards = b.episode_rewards.float()
    if algo.dapo_overlong:
        if algo.dapo_overlong_max_len <= 0:
            raise ValueError("algo.dapo_overlong needs algo.dapo_overlong_max_len > 0")
        pen = algos.dapo_overlong_penalty(rm.sum(-1), algo.dapo_overlong_max_len, algo.dapo_overlong_cache_len)
        e = ep_rewards.shape[0]
        tot = torch.zeros(e, device=rm.device).index_add_(0, b.episode_index, pen)
        cnt = torch.zeros(e, device=rm.device).index_add_(0, b.episode_index, torch.ones_like(pen))
        ep_rewards = ep_rewards + tot / cnt.clamp_min(1.0)
    return ep_rewards


def base_advantages(algo: AlgoConfig, b: RolloutBatch, old: OldPolicyOutputs | None, ep_rewards: Tensor
                    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Stage 1, the base estimator of ``algo``: ``(base_adv, returns, episode_advantages)``; ``base_adv`` (B,)
    (episode-level, broadcast to rows) or (B, L) (forked step groups, trajectory GiGPO, GAE); ``returns`` (B, L) for
    GAE, else None; ``episode_advantages`` (E,) for an episode-level estimator, else None.

    Raises:
        ValueError: a fork with a critic; GAE without old values; a row-level estimator without observation keys.
    """
    rm = b.response_mask
    device = rm.device
    if "episode_fork_base" in (b.extras or {}):  # rollout.fork: the step-group estimator, (B, L)
        if algo.uses_critic:
            raise ValueError("rollout.fork does not combine with a critic (algo=ppo): use grpo, drgrpo or rloo")
        ex = b.extras
        return algos.fork_advantages(algo.adv_estimator, ep_rewards, b.episode_group_index,
                                     ex["episode_fork_base"], ex["episode_fork_turn"], ex["token_turn"],
                                     b.episode_index, rm, std=algo.std), None, None
    if algo.uses_critic:
        # GAE per row: the row's (episode) reward on its last response token, values from the value head.
        last = (rm * torch.arange(rm.shape[1], device=device)).argmax(-1)  # (B,) last response column
        token_rewards = torch.zeros_like(rm)
        token_rewards[torch.arange(rm.shape[0]), last] = ep_rewards[b.episode_index]
        if old is None:
            raise ValueError("GAE needs the old values of the no-grad pass (old=None)")
        adv, returns = algos.compute_gae(token_rewards, old.values, rm, algo.gamma, algo.lam)
        mean = (adv * rm).sum() / rm.sum().clamp_min(1.0)  # whiten over the batch's response tokens
        var = (((adv - mean) * rm) ** 2).sum() / rm.sum().clamp_min(1.0)
        return torch.where(rm > 0, (adv - mean) / (var.sqrt() + 1e-8), 0.0), returns, None
    if algos.ADV_ESTIMATORS.meta(algo.adv_estimator).get("row_level", False):
        # row-level estimators (gigpo) see every turn row: rewards broadcast, episodes, turns, observation keys
        ex = b.extras or {}
        if b.obs_key is not None:
            return algos.compute_advantages(
                algo.adv_estimator, ep_rewards[b.episode_index], b.group_index,
                episode_index=b.episode_index, turn_index=b.turn_index, obs_key=b.obs_key, std=algo.std), None, None
        if "episode_turn_obs_key" in ex and "token_turn" in ex:  # trajectory rows: per-turn values on tokens
            return algos.gigpo_token_advantages(ep_rewards, b.episode_group_index, ex["episode_turn_obs_key"],
                                                ex["token_turn"], b.episode_index, rm, std=algo.std), None, None
        raise ValueError(f"algo.adv_estimator={algo.adv_estimator} needs each turn's observation key "
                         "(RolloutBatch.extras['obs_key'] in per-turn mode; 'episode_turn_obs_key' and "
                         "'token_turn' in full-trajectory mode: build_rollout_batch writes them)")
    ep_adv = algos.compute_advantages(algo.adv_estimator, ep_rewards, b.episode_group_index, std=algo.std)
    base_adv = ep_adv[b.episode_index]  # (E,) -> (B,) broadcast to the episode's rows
    return base_adv, None, ep_adv if base_adv.dim() == 1 else None


def step_advantages(algo: AlgoConfig, credit: CreditConfig, plan: algos.AdvantagePlan, b: RolloutBatch,
                    old: OldPolicyOutputs | None) -> StepAdvantages:
    """The token advantages and loss mask of batch ``b`` (on the learner's device) under ``plan``: stage 1
    (:func:`base_advantages`), stages 2-5 by ``agent_rl.algos.token_advantages`` (``agent_rl/algos/pipeline.py``).
    ``old=None``: from the rewards alone (the single pass). Errors: those of :func:`episode_rewards` and
    :func:`base_advantages`."""
    base_adv, returns, ep_adv = base_advantages(algo, b, old, episode_rewards(algo, b))
    advantages, loss_mask = algos.token_advantages(
        plan, credit_inputs(b, old, base_adv, b.response_mask), quantile_clip=algo.js_quantile_clip,
        credit_kwargs=credit.kwargs)
    return StepAdvantages(advantages=advantages, loss_mask=loss_mask, returns=returns, S=plan.S, plan=plan,
                          episode_advantages=ep_adv)
