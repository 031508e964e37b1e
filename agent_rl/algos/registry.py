"""Registries: one per extension axis, one signature per registry (STYLE habit 3).

Each registry maps a name to a function. Registration is by decorator, a duplicate name raises ``ValueError``, and an
unknown name raises ``ValueError`` listing the valid names (with a "did you mean" hint). The built-in names are also
given as ``str`` Enums (``AdvEstimator``, ``PolicyLossName``, ``CreditRuleName``, ``ScheduleKind``); anywhere a name
is accepted, an Enum member works too. The signature each registry expects is a ``Protocol`` below.

Adding your own (no trainer edit needed)::

    from agent_rl.algos import register_adv_estimator

    @register_adv_estimator("my_adv")
    def my_adv(rewards, group_index, **kwargs):   # (B,), (B,) -> (B,)
        return rewards - rewards.mean()

and select it with ``algo.adv_estimator=my_adv``.
"""

from __future__ import annotations

import difflib
from enum import Enum
from typing import Any, Callable, Generic, Protocol, TypeVar

from torch import Tensor

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "Registry",
    "AdvEstimator",
    "PolicyLossName",
    "CreditRuleName",
    "ScheduleKind",
    "LossAgg",
    "CreditLevel",
    "AdvEstimatorFn",
    "PolicyLossFn",
    "CreditRuleFn",
    "ScheduleFn",
    "ADV_ESTIMATORS",
    "POLICY_LOSSES",
    "CREDIT_RULES",
    "SCHEDULES",
    "register_adv_estimator",
    "register_policy_loss",
    "register_credit_rule",
    "register_schedule",
    "get_adv_estimator",
    "get_policy_loss",
    "get_credit_rule",
    "get_schedule",
    "as_name",
]


def as_name(name: str | Enum) -> str:
    """Return the plain string of a name given as ``str`` or as an Enum member (``AdvEstimator.GRPO -> "grpo"``)."""
    if isinstance(name, Enum):
        return str(name.value)
    if not isinstance(name, str):
        raise TypeError(f"a registry name must be a str or an Enum member, got {type(name).__name__}")
    return name


