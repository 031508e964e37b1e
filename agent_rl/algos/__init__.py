"""agent_rl.algos: the credit math as small pure torch functions (docs/algorithms.md; map: docs/algorithms_impl.md).

Imports only torch and the standard library. Dims: the package glossary of ``agent_rl.types`` (B rows, T response
tokens, L row length, E episodes, G group size, K turns, V vocabulary, N flattened tokens).

What the learner calls, by spec section:
    1  compute_advantages(name, rewards, group_index, episode_index=None, **kw) -> (B,)  (grpo, drgrpo, rloo,
       reinforce_pp, gigpo);  compute_gae(...);  dapo_overlong_penalty, dapo_keep_groups
    2  policy_loss(name, logprobs, old_logprobs, advantages, response_mask, ...) -> (loss, metrics); agg_loss;
       kl_penalty
    7  behaviour_weights(old_logprobs, behaviour_logprobs, response_mask, correction, cap) -> (w (B, T), metrics)
       (policy_loss applies them with behaviour_logprobs=...)
    0/3 logprobs_from_logits, entropy_from_logits, js_divergence_from_logits (chunked, (N, V) -> (N,)),
       js_divergence_rows (one chunk, torch.compile-friendly)
    3  tgrl_advantages, tgrl_token_weights, tgrl_delta_r, tgrl_metrics; AdaptiveHighTemperature (algo.t_high=auto)
    3b calibration_scores(records, t_low, t_high) -> {"pairs", "chosen", ...}; candidate_pairs; medium_tasks
       (algo.calibration=probe: pure Python, the probe's episodes are played by agent_rl.calibration)
    8  TAMPO: virtual_logprobs (chunk (n, V) -> (n, K)), episode_virtual_likelihoods, tampo_normalise (sparsemax /
       softmax / argmax), tampo_statistic (the batch statistic A_B), tampo_episode_sums (its additive part, per
       learner rank), tampo_meta_policy, tampo_nucleus, tampo_draw; TampoMetaPolicy (the driver's state);
       parse_temperature_schedule, scheduled_temperature (rollout.temperature_schedule)
    4  schedule_value(kind, step, total_steps, ...) -> S
    5  apply_credit(name, CreditInputs(...), S, level) -> (advantages (B, T), loss_mask (B, T));
       tp_mask, turn_tp_mask, forking_mask, entropy_adv, empg_advantages
    fork   fork_advantages(name, episode_rewards, episode_group_index, fork_base, fork_turn, token_turn,
           episode_index, response_mask) -> (B, T): forked groups' step-group advantages
    pipeline: advantage_plan(...) -> AdvantagePlan; token_advantages(plan, CreditInputs) runs
       base -> TGRL JS weights -> credit rule -> low-row mask -> clamp
Registries (decorator registration): register_adv_estimator, register_policy_loss, register_credit_rule,
register_schedule and get_* (see agent_rl.algos.registry).
"""

