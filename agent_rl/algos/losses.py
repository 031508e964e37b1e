"""Policy losses (algorithms.md §2), loss aggregation and the KL penalty. Pure torch; differentiable in ``logprobs``.

Dims: B rows, T response tokens (in the learner T == L: prompt, padding and observation positions carry mask 0).

Metrics: every metric returned here is a **0-dim detached tensor** (no ``.item()``, so no device sync per
micro-batch); call ``float(v)`` when logging. Keys follow algorithms.md §6: ``actor/pg_loss``, ``actor/clipfrac``,
``actor/approx_kl``, plus ``actor/pg_clipfrac_lower`` (dual-clip fraction) and ``actor/ratio_mean``; the behaviour
weights of the off-policy correction (:func:`behaviour_weights`, algorithms.md section 7) report
``async/behaviour_weight_mean``, ``async/behaviour_weight_capped_frac``, ``async/behaviour_weight_zero_frac``.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import Tensor

from ._groups import check_2d
from .registry import POLICY_LOSSES, LossAgg, PolicyLossName, as_name, get_policy_loss, register_policy_loss

__all__ = ["policy_loss", "agg_loss", "agg_denominator", "ppo_clip_loss", "gspo_loss", "kl_penalty", "masked_mean",
           "behaviour_weights", "BEHAVIOUR_CORRECTIONS"]

_LOG_RATIO_CLAMP = 20.0  # algorithms.md section 2: exp(clamp(logp - old_logp, -20, 20))

#: the corrections :func:`behaviour_weights` applies (``algo.behaviour_correction`` after ``auto`` is resolved by
#: ``agent_rl.learner.config.resolve_behaviour_correction``).
BEHAVIOUR_CORRECTIONS = ("tis", "mask", "none")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask > 0`` (same shapes); 0 when the mask is empty. Returns a 0-dim tensor."""
    m = mask > 0
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp_min(1)


def _broadcast_adv(advantages: Tensor, like: Tensor) -> Tensor:
    """(B,) or (B, T) advantages -> (B, T)."""
    if advantages.dim() == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(f"advantages (B,) has B={advantages.shape[0]}, expected {like.shape[0]}")
        return advantages[:, None].expand_as(like)  # (B,) -> (B, T)
    check_2d("advantages", advantages, tuple(like.shape))
    return advantages


def agg_denominator(response_mask: Tensor, loss_agg: str | Enum = "token_mean") -> Tensor:
    """The normaliser of :func:`agg_loss` for ``loss_agg`` over ``response_mask`` (B, T): the number of masked
    tokens (``token_mean``), of rows with >= 1 masked token (``seq_mean_token_mean``), or of rows B
    (``seq_mean_token_sum_norm``, whose ``L_max`` factor :func:`agg_loss` applies itself). At least 1.

    The learner computes it once per mini-batch and passes it as ``denominator=`` to each micro-batch's
    :func:`agg_loss`, so the summed micro-batch losses equal the mini-batch loss.

    Raises:
        ValueError: unknown ``loss_agg``.
    """
    mode = as_name(loss_agg)
    m = (response_mask > 0).float()
    if mode == LossAgg.TOKEN_MEAN.value:
        return m.sum().clamp_min(1.0)
    if mode == LossAgg.SEQ_MEAN_TOKEN_MEAN.value:
        return (m.sum(-1) > 0).float().sum().clamp_min(1.0)
    if mode == LossAgg.SEQ_MEAN_TOKEN_SUM_NORM.value:
        return torch.tensor(float(max(m.shape[0], 1)), device=m.device)
    raise ValueError(f"unknown loss_agg {mode!r} (algo.loss_agg); valid names: {[e.value for e in LossAgg]}")


