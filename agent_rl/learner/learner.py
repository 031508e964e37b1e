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

from __future__ import annotations

import copy
import logging
import math
import time
from typing import Any

import torch
from torch import Tensor, nn

from agent_rl import algos
from agent_rl.learner.advantages import check_names, step_advantages, step_plan
from agent_rl.learner.batching import group_mini_batches, micro_batches, token_budget_micro_batches
from agent_rl.learner.config import (AlgoConfig, CreditConfig, OptimConfig, ScheduleConfig,
                                     resolve_behaviour_correction)
from agent_rl.learner.forward import PolicyForward, policy_trunk, response_positions
from agent_rl.learner.learner_state import learner_state, load_learner_state
from agent_rl.learner.lr_schedule import lr_scheduler, restore_optimizer, set_rl_step_lr
from agent_rl.learner.micro_loss import micro_batch_loss
from agent_rl.learner.nonfinite import NonFiniteGuard
from agent_rl.learner.outputs import OldPolicyOutputs, StepAdvantages
from agent_rl.learner.step_metrics import (RATIO_METRICS, OptimiseStats, async_metrics, old_policy_metrics, tampo_sums,
                                           token_stats)
from agent_rl.lora import is_lora
from agent_rl.memory import memory_metrics, release_free_heap
from agent_rl.types import RolloutBatch

__all__ = ["Learner", "OldPolicyOutputs", "RATIO_METRICS", "SINGLE_PASS_CREDIT", "StepAdvantages",
           "group_mini_batches", "lr_scheduler", "policy_trunk", "response_positions", "restore_optimizer",
           "token_budget_micro_batches"]

