"""The learner step's metrics (names of algorithms.md section 6): the running weighted means of the PPO epochs'
micro-batch metrics, the asynchronous-rollout metrics, TAMPO's batch sums, and the step's summary row."""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from agent_rl import algos
from agent_rl.learner.config import AlgoConfig
from agent_rl.learner.outputs import OldPolicyOutputs, StepAdvantages
from agent_rl.types import RolloutBatch

#: policy-loss metrics that compare the new policy with the old one (reported from optimiser steps 2..n).
RATIO_METRICS = ("actor/clipfrac", "actor/approx_kl", "actor/pg_clipfrac_lower", "actor/ratio_mean")


class OptimiseStats:
    """Weighted means of the PPO epochs' metrics, the grad norms and the optimiser steps of one learner step."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.grad_norms: list[float] = []
        self.n_opt_steps = 0

    def add(self, name: str, value: Tensor | float, weight: float) -> None:
        """Add ``value`` with ``weight`` to the mean of ``name``."""
        self.sums[name] = self.sums.get(name, 0.0) + float(value) * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def add_micro(self, metrics: dict[str, Tensor], weight: float) -> None:
        """A micro-batch's metrics with ``weight`` (its trained tokens). The ratio statistics of the first optimiser
        step are trivial (the policy is the old one: ratio 1, clipfrac 0): they are reported from steps 2..n when
        there are several."""
        for k, v in metrics.items():
            self.add(f"first:{k}" if self.n_opt_steps == 1 and k in RATIO_METRICS else k, v, weight)

    def result(self, skipped: bool) -> dict[str, float]:
        """The ``actor/*`` / ``critic/*`` metrics of the step; ``skipped``: the step applied no update."""
        sums, weights = self.sums, self.weights
        out = {k: sums[k] / weights[k] if weights[k] > 0 else 0.0 for k in sums}
        out["actor/skipped_nonfinite"] = float(skipped)
        for k in RATIO_METRICS:  # a single optimiser step: its (trivial) ratio statistics are all there are
            first = out.pop(f"first:{k}", None)
            if k not in out and first is not None:
                out[k] = first
        out["actor/optimizer_steps"] = float(self.n_opt_steps)
        out.setdefault("actor/clipfrac", 0.0)  # no row carried gradient (e.g. all rewards of every group equal):
        out.setdefault("actor/approx_kl", 0.0)  # the policy did not move, ratio 1 everywhere
        out.setdefault("actor/pg_clipfrac_lower", 0.0)
        out.setdefault("actor/ratio_mean", 1.0)
        # no optimiser step because the advantages were non-finite: no grad norm (null), not 0
        grad_norms = self.grad_norms
        out["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else (
            math.nan if skipped else 0.0)
        return out


def async_metrics(algo: AlgoConfig, behaviour_correction: str, b: RolloutBatch, old: OldPolicyOutputs,
                  loss_mask: Tensor, step: int) -> dict[str, float]:
    """The asynchronous-rollout metrics of the step (algorithms.md section 7), over the trained tokens
    (``loss_mask`` > 0) of the whole batch, whether or not their row was forwarded in the grad pass:

    - ``async/staleness_mean`` / ``async/staleness_max``: staleness (step - 1) - v of each token, v its sampling
      version (``RolloutBatch.policy_versions``; a batch without it counts as sampled by version step - 1,
      staleness 0);
    - ``async/behaviour_weight_mean`` / ``_capped_frac`` / ``_zero_frac``: the behaviour weights the loss applied
      (:func:`agent_rl.algos.behaviour_weights` under the learner's ``behaviour_correction``; they depend on the
      no-grad pass only, so they are the same in every epoch and mini-batch).

    All 0 when there is no trained token (the weight mean then 0 too)."""
    trained = loss_mask > 0
    n = trained.sum().clamp_min(1)
    versions = getattr(b, "policy_versions", None)
    if versions is None:
        stale = torch.zeros_like(loss_mask)
    else:
        stale = ((step - 1) - versions.to(loss_mask.device).long()).to(loss_mask.dtype)  # (B, L)
    stale = torch.where(trained, stale, torch.zeros_like(stale))
    stale_max = float(stale.masked_fill(~trained, float("-inf")).max()) if bool(trained.any()) else 0.0
    _, w_metrics = algos.behaviour_weights(
        old.logprobs, b.engine_logprobs, loss_mask, behaviour_correction, algo.behaviour_weight_cap,
        sequence_level=algos.POLICY_LOSSES.meta(algo.policy_loss).get("sequence_level", False))
    return {
        "async/staleness_mean": float(stale.sum() / n),
        "async/staleness_max": stale_max,
        **{k: float(v) for k, v in w_metrics.items()},
    }


def tampo_sums(algo: AlgoConfig, b: RolloutBatch, old: OldPolicyOutputs, adv: StepAdvantages, pass_s: float
               ) -> dict[str, float]:
    """``tampo_sum/*`` of this batch (or rank shard): :func:`agent_rl.algos.tampo_episode_sums` of the episodes'
    token-mean virtual likelihoods (the union of an episode's turn rows) and GRPO advantages, plus
    ``time/tampo_s`` (this and ``pass_s``, the candidates' log-probs of the no-grad pass).

    Raises:
        ValueError: no episode-level advantages (an estimator other than grpo) or no candidates' log-probs.
    """
    t0 = time.perf_counter()
    if adv.episode_advantages is None or old.virtual_logprobs is None:
        raise ValueError(f"algo=tampo needs an episode-level advantage estimator (grpo), got "
                         f"algo.adv_estimator={algo.adv_estimator}")
    tc = algo.tampo
    ell, n_tok = algos.episode_virtual_likelihoods(old.virtual_logprobs, b.response_mask, b.episode_index)
    episodes = torch.unique(b.episode_index)  # (E,) ascending: the order of ell's rows
    sums = algos.tampo_episode_sums(ell, adv.episode_advantages[episodes], tc.temps, tc.norm, tc.norm_tau,
                                    n_tokens=n_tok)
    out = algos.tampo_sum_metrics(sums, tc.temps)
    out["time/tampo_s"] = time.perf_counter() - t0 + pass_s
    return out


def old_policy_metrics(algo: AlgoConfig, b: RolloutBatch, old: OldPolicyOutputs, loss_mask: Tensor, *, lr: float,
                       S: float) -> dict[str, float]:
    """The step's metrics read from the old policy's pass ``old`` over batch ``b`` and the trained tokens
    (``loss_mask`` (B, L)): ``actor/entropy`` (mean over response tokens), ``actor/lr`` (``lr``),
    ``actor/engine_logprob_diff`` (mean |old - engine| log-prob: the engine/learner mismatch),
    ``credit/trained_token_frac``, ``credit/js_mean`` (over TGRL's high rows, where JS was computed) and
    ``schedule/S`` (``S``)."""
    rm = b.response_mask  # (B, L) float 0/1
    n_resp = rm.sum().clamp_min(1.0)
    high_tok = rm * b.is_high[:, None].float() if algo.is_tgrl else rm  # where JS was computed
    return {
        "actor/entropy": float((old.entropy * rm).sum() / n_resp),
        "actor/lr": lr,
        "actor/engine_logprob_diff": float((torch.where(torch.isfinite(old.logprobs),
                                                        (old.logprobs - b.engine_logprobs).abs(), 0.0) * rm
                                            ).sum() / n_resp),
        "credit/trained_token_frac": float(loss_mask.sum() / n_resp),
        "credit/js_mean": float((old.js * high_tok).sum() / high_tok.sum().clamp_min(1.0)),
        "schedule/S": float(S),
    }


def token_stats(advantages: Tensor, loss_mask: Tensor, old: OldPolicyOutputs) -> dict[str, Tensor]:
    """``Learner.last_token_stats``: the step's advantages, loss mask, old log-probs, entropy and JS, each (B, L)
    float32 on CPU, aligned with ``input_ids``."""
    return {
        "advantages": advantages.detach().float().cpu(),
        "loss_mask": loss_mask.detach().float().cpu(),
        "old_logprobs": old.logprobs.detach().float().cpu(),
        "entropy": old.entropy.detach().float().cpu(),
        "js": old.js.detach().float().cpu(),
    }
