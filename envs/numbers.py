"""The one rule for a reward that crosses a boundary on its way into a training batch: :func:`checked_reward`.

A reward is a finite real number whose magnitude fits in float32 (``|r| <= FLOAT32_MAX``), because the batch stores
rewards as float32 tensors (``agent_rl.rollout.build_rollout_batch``): a NaN spreads through the group statistics
into every advantage and parameter, and a float64 such as 3.5e38 or 1e308 becomes ``inf`` in float32 (REINFORCE++'s
batch whitening then zeroes the whole step). Anything else is refused with :class:`RewardError` (a ``ValueError``)
and the caller fails the episode as an env failure (re-run, then the group dropped; ``docs/env_errors.md``), never
trains on it and never clamps it.

Where it is applied (each door a reward passes; the same function everywhere):

- the hosting core's ``step`` (``envs.hosting.child.EnvHost``): every env played in-process (``LocalEnvPool``) or
  served over HTTP (the env server, OpenEnv and MCP routes), graders (math, code) included;
- the HTTP client's step answer (``agent_rl.envclient.HTTPEnvPool``): a server that is not this project's;
- the rollout orchestrator: each step's reward and the episode's sum (any ``EnvPool``; a sum of fitting rewards
  can overflow float32), and ``build_rollout_batch`` refuses an episode whose reward breaks the rule;
- the gateway: ``POST /sessions/<id>/reward`` (422), an agent program's returned or printed reward, the episode's.

This module imports nothing of ``agent_rl`` (data flows one way), so envs, servers and the trainer share it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["FLOAT32_MAX", "RewardError", "checked_reward"]

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest finite float32, 3.4028234663852886e38: a reward of larger magnitude is ``inf`` in a batch."""


class RewardError(ValueError):
    """A reward that is not a finite real number within the float32 range (see :func:`checked_reward`)."""


def checked_reward(value: Any, source: str = "reward") -> float:
    """``value`` as a Python float, if it is a reward a batch can hold.

    Args:
        value: a real number (int, float, bool, numpy or torch scalar: anything ``float()`` reads that is not
            text or None).
        source: who gave it, for the message (``"the env's reward"``, ``"the program's reward"``).

    Returns:
        ``float(value)``.

    Raises:
        RewardError: None, text, a value ``float()`` cannot read, NaN, +-inf, or ``|value| > FLOAT32_MAX``
            (3.5e38, 1e308: finite in float64, ``inf`` in float32); the message names ``source`` and the value.
    """
    if value is None or isinstance(value, (str, bytes)):
        raise RewardError(f"{source} must be a number, got {type(value).__name__} {value!r:.40}")
    try:
        reward = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise RewardError(f"{source} must be a number, got {type(value).__name__} ({exc})") from None
    if not math.isfinite(reward):
        raise RewardError(f"{source} is not finite ({reward})")
    if abs(reward) > FLOAT32_MAX:
        raise RewardError(f"{source} {reward:g} is outside the float32 range (|r| <= {FLOAT32_MAX:.7g}): it would "
                          "be inf in the batch")
    return reward
