"""What the learner's passes give: the old policy's per-token outputs and the step's advantages (the records
``agent_rl.learner.forward``, ``agent_rl.learner.advantages`` and ``Learner.update`` pass between them)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from agent_rl import algos


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
