"""Evaluation on fixed panels: ``python -m agent_rl.eval env=alfworld policy=expert eval.split=valid_unseen``.

One code path with training: the same config groups (``env=``, ``model=``, ``engine=``, ``model.path=``), prompts,
action parser, env servers and :class:`~agent_rl.rollout.RolloutOrchestrator` (the reference policies answer turns
in place of the engine). See ``docs/evaluation.md``.
"""

from __future__ import annotations

from math import comb
from typing import Any

__all__ = ["pass_at_k", "main", "evaluate"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1).

    ``1 - C(n - c, k) / C(n, k)``: the probability that at least one of k samples drawn without replacement from
    n samples, c of them correct, is correct.

    Args:
        n: samples per task (>= 1). c: correct ones (0 <= c <= n). k: 1 <= k <= n.
    Raises:
        ValueError: arguments outside those ranges.
    Examples: ``pass_at_k(5, 2, 1) == 0.4``, ``pass_at_k(5, 2, 2) == 0.7``, ``pass_at_k(5, 2, 5) == 1.0``.
    """
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def main(overrides: list[str] | None = None) -> dict[str, Any]:
    """``python -m agent_rl.eval`` (see :func:`agent_rl.eval.runner.main`)."""
    from agent_rl.eval.runner import main as _main

    return _main(overrides)


def evaluate(*args: Any, **kwargs: Any) -> Any:
    """See :func:`agent_rl.eval.runner.evaluate`."""
    from agent_rl.eval.runner import evaluate as _evaluate

    return _evaluate(*args, **kwargs)