log = logging.getLogger(__name__)
#: credit rules that read neither the entropy nor the JS of the old policy (the single pass has neither before the
#: advantages): every other rule keeps the separate no-grad pass.
SINGLE_PASS_CREDIT = ("uniform", "tp")


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
            it selects the correction of the policy-gradient term: ``tis`` when k > 0, ``none`` when k = 0 (unless
            ``sampler_rounds``).
        single_pass: fold the no-grad pass into the grad pass on the steps where it changes nothing
            (:meth:`single_pass_step`); False: always the separate no-grad pass (the two paths give the same loss
            and gradients).
        sampler_rounds: the engine samples in another precision than these weights (``engine.dtype``); with
            ``algo.behaviour_correction=auto`` it selects ``tis`` too (:func:`resolve_behaviour_correction`).
    Raises:
        ValueError: unknown estimator / loss / credit rule / schedule names (messages list the valid ones), or
            a credit rule at a level it does not define.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, algo: AlgoConfig, optim: OptimConfig, *,
                 credit: CreditConfig | None = None, schedule: ScheduleConfig | None = None,
                 ref_model: nn.Module | None = None, device: str | torch.device = "cpu",
                 mixed_precision: str = "auto", seed: int = 0, top_k: int = 0, top_p: float = 1.0,
                 max_staleness: int = 0, single_pass: bool = True, sampler_rounds: bool = False) -> None:
        self.lora = is_lora(model)
        if self.lora:  # the adapter's own learning rate (OptimConfig.lora_lr)
            optim = optim.for_lora()
        self.algo, self.optim_cfg = algo, optim
        algos.truncation_mask(torch.zeros(1, 2), 1.0, top_k, top_p)  # validates top_k / top_p
        self.top_k, self.top_p = int(top_k), float(top_p)
        #: the run's staleness bound k and the behaviour correction it resolves ``algo.behaviour_correction`` to
        self.max_staleness = int(max_staleness)
        self.behaviour_correction = resolve_behaviour_correction(algo, max_staleness, sampler_rounds)
        self.single_pass = bool(single_pass)
        self.credit = credit or CreditConfig()
        self.schedule = schedule or ScheduleConfig()
        check_names(algo, self.credit, self.schedule)  # unknown registry names fail early, listing the valid ones

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
        #: the forward passes (no-grad pass, grad log-probs, FSDP idle passes), reading this learner at each call
        self.forward = PolicyForward(self)
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
        asynchronous-rollout metrics of algorithms.md section 7 (:func:`.step_metrics.async_metrics`):
        ``async/staleness_mean``,
        ``async/staleness_max``, ``async/behaviour_weight_mean``, ``async/behaviour_weight_capped_frac``,
        ``async/behaviour_weight_zero_frac``, and this process's memory (:func:`memory_metrics`: ``perf/max_rss_gb``,
        ``perf/cpu_memory_used_gb``; on CUDA ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb``).
        """
        t0 = time.perf_counter()
        if self.optim_cfg.warmup_unit == "rl_step":
            set_rl_step_lr(self.optimizer, self.scheduler, step)
        release_free_heap()  # what generation freed, before the activations (agent_rl.memory)
        b = self._to_device(batch)
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
        tampo_metrics = tampo_sums(self.algo, b, old, adv, self.forward.tampo_pass_s) if self.algo.is_tampo else {}

        # 3. PPO epochs over mini-batches with gradient accumulation (single pass: one step that also fills ``old``)
        stats = self._optimise(b, old, advantages, loss_mask, returns, fill_old=single)

        # 4. metrics (names of algorithms.md section 6)
        metrics = {
            **stats,
            **old_policy_metrics(self.algo, b, old, loss_mask, lr=float(self.scheduler.get_last_lr()[0]), S=S),
            **async_metrics(self.algo, self.behaviour_correction, b, old, loss_mask, step),
            **tampo_metrics,
            **algos.tgrl_metrics(b.rewards, b.group_index, b.is_high, success=b.won, episode_index=b.episode_index),
            "actor/single_pass": float(single),
        }
        metrics["time/update_s"] = time.perf_counter() - t0
        metrics.update(memory_metrics(self.device))
        # per-token view of this step for the episode store / viewer: (B, L) float32 on CPU, aligned with input_ids
        self.last_token_stats = token_stats(advantages, loss_mask, old)
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
        """Optimizer, scheduler, value head and shuffling-generator states (the policy weights are saved apart;
        :func:`agent_rl.learner.learner_state.learner_state`)."""
        return learner_state(self.optimizer, self.scheduler, self.value_head, self.generator)

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`, under this learner's config: the AdamW moments, optimiser step count, value
        head and shuffling generator come from ``sd``; the optimiser hyper-parameters and LR schedule from
        ``optim`` (:func:`restore_optimizer`: a resume that changes ``optim.lr`` trains at the new one).

        Raises:
            ValueError: the learner has a value head (``algo=ppo``) and ``sd`` none, or the reverse.
        """
        self.scheduler = load_learner_state(sd, self.optimizer, self.optim_cfg, self.value_head, self.generator,
                                            algo_name=self.algo.name)

    @property
    def lr(self) -> float:
        """The learning rate of the next optimiser step (``actor/lr`` of :meth:`update` is this after the step)."""
        return float(self.scheduler.get_last_lr()[0])

    def _to_device(self, batch: RolloutBatch) -> RolloutBatch:
        """``batch`` on the learner's device (:meth:`RolloutBatch.to`), checked for trainable temperatures."""
        b = batch.to(self.device)
        if bool((b.temperature <= 0).any()):
            raise ValueError("every row needs a sampling temperature > 0 (greedy rows cannot be trained on)")
        return b

    def _micro_batches(self, rows: Tensor, attention_mask: Tensor) -> list[Tensor]:
        """``rows`` (n,) in micro-batches of rows of similar length (:func:`agent_rl.learner.batching.micro_batches`
        under ``algo.micro_batch_size`` / ``algo.micro_batch_tokens``)."""
        return micro_batches(rows, attention_mask, self.algo.micro_batch_size, self.algo.micro_batch_tokens)

    def _no_grad_pass(self, b: RolloutBatch, with_js: bool, rows: Tensor | None = None,
                      out: OldPolicyOutputs | None = None) -> OldPolicyOutputs:
        """The no-grad pass over the old policy (:meth:`PolicyForward.no_grad_pass`): old log-probs, entropy, JS,
        old values, reference log-probs; each (B, L), 0 off the response mask. ``rows`` (n,) long: only these rows
        are forwarded (default all), written into ``out`` when given."""
        return self.forward.no_grad_pass(b, with_js, rows=rows, out=out)

    # ------------------------------------------------------------------------------------------------------------
    # Advantages and credit
    # ------------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def advantages(self, batch: RolloutBatch, old: OldPolicyOutputs | None, *, step: int, total_steps: int
                   ) -> StepAdvantages:
        """The token advantages and loss mask of ``batch`` at 1-based ``step`` of ``total_steps``, from the no-grad
        pass ``old`` (:meth:`evaluate`): stage 1 (base estimator), stages 2-5 by
        ``agent_rl.algos.token_advantages`` with ``algos.advantage_plan`` (:func:`agent_rl.learner.advantages.
        step_advantages`; ``agent_rl/algos/pipeline.py``). ``old=None``: from the rewards alone (the single pass,
        :meth:`single_pass_step`).

        Returns:
            :class:`StepAdvantages` ((B, L) tensors on the learner's device).
        Raises:
            ValueError: a row-level estimator (gigpo) without observation keys, DAPO overlong without L_max;
                ``old=None`` where GAE needs its values or a stage its entropy or JS.
        """
        b = self._to_device(batch)
        return step_advantages(self.algo, self.credit, self._plan(step, total_steps), b, old)

    def _plan(self, step: int, total_steps: int) -> algos.AdvantagePlan:
        """The step's advantage plan (:func:`agent_rl.learner.advantages.step_plan`) at the schedule's strength S."""
        return step_plan(self.algo, self.credit, self.schedule, step, total_steps)

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
        stats = OptimiseStats()
        guard = NonFiniteGuard(dp)
        # a non-finite advantage on a trained token skips the whole step (each rank decides, then all agree)
        self.skip_cause = guard.advantages_cause(advantages, loss_mask)
        self.model.train()
        n_mini = algo.num_mini_batches
        if dp is not None:  # every rank runs the same number of optimiser steps (whole groups per rank differ)
            n_mini = dp.global_min(min(n_mini, int(torch.unique(b.group_index).numel())))
        for _epoch in range(algo.ppo_epochs):
            if self.skip_cause is not None:
                break  # skipped (non-finite advantages, or an optimiser step's loss or gradient): the rest too
            for mb_rows in group_mini_batches(b.group_index, n_mini, self.generator):
                stats.n_opt_steps += 1
                self.skip_cause = self._optimiser_step(b, old, advantages, loss_mask, returns, mb_rows, active,
                                                       max_len, stats, guard, fill_old)
                if self.skip_cause is not None:
                    break
        out = stats.result(skipped=self.skip_cause is not None)
        if self.skip_cause is not None:
            log.warning("update skipped, nothing applied (parameters and optimiser state unchanged): %s",
                        self.skip_cause)
        return out

    def _optimiser_step(self, b: RolloutBatch, old: OldPolicyOutputs, advantages: Tensor, loss_mask: Tensor,
                        returns: Tensor | None, mb_rows: Tensor, active: Tensor, max_len: int,
                        stats: OptimiseStats, guard: NonFiniteGuard, fill_old: bool) -> str | None:
        """One optimiser step on mini-batch ``mb_rows`` (b,): the micro-batches' losses (``active`` (B,) rows only)
        accumulated under the whole mini-batch's denominators, DDP's gradient sync, the global grad-norm clip, then
        AdamW and the scheduler unless a loss or the grad norm is non-finite on any rank: then the gradients are
        dropped and nothing is applied (parameters, moments, lr unchanged). Returns that skip's cause, else None."""
        algo, dp = self.algo, self.data_parallel
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
        for _ in range(self.forward.lockstep_padding(len(micro))):  # FSDP: as many backwards as any rank
            self.forward.idle_pass(b, backward=True)
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
            stats.add_micro(m, float(loss_mask[rows].sum()))
        if dp is not None:
            dp.sync_gradients()  # DDP all-reduce of the accumulated gradients, then one clip everywhere
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.params, self.optim_cfg.max_grad_norm if self.optim_cfg.max_grad_norm > 0 else math.inf)
        stats.grad_norms.append(float(grad_norm))
        stats.add("actor/pg_loss", mb_pg_loss, 1.0)
        cause = guard.optimiser_step_cause(finite_loss, float(grad_norm), stats.n_opt_steps)
        if cause is not None:
            self.optimizer.zero_grad(set_to_none=True)  # never applied: parameters, moments, lr unchanged
            return cause
        self.optimizer.step()
        if self.optim_cfg.warmup_unit == "optimizer_step":
            self.scheduler.step()
        return None

    def _micro_loss(self, b: RolloutBatch, old: OldPolicyOutputs, advantages: Tensor, loss_mask: Tensor,
                    returns: Tensor | None, rows: Tensor, den: Tensor, tok_den: Tensor, max_len: int | None,
                    fill_old: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of one micro-batch and its metrics (:func:`agent_rl.learner.micro_loss.micro_batch_loss`)."""
        return micro_batch_loss(self.forward, b, old, advantages, loss_mask, returns, rows, den, tok_den, max_len,
                                fill_old=fill_old)