def agg_loss(
    loss_mat: Tensor,
    response_mask: Tensor,
    loss_agg: str | Enum = "token_mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """Aggregate per-token losses (``algo.loss_agg``, algorithms.md section 2).

    - ``token_mean``: sum of masked token losses / number of masked tokens (default).
    - ``seq_mean_token_mean``: per-row mean over its masked tokens, then mean over rows that have >= 1 masked token.
    - ``seq_mean_token_sum_norm`` (Dr.GRPO): per-row sum / ``max_len``, then mean over all B rows, i.e.
      ``sum / (B * L_max)``, a constant divisor.

    Args:
        loss_mat: (B, T) per-token losses.
        response_mask: (B, T) 0/1; masked-out entries never enter (even if non-finite).
        loss_agg: one of the three names.
        max_len: L_max for ``seq_mean_token_sum_norm``; None = T. In the learner T includes the prompt, so pass the
            configured maximum *response* length.
        denominator: replaces the normaliser (token count for ``token_mean``, row count for the ``seq_mean_*``
            modes), e.g. the count over the whole mini-batch when a mini-batch is split into micro-batches whose
            losses are summed.
    Returns:
        0-dim loss. An empty mask gives 0 (never NaN).
    Raises:
        ValueError: unknown ``loss_agg`` (lists the valid names), bad shapes, or ``max_len <= 0``.
    """
    check_2d("loss_mat", loss_mat)
    check_2d("response_mask", response_mask, tuple(loss_mat.shape))
    mode = as_name(loss_agg)
    m = response_mask > 0
    lm = torch.where(m, loss_mat, torch.zeros_like(loss_mat))
    mf = m.to(lm.dtype)
    den = agg_denominator(response_mask, mode) if denominator is None else denominator
    if mode == LossAgg.TOKEN_MEAN.value:
        return lm.sum() / den
    if mode == LossAgg.SEQ_MEAN_TOKEN_MEAN.value:
        row_mean = lm.sum(-1) / mf.sum(-1).clamp_min(1.0)  # (B,)
        return row_mean.sum() / den
    if mode == LossAgg.SEQ_MEAN_TOKEN_SUM_NORM.value:
        l_max = float(max_len) if max_len is not None else float(loss_mat.shape[-1])
        if l_max <= 0:
            raise ValueError(f"max_len must be > 0, got {max_len}")
        return (lm.sum(-1) / l_max).sum() / den
    raise ValueError(f"unknown loss_agg {mode!r} (algo.loss_agg); valid names: {[e.value for e in LossAgg]}")


def behaviour_weights(
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    response_mask: Tensor,
    correction: str = "tis",
    cap: float = 2.0,
    sequence_level: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Behaviour weights of the off-policy correction (algorithms.md section 7, "Off-policy correction").

    The ratio of the proximal (old) policy to the behaviour policy that sampled is ``rho = exp(old_logp -
    logp_beh)`` per token; with ``sequence_level`` (GSPO) one per row, ``rho = exp(mean_t (old_logp - logp_beh))``
    over the row's masked tokens. Then, with C = ``cap``:

    - ``tis`` (truncated importance sampling, Yao et al. 2025): ``w = min(rho, C)``;
    - ``mask`` (AReaL's decoupled PPO, Fu et al. 2025): ``w = 0`` where ``rho > C``, else 1;
    - ``none``: ``w = 1``.

    In every mode a token whose old log-prob is not finite (``-inf``: the sampled token lies outside the learner's
    top-k / top-p truncation at the row's temperature) gets ``w = 0`` and is left out of its row's sequence mean.
    No NaN or inf comes out (``logp_beh = -inf`` gives ``rho = inf``, capped to C). The weights carry no gradient
    (the inputs are detached).

    Args:
        old_logprobs: (B, T) log-probs of the learner's no-grad pass (nats); may hold ``-inf``.
        behaviour_logprobs: (B, T) the engine's log-probs of the sampled tokens (``RolloutBatch.engine_logprobs``).
        response_mask: (B, T) 0/1, the trained tokens.
        correction: ``tis`` | ``mask`` | ``none``. cap: C, > 1 (``inf`` allowed: plain importance sampling).
        sequence_level: one weight per row (``register_policy_loss(..., sequence_level=True)``, GSPO).
    Returns:
        ``(w, metrics)``: w (B, T) float, 0 off the mask; metrics, 0-dim detached tensors over the masked tokens:
        ``async/behaviour_weight_mean`` (mean w), ``async/behaviour_weight_capped_frac`` (fraction where the cap
        acted: ``rho > C``, so w = C under ``tis``, w = 0 under ``mask``; 0 under ``none``),
        ``async/behaviour_weight_zero_frac`` (fraction with w = 0: non-finite old log-probs, under ``mask`` also the
        capped tokens).
    Raises:
        ValueError: unknown ``correction``, ``cap <= 1``, bad shapes.
    """
    check_2d("old_logprobs", old_logprobs)
    check_2d("behaviour_logprobs", behaviour_logprobs, tuple(old_logprobs.shape))
    check_2d("response_mask", response_mask, tuple(old_logprobs.shape))
    if correction not in BEHAVIOUR_CORRECTIONS:
        raise ValueError(f"unknown behaviour correction {correction!r}; valid: {list(BEHAVIOUR_CORRECTIONS)}")
    if not float(cap) > 1.0:
        raise ValueError(f"behaviour weight cap must be > 1, got {cap}")
    old = old_logprobs.detach()
    beh = behaviour_logprobs.detach().to(old.dtype)
    m = response_mask > 0
    valid = m & torch.isfinite(old)  # (B, T) tokens that can carry a weight
    log_rho = torch.where(valid, old - beh, torch.zeros_like(old))  # (B, T); +inf where logp_beh = -inf
    if sequence_level:
        n_valid = valid.sum(-1).clamp_min(1).to(old.dtype)  # (B,)
        log_rho = (log_rho.sum(-1) / n_valid)[:, None].expand_as(old)  # (B,) -> (B, T): mean_t over valid tokens
    rho = torch.exp(log_rho)
    capped = valid & (rho > cap)
    if correction == "tis":
        w = torch.where(capped, torch.full_like(rho, float(cap)), rho)  # min(rho, C)
    elif correction == "mask":
        w = (~capped).to(old.dtype)
    else:
        w = torch.ones_like(old)
    w = torch.where(valid, w, torch.zeros_like(w))
    metrics = {
        "async/behaviour_weight_mean": masked_mean(w, response_mask),
        "async/behaviour_weight_capped_frac": masked_mean((capped & (correction != "none")).to(old.dtype),
                                                          response_mask),
        "async/behaviour_weight_zero_frac": masked_mean((w == 0).to(old.dtype), response_mask),
    }
    return w, metrics


def policy_loss(
    name: str | Enum,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    loss_agg: str | Enum = "token_mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
    behaviour_correction: str = "none",
    behaviour_weight_cap: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy-gradient loss by registered name (``algo.policy_loss``), aggregated by ``loss_agg``, each token's (or,
    for a ``sequence_level`` loss such as ``gspo``, each row's) term multiplied by its behaviour weight w
    (:func:`behaviour_weights`; algorithms.md section 7). The weight applies here, to every registered loss alike;
    the aggregation's denominator is the one of ``response_mask``, unchanged by the weights.

    Tokens whose ``old_logprobs`` are not finite (``-inf``: outside the learner's top-k / top-p truncation) are
    removed from the loss (w = 0) without NaN in the loss or its gradient: the loss function sees them with log-probs
    0 and mask 0, so they also stay out of its ratio statistics. With ``behaviour_correction="none"`` (or no
    ``behaviour_logprobs``) and finite old log-probs the loss and gradients are exactly the unweighted ones.

    Args:
        name: ``ppo_clip`` | ``gspo`` | a name added with :func:`register_policy_loss`.
        logprobs: (B, T) current-policy log-probs (with grad), at the row's temperature.
        old_logprobs: (B, T) old-policy log-probs (no grad; the learner's no-grad pass), same temperature.
        advantages: (B,) per row or (B, T) per token.
        response_mask: (B, T) 0/1 loss mask (after credit rules).
        clip_low, clip_high: eps_low, eps_high of the ratio clip (DAPO uses 0.2 / 0.28).
        dual_clip: c of the dual clip for A < 0 (None disables); ``ppo_clip`` only.
        loss_agg, max_len, denominator: see :func:`agg_loss`.
        behaviour_logprobs: (B, T) the engine's log-probs of the sampled tokens (``RolloutBatch.engine_logprobs``);
            None: no correction (w = 1 on finite tokens).
        behaviour_correction: ``tis`` | ``mask`` | ``none``. behaviour_weight_cap: C (> 1).
    Returns:
        ``(loss, metrics)``: 0-dim loss; metrics are 0-dim detached tensors: ``actor/pg_loss`` (the aggregated loss),
        ``actor/clipfrac``, ``actor/approx_kl``, ``actor/pg_clipfrac_lower``, ``actor/ratio_mean``, and with
        ``behaviour_logprobs`` the ``async/behaviour_weight_*`` metrics of :func:`behaviour_weights`.
    Raises:
        ValueError: unknown name / aggregation / correction, bad shapes, cap <= 1.
    """
    fn = get_policy_loss(name)
    check_2d("logprobs", logprobs)
    check_2d("old_logprobs", old_logprobs, tuple(logprobs.shape))
    check_2d("response_mask", response_mask, tuple(logprobs.shape))
    adv = _broadcast_adv(advantages, logprobs)
    # -inf old log-probs: the loss function sees 0 / 0 with mask 0 there (torch.where is exact elsewhere, so finite
    # inputs give exactly the values and gradients of a plain call)
    finite = torch.isfinite(old_logprobs.detach())
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp_in = torch.where(finite, logprobs, zero)
    old_in = torch.where(finite, old_logprobs, zero.to(old_logprobs.dtype))
    mask_in = torch.where(finite, response_mask, torch.zeros_like(response_mask))
    pg_losses, metrics = fn(
        lp_in, old_in, adv, mask_in, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    if behaviour_logprobs is None:
        w = finite.to(pg_losses.dtype)
        w_metrics: dict[str, Tensor] = {}
    else:
        w, w_metrics = behaviour_weights(
            old_logprobs, behaviour_logprobs, response_mask, behaviour_correction, behaviour_weight_cap,
            sequence_level=POLICY_LOSSES.meta(name).get("sequence_level", False))
    pg_losses = pg_losses * w.to(pg_losses.dtype)  # w has no gradient; 1.0 * x is exactly x
    loss = agg_loss(pg_losses, response_mask, loss_agg, max_len=max_len, denominator=denominator)
    metrics = {"actor/pg_loss": loss.detach(), **metrics, **w_metrics}
    return loss, metrics


def _kl_k3_metric(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """approx_kl = masked mean of ``(r - 1) - log r`` (Schulman's k3 estimator of KL(old || new), >= 0), detached."""
    lr = log_ratio.detach()
    return masked_mean(torch.expm1(lr) - lr, mask)


@register_policy_loss(PolicyLossName.PPO_CLIP)
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO clip with dual clip (algorithms.md section 2; Schulman et al. 2017, Ye et al. 2020).

    ``r = exp(clamp(logp - old_logp, -20, 20))``; ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``;
    for ``A < 0``: ``l = min(l, -A c)``.

    Args:
        logprobs, old_logprobs, advantages, response_mask: (B, T).
    Returns:
        ``(pg_losses (B, T), metrics)``; ``actor/clipfrac`` = fraction of masked tokens where the clipped term is
        the larger one (the gradient is cut), ``actor/pg_clipfrac_lower`` = fraction where the dual clip binds.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # (B, T)
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(pg1, pg2)
    if dual_clip is not None:
        pg3 = -advantages * dual_clip
        dual = torch.minimum(clipped, pg3)
        lower = (advantages < 0) & (pg3 < clipped)
        pg_losses = torch.where(advantages < 0, dual, clipped)
    else:
        lower = torch.zeros_like(response_mask, dtype=torch.bool)
        pg_losses = clipped
    metrics = {
        "actor/clipfrac": masked_mean((pg2 > pg1).float(), response_mask).detach(),
        "actor/pg_clipfrac_lower": masked_mean(lower.float(), response_mask).detach(),
        "actor/approx_kl": _kl_k3_metric(log_ratio, response_mask),
        "actor/ratio_mean": masked_mean(ratio.detach(), response_mask),
    }
    return pg_losses, metrics


@register_policy_loss(PolicyLossName.GSPO, sequence_level=True)
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025; algorithms.md §2): sequence ratio ``s_i = exp(mean_t (logp - old_logp))`` over the
    row's masked tokens, clipped per sequence: ``l = max(-A s, -A clip(s, 1 - eps_low, 1 + eps_high))``.

    Written in the paper's token form ``s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t])`` (value ``s_i`` on every
    token, gradient ``s_i * grad mean_t logp_t`` once aggregated by ``seq_mean_token_mean``, the paper's choice; the
    GSPO paper uses much smaller clip ranges, e.g. 3e-4 / 4e-4). With per-token advantages the token form is kept.
    ``dual_clip`` is ignored (not part of GSPO). The log sequence ratio is clamped to [-20, 20].

    Returns:
        ``(pg_losses (B, T), metrics)``; ``actor/clipfrac`` counts masked tokens of clipped sequences.
    """
    m = response_mask > 0
    log_ratio = torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs))  # (B, T)
    n_tok = m.sum(-1).clamp_min(1).to(logprobs.dtype)  # (B,)
    seq_log_ratio = (log_ratio.sum(-1) / n_tok).detach()  # (B,) log s_i, no grad
    # (B, T): value log s_i, gradient of logp_t; a -inf logp_t (the token left the truncation after an update)
    # would give -inf - -inf = NaN: its value is the row's (-inf, clamped below) and it gets no gradient
    tok_log_ratio = torch.where(torch.isfinite(logprobs), seq_log_ratio[:, None] + logprobs - logprobs.detach(),
                                seq_log_ratio[:, None].expand_as(logprobs))
    ratio = torch.exp(tok_log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_losses = torch.maximum(pg1, pg2)
    metrics = {
        "actor/clipfrac": masked_mean((pg2 > pg1).float(), response_mask).detach(),
        "actor/pg_clipfrac_lower": torch.zeros((), device=logprobs.device),
        "actor/approx_kl": _kl_k3_metric(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP), response_mask),
        "actor/ratio_mean": masked_mean(ratio.detach(), response_mask),
    }
    return pg_losses, metrics


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate for the optional KL loss (``algo.kl_coef``; Schulman's estimators).

    - ``k1``: ``logp - ref_logp``; ``k2``: ``0.5 (logp - ref_logp)^2``;
    - ``k3`` (default, low variance, >= 0): ``exp(ref_logp - logp) - (ref_logp - logp) - 1``, with the log ratio
      clamped to [-20, 20] and the result to [-10, 10] (as verl's ``low_var_kl``).

    Args:
        logprobs: (B, T) with grad. ref_logprobs: (B, T) reference model log-probs (no grad).
        kind: ``k1`` | ``k2`` | ``k3``.
    A token that both policies give probability 0 (both log-probs ``-inf``, e.g. outside the top-k / top-p
    truncation) has penalty 0 and no gradient (not NaN). With only one of them ``-inf`` the KL is infinite in
    truth: ``k3`` is finite there (its clamps), ``k1`` / ``k2`` return +-inf, so the learner uses ``k3`` and the
    learner's loss mask removes tokens whose old log-prob is ``-inf`` (algorithms.md section 7).

    Returns:
        (B, T) per-token penalty; aggregate it with :func:`agg_loss` and the loss mask.
    Raises:
        ValueError: unknown kind.
    """
    check_2d("ref_logprobs", ref_logprobs, tuple(logprobs.shape))
    both_zero = torch.isneginf(logprobs.detach()) & torch.isneginf(ref_logprobs)  # torch.where is exact elsewhere
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    diff = torch.where(both_zero, zero, logprobs) - torch.where(both_zero, zero.to(ref_logprobs.dtype), ref_logprobs)
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        d = (-diff).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # log(ref / pi)
        return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl kind {kind!r}; valid: ['k1', 'k2', 'k3']")
