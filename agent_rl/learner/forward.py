"""The learner's forward passes over the policy: trunk hidden states, chunked log-probs / entropy / JS of the
response tokens, the no-grad pass over the old policy (module docstring of ``agent_rl.learner.learner``, step 1),
the grad pass's checkpointed log-probs, and FSDP's lock-step idle passes."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from agent_rl import algos
from agent_rl.learner.outputs import OldPolicyOutputs
from agent_rl.lora import base_module
from agent_rl.types import RolloutBatch



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


class PolicyForward:
    """The forward passes of a :class:`~agent_rl.learner.learner.Learner`: they read the learner's current model,
    reference, value head, configs and data-parallel hooks at each call (FSDP replaces the model and optimiser after
    construction), and split rows with the learner's ``_micro_batches``.

    Attributes:
        tampo_pass_s: seconds the last :meth:`no_grad_pass` spent on TAMPO's candidate log-probs (``time/tampo_s``).
    """

    def __init__(self, learner: Any) -> None:
        self.learner = learner
        self.tampo_pass_s = 0.0

    def autocast(self):
        """bf16 autocast on the learner's device when its mixed precision is on, else a no-op context."""
        if self.learner.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.learner.device.type, dtype=self.learner.autocast_dtype)

    def lockstep_padding(self, n: int) -> int:
        """Idle passes this rank adds to its ``n`` forward (or backward) passes so that every rank runs the same
        number: ranks whose collectives run inside forward and backward (``data_parallel.lockstep``: FSDP's
        all-gathers and reduce-scatters) would otherwise wait for each other forever. 0 for one process and DDP.
        Collective itself: call it before the passes it pads (every rank at the same point); the ranks' count of
        passes is the hooks' (``dp.lockstep_padding``: FSDP's gradient-sync control counts its backwards with it)."""
        dp = self.learner.data_parallel
        return dp.lockstep_padding(n) if dp is not None and getattr(dp, "lockstep", False) else 0

    def idle_pass(self, b: RolloutBatch, *, backward: bool, with_ref: bool = False) -> None:
        """One forward over the batch's first row that changes nothing (:meth:`lockstep_padding`): its
        ``backward`` is of a zero loss through ``lm_head`` and the trunk, so every trainable parameter gets a zero
        gradient contribution (each FSDP unit reduce-scatters on every rank); ``with_ref``: also the reference
        forward when it is the policy with its LoRA adapter disabled (the same sharded units)."""
        ids, am = b.input_ids[:1], b.attention_mask[:1]
        h = self.hidden(self.learner.model, ids, am)
        if with_ref and getattr(self.learner, "ref_is_base", False):
            with self.learner.model.disable_adapter():
                self.hidden(self.learner.model, ids, am)
        if backward:
            _, lm_head = policy_trunk(self.learner.model)
            with self.autocast():
                z = lm_head(h[:, -1])
            (z.float().sum() * 0.0).backward()

    def hidden(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Last hidden states (b, L', d) of ``model``'s trunk, L' = last attended column + 1 of these rows."""
        last = int(attention_mask.any(0).nonzero().max()) + 1 if bool(attention_mask.any()) else 1
        ids, am = input_ids[:, :last], attention_mask[:, :last]
        position_ids = (am.cumsum(-1) - 1).clamp(min=0)  # (b, L'): robust to left or right padding
        trunk, _ = policy_trunk(model)
        with self.autocast():
            return trunk(input_ids=ids, attention_mask=am, position_ids=position_ids, use_cache=False).last_hidden_state

    @torch.no_grad()
    def no_grad_pass(self, b: RolloutBatch, with_js: bool, rows: Tensor | None = None,
                     out: OldPolicyOutputs | None = None) -> OldPolicyOutputs:
        """Old log-probs, entropy, JS, old values, reference log-probs; each (B, L), 0 off the response mask.
        ``rows`` (n,) long: only these rows are forwarded (default all), written into ``out`` when given."""
        lrn = self.learner
        bsz, seq = b.input_ids.shape
        zeros = lambda: torch.zeros(bsz, seq, dtype=torch.float32, device=lrn.device)  # noqa: E731
        tampo_temps = list(lrn.algo.tampo.temps) if lrn.algo.is_tampo else None
        self.tampo_pass_s = 0.0  # time/tampo_s: the candidates' log-probs of this pass
        out = out if out is not None else OldPolicyOutputs(
            logprobs=zeros(), entropy=zeros(), js=zeros(), values=zeros() if lrn.value_head is not None else None,
            ref_logprobs=zeros() if lrn.ref_model is not None or lrn.ref_is_base else None,
            virtual_logprobs=None if tampo_temps is None else torch.zeros(
                bsz, seq, len(tampo_temps), dtype=torch.float32, device=lrn.device))
        chunk = lrn.algo.logits_chunk_size
        was_training = lrn.model.training
        lrn.model.eval()
        try:
            rows_all = torch.arange(bsz, device=lrn.device) if rows is None else rows
            micro = lrn._micro_batches(rows_all, b.attention_mask)
            n_fwd = sum(int(bool((b.response_mask[rows][:, 1:] > 0).any())) for rows in micro)  # forwards to run
            for _ in range(self.lockstep_padding(n_fwd)):  # FSDP: as many forwards as any rank (agreed first)
                self.idle_pass(b, backward=False, with_ref=out.ref_logprobs is not None)
            for rows in micro:
                rr, cc = response_positions(b.response_mask[rows])
                if rr.numel() == 0:
                    continue
                h = self.hidden(lrn.model, b.input_ids[rows], b.attention_mask[rows])[rr, cc - 1]  # (N, d)
                tokens = b.input_ids[rows][rr, cc]  # (N,)
                temps = b.temperature[rows][rr]  # (N,) each token at its row's temperature
                # JS rows: TGRL's high rows; with credit=js on another algo, every row (at algo.t_low / t_high)
                high = b.is_high[rows][rr] if lrn.algo.is_tgrl else torch.ones_like(rr, dtype=torch.bool)
                _, lm_head = policy_trunk(lrn.model)
                lp, ent, js, vlp = [], [], torch.zeros(rr.numel(), device=lrn.device), []
                for a in range(0, rr.numel(), chunk):
                    with self.autocast():
                        z = lm_head(h[a:a + chunk])  # (n, V) logits of this chunk only
                    t = temps[a:a + chunk]
                    lp.append(algos.logprobs_from_logits(self.truncate(z, t), tokens[a:a + chunk], t))
                    ent.append(algos.entropy_from_logits(z, t))
                    if tampo_temps is not None:  # TAMPO 8.2: every candidate from these logits, (n, K)
                        t_v = time.perf_counter()
                        vlp.append(algos.virtual_logprobs(z, tokens[a:a + chunk], tampo_temps))
                        self.tampo_pass_s += time.perf_counter() - t_v
                    sel = high[a:a + chunk]
                    if with_js and bool(sel.any()):
                        if lrn.algo.t_high == "auto":  # each high row's own T1 (the pick of its step)
                            for t1 in t[sel].unique().tolist():
                                at = sel & (t == t1)
                                js[a:a + chunk][at] = self.js(z[at], t1)
                        else:
                            js[a:a + chunk][sel] = self.js(z[sel], float(lrn.algo.t_high))
                    del z
                grow, gcol = rows[rr], cc
                out.logprobs[grow, gcol] = torch.cat(lp)
                out.entropy[grow, gcol] = torch.cat(ent)
                out.js[grow, gcol] = js
                if out.virtual_logprobs is not None:
                    out.virtual_logprobs[grow, gcol] = torch.cat(vlp)
                if lrn.value_head is not None:
                    out.values[grow, gcol] = lrn.value_head(h.float()).squeeze(-1)
                if out.ref_logprobs is not None:
                    ref = lrn.model if lrn.ref_is_base else lrn.ref_model
                    with lrn.model.disable_adapter() if lrn.ref_is_base else nullcontext():  # LoRA: the base
                        h_ref = self.hidden(ref, b.input_ids[rows], b.attention_mask[rows])[rr, cc - 1]
                        _, ref_head = policy_trunk(ref)
                        ref_lp = [algos.logprobs_from_logits(
                            self.truncate(ref_head(h_ref[a:a + chunk]), temps[a:a + chunk]), tokens[a:a + chunk],
                            temps[a:a + chunk]) for a in range(0, rr.numel(), chunk)]
                    out.ref_logprobs[grow, gcol] = torch.cat(ref_lp)
        finally:
            lrn.model.train(was_training)
        return out

    def truncate(self, z: Tensor, temps: Tensor) -> Tensor:
        """The sampler's top-k / top-p truncation of logits z (n, V) at the rows' temperatures (n,) (no-op when off)."""
        return algos.truncate_logits(z, temps, self.learner.top_k, self.learner.top_p)

    def js(self, z: Tensor, t_high: float) -> Tensor:
        """Token JS (n,) of logits z (n, V), n <= logits_chunk_size, at algo.t_low / ``t_high`` (no grad; T1: the
        fixed ``algo.t_high``, or under ``algo.t_high=auto`` the rows' own). Compiled: padded to exactly
        ``logits_chunk_size`` rows (zero rows give JS 0) so one compiled graph serves every call."""
        if self.learner._compiled_js is None:
            return algos.js_divergence_from_logits(z, self.learner.algo.t_low, t_high)
        n, chunk = z.shape[0], self.learner.algo.logits_chunk_size
        padded = z.new_zeros(chunk, z.shape[1])
        padded[:n] = z
        return self.learner._compiled_js(padded, self.learner.algo.t_low, t_high)[:n]

    def grad_logprobs(self, h: Tensor, tokens: Tensor, temps: Tensor, with_entropy: bool | str
                       ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (N,) (and entropy (N,)) with grad, chunk by chunk; each chunk's logits are recomputed in
        backward (checkpoint) so no (N, V) activation is stored. ``with_entropy="detached"``: the entropy of the
        same logits without grad (the single pass's ``old.entropy``)."""
        _, lm_head = policy_trunk(self.learner.model)

        def chunk_fn(hc: Tensor, tc: Tensor, temp: Tensor) -> tuple[Tensor, Tensor]:
            with self.autocast():
                z = lm_head(hc)  # (n, V)
            lp = algos.logprobs_from_logits(self.truncate(z, temp), tc, temp)
            if with_entropy == "detached":
                with torch.no_grad():
                    ent = algos.entropy_from_logits(z.detach(), temp)
            else:
                ent = algos.entropy_from_logits(z, temp) if with_entropy else lp.new_zeros(())
            return lp, ent

        chunk = self.learner.algo.logits_chunk_size
        lps, ents = [], []
        for a in range(0, h.shape[0], chunk):
            args = (h[a:a + chunk], tokens[a:a + chunk], temps[a:a + chunk])
            lp, ent = checkpoint(chunk_fn, *args, use_reentrant=False) if h.shape[0] > chunk else chunk_fn(*args)
            lps.append(lp)
            ents.append(ent)
        return torch.cat(lps), (torch.cat(ents) if with_entropy else None)

    # ------------------------------------------------------------------------------------------------------------
    # Advantages and credit