class Registry(Generic[F]):
    """A name -> function table for one extension axis.

    Args:
        kind: what is registered (used in error messages), e.g. ``"advantage estimator"``.
        config_key: the config key that selects an entry (used in error messages), e.g. ``"algo.adv_estimator"``.
    """

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind
        self.config_key = config_key
        self._fns: dict[str, F] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str | Enum, **meta: Any) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name``; extra keyword ``meta`` is stored (see :meth:`meta`).

        Raises:
            ValueError: ``name`` is already registered (names are never silently overwritten).
        """
        key = as_name(name)

        def deco(fn: F) -> F:
            if key in self._fns:
                raise ValueError(f"{self.kind} {key!r} is already registered ({self._fns[key]!r})")
            self._fns[key] = fn
            self._meta[key] = dict(meta)
            return fn

        return deco

    def get(self, name: str | Enum) -> F:
        """Return the function registered under ``name``.

        Raises:
            ValueError: unknown name; the message lists the valid names and the closest match.
        """
        key = as_name(name)
        try:
            return self._fns[key]
        except KeyError:
            close = difflib.get_close_matches(key, list(self._fns), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown {self.kind} {key!r} ({self.config_key}); valid names: {sorted(self._fns)}.{hint}"
            ) from None

    def meta(self, name: str | Enum) -> dict[str, Any]:
        """Metadata given at registration (e.g. the levels a credit rule supports)."""
        self.get(name)
        return self._meta[as_name(name)]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, (str, Enum)) and as_name(name) in self._fns  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


# ----------------------------------------------------------------------------------------------------------------------
# Built-in names
# ----------------------------------------------------------------------------------------------------------------------
class AdvEstimator(str, Enum):
    """Built-in outcome advantage estimators (algorithms.md section 1). ``ppo`` (GAE) is :func:`compute_gae`, not here,
    because it needs values and token rewards (a different signature)."""

    GRPO = "grpo"
    DRGRPO = "drgrpo"
    RLOO = "rloo"
    REINFORCE_PP = "reinforce_pp"
    GIGPO = "gigpo"


class PolicyLossName(str, Enum):
    """Built-in policy losses (algorithms.md section 2)."""

    PPO_CLIP = "ppo_clip"
    GSPO = "gspo"


class CreditRuleName(str, Enum):
    """Built-in credit rules (algorithms.md section 5)."""

    UNIFORM = "uniform"
    JS = "js"
    TP = "tp"
    FORKING = "forking"
    ENTROPY_ADV = "entropy_adv"
    EMPG = "empg"


class ScheduleKind(str, Enum):
    """Built-in temporal schedules (algorithms.md section 4)."""

    LINEAR = "linear"
    SIGMOID = "sigmoid"
    POWER = "power"
    CONSTANT = "constant"
    NONE = "none"


class LossAgg(str, Enum):
    """Loss aggregations (``algo.loss_agg``, algorithms.md section 2)."""

    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"


class CreditLevel(str, Enum):
    """Where a credit rule acts (``credit.level``): per token of a row, or per turn (= per row in per-turn mode)."""

    TOKEN = "token"
    TURN = "turn"


# ----------------------------------------------------------------------------------------------------------------------
# Signatures (one per registry)
# ----------------------------------------------------------------------------------------------------------------------
class AdvEstimatorFn(Protocol):
    """``(rewards (B,), group_index (B,) long, **kwargs) -> advantages (B,)``; no grad, pure."""

    def __call__(self, rewards: Tensor, group_index: Tensor, **kwargs: Any) -> Tensor: ...


class PolicyLossFn(Protocol):
    """Per-token policy loss before aggregation.

    ``(logprobs (B, T), old_logprobs (B, T), advantages (B, T), response_mask (B, T), *, clip_low, clip_high,
    dual_clip) -> (pg_losses (B, T), metrics)``; metrics are 0-dim detached tensors, masked means over
    ``response_mask`` (keys ``"actor/clipfrac"``, ``"actor/approx_kl"``, ...).
    """

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        *,
        clip_low: float,
        clip_high: float,
        dual_clip: float | None,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


class CreditRuleFn(Protocol):
    """``(inputs: CreditInputs, S: float, level: "token"|"turn", **kwargs) -> (advantages (B, T), loss_mask (B, T))``.

    Registered with ``levels=(...)``, the levels the rule supports; :func:`agent_rl.algos.apply_credit` checks it.
    """

    def __call__(self, inputs: Any, S: float, level: str, **kwargs: Any) -> tuple[Tensor, Tensor]: ...


class ScheduleFn(Protocol):
    """``(tau in [0, 1], m) -> S``, with tau the training progress of algorithms.md section 4 (0 = start, 1 = s_max)."""

    def __call__(self, tau: float, m: float, **kwargs: Any) -> float: ...


# ----------------------------------------------------------------------------------------------------------------------
# The four registries and their public helpers
# ----------------------------------------------------------------------------------------------------------------------
ADV_ESTIMATORS: Registry[AdvEstimatorFn] = Registry("advantage estimator", "algo.adv_estimator")
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "algo.policy_loss")
CREDIT_RULES: Registry[CreditRuleFn] = Registry("credit rule", "credit")
SCHEDULES: Registry[ScheduleFn] = Registry("schedule", "schedule")


def register_adv_estimator(name: str | Enum, row_level: bool = False) -> Callable[[F], F]:
    """Decorator: register an :class:`AdvEstimatorFn` under ``name`` (ValueError if taken).

    ``row_level=False`` (outcome estimators): :func:`agent_rl.algos.compute_advantages` reduces rows to one entry per
    episode when given ``episode_index``. ``row_level=True`` (turn-aware estimators such as ``gigpo``): the estimator
    gets the rows and ``episode_index`` as a keyword.
    """
    return ADV_ESTIMATORS.register(name, row_level=row_level)


def register_policy_loss(name: str | Enum, sequence_level: bool = False) -> Callable[[F], F]:
    """Decorator: register a :class:`PolicyLossFn` under ``name`` (ValueError if taken).

    ``sequence_level=True`` (``gspo``): the loss weighs whole sequences, so the behaviour weight of the off-policy
    correction (:func:`agent_rl.algos.behaviour_weights`) is one per sequence, ``min(exp(mean_t(old_logp -
    logp_beh)), C)``; ``False``: one per token, multiplying each token's policy-gradient loss.
    """
    return POLICY_LOSSES.register(name, sequence_level=bool(sequence_level))


def register_credit_rule(name: str | Enum, levels: tuple[str, ...] = ("token", "turn")) -> Callable[[F], F]:
    """Decorator: register a :class:`CreditRuleFn` under ``name``, supporting ``levels`` (ValueError if taken)."""
    bad = [lv for lv in levels if lv not in {e.value for e in CreditLevel}]
    if bad:
        raise ValueError(f"unknown credit levels {bad}; valid: {[e.value for e in CreditLevel]}")
    return CREDIT_RULES.register(name, levels=tuple(levels))


def register_schedule(name: str | Enum) -> Callable[[F], F]:
    """Decorator: register a :class:`ScheduleFn` under ``name`` (ValueError if taken)."""
    return SCHEDULES.register(name)


def get_adv_estimator(name: str | Enum) -> AdvEstimatorFn:
    """Registered advantage estimator (ValueError listing valid names if unknown)."""
    return ADV_ESTIMATORS.get(name)


def get_policy_loss(name: str | Enum) -> PolicyLossFn:
    """Registered per-token policy loss (ValueError listing valid names if unknown)."""
    return POLICY_LOSSES.get(name)


def get_credit_rule(name: str | Enum) -> CreditRuleFn:
    """Registered credit rule (ValueError listing valid names if unknown)."""
    return CREDIT_RULES.get(name)


def get_schedule(name: str | Enum) -> ScheduleFn:
    """Registered schedule (ValueError listing valid names if unknown)."""
    return SCHEDULES.get(name)
