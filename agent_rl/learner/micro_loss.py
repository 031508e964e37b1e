"""The loss of one micro-batch (module docstring of ``agent_rl.learner.learner``, step 3): the policy-gradient term
under the behaviour correction, the KL term to the reference, the entropy bonus and the value loss, each divided by
the mini-batch's denominators so that the micro-batches' gradients sum to the mini-batch loss's."""

from __future__ import annotations

import torch
from torch import Tensor

from agent_rl import algos
from agent_rl.learner.forward import PolicyForward, response_positions
from agent_rl.learner.outputs import OldPolicyOutputs
from agent_rl.types import RolloutBatch


def micro_batch_loss(fwd: PolicyForward, b: RolloutBatch, old: OldPolicyOutputs, advantages: Tensor,
                     loss_mask: Tensor, returns: Tensor | None, rows: Tensor, den: Tensor, tok_den: Tensor,
                     max_len: int | None, fill_old: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch, already divided by the mini-batch denominators (``den`` of ``algo.loss_agg``,
    ``tok_den`` = trained tokens of the mini-batch, for the value loss); and its metrics (0-dim tensors).
    ``fill_old``: the old log-probs are these log-probs detached (the single pass), written with the entropy of
    the same logits into ``old``."""
    lrn = fwd.learner
    algo = lrn.algo
    am = b.attention_mask[rows]
    h_full = fwd.hidden(lrn.model, b.input_ids[rows], am)  # (b, L', d)
    seq = h_full.shape[1]
    rm = b.response_mask[rows][:, :seq]
    rr, cc = response_positions(rm)
    h = h_full[rr, cc - 1]  # (N, d)
    tokens = b.input_ids[rows][rr, cc]
    temps = b.temperature[rows][rr]
    lp_flat, ent_flat = fwd.grad_logprobs(
        h, tokens, temps, with_entropy=True if algo.ent_coef > 0 else ("detached" if fill_old else False))
    logprobs = torch.zeros(rows.numel(), seq, device=lrn.device).index_put((rr, cc), lp_flat)  # (b, L')
    mask = loss_mask[rows][:, :seq]
    if fill_old:  # on-policy: old = new detached, from these logits
        old.logprobs[rows[rr], cc] = lp_flat.detach().float()
        old.entropy[rows[rr], cc] = ent_flat.detach().float()
        if algo.ent_coef <= 0:
            ent_flat = None
    old_lp = old.logprobs[rows][:, :seq]
    # the behaviour weight w (algorithms.md section 7) multiplies the policy-gradient term only; a token with
    # old log-prob -inf (outside the learner's truncation) has w = 0 and is out of the KL term as well
    loss, metrics = algos.policy_loss(
        algo.policy_loss, logprobs, old_lp, advantages[rows][:, :seq], mask,
        clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip=algo.dual_clip, loss_agg=algo.loss_agg,
        max_len=max_len, denominator=den, behaviour_logprobs=b.engine_logprobs[rows][:, :seq],
        behaviour_correction=lrn.behaviour_correction, behaviour_weight_cap=algo.behaviour_weight_cap)
    for k in [k for k in metrics if k.startswith("async/")]:
        del metrics[k]  # the step's behaviour-weight metrics are over every trained token (_async_metrics)
    if algo.kl_coef > 0:
        kl = algos.kl_penalty(logprobs, old.ref_logprobs[rows][:, :seq], kind="k3")
        kl = torch.where(torch.isfinite(old_lp), kl, 0.0)
        kl_loss = algos.agg_loss(kl, mask, algo.loss_agg, max_len=max_len, denominator=den)
        loss = loss + algo.kl_coef * kl_loss
        metrics["actor/kl_ref"] = (kl * mask).sum().detach() / mask.sum().clamp_min(1.0)
    if ent_flat is not None:
        entropy = torch.zeros(rows.numel(), seq, device=lrn.device).index_put((rr, cc), ent_flat)
        loss = loss - algo.ent_coef * algos.agg_loss(entropy, mask, algo.loss_agg, max_len=max_len,
                                                     denominator=den)
    if lrn.value_head is not None and returns is not None:
        values = torch.zeros(rows.numel(), seq, device=lrn.device).index_put(
            (rr, cc), lrn.value_head(h.float()).squeeze(-1))
        old_v, ret = old.values[rows][:, :seq], returns[rows][:, :seq]
        vf = (values - ret) ** 2
        if algo.value_clip > 0:
            v_clip = old_v + (values - old_v).clamp(-algo.value_clip, algo.value_clip)
            vf = torch.maximum(vf, (v_clip - ret) ** 2)
        vf_loss = 0.5 * algos.agg_loss(vf, mask, "token_mean", denominator=tok_den)
        loss = loss + algo.vf_coef * vf_loss
        metrics["critic/vf_loss"] = 0.5 * (vf * mask).sum().detach() / mask.sum().clamp_min(1.0)
        metrics["critic/values_mean"] = (values * mask).sum().detach() / mask.sum().clamp_min(1.0)
    return loss, metrics
