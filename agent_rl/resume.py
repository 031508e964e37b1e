"""Resuming a run checks its config against the checkpoint's: :func:`compare_for_resume`, the one function that
reads the resume rule each config field declares in its metadata (:mod:`agent_rl.resume_rules`: may change,
applied, must match; a field without one takes its group's, e.g. ``Config.env_server``). docs/training.md, "Resume".
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any

from agent_rl.config.compose import config_dict
from agent_rl.config.schema import Config, ConfigError, field_types
from agent_rl.resume_rules import rule_of


def _schema_node(path: list[str]) -> Any:
    """The dataclass type at dotted ``path`` of the Config tree, ``dict`` for a free-form dict field (``env.kwargs``,
    ``credit.kwargs``, ``env.sampler.options``: compared whole), None for a path the schema does not have."""
    node: Any = Config
    for part in path:
        if not (isinstance(node, type) and is_dataclass(node)):
            return dict
        node = field_types(node).get(part)
        if node is None:
            return None
    return node if isinstance(node, type) and is_dataclass(node) else dict


def _flatten(node: Any, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Dotted key -> value over the schema's fields; free-form dicts stay whole values."""
    if isinstance(node, dict) and (not path or _schema_node(list(path)) is not dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, (*path, str(key))))
        return out
    return {".".join(path): list(node) if isinstance(node, tuple) else node}


def rules_of(cls: type) -> dict[str, tuple[str, str] | None]:
    """Dotted key -> ``(rule, how)`` for every leaf key of dataclass tree ``cls`` (a free-form dict field is one
    key): the rule its field declares, else the nearest enclosing group field's (``how``: the applying code of an
    "applied" key, else ""); None for a key whose field and groups declare none."""
    out: dict[str, tuple[str, str] | None] = {}

    def walk(node: type, prefix: str, inherited: tuple[str, str] | None) -> None:
        types = field_types(node)
        for f in fields(node):
            rule = rule_of(f) or inherited
            t = types[f.name]
            if isinstance(t, type) and is_dataclass(t):
                walk(t, f"{prefix}{f.name}.", rule)
            else:
                out[f"{prefix}{f.name}"] = rule

    walk(cls, "", None)
    return out


@cache
def resume_rules() -> dict[str, tuple[str, str]]:
    """:func:`rules_of` the :class:`Config` tree; every key has a rule (``tests/train/test_resume_rules.py``)."""
    rules = rules_of(Config)
    missing = sorted(k for k, r in rules.items() if r is None)
    if missing:
        raise TypeError(f"config keys without a resume rule (agent_rl.resume_rules): {', '.join(missing)}")
    return rules  # type: ignore[return-value]


def resume_rule(key: str) -> tuple[str, str]:
    """``(rule, how)`` of dotted ``key`` (:func:`resume_rules`); a key inside a free-form dict field takes the
    field's. Raises KeyError for a key the schema does not have."""
    rules = resume_rules()
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        rule = rules.get(".".join(parts[:n]))
        if rule is not None:
            return rule
    raise KeyError(f"{key!r} is not a config key")


def resume_rules_of(kind: str) -> dict[str, str]:
    """The keys whose rule is ``kind`` ("may change", "applied", "must match") -> their ``how``."""
    return {k: r[1] for k, r in resume_rules().items() if r is not None and r[0] == kind}


def may_change_on_resume(key: str) -> bool:
    """Whether dotted ``key`` may change freely on resume (its rule is "may change")."""
    return resume_rule(key)[0] == "may change"


_MISSING = "(absent)"


def compare_for_resume(saved: dict[str, Any] | None, cfg: Config, *, source: str = "the checkpoint") -> list[str]:
    """Compare the config a checkpoint was trained under (``saved``, nested dict) with ``cfg`` before resuming.

    Returns the lines to print: one per differing key, ``resume: KEY: OLD -> NEW (may change | applied: HOW |
    new key | removed key)`` (its rule: :func:`resume_rule`), a warning when "applied" keys changed, plus a note when
    ``total_steps`` changes under a schedule that depends on it. Keys added or removed by a code upgrade are
    reported, not refused.

    Raises:
        ConfigError: a "must match" key differs (with or without ``trainer.resume_allow_changes``), or an
            "applied" key differs and
            ``trainer.resume_allow_changes`` is false; one line naming each key with both values.
    """
    if saved is None:
        return [f"resume: no saved config found ({source}); cannot check that the run resumes under the same one"]
    old, new = _flatten(saved), _flatten(config_dict(cfg))
    lines, applied, fixed = [], [], []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        if a == b or key in ("trainer.resume", "trainer.resume_allow_changes", "trainer.resume_weights_only"):
            continue  # the resume request itself
        if a is _MISSING or b is _MISSING:
            kind = "new key" if a is _MISSING else "removed key"
        elif (rule := resume_rule(key))[0] == "may change":
            kind = "may change"
        elif rule[0] == "applied":
            kind = f"applied: {rule[1]}"
            applied.append(f"{key}: {a!r} -> {b!r}")
        else:
            kind = "must match"
            fixed.append(f"{key}: {a!r} -> {b!r}")
        lines.append(f"resume: {key}: {a!r} -> {b!r} ({kind})")
    can_change = ", ".join(resume_rules_of("applied"))
    if fixed:
        raise ConfigError(f"resuming changes {len(fixed)} key(s) that must match the checkpoint's config ({source}), "
                          f"even with trainer.resume_allow_changes=true: {'; '.join(fixed)}. Only these keys can "
                          f"change on resume (with trainer.resume_allow_changes=true): {can_change}; use a new "
                          "trainer.output_dir (model.path=<checkpoint> starts a new run from its weights)")
    if applied and not cfg.trainer.resume_allow_changes:
        raise ConfigError(f"resuming changes {len(applied)} key(s) that must match the checkpoint's config "
                          f"({source}): {'; '.join(applied)}. Add trainer.resume_allow_changes=true to resume and "
                          "apply the new value(s) from the first resumed step, or use a new trainer.output_dir")
    if applied:
        lines.append(f"resume: WARNING: {len(applied)} key(s) changed (trainer.resume_allow_changes=true), each "
                     "applied from the first resumed step: the resumed run is not the run it continues")
    if old.get("trainer.total_steps") != new.get("trainer.total_steps") and cfg.schedule.value is None and \
            cfg.schedule.kind not in ("none", "constant"):
        lines.append(f"resume: note: schedule={cfg.schedule.kind} depends on trainer.total_steps; the remaining "
                     "steps follow the new N")
    return lines


RESUME_APPLIED: dict[str, str] = resume_rules_of("applied")
"""The "applied" keys -> the code that applies each (derived from the fields' metadata; for messages and tests)."""
