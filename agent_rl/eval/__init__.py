"""Evaluation on fixed panels: ``python -m agent_rl.eval env=alfworld policy=expert eval.split=valid_unseen``.

One code path with training: the same config groups (``env=``, ``model=``, ``engine=``, ``model.path=``), prompts,
action parser, env servers and :class:`~agent_rl.rollout.GroupPlayer` (the reference policies of
:mod:`agent_rl.rollout.policies` answer turns in place of the engine). The run is :mod:`agent_rl.eval.runner`
(``python -m agent_rl.eval``), the in-training panel :mod:`agent_rl.eval.training`. See ``docs/evaluation.md``.
"""

from __future__ import annotations

from math import comb

__all__ = ["pass_at_k"]


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
