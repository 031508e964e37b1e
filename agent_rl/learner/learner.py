"""The learner: one RL update from a ``RolloutBatch`` (docs/algorithms.md, sections 0-3 and 6).

One step, top to bottom (``Learner.update``):

1. **No-grad pass** over the batch (micro-batches of rows, sorted by length) -> :class:`OldPolicyOutputs`: hidden
   states from the policy trunk, then, only at response positions and in chunks of ``algo.logits_chunk_size``
   tokens, ``logits = lm_head(h)`` and from those same logits: old log-probs at each row's own temperature, token entropy at that temperature, and for TGRL's
   high rows (after warm-up) the JS divergence between softmax(z/T0) and softmax(z/T1). No (B, L, V) tensor is ever
   built, the JS needs no extra forward pass, and its weights never carry gradient. ``algo=ppo``: old values from the
   value head; ``kl_coef > 0``: reference log-probs from the frozen reference model.
2. **Advantages** (:meth:`Learner.advantages` -> :class:`StepAdvantages`): the base estimator (episode-level
   ``agent_rl.algos.compute_advantages`` broadcast to rows via ``episode_index``; row-level GiGPO; GAE for PPO; with
   forked groups, ``rollout.fork``, the (B, L) step-group advantages of ``agent_rl.algos.fork_advantages``), then
   ``agent_rl.algos.token_advantages``: TGRL JS weights -> credit rule -> low-row mask -> clamp, as
   ``algos.advantage_plan`` decides for the config and the step.
3. **PPO epochs** over ``algo.num_mini_batches`` mini-batches of whole groups (:func:`group_mini_batches`), each
   split into micro-batches (gradient accumulation; every aggregation uses the whole mini-batch's denominator,
   ``algos.agg_denominator``, so the accumulated gradient equals the mini-batch loss's), AdamW, global grad-norm
   clip, LR warm-up. Ratio statistics are reported from optimiser steps 2..n. A non-finite update is never applied
   (:meth:`Learner._optimise`): non-finite advantages on trained tokens skip the step before any optimiser step; a
   non-finite micro-batch loss or global grad norm skips that optimiser step and the rest of the step (no
   ``optimizer.step``, no scheduler step: the parameters and the optimiser state stay as they were);
   ``actor/skipped_nonfinite`` is 1, with the cause in :attr:`Learner.skip_cause`. Under data parallelism the
   decision is all-reduced (MAX), so a non-finite value on any rank skips on every rank alike.

Single pass (:meth:`Learner.single_pass_step`): on an on-policy step (one epoch of one mini-batch, no staleness) the
old log-probs equal the new ones detached, so step 1 is folded into step 3: the advantages come first (from the
rewards alone), the grad pass's own logits give ``old_logprobs`` (its log-probs detached) and the entropy, and the
rows that carry no gradient get a no-grad forward of their own for the metrics: one forward per row instead of two.
The separate no-grad pass stays wherever a rule needs the old policy before or apart from the grad pass: several
epochs or mini-batches (the policy moves between optimiser steps), staleness (``trainer.max_staleness > 0`` or rows
sampled by an older version), advantages that read the pass (TGRL's JS weights after warm-up, credit rules other than
``uniform`` / ``tp``, GAE's old values with ``algo=ppo``, TAMPO's candidate log-probs), the KL term's reference
log-probs (``kl_coef > 0``), and FSDP's lock-step forwards.

Memory: logits-sized work is chunked; in the grad pass each chunk's ``lm_head`` + log-softmax is recomputed in
backward (``torch.utils.checkpoint``) so only the (N, d) hidden states are kept. Rows that carry no gradient (no
trained token, or zero advantage everywhere when no KL/entropy/value term is on: e.g. TGRL's low rows, groups with
equal rewards) are not forwarded in the grad pass; they still count in the loss denominators.

Device: ``cpu`` for tests; on CUDA the forward runs under bf16 autocast (fp32 master weights) and
``model.gradient_checkpointing`` (``ModelConfig``) recomputes activations.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from agent_rl import algos
from agent_rl.learner.config import (AlgoConfig, CreditConfig, OptimConfig, ScheduleConfig,
                                     resolve_behaviour_correction)
from agent_rl.lora import base_module, is_lora
from agent_rl.memory import memory_metrics, release_free_heap
from agent_rl.types import RolloutBatch


@dataclass
class StepAdvantages:
    """Output of :meth:`Learner.advantages` (each tensor (B, L), aligned with ``input_ids``).

    Attributes:
        advantages: token advantages, 0 wherever ``loss_mask`` is 0.
        loss_mask: 1 on trained tokens (the response mask after the credit rule's mask, e.g. TP / forking).
        returns: GAE returns (``algo=ppo``), else None.
        S: the schedule's credit strength of the step. plan: which pipeline stages ran.
    """

    advantages: Tensor
    loss_mask: Tensor
    returns: Tensor | None
    S: float
    plan: algos.AdvantagePlan
    episode_advantages: Tensor | None = None
    """(E,) the episode-level base advantages (indexed by ``episode_index``) when the estimator is episode-level,
    else None (TAMPO's A_i, algorithms.md 8.4)."""


@dataclass
class OldPolicyOutputs:
    """What the no-grad pass over the sampling (old) policy gives, each (B, L) float32 aligned with ``input_ids``
    (0 off the response mask), at each row's own temperature.

    Attributes:
        logprobs: old log-probs of the sampled tokens (``old_logprobs`` of the PPO ratio; under the engine's top-k /
            top-p truncation when set).
        entropy: token entropy of softmax(z / T_row) (detached; forking / entropy_adv / empg read it).
        js: TGRL's token JS divergence between softmax(z / T0) and softmax(z / T1) (0 where not computed).
        values: old values of the value head (``algo=ppo``), else None.
        ref_logprobs: reference-model log-probs (``algo.kl_coef > 0``), else None.
        virtual_logprobs: ``algo=tampo``: (B, L, K) log-probs of the sampled tokens at each candidate
            ``algo.tampo.temps[k]`` from the same logits (``agent_rl.algos.virtual_logprobs``, algorithms.md 8.2),
            else None.
    """

    logprobs: Tensor
    entropy: Tensor
    js: Tensor
    values: Tensor | None = None
    ref_logprobs: Tensor | None = None
    virtual_logprobs: Tensor | None = None


log = logging.getLogger(__name__)
#: credit rules that read neither the entropy nor the JS of the old policy (the single pass has neither before the
#: advantages): every other rule keeps the separate no-grad pass.
SINGLE_PASS_CREDIT = ("uniform", "tp")

#: policy-loss metrics that compare the new policy with the old one (reported from optimiser steps 2..n).
RATIO_METRICS = ("actor/clipfrac", "actor/approx_kl", "actor/pg_clipfrac_lower", "actor/ratio_mean")


def group_mini_batches(group_index: Tensor, num_mini_batches: int, generator: torch.Generator) -> list[Tensor]:
    """Split a batch's rows into mini-batches of whole groups (algorithms.md, TGRL "Reference training recipe": the
    batch's groups split into ``algo.num_mini_batches`` mini-batches; every row of an episode, and so of a group,
    lands in one mini-batch).

    The groups are shuffled with ``generator`` and dealt into ``min(num_mini_batches, number of groups)`` chunks of
    nearly equal group counts (the first ``n_groups % k`` chunks get one group more).

    Args:
        group_index: (B,) long, rows of a group share it. num_mini_batches: >= 1. generator: CPU generator.
    Returns:
        list of (b_i,) long row indices on ``group_index``'s device, each ascending; together a partition of 0..B-1.
    Raises:
        ValueError: ``num_mini_batches < 1``.
    """
    if num_mini_batches < 1:
        raise ValueError(f"num_mini_batches must be >= 1, got {num_mini_batches}")
    uniq, inv = torch.unique(group_index.cpu(), return_inverse=True)  # (G,), (B,) dense group id per row
    n_groups = int(uniq.numel())
    if n_groups == 0:
        return []
    perm = torch.randperm(n_groups, generator=generator)  # (G,) shuffled groups
    k = min(num_mini_batches, n_groups)
    chunk_of_group = torch.empty(n_groups, dtype=torch.long)
    for i, groups in enumerate(perm.tensor_split(k)):
        chunk_of_group[groups] = i
    chunk = chunk_of_group[inv]  # (B,) mini-batch of each row
    return [(chunk == i).nonzero(as_tuple=True)[0].to(group_index.device) for i in range(k)]


def token_budget_micro_batches(rows: Tensor, lengths: Tensor, max_tokens: int) -> list[Tensor]:
    """Micro-batches of ``rows`` under a token budget (``algo.micro_batch_tokens``; verl's dynamic batch size,
    ``use_dynamic_bsz`` / ``rearrange_micro_batches``, for padded rows).

    The rows are sorted by length, longest first (stable), and cut greedily into consecutive runs: a run grows while
    ``(rows in it) x (its longest row)`` stays <= ``max_tokens`` (the padded size of its forward); a row longer than
    the budget is a micro-batch of its own. Sorted runs waste the least padding, and every micro-batch is as full
    as the budget allows.

    Args:
        rows: (n,) long row indices. lengths: (n,) each row's padded length in tokens. max_tokens: >= 1.
    Returns:
        list of (b_i,) long tensors (rows' values), together a permutation of ``rows``, longest first.
    Raises:
        ValueError: ``max_tokens < 1`` or ``rows`` and ``lengths`` of different shapes.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if rows.shape != lengths.shape or rows.dim() != 1:
        raise ValueError(f"rows {tuple(rows.shape)} and lengths {tuple(lengths.shape)} must be the same (n,) shape")
    order = torch.argsort(lengths, descending=True, stable=True)
    rows, sizes = rows[order], lengths[order].tolist()
    out, start = [], 0
    for i in range(1, len(sizes) + 1):  # cut before row i when adding it would exceed the budget
        if i == len(sizes) or (i - start + 1) * max(int(sizes[start]), 1) > max_tokens:
            out.append(rows[start:i])
            start = i
    return out


def lr_scheduler(optimizer: torch.optim.Optimizer, warmup: int, *, steps_done: int = 0,
                 unit: str = "optimizer_step") -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule of ``OptimConfig``: linear warm-up over ``warmup`` units, then constant.

    ``unit="optimizer_step"``: stepped after every optimiser step, ``lr(n) = initial_lr * min(1, (n + 1) / warmup)``
    after n optimiser steps. ``unit="rl_step"`` (the TGRL reference's scheduler, algorithms.md section 3): stepped
    once per RL step by :meth:`Learner.update`, ``lr(n) = initial_lr * min(1, n / warmup)`` with n = the RL steps
    before this one, so RL step s (1-based) runs at ``lr * min(1, (s - 1) / warmup)`` and step 1 at 0. ``warmup``
    0: constant.

    ``steps_done`` > 0 (a resume): the schedule continues after that many units, from each param group's
    ``initial_lr`` (the peak), which must be set; the groups' ``lr`` is set to the schedule's value there.
    """
    def factor(n: int) -> float:  # a plain function: LambdaLR's state_dict keeps no copy of it
        return min(1.0, (n + 1) / warmup) if warmup > 0 else 1.0

    def rl_factor(n: int) -> float:
        return min(1.0, n / warmup) if warmup > 0 else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, rl_factor if unit == "rl_step" else factor,
                                             last_epoch=steps_done - 1)


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], optim: OptimConfig, *,
                      unit: str | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """Load a saved AdamW state into ``optimizer`` under the run's ``optim`` config, and return its LR schedule.

    The checkpoint gives the AdamW moments and step counts (``state["optimizer"]``) and the optimiser steps taken
    (``state["scheduler"]["last_epoch"]``); the config gives every hyper-parameter: each param group's ``lr`` /
    ``initial_lr`` (``optim.lr``), ``weight_decay``, ``betas`` and ``eps`` are written over the restored ones, and
    the schedule (``optim.warmup``) is rebuilt at the restored step. A resume under the same config restores the
    exact learning rate; a resume that changes these keys (``agent_rl.resume.RESUME_APPLIED``, declared on the
    fields) applies them.

    Args:
        optimizer: the learner's (fresh) optimizer over the same parameters. state: ``{"optimizer": ...,
            "scheduler": ...}`` as :meth:`Learner.state_dict` saves them. unit: what the schedule counts
            (:func:`lr_scheduler`; None: ``optim.warmup_unit``).
    Raises:
        ValueError: the saved state does not fit ``optimizer`` (other parameter groups or sizes; torch's message).
    """
    optimizer.load_state_dict(state["optimizer"])
    for group in optimizer.param_groups:
        group.update(lr=optim.lr, initial_lr=optim.lr, weight_decay=optim.weight_decay, betas=tuple(optim.betas),
                     eps=optim.eps)
    saved = dict(state["scheduler"])
    scheduler = lr_scheduler(optimizer, optim.warmup, steps_done=int(saved["last_epoch"]),
                             unit=unit or optim.warmup_unit)
    # the saved counters (last_epoch, _step_count, ...) as they were; the learning rates as the config gives them
    saved.update(base_lrs=list(scheduler.base_lrs), _last_lr=list(scheduler.get_last_lr()),
                 lr_lambdas=[None] * len(optimizer.param_groups))
    scheduler.load_state_dict(saved)
    return scheduler


