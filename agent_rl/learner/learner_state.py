"""The learner's own checkpoint state (``learner.pt``): AdamW moments and step counts, the LR schedule's counters,
the value head and the mini-batch shuffling generator (the policy weights are saved apart,
``agent_rl.learner.checkpoint``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from agent_rl.learner.config import OptimConfig
from agent_rl.learner.lr_schedule import restore_optimizer


def learner_state(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                  value_head: nn.Module | None, generator: torch.Generator) -> dict[str, Any]:
    """``{"optimizer", "scheduler", "value_head", "generator"}``: the state dicts (``value_head`` None without a
    value head) and the generator's state."""
    return {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "value_head": value_head.state_dict() if value_head is not None else None,
        "generator": generator.get_state(),
    }


def load_learner_state(sd: dict[str, Any], optimizer: torch.optim.Optimizer, optim: OptimConfig,
                       value_head: nn.Module | None, generator: torch.Generator, *, algo_name: str
                       ) -> torch.optim.lr_scheduler.LambdaLR:
    """Load :func:`learner_state`'s ``sd`` under the run's ``optim`` (:func:`restore_optimizer`) into
    ``optimizer``, ``value_head`` and ``generator`` (when saved); returns the restored LR schedule.

    Raises:
        ValueError: a value head (``algo=ppo``, ``algo_name``) and ``sd`` none, or the reverse.
    """
    if (value_head is None) != (sd.get("value_head") is None):
        saved, mine = ("no", "one") if value_head is not None else ("a", "none")
        raise ValueError(f"the saved learner state has {saved} value head but this learner "
                         f"(algo={algo_name}) has {mine}")
    scheduler = restore_optimizer(optimizer, sd, optim)
    if value_head is not None:
        value_head.load_state_dict(sd["value_head"])
    if sd.get("generator") is not None:
        generator.set_state(sd["generator"])
    return scheduler