from .advantages import (
    compute_advantages,
    compute_gae,
    dapo_keep_groups,
    dapo_overlong_penalty,
    discounted_turn_returns,
    drgrpo_advantages,
    gigpo_advantages,
    gigpo_token_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from .calibration import calibration_scores, candidate_pairs, medium_tasks
from .credit import (
    CreditInputs,
    apply_credit,
    empg_advantages,
    entropy_adv,
    forking_mask,
    next_turn_values,
    tp_mask,
    turn_tp_mask,
)
from .fork import FORK_ESTIMATORS, fork_advantages
from .logits import (
    LN2,
    entropy_from_logits,
    js_divergence_from_logits,
    js_divergence_rows,
    logprobs_from_logits,
    truncate_logits,
    truncation_mask,
)
from .losses import (
    BEHAVIOUR_CORRECTIONS,
    agg_denominator,
    agg_loss,
    behaviour_weights,
    gspo_loss,
    kl_penalty,
    masked_mean,
    policy_loss,
    ppo_clip_loss,
)
from .registry import (
    ADV_ESTIMATORS,
    CREDIT_RULES,
    POLICY_LOSSES,
    SCHEDULES,
    AdvEstimator,
    AdvEstimatorFn,
    CreditLevel,
    CreditRuleFn,
    CreditRuleName,
    LossAgg,
    PolicyLossFn,
    PolicyLossName,
    Registry,
    ScheduleFn,
    ScheduleKind,
    get_adv_estimator,
    get_credit_rule,
    get_policy_loss,
    get_schedule,
    register_adv_estimator,
    register_credit_rule,
    register_policy_loss,
    register_schedule,
)
from .pipeline import (
    AdvantagePlan,
    advantage_plan,
    clamp_stage,
    js_weight_stage,
    low_row_stage,
    token_advantages,
)
from .schedules import schedule_progress, schedule_value
from .tampo import (TAMPO_NORMS, TAMPO_SCOPES, TAMPO_SUM_PREFIX, tampo_sum_metrics, TampoMetaPolicy, episode_virtual_likelihoods,
                    parse_temperature_schedule, scheduled_temperature, sparsemax, tampo_draw, tampo_episode_sums,
                    tampo_meta_policy, tampo_normalise, tampo_nucleus, tampo_statistic, virtual_logprobs)
from .tgrl import (AdaptiveHighTemperature, masked_row_quantile, tgrl_advantages, tgrl_delta_r, tgrl_metrics,
                   tgrl_token_weights)

__all__ = [
    # advantages (algorithms.md section 1)
    "compute_advantages",
    "grpo_advantages",
    "drgrpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "gigpo_advantages",
    "gigpo_token_advantages",
    "discounted_turn_returns",
    "compute_gae",
    "dapo_overlong_penalty",
    "dapo_keep_groups",
    # forked groups (docs/algorithms_impl.md)
    "fork_advantages",
    "FORK_ESTIMATORS",
    # losses (algorithms.md section 2)
    "policy_loss",
    "behaviour_weights",
    "BEHAVIOUR_CORRECTIONS",
    "agg_loss",
    "agg_denominator",
    "ppo_clip_loss",
    "gspo_loss",
    "kl_penalty",
    "masked_mean",
    # logits helpers (algorithms.md section 0, 3.3)
    "logprobs_from_logits",
    "truncate_logits",
    "truncation_mask",
    "entropy_from_logits",
    "js_divergence_from_logits",
    "js_divergence_rows",
    "LN2",
    # TGRL (algorithms.md section 3)
    "tgrl_token_weights",
    "AdaptiveHighTemperature",
    "tgrl_advantages",
    "tgrl_delta_r",
    "tgrl_metrics",
    "masked_row_quantile",
    # TGRL calibrated temperatures (algorithms.md section 3b)
    "calibration_scores",
    "candidate_pairs",
    "medium_tasks",
    # TAMPO (algorithms.md section 8)
    "TAMPO_NORMS",
    "TAMPO_SCOPES",
    "virtual_logprobs",
    "episode_virtual_likelihoods",
    "sparsemax",
    "tampo_normalise",
    "tampo_statistic",
    "tampo_episode_sums",
    "TAMPO_SUM_PREFIX",
    "tampo_sum_metrics",
    "tampo_meta_policy",
    "tampo_nucleus",
    "tampo_draw",
    "TampoMetaPolicy",
    "parse_temperature_schedule",
    "scheduled_temperature",
    # schedules (algorithms.md section 4)
    "schedule_value",
    "schedule_progress",
    # credit (algorithms.md section 5)
    "CreditInputs",
    "apply_credit",
    "tp_mask",
    "turn_tp_mask",
    "forking_mask",
    "entropy_adv",
    "empg_advantages",
    "next_turn_values",
    # the advantage pipeline (base -> JS weights -> credit -> low rows -> clamp)
    "AdvantagePlan",
    "advantage_plan",
    "js_weight_stage",
    "low_row_stage",
    "clamp_stage",
    "token_advantages",
    # registries
    "Registry",
    "ADV_ESTIMATORS",
    "POLICY_LOSSES",
    "CREDIT_RULES",
    "SCHEDULES",
    "AdvEstimator",
    "PolicyLossName",
    "CreditRuleName",
    "ScheduleKind",
    "LossAgg",
    "CreditLevel",
    "AdvEstimatorFn",
    "PolicyLossFn",
    "CreditRuleFn",
    "ScheduleFn",
    "register_adv_estimator",
    "register_policy_loss",
    "register_credit_rule",
    "register_schedule",
    "get_adv_estimator",
    "get_policy_loss",
    "get_credit_rule",
    "get_schedule",
]