def response_positions(response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Rows and columns of response tokens (column >= 1: the token at column c is predicted from position c - 1).

    Args:
        response_mask: (b, L) 0/1.
    Returns:
        ``(rows (N,), cols (N,))`` long, N = number of masked tokens in columns 1..L-1.
    """
    rows, cols = (response_mask[:, 1:] > 0).nonzero(as_tuple=True)
    return rows, cols + 1


def policy_trunk(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(trunk, lm_head)`` of a transformers causal LM: the base model returning hidden states and the output
    projection; for a LoRA (peft) model, those of the causal LM inside it (``agent_rl.lora.base_module``), whose
    adapted layers run the adapter. Models whose forward post-processes logits (soft-capping, logit scales) are not
    supported."""
    model = base_module(model)
    return model.base_model, model.get_output_embeddings()


class Learner:
    """RL learner over a causal LM policy (see module docstring).

    Args:
        model: the policy (``transformers`` causal LM); moved to ``device``.
        tokenizer: its tokenizer (saved with checkpoints).
        algo, optim: algorithm and optimiser configs.
        credit: credit rule (default ``CreditConfig()``: uniform, the config's default; ``algo=tgrl``'s preset
            selects ``js``, TGRL's own credit: pass ``CreditConfig(name="js")`` for it).
        schedule: temporal schedule of the credit strength S (default ``none``).
        ref_model: frozen reference for ``algo.kl_coef > 0`` (default: a deep copy of ``model`` at construction;
            for a LoRA model, the model itself with its adapter disabled, ``disable_adapter()``: the frozen base,
            no second copy).
        A LoRA (peft) ``model`` (``agent_rl.lora``) trains its adapter only (the parameters that require grad) at
        ``optim.for_lora()``'s learning rate (``optim.lora_lr``, default 10 x ``optim.lr``).
        device: ``"cpu"`` / ``"cuda"``.
        mixed_precision: ``"auto"`` (bf16 autocast on CUDA, fp32 on CPU) | ``"bf16"`` | ``"no"``.
        seed: seed of the mini-batch shuffling generator.
        top_k, top_p: the sampler's truncation (``engine.top_k`` / ``engine.top_p``; 0 / 1.0 = off). Old and new
            log-probs are then taken under the same truncated distribution the engine sampled from
            (``agent_rl.algos.truncate_logits``), so the PPO ratio compares like with like; entropy and JS stay
            those of the full tempered distribution.
        max_staleness: ``trainer.max_staleness`` k (algorithms.md section 7); with ``algo.behaviour_correction=auto``
            it selects the correction of the policy-gradient term: ``tis`` when k > 0, ``none`` when k = 0.
        single_pass: fold the no-grad pass into the grad pass on the steps where it changes nothing
            (:meth:`single_pass_step`); False: always the separate no-grad pass (the two paths give the same loss
            and gradients).
    Raises:
        ValueError: unknown estimator / loss / credit rule / schedule names (messages list the valid ones), or
            a credit rule at a level it does not define.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, algo: AlgoConfig, optim: OptimConfig, *,
                 credit: CreditConfig | None = None, schedule: ScheduleConfig | None = None,
                 ref_model: nn.Module | None = None, device: str | torch.device = "cpu",
                 mixed_precision: str = "auto", seed: int = 0, top_k: int = 0, top_p: float = 1.0,
                 max_staleness: int = 0, single_pass: bool = True) -> None:
        self.lora = is_lora(model)
        if self.lora:  # the adapter's own learning rate (OptimConfig.lora_lr)
            optim = optim.for_lora()
        self.algo, self.optim_cfg = algo, optim
        algos.truncation_mask(torch.zeros(1, 2), 1.0, top_k, top_p)  # validates top_k / top_p
        self.top_k, self.top_p = int(top_k), float(top_p)
        #: the run's staleness bound k and the behaviour correction it resolves ``algo.behaviour_correction`` to
        self.max_staleness = int(max_staleness)
        self.behaviour_correction = resolve_behaviour_correction(algo, max_staleness)
        self.single_pass = bool(single_pass)
        self.credit = credit or CreditConfig()
        self.schedule = schedule or ScheduleConfig()
        # Fail early on unknown registry names (their errors list the valid names).
        algos.get_policy_loss(algo.policy_loss)
        if not algo.uses_critic:
            algos.get_adv_estimator(algo.adv_estimator)
        levels = algos.CREDIT_RULES.meta(self.credit.name).get("levels", ("token", "turn"))
        if self.credit.level not in levels:
            raise ValueError(f"credit={self.credit.name} is not defined at credit.level={self.credit.level}; "
                             f"it supports {list(levels)}")
        algos.get_schedule(self.schedule.kind)
        if "quantile_clip" in self.credit.kwargs:  # one key for one idea
            raise ValueError("credit.kwargs.quantile_clip is not read: the JS percentile clip is algo.js_quantile_clip")

        self.device = torch.device(device)
        self.tokenizer = tokenizer
        self.model = model.to(self.device)
        use_bf16 = mixed_precision == "bf16" or (mixed_precision == "auto" and self.device.type == "cuda")
        self.autocast_dtype = torch.bfloat16 if use_bf16 else None
        hidden = model.config.hidden_size
        self.value_head: nn.Linear | None = None
        if algo.uses_critic:
            self.value_head = nn.Linear(hidden, 1).to(self.device)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        self.ref_model: nn.Module | None = None
        #: the KL reference is the LoRA model with its adapter disabled (no copy)
        self.ref_is_base = algo.kl_coef > 0 and self.lora and ref_model is None
        if algo.kl_coef > 0 and not self.ref_is_base:
            self.ref_model = (ref_model if ref_model is not None else copy.deepcopy(model)).to(self.device).eval()
            self.ref_model.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            self.params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                                           weight_decay=optim.weight_decay)
        self.scheduler = lr_scheduler(self.optimizer, optim.warmup, unit=optim.warmup_unit)
        self.generator = torch.Generator().manual_seed(seed)
        self._compiled_js = torch.compile(algos.js_divergence_from_logits, dynamic=False) if algo.compile_js else None
        #: per-token tensors of the last ``update`` (see there); None before the first update.
        self.last_token_stats: dict[str, Tensor] | None = None
        #: data-parallel hooks when this learner is one rank of several (``agent_rl.distributed.DataParallel``:
        #: global loss denominators and L_max, DDP gradient averaging before the clip); None: one process.
        self.data_parallel: Any = None
        self.skip_cause: str | None = None
        """Why the last :meth:`update` applied no update (``actor/skipped_nonfinite`` 1), else None."""

    # ------------------------------------------------------------------------------------------------------------
    # Public API
    # ------------------------------------------------------------------------------------------------------------
    def update(self, batch: RolloutBatch, *, step: int, total_steps: int) -> dict[str, float]:
        """One learner step on ``batch`` (``step`` is 1-based); returns the section-6 learner metrics.

        Returns (python floats): ``actor/pg_loss``, ``actor/clipfrac``, ``actor/approx_kl``, ``actor/grad_norm``,
        ``actor/entropy``, ``actor/lr``, ``credit/trained_token_frac``, ``credit/js_mean``, ``schedule/S``,
        ``tgrl/delta_R``, ``tgrl/success_high``, ``tgrl/success_low``, ``time/update_s``,
        ``actor/skipped_nonfinite`` (1: a non-finite advantage, loss or gradient, and no update was applied; the
        cause in :attr:`skip_cause`, logged; module docstring), plus ``actor/engine_logprob_diff`` (mean |old -
        engine| log-prob: the engine/learner mismatch),
        ``actor/kl_ref`` (kl_coef > 0), ``critic/vf_loss`` and ``critic/values_mean`` (algo=ppo), and the
        asynchronous-rollout metrics of algorithms.md section 7 (:meth:`_async_metrics`): ``async/staleness_mean``,
        ``async/staleness_max``, ``async/behaviour_weight_mean``, ``async/behaviour_weight_capped_frac``,
        ``async/behaviour_weight_zero_frac``, and this process's memory (:func:`memory_metrics`: ``perf/max_rss_gb``,
        ``perf/cpu_memory_used_gb``; on CUDA ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb``).
        """
        t0 = time.perf_counter()
        if self.optim_cfg.warmup_unit == "rl_step":
            self._set_rl_step_lr(step)
        release_free_heap()  # what generation freed, before the activations (agent_rl.memory)
        b = self._to_device(batch)
        rm = b.response_mask  # (B, L) float 0/1
        single = self.single_pass_step(b, step, total_steps)
        if single:
            # on-policy step: advantages from the rewards alone; the grad pass fills ``old`` from its own logits
            old = self._empty_old(b)
            adv = self.advantages(b, None, step=step, total_steps=total_steps)
        else:
            # 1. one no-grad pass: old log-probs, entropy, JS (TGRL high rows, when the step's plan weights by JS),
            #    old values, reference log-probs
            old = self._no_grad_pass(b, with_js=self._plan(step, total_steps).js_strength is not None)
            # 2. advantages: base estimator -> TGRL JS weights -> credit rule -> low-row mask -> clamp
            adv = self.advantages(b, old, step=step, total_steps=total_steps)
        advantages, loss_mask, returns, S = adv.advantages, adv.loss_mask, adv.returns, adv.S

        # TAMPO (algorithms.md 8.2-8.4): the additive part of the batch statistic, from the old-policy pass (before
        # the update) and the episode GRPO advantages; the driver sums ranks, divides by N and moves the EMA
        tampo_metrics = self._tampo_sums(b, old, adv) if self.algo.is_tampo else {}

        # 3. PPO epochs over mini-batches with gradient accumulation (single pass: one step that also fills ``old``)
        stats = self._optimise(b, old, advantages, loss_mask, returns, fill_old=single)

        # 4. metrics (names of algorithms.md section 6)
        n_resp = rm.sum().clamp_min(1.0)
        high_tok = rm * b.is_high[:, None].float() if self.algo.is_tgrl else rm  # where JS was computed
        success = b.won  # None: success = reward > 0
        metrics = {
            **stats,
            "actor/entropy": float((old.entropy * rm).sum() / n_resp),
            "actor/lr": float(self.scheduler.get_last_lr()[0]),
            "actor/engine_logprob_diff": float((torch.where(torch.isfinite(old.logprobs),
                                                            (old.logprobs - b.engine_logprobs).abs(), 0.0) * rm
                                                ).sum() / n_resp),
            "credit/trained_token_frac": float(loss_mask.sum() / n_resp),
            "credit/js_mean": float((old.js * high_tok).sum() / high_tok.sum().clamp_min(1.0)),
            "schedule/S": float(S),
            **self._async_metrics(b, old, loss_mask, step),
            **tampo_metrics,
            **algos.tgrl_metrics(b.rewards, b.group_index, b.is_high, success=success,
                                 episode_index=b.episode_index),
            "actor/single_pass": float(single),
        }
        metrics["time/update_s"] = time.perf_counter() - t0
        metrics.update(memory_metrics(self.device))
        # per-token view of this step for the episode store / viewer: (B, L) float32 on CPU, aligned with input_ids
        self.last_token_stats = {
            "advantages": advantages.detach().float().cpu(),
            "loss_mask": loss_mask.detach().float().cpu(),
            "old_logprobs": old.logprobs.detach().float().cpu(),
            "entropy": old.entropy.detach().float().cpu(),
            "js": old.js.detach().float().cpu(),
        }
        release_free_heap()  # the update's activations, before the next generation
        return metrics

    def single_pass_step(self, batch: RolloutBatch, step: int, total_steps: int) -> bool:
        """Whether :meth:`update` folds the no-grad pass into the grad pass at ``step`` (module docstring, "Single
        pass"): the learner's ``single_pass`` is on, the step is one optimiser step (``algo.ppo_epochs == 1`` and
        ``algo.num_mini_batches == 1``), on-policy (``max_staleness == 0`` and every row's policy version, when the
        batch has them, ``step - 1``), and nothing reads the old policy apart from the grad pass: no value head, no
        TAMPO, ``kl_coef == 0``, no JS weights in the step's plan, a credit rule in :data:`SINGLE_PASS_CREDIT`, no
        FSDP lock-step forwards."""
        algo = self.algo
        if not self.single_pass or algo.ppo_epochs != 1 or algo.num_mini_batches != 1 or self.max_staleness != 0:
            return False
        if self.value_head is not None or algo.is_tampo or algo.kl_coef > 0:
            return False
        dp = self.data_parallel
        if dp is not None and getattr(dp, "lockstep", False):
            return False
        plan = self._plan(step, total_steps)
        if plan.js_strength is not None or (plan.credit is not None and plan.credit not in SINGLE_PASS_CREDIT):
            return False
        versions = getattr(batch, "policy_versions", None)  # (B, L): read on the response tokens only
        return versions is None or bool((versions.to(batch.response_mask.device)[batch.response_mask > 0]
                                         == step - 1).all())

    def _empty_old(self, b: RolloutBatch) -> OldPolicyOutputs:
        """Zero (B, L) log-probs, entropy and JS on the learner's device, for the single pass to fill."""
        bsz, seq = b.input_ids.shape
        zeros = lambda: torch.zeros(bsz, seq, dtype=torch.float32, device=self.device)  # noqa: E731
        return OldPolicyOutputs(logprobs=zeros(), entropy=zeros(), js=zeros())

    def evaluate(self, batch: RolloutBatch, *, with_js: bool = True) -> OldPolicyOutputs:
        """The update's no-grad pass alone (:class:`OldPolicyOutputs`: ``logprobs``, ``entropy``, ``js``, ``values``,
        ``ref_logprobs``, each (B, L) float32 aligned with ``input_ids``, 0 off the response mask, at each row's
        temperature)."""
        return self._no_grad_pass(self._to_device(batch), with_js=with_js)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler, value head and shuffling-generator states (the policy weights are saved apart)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`, under this learner's config: the AdamW moments, optimiser step count, value
        head and shuffling generator come from ``sd``; the optimiser hyper-parameters and LR schedule from
        ``optim`` (:func:`restore_optimizer`: a resume that changes ``optim.lr`` trains at the new one).

        Raises:
            ValueError: the learner has a value head (``algo=ppo``) and ``sd`` none, or the reverse.
        """
        if (self.value_head is None) != (sd.get("value_head") is None):
            saved, mine = ("no", "one") if self.value_head is not None else ("a", "none")
            raise ValueError(f"the saved learner state has {saved} value head but this learner "
                             f"(algo={self.algo.name}) has {mine}")
        self.scheduler = restore_optimizer(self.optimizer, sd, self.optim_cfg)
        if self.value_head is not None:
            self.value_head.load_state_dict(sd["value_head"])
        if sd.get("generator") is not None:
            self.generator.set_state(sd["generator"])

    def _set_rl_step_lr(self, step: int) -> None:
        """``optim.warmup_unit=rl_step``: every param group's lr for 1-based RL step ``step``, the schedule's value
        after ``step - 1`` RL steps (:func:`lr_scheduler`); the scheduler's counter and last lr follow, so
        ``actor/lr`` and a checkpoint read the same."""
        factor = self.scheduler.lr_lambdas[0](step - 1)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * factor
        self.scheduler.last_epoch = step - 1
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what get_last_lr reads

    @property
    def lr(self) -> float:
        """The learning rate of the next optimiser step (``actor/lr`` of :meth:`update` is this after the step)."""
        return float(self.scheduler.get_last_lr()[0])

    # ------------------------------------------------------------------------------------------------------------
    # Forward helpers
    # ------------------------------------------------------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _to_device(self, batch: RolloutBatch) -> RolloutBatch:
        """``batch`` on the learner's device (:meth:`RolloutBatch.to`), checked for trainable temperatures."""
        b = batch.to(self.device)
        if bool((b.temperature <= 0).any()):
            raise ValueError("every row needs a sampling temperature > 0 (greedy rows cannot be trained on)")
        return b

    def _micro_batches(self, rows: Tensor, attention_mask: Tensor) -> list[Tensor]:
        """Split ``rows`` (n,) into micro-batches of rows of similar length, longest first: ``algo.micro_batch_size``
        rows each, or with ``algo.micro_batch_tokens > 0`` packed under that token budget
        (:func:`token_budget_micro_batches` on each row's padded length, last attended column + 1, which is what
        the forward of a micro-batch computes). Either way every micro-batch's loss is divided by its mini-batch's
        denominator, so the accumulated gradient does not depend on the split."""
        if self.algo.micro_batch_tokens > 0:
            am = attention_mask[rows]
            cols = torch.arange(1, am.shape[1] + 1, device=am.device)
            ends = (am.bool() * cols).amax(-1)  # (n,) last attended column + 1 (0 for an empty row)
            return token_budget_micro_batches(rows, ends, self.algo.micro_batch_tokens)
        lengths = attention_mask[rows].sum(-1)
        rows = rows[torch.argsort(lengths, descending=True, stable=True)]
        return list(rows.split(self.algo.micro_batch_size))

    def _lockstep_padding(self, n: int) -> int:
        """Idle passes this rank adds to its ``n`` forward (or backward) passes so that every rank runs the same
        number: ranks whose collectives run inside forward and backward (``data_parallel.lockstep``: FSDP's
        all-gathers and reduce-scatters) would otherwise wait for each other forever. 0 for one process and DDP.
        Collective itself: call it before the passes it pads (every rank at the same point); the ranks' count of
        passes is the hooks' (``dp.lockstep_padding``: FSDP's gradient-sync control counts its backwards with it)."""
        dp = self.data_parallel
        return dp.lockstep_padding(n) if dp is not None and getattr(dp, "lockstep", False) else 0

    def _idle_pass(self, b: RolloutBatch, *, backward: bool, with_ref: bool = False) -> None:
        """One forward over the batch's first row that changes nothing (:meth:`_lockstep_padding`): its
        ``backward`` is of a zero loss through ``lm_head`` and the trunk, so every trainable parameter gets a zero
        gradient contribution (each FSDP unit reduce-scatters on every rank); ``with_ref``: also the reference
        forward when it is the policy with its LoRA adapter disabled (the same sharded units)."""
        ids, am = b.input_ids[:1], b.attention_mask[:1]
        h = self._hidden(self.model, ids, am)
        if with_ref and getattr(self, "ref_is_base", False):
            with self.model.disable_adapter():
                self._hidden(self.model, ids, am)
        if backward:
            _, lm_head = policy_trunk(self.model)
            with self._autocast():
                z = lm_head(h[:, -1])
            (z.float().sum() * 0.0).backward()

    def _hidden(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Last hidden states (b, L', d) of ``model``'s trunk, L' = last attended column + 1 of these rows."""
        last = int(attention_mask.any(0).nonzero().max()) + 1 if bool(attention_mask.any()) else 1
        ids, am = input_ids[:, :last], attention_mask[:, :last]
        position_ids = (am.cumsum(-1) - 1).clamp(min=0)  # (b, L'): robust to left or right padding
        trunk, _ = policy_trunk(model)
        with self._autocast():
            return trunk(input_ids=ids, attention_mask=am, position_ids=position_ids, use_cache=False).last_hidden_state

    @torch.no_grad()
    def _no_grad_pass(self, b: RolloutBatch, with_js: bool, rows: Tensor | None = None,
                      out: OldPolicyOutputs | None = None) -> OldPolicyOutputs:
        """Old log-probs, entropy, JS, old values, reference log-probs; each (B, L), 0 off the response mask.
        ``rows`` (n,) long: only these rows are forwarded (default all), written into ``out`` when given."""
        bsz, seq = b.input_ids.shape
        zeros = lambda: torch.zeros(bsz, seq, dtype=torch.float32, device=self.device)  # noqa: E731
        tampo_temps = list(self.algo.tampo.temps) if self.algo.is_tampo else None
        self._tampo_pass_s = 0.0  # time/tampo_s: the candidates' log-probs of this pass
        out = out if out is not None else OldPolicyOutputs(
            logprobs=zeros(), entropy=zeros(), js=zeros(), values=zeros() if self.value_head is not None else None,
            ref_logprobs=zeros() if self.ref_model is not None or self.ref_is_base else None,
            virtual_logprobs=None if tampo_temps is None else torch.zeros(
                bsz, seq, len(tampo_temps), dtype=torch.float32, device=self.device))
        chunk = self.algo.logits_chunk_size
        was_training = self.model.training
        self.model.eval()
        try:
            rows_all = torch.arange(bsz, device=self.device) if rows is None else rows
            micro = self._micro_batches(rows_all, b.attention_mask)
            n_fwd = sum(int(bool((b.response_mask[rows][:, 1:] > 0).any())) for rows in micro)  # forwards to run
            for _ in range(self._lockstep_padding(n_fwd)):  # FSDP: as many forwards as any rank (agreed first)
                self._idle_pass(b, backward=False, with_ref=out.ref_logprobs is not None)
            for rows in micro:
                rr, cc = response_positions(b.response_mask[rows])
                if rr.numel() == 0:
                    continue
                h = self._hidden(self.model, b.input_ids[rows], b.attention_mask[rows])[rr, cc - 1]  # (N, d)
                tokens = b.input_ids[rows][rr, cc]  # (N,)
                temps = b.temperature[rows][rr]  # (N,) each token at its row's temperature
                # JS rows: TGRL's high rows; with credit=js on another algo, every row (at algo.t_low / t_high)
                high = b.is_high[rows][rr] if self.algo.is_tgrl else torch.ones_like(rr, dtype=torch.bool)
                _, lm_head = policy_trunk(self.model)
                lp, ent, js, vlp = [], [], torch.zeros(rr.numel(), device=self.device), []
                for a in range(0, rr.numel(), chunk):
                    with self._autocast():
                        z = lm_head(h[a:a + chunk])  # (n, V) logits of this chunk only
                    t = temps[a:a + chunk]
                    lp.append(algos.logprobs_from_logits(self._truncate(z, t), tokens[a:a + chunk], t))
                    ent.append(algos.entropy_from_logits(z, t))
                    if tampo_temps is not None:  # TAMPO 8.2: every candidate from these logits, (n, K)
                        t_v = time.perf_counter()
                        vlp.append(algos.virtual_logprobs(z, tokens[a:a + chunk], tampo_temps))
                        self._tampo_pass_s += time.perf_counter() - t_v
                    sel = high[a:a + chunk]
                    if with_js and bool(sel.any()):
                        if self.algo.t_high == "auto":  # each high row's own T1 (the pick of its step)
                            for t1 in t[sel].unique().tolist():
                                at = sel & (t == t1)
                                js[a:a + chunk][at] = self._js(z[at], t1)
                        else:
                            js[a:a + chunk][sel] = self._js(z[sel], float(self.algo.t_high))
                    del z
                grow, gcol = rows[rr], cc
                out.logprobs[grow, gcol] = torch.cat(lp)
                out.entropy[grow, gcol] = torch.cat(ent)
                out.js[grow, gcol] = js
                if out.virtual_logprobs is not None:
                    out.virtual_logprobs[grow, gcol] = torch.cat(vlp)
                if self.value_head is not None:
                    out.values[grow, gcol] = self.value_head(h.float()).squeeze(-1)
                if out.ref_logprobs is not None:
                    ref = self.model if self.ref_is_base else self.ref_model
                    with self.model.disable_adapter() if self.ref_is_base else nullcontext():  # LoRA: the base
                        h_ref = self._hidden(ref, b.input_ids[rows], b.attention_mask[rows])[rr, cc - 1]
                        _, ref_head = policy_trunk(ref)
                        ref_lp = [algos.logprobs_from_logits(
                            self._truncate(ref_head(h_ref[a:a + chunk]), temps[a:a + chunk]), tokens[a:a + chunk],
                            temps[a:a + chunk]) for a in range(0, rr.numel(), chunk)]
                    out.ref_logprobs[grow, gcol] = torch.cat(ref_lp)
        finally:
            self.model.train(was_training)
        return out

    def _truncate(self, z: Tensor, temps: Tensor) -> Tensor:
        """The sampler's top-k / top-p truncation of logits z (n, V) at the rows' temperatures (n,) (no-op when off)."""
        return algos.truncate_logits(z, temps, self.top_k, self.top_p)

    def _js(self, z: Tensor, t_high: float) -> Tensor:
        """Token JS (n,) of logits z (n, V), n <= logits_chunk_size, at algo.t_low / ``t_high`` (no grad; T1: the
        fixed ``algo.t_high``, or under ``algo.t_high=auto`` the rows' own). Compiled: padded to exactly
        ``logits_chunk_size`` rows (zero rows give JS 0) so one compiled graph serves every call."""
        if self._compiled_js is None:
            return algos.js_divergence_from_logits(z, self.algo.t_low, t_high)
        n, chunk = z.shape[0], self.algo.logits_chunk_size
        padded = z.new_zeros(chunk, z.shape[1])
        padded[:n] = z
        return self._compiled_js(padded, self.algo.t_low, t_high)[:n]

    def _grad_logprobs(self, h: Tensor, tokens: Tensor, temps: Tensor, with_entropy: bool | str
                       ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (N,) (and entropy (N,)) with grad, chunk by chunk; each chunk's logits are recomputed in
        backward (checkpoint) so no (N, V) activation is stored. ``with_entropy="detached"``: the entropy of the
        same logits without grad (the single pass's ``old.entropy``)."""
        _, lm_head = policy_trunk(self.model)

        def chunk_fn(hc: Tensor, tc: Tensor, temp: Tensor) -> tuple[Tensor, Tensor]:
            with self._autocast():
                z = lm_head(hc)  # (n, V)
            lp = algos.logprobs_from_logits(self._truncate(z, temp), tc, temp)
            if with_entropy == "detached":
                with torch.no_grad():
                    ent = algos.entropy_from_logits(z.detach(), temp)
            else:
                ent = algos.entropy_from_logits(z, temp) if with_entropy else lp.new_zeros(())
            return lp, ent

        chunk = self.algo.logits_chunk_size
        lps, ents = [], []
        for a in range(0, h.shape[0], chunk):
            args = (h[a:a + chunk], tokens[a:a + chunk], temps[a:a + chunk])
            lp, ent = checkpoint(chunk_fn, *args, use_reentrant=False) if h.shape[0] > chunk else chunk_fn(*args)
            lps.append(lp)
            ents.append(ent)
        return torch.cat(lps), (torch.cat(ents) if with_entropy else None)

    # ------------------------------------------------------------------------------------------------------------
    # Advantages and credit
    # ------------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def advantages(self, batch: RolloutBatch, old: OldPolicyOutputs | None, *, step: int, total_steps: int
                   ) -> StepAdvantages:
        """The token advantages and loss mask of ``batch`` at 1-based ``step`` of ``total_steps``, from the no-grad
        pass ``old`` (:meth:`evaluate`): stage 1 (base estimator) here, stages 2-5 by
        ``agent_rl.algos.token_advantages`` with ``algos.advantage_plan`` (see ``agent_rl/algos/pipeline.py``).
        ``old=None``: from the rewards alone (the single pass, :meth:`single_pass_step`).

        Returns:
            :class:`StepAdvantages` ((B, L) tensors on the learner's device).
        Raises:
            ValueError: a row-level estimator (gigpo) without observation keys, DAPO overlong without L_max;
                ``old=None`` where GAE needs its values or a stage its entropy or JS.
        """
        b = self._to_device(batch)
        rm = b.response_mask
        plan = self._plan(step, total_steps)
        algo = self.algo
        ep_rewards = b.episode_rewards.float()
        if algo.dapo_overlong:  # DAPO overlong shaping: each episode gets the mean penalty of its turns' lengths
            if algo.dapo_overlong_max_len <= 0:
                raise ValueError("algo.dapo_overlong needs algo.dapo_overlong_max_len > 0")
            pen = algos.dapo_overlong_penalty(rm.sum(-1), algo.dapo_overlong_max_len, algo.dapo_overlong_cache_len)
            e = ep_rewards.shape[0]
            tot = torch.zeros(e, device=self.device).index_add_(0, b.episode_index, pen)
            cnt = torch.zeros(e, device=self.device).index_add_(0, b.episode_index, torch.ones_like(pen))
            ep_rewards = ep_rewards + tot / cnt.clamp_min(1.0)
        returns = None
        forked = "episode_fork_base" in (b.extras or {})
        if forked:  # rollout.fork: the step-group estimator (docs/algorithms_impl.md, "Forked groups"), (B, L)
            if algo.uses_critic:
                raise ValueError("rollout.fork does not combine with a critic (algo=ppo): use grpo, drgrpo or rloo")
            ex = b.extras
            base_adv = algos.fork_advantages(algo.adv_estimator, ep_rewards, b.episode_group_index,
                                             ex["episode_fork_base"], ex["episode_fork_turn"], ex["token_turn"],
                                             b.episode_index, rm, std=algo.std)
        elif algo.uses_critic:
            # GAE per row: the row's (episode) reward on its last response token, values from the value head.
            last = (rm * torch.arange(rm.shape[1], device=self.device)).argmax(-1)  # (B,) last response column
            token_rewards = torch.zeros_like(rm)
            token_rewards[torch.arange(rm.shape[0]), last] = ep_rewards[b.episode_index]
            if old is None:
                raise ValueError("GAE needs the old values of the no-grad pass (old=None)")
            adv, returns = algos.compute_gae(token_rewards, old.values, rm, algo.gamma, algo.lam)
            mean = (adv * rm).sum() / rm.sum().clamp_min(1.0)  # whiten over the batch's response tokens
            var = (((adv - mean) * rm) ** 2).sum() / rm.sum().clamp_min(1.0)
            base_adv: Tensor = torch.where(rm > 0, (adv - mean) / (var.sqrt() + 1e-8), 0.0)
        elif algos.ADV_ESTIMATORS.meta(algo.adv_estimator).get("row_level", False):
            # row-level estimators (gigpo) see every turn row: rewards broadcast, episodes, turns, observation keys
            ex = b.extras or {}
            if b.obs_key is not None:
                base_adv = algos.compute_advantages(
                    algo.adv_estimator, ep_rewards[b.episode_index], b.group_index,
                    episode_index=b.episode_index, turn_index=b.turn_index, obs_key=b.obs_key, std=algo.std)
            elif "episode_turn_obs_key" in ex and "token_turn" in ex:  # trajectory rows: per-turn values on tokens
                base_adv = algos.gigpo_token_advantages(ep_rewards, b.episode_group_index, ex["episode_turn_obs_key"],
                                                        ex["token_turn"], b.episode_index, rm, std=algo.std)
            else:
                raise ValueError(f"algo.adv_estimator={algo.adv_estimator} needs each turn's observation key "
                                 "(RolloutBatch.extras['obs_key'] in per-turn mode; 'episode_turn_obs_key' and "
                                 "'token_turn' in full-trajectory mode: build_rollout_batch writes them)")
        else:
            ep_adv = algos.compute_advantages(algo.adv_estimator, ep_rewards, b.episode_group_index,
                                              std=algo.std)
            base_adv = ep_adv[b.episode_index]  # (E,) -> (B,) broadcast to the episode's rows
        advantages, loss_mask = algos.token_advantages(
            plan, self._credit_inputs(b, old, base_adv, rm), quantile_clip=algo.js_quantile_clip,
            credit_kwargs=self.credit.kwargs)
        return StepAdvantages(advantages=advantages, loss_mask=loss_mask, returns=returns, S=plan.S, plan=plan,
                              episode_advantages=ep_adv if not forked and base_adv.dim() == 1 and not algo.uses_critic
                              and not algos.ADV_ESTIMATORS.meta(algo.adv_estimator).get("row_level", False)
                              else None)

    def _tampo_sums(self, b: RolloutBatch, old: OldPolicyOutputs, adv: StepAdvantages) -> dict[str, float]:
        """``tampo_sum/*`` of this batch (or rank shard): :func:`agent_rl.algos.tampo_episode_sums` of the episodes'
        token-mean virtual likelihoods (the union of an episode's turn rows) and GRPO advantages, plus
        ``time/tampo_s`` (this and the candidates' log-probs of the no-grad pass)."""
        t0 = time.perf_counter()
        if adv.episode_advantages is None or old.virtual_logprobs is None:
            raise ValueError(f"algo=tampo needs an episode-level advantage estimator (grpo), got "
                             f"algo.adv_estimator={self.algo.adv_estimator}")
        tc = self.algo.tampo
        ell, n_tok = algos.episode_virtual_likelihoods(old.virtual_logprobs, b.response_mask, b.episode_index)
        episodes = torch.unique(b.episode_index)  # (E,) ascending: the order of ell's rows
        sums = algos.tampo_episode_sums(ell, adv.episode_advantages[episodes], tc.temps, tc.norm, tc.norm_tau,
                                        n_tokens=n_tok)
        out = algos.tampo_sum_metrics(sums, tc.temps)
        out["time/tampo_s"] = time.perf_counter() - t0 + getattr(self, "_tampo_pass_s", 0.0)
        return out

    def _plan(self, step: int, total_steps: int) -> algos.AdvantagePlan:
        """The step's advantage plan (``algos.advantage_plan``) at the schedule's strength S: it decides both whether
        the no-grad pass computes JS (``js_strength is not None``) and which pipeline stages run."""
        S = self.schedule.value if self.schedule.value is not None else algos.schedule_value(
            self.schedule.kind, step, total_steps, m=self.schedule.m,
            s_min_ratio=self.schedule.s_min_ratio, s_max_ratio=self.schedule.s_max_ratio)
        algo = self.algo
        return algos.advantage_plan(
            is_tgrl=algo.is_tgrl, warmup=algo.in_warmup(step), credit=self.credit.name, level=self.credit.level,
            S=S, scheduled=self.schedule.kind != "none" or self.schedule.value is not None, adv_clip=algo.adv_clip,
            low_rows_in_denominator=algo.low_rows_in_denominator)

    @staticmethod
    def _credit_inputs(b: RolloutBatch, old: OldPolicyOutputs | None, advantages: Tensor, rm: Tensor
                       ) -> Any:
        return algos.CreditInputs(
            advantages=advantages, response_mask=rm, turn_index=b.turn_index, num_turns=b.num_turns,
            episode_index=b.episode_index, entropy=None if old is None else old.entropy,
            js=None if old is None else old.js, is_high=b.is_high)

    # ------------------------------------------------------------------------------------------------------------
    # Optimisation
    # ------------------------------------------------------------------------------------------------------------
    def _optimise(self, b: RolloutBatch, old: OldPolicyOutputs, advantages: Tensor, loss_mask: Tensor,
                  returns: Tensor | None, fill_old: bool = False) -> dict[str, float]:
        """The PPO epochs (module docstring, step 3). ``fill_old`` (the single pass, one optimiser step): each
        micro-batch's old log-probs are its own log-probs detached, written with its entropy into ``old``, and the
        rows that carry no gradient get a no-grad forward into ``old``."""
        algo = self.algo
        extra_terms = algo.kl_coef > 0 or algo.ent_coef > 0 or self.value_head is not None
        # rows that can carry gradient (others only count in the denominators)
        active = (loss_mask.sum(-1) > 0) & (extra_terms | ((advantages != 0) & (loss_mask > 0)).any(-1))
        # Dr.GRPO's constant L_max (algo.loss_max_len; algo=drgrpo refuses 0), else the longest response of the batch
        max_len = algo.loss_max_len or max(int(b.response_mask.sum(-1).max()), 1)
        dp = self.data_parallel
        if dp is not None and not algo.loss_max_len:
            max_len = dp.global_max(max_len)
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        grad_norms: list[float] = []
        # a non-finite advantage on a trained token poisons every update it reaches: skip the whole step (each rank
        # decides, then all agree)
        bad_adv = bool((~torch.isfinite(advantages) & (loss_mask > 0)).any())
        self.skip_cause = "non-finite advantages on trained tokens" if self._any_rank(bad_adv) else None

        def acc(name: str, value: Tensor | float, weight: float) -> None:
            sums[name] = sums.get(name, 0.0) + float(value) * weight
            weights[name] = weights.get(name, 0.0) + weight

        self.model.train()
        n_opt_steps = 0
        n_mini = algo.num_mini_batches
        if dp is not None:  # every rank runs the same number of optimiser steps (whole groups per rank differ)
            n_mini = dp.global_min(min(n_mini, int(torch.unique(b.group_index).numel())))
        for _epoch in range(algo.ppo_epochs):
            if self.skip_cause is not None:
                break  # skipped (non-finite advantages, or an optimiser step's loss or gradient): the rest too
            for mb_rows in group_mini_batches(b.group_index, n_mini, self.generator):
                n_opt_steps += 1
                mb_mask = loss_mask[mb_rows]
                den = algos.agg_denominator(mb_mask, algo.loss_agg)  # the whole mini-batch's, for every micro-batch
                tok_den = mb_mask.sum().clamp_min(1.0)
                if dp is not None:  # every rank divides by the global denominator (see DataParallel)
                    den, tok_den = dp.global_denominator(den), dp.global_denominator(tok_den)
                self.optimizer.zero_grad(set_to_none=True)
                mb_pg_loss = 0.0
                finite_loss = True
                fwd_rows = mb_rows[active[mb_rows]]
                micro = self._micro_batches(fwd_rows, b.attention_mask) if fwd_rows.numel() else []
                for _ in range(self._lockstep_padding(len(micro))):  # FSDP: as many backwards as any rank
                    self._idle_pass(b, backward=True)
                if fill_old:  # rows the grad pass does not forward: their old log-probs and entropy, for metrics
                    idle_rows = mb_rows[~active[mb_rows]]
                    if idle_rows.numel():
                        self._no_grad_pass(b, with_js=False, rows=idle_rows, out=old)
                for rows in micro:
                    loss, m = self._micro_loss(b, old, advantages, loss_mask, returns, rows, den, tok_den, max_len,
                                               fill_old=fill_old)
                    finite_loss = finite_loss and bool(torch.isfinite(loss.detach()))
                    loss.backward()
                    mb_pg_loss += float(m.pop("actor/pg_loss"))  # micro losses share den: they sum to the mb loss
                    w = float(loss_mask[rows].sum())
                    for k, v in m.items():
                        # ratio statistics of the first optimiser step are trivial (the policy is the old one:
                        # ratio 1, clipfrac 0): they are reported from steps 2..n when there are several
                        acc(f"first:{k}" if n_opt_steps == 1 and k in RATIO_METRICS else k, v, w)
                if dp is not None:
                    dp.sync_gradients()  # DDP all-reduce of the accumulated gradients, then one clip everywhere
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    self.params, self.optim_cfg.max_grad_norm if self.optim_cfg.max_grad_norm > 0 else math.inf)
                grad_norms.append(float(grad_norm))
                acc("actor/pg_loss", mb_pg_loss, 1.0)
                finite_grad = math.isfinite(float(grad_norm))
                if self._any_rank(not (finite_loss and finite_grad)):
                    cause = ("a non-finite micro-batch loss" if not finite_loss else
                             f"non-finite gradient (global grad norm {float(grad_norm)})" if not finite_grad else
                             "a non-finite loss on another rank")
                    self.skip_cause = f"{cause} at optimiser step {n_opt_steps} of the step"
                    self.optimizer.zero_grad(set_to_none=True)  # never applied: parameters, moments, lr unchanged
                    break
                self.optimizer.step()
                if self.optim_cfg.warmup_unit == "optimizer_step":
                    self.scheduler.step()
        out = {k: sums[k] / weights[k] if weights[k] > 0 else 0.0 for k in sums}
        out["actor/skipped_nonfinite"] = float(self.skip_cause is not None)
        if self.skip_cause is not None:
            log.warning("update skipped, nothing applied (parameters and optimiser state unchanged): %s",
                        self.skip_cause)
        for k in RATIO_METRICS:  # a single optimiser step: its (trivial) ratio statistics are all there are
            first = out.pop(f"first:{k}", None)
            if k not in out and first is not None:
                out[k] = first
        out["actor/optimizer_steps"] = float(n_opt_steps)
        out.setdefault("actor/clipfrac", 0.0)  # no row carried gradient (e.g. all rewards of every group equal):
        out.setdefault("actor/approx_kl", 0.0)  # the policy did not move, ratio 1 everywhere
        out.setdefault("actor/pg_clipfrac_lower", 0.0)
        out.setdefault("actor/ratio_mean", 1.0)
        # no optimiser step because the advantages were non-finite: no grad norm (null), not 0
        out["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else (
            math.nan if self.skip_cause is not None else 0.0)
        return out

    def _any_rank(self, flag: bool) -> bool:
        """``flag`` of any rank (one MAX all-reduce under data parallelism): every rank takes the same decision."""
        dp = self.data_parallel
        return bool(dp.global_max(int(flag))) if dp is not None else bool(flag)

    def _micro_loss(self, b: RolloutBatch, old: OldPolicyOutputs, advantages: Tensor, loss_mask: Tensor,
                    returns: Tensor | None, rows: Tensor, den: Tensor, tok_den: Tensor, max_len: int | None,
                    fill_old: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of one micro-batch, already divided by the mini-batch denominators (``den`` of ``algo.loss_agg``,
        ``tok_den`` = trained tokens of the mini-batch, for the value loss); and its metrics (0-dim tensors).
        ``fill_old``: the old log-probs are these log-probs detached (the single pass), written with the entropy of
        the same logits into ``old``."""
        algo = self.algo
        am = b.attention_mask[rows]
        h_full = self._hidden(self.model, b.input_ids[rows], am)  # (b, L', d)
        seq = h_full.shape[1]
        rm = b.response_mask[rows][:, :seq]
        rr, cc = response_positions(rm)
        h = h_full[rr, cc - 1]  # (N, d)
        tokens = b.input_ids[rows][rr, cc]
        temps = b.temperature[rows][rr]
        lp_flat, ent_flat = self._grad_logprobs(
            h, tokens, temps, with_entropy=True if algo.ent_coef > 0 else ("detached" if fill_old else False))
        logprobs = torch.zeros(rows.numel(), seq, device=self.device).index_put((rr, cc), lp_flat)  # (b, L')
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
            behaviour_correction=self.behaviour_correction, behaviour_weight_cap=algo.behaviour_weight_cap)
        for k in [k for k in metrics if k.startswith("async/")]:
            del metrics[k]  # the step's behaviour-weight metrics are over every trained token (_async_metrics)
        if algo.kl_coef > 0:
            kl = algos.kl_penalty(logprobs, old.ref_logprobs[rows][:, :seq], kind="k3")
            kl = torch.where(torch.isfinite(old_lp), kl, 0.0)
            kl_loss = algos.agg_loss(kl, mask, algo.loss_agg, max_len=max_len, denominator=den)
            loss = loss + algo.kl_coef * kl_loss
            metrics["actor/kl_ref"] = (kl * mask).sum().detach() / mask.sum().clamp_min(1.0)
        if ent_flat is not None:
            entropy = torch.zeros(rows.numel(), seq, device=self.device).index_put((rr, cc), ent_flat)
            loss = loss - algo.ent_coef * algos.agg_loss(entropy, mask, algo.loss_agg, max_len=max_len,
                                                         denominator=den)
        if self.value_head is not None and returns is not None:
            values = torch.zeros(rows.numel(), seq, device=self.device).index_put(
                (rr, cc), self.value_head(h.float()).squeeze(-1))
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

    def _async_metrics(self, b: RolloutBatch, old: OldPolicyOutputs, loss_mask: Tensor, step: int
                       ) -> dict[str, float]:
        """The asynchronous-rollout metrics of the step (algorithms.md section 7), over the trained tokens
        (``loss_mask`` > 0) of the whole batch, whether or not their row was forwarded in the grad pass:

        - ``async/staleness_mean`` / ``async/staleness_max``: staleness (step - 1) - v of each token, v its sampling
          version (``RolloutBatch.policy_versions``; a batch without it counts as sampled by version step - 1,
          staleness 0);
        - ``async/behaviour_weight_mean`` / ``_capped_frac`` / ``_zero_frac``: the behaviour weights the loss applied
          (:func:`agent_rl.algos.behaviour_weights` under this learner's correction; they depend on the no-grad
          pass only, so they are the same in every epoch and mini-batch).

        All 0 when there is no trained token (the weight mean then 0 too)."""
        algo = self.algo
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
            old.logprobs, b.engine_logprobs, loss_mask, self.behaviour_correction, algo.behaviour_weight_cap,
            sequence_level=algos.POLICY_LOSSES.meta(algo.policy_loss).get("sequence_level", False))
        return {
            "async/staleness_mean": float(stale.sum() / n),
            "async/staleness_max": stale_max,
            **{k: float(v) for k, v in w_metrics.items()},
        }
