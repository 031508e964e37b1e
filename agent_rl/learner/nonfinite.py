"""The non-finite update guard (module docstring of ``agent_rl.learner.learner``): an update with a non-finite
advantage on a trained token, micro-batch loss or global grad norm is never applied. Under data parallelism every
decision is all-reduced (MAX), so a non-finite value on any rank skips on every rank alike."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


class NonFiniteGuard:
    """The skip decisions of one learner step.

    Args:
        data_parallel: the learner's data-parallel hooks (``global_max``), or None for one process.
    """

    def __init__(self, data_parallel: Any) -> None:
        self.data_parallel = data_parallel

    def any_rank(self, flag: bool) -> bool:
        """``flag`` of any rank (one MAX all-reduce under data parallelism): every rank takes the same decision."""
        dp = self.data_parallel
        return bool(dp.global_max(int(flag))) if dp is not None else bool(flag)

    def advantages_cause(self, advantages: Tensor, loss_mask: Tensor) -> str | None:
        """Why the whole step is skipped before any optimiser step: a non-finite advantage (B, L) on a trained token
        (``loss_mask`` (B, L) > 0) of any rank poisons every update it reaches; else None. Collective."""
        bad_adv = bool((~torch.isfinite(advantages) & (loss_mask > 0)).any())
        return "non-finite advantages on trained tokens" if self.any_rank(bad_adv) else None

    def optimiser_step_cause(self, finite_loss: bool, grad_norm: float, n_opt_steps: int) -> str | None:
        """Why optimiser step ``n_opt_steps`` (1-based, of the step) and the rest of the step are skipped: a
        non-finite micro-batch loss or global grad norm on any rank; else None. Collective."""
        finite_grad = math.isfinite(grad_norm)
        if not self.any_rank(not (finite_loss and finite_grad)):
            return None
        cause = ("a non-finite micro-batch loss" if not finite_loss else
                 f"non-finite gradient (global grad norm {grad_norm})" if not finite_grad else
                 "a non-finite loss on another rank")
        return f"{cause} at optimiser step {n_opt_steps} of the step"
