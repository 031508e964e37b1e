"""What a resumed run may do with each config key, declared on the config dataclass field as its metadata.

Three rules (docs/training.md, "Resume"), each a ``dataclasses.field(metadata=...)`` value:

- :data:`MAY_CHANGE`: the key does not change what is trained (where it runs, how fast, run length, bookkeeping);
- :func:`applied`: the key may change with ``trainer.resume_allow_changes=true``; its argument names the code that
  applies the new value from the first resumed step on;
- :data:`MUST_MATCH`: every other key (algorithm, model, env and its tasks, sampling, seeds): a resume that changes
  it is refused, with or without ``trainer.resume_allow_changes``.

A field without metadata takes the rule of the nearest enclosing group field (``Config.env_server`` declares
:data:`MAY_CHANGE` for all of ``env_server.*``). :func:`agent_rl.resume.compare_for_resume` reads them; every key of
the tree resolves to a rule (``tests/test_resume_rules.py``). This module imports nothing of the project, so every
config module can declare its fields with it.
"""

from __future__ import annotations

from dataclasses import Field
from types import MappingProxyType
from typing import Any, Mapping

KEY = "resume"
"""The metadata key of a field's rule."""
HOW = "resume_applied_by"
"""The metadata key of an :func:`applied` field's applying code."""
RULES = ("may change", "applied", "must match")

MAY_CHANGE: Mapping[str, Any] = MappingProxyType({KEY: "may change"})
MUST_MATCH: Mapping[str, Any] = MappingProxyType({KEY: "must match"})


def applied(how: str) -> Mapping[str, Any]:
    """The metadata of a key a resume may change with ``trainer.resume_allow_changes=true``; ``how``: the code that
    applies the new value from the first resumed step on (printed with the difference)."""
    if not how:
        raise ValueError("applied(how): name the code that applies the new value")
    return MappingProxyType({KEY: "applied", HOW: how})


def rule_of(f: Field) -> tuple[str, str] | None:
    """``(rule, how)`` declared on dataclass field ``f`` (``how`` is "" unless the rule is "applied"); None when it
    declares none (it then takes its group's)."""
    rule = f.metadata.get(KEY)
    if rule is None:
        return None
    if rule not in RULES:
        raise ValueError(f"field {f.name}: resume rule {rule!r} is not one of {RULES}")
    return rule, f.metadata.get(HOW, "")
