"""The learning-rate schedule of ``OptimConfig`` (linear warm-up, counted in optimiser steps or RL steps) and the
restore of a saved AdamW state under the run's config."""

from __future__ import annotations

from typing import Any

import torch

from agent_rl.learner.config import OptimConfig


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


def set_rl_step_lr(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, step: int
                   ) -> None:
    """``optim.warmup_unit=rl_step``: every param group's lr for 1-based RL step ``step``, the schedule's value
    after ``step - 1`` RL steps (:func:`lr_scheduler`); the scheduler's counter and last lr follow, so
    ``actor/lr`` and a checkpoint read the same."""
    factor = scheduler.lr_lambdas[0](step - 1)
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base * factor
    scheduler.last_epoch = step - 1
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr reads
