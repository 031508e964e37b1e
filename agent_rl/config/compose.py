"""Loading a run's config: Hydra composes ``configs/config.yaml`` with dotted ``key=value`` overrides onto the
:class:`agent_rl.config.schema.Config` schema (its compose API, so ``train.main`` can be called from tests exactly
like the CLI); unknown keys are rejected naming the valid ones, Hydra/OmegaConf errors are explained in one line, and
:func:`load_config` returns the typed config after :func:`agent_rl.config.trainable.check_trainable`.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

from agent_rl.config.schema import CONFIG_DIR, SCHEMA_NAME, Config, ConfigError, field_types
from agent_rl.config.trainable import check_trainable

def register_configs() -> None:
    """Register the schema in Hydra's ConfigStore (``configs/config.yaml`` lists it first in its defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)



# ---------------------------------------------------------------------------------------------- unknown keys
REPLACED_KEYS: dict[str, str] = {
    "trainer.tensorboard": "trainer.loggers lists the metric sinks: trainer.tensorboard=false is "
                           "trainer.loggers=[jsonl]; true is the default [jsonl,tensorboard]",
}
"""Keys that no longer exist -> what replaced them (refused with this hint)."""


def _check_key(path: list[str], full: str) -> bool:
    """Raise ConfigError when the dotted ``path`` is not a field of the Config tree (a replaced key with its hint,
    :data:`REPLACED_KEYS`); True when the path goes inside a free-form dict field (``env.kwargs``,
    ``credit.kwargs``, ``env.sampler.options``), which accepts any key."""
    if ".".join(path) in REPLACED_KEYS:
        raise ConfigError(f"config key {full!r} was replaced: {REPLACED_KEYS['.'.join(path)]}")
    node: Any = Config
    for depth, part in enumerate(path):
        if not (isinstance(node, type) and is_dataclass(node)):
            return True
        types = field_types(node)
        if part not in types:
            where = ".".join(path[:depth]) or "the root config"
            valid = sorted(types)
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f" Did you mean {'.'.join(path[:depth] + close)!r}?" if close else ""
            raise ConfigError(f"unknown config key {full!r}: {where} has no key {part!r}; valid keys of {where}: "
                              f"{', '.join(valid)}.{hint}")
        node = types[part]
    return False


#: ``key=value`` short forms of a group's one switch -> the full key (``algo.calibration=probe`` is
#: ``algo.calibration.mode=probe``, algorithms.md section 3b).
SHORT_FORMS: dict[str, str] = {"algo.calibration": "algo.calibration.mode"}


def check_overrides(overrides: list[str]) -> list[str]:
    """Reject overrides whose key is not in the Config tree, naming the valid keys (group selections such as
    ``algo=grpo`` are checked by Hydra, whose error lists the available options). Returns the overrides with keys
    inside free-form dict fields turned into Hydra's add-or-set form (``env.kwargs.x=1`` -> ``++env.kwargs.x=1``)
    and the :data:`SHORT_FORMS` spelled out."""
    groups = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()}
    result = []
    for ov in overrides:
        head, sep, value = ov.partition("=")
        if sep and head in SHORT_FORMS:
            ov = f"{SHORT_FORMS[head]}={value}"
        key = re.split(r"=", ov, maxsplit=1)[0].lstrip("+~").split("@")[0]
        if key in groups or key.startswith("hydra"):
            result.append(ov)
            continue
        free = _check_key(key.split("."), key)
        result.append(f"++{ov}" if free and not ov.startswith(("+", "~")) else ov)
    return result


def _explain(exc: Exception) -> ConfigError:
    """Turn an OmegaConf/Hydra error into a one-line ConfigError that names the valid keys or options."""
    cause = exc.__cause__
    msg = str(exc) if cause is None else f"{exc}: {cause}"
    m = re.search(r"full_key: ([\w.\[\]]+)", msg)
    if m:
        try:
            _check_key(m.group(1).split("."), m.group(1))
        except ConfigError as err:
            return err
    missing = re.search(r"Could not find '([\w-]+)/([^']*)'", msg)
    if missing:  # unknown group option: Hydra's message spans many lines
        group, option = missing.groups()
        options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
        close = difflib.get_close_matches(option, options, n=1)
        hint = f" Did you mean {group}={close[0]}?" if close else ""
        return ConfigError(f"unknown option {group}={option}: available options in '{group}': "
                           f"{', '.join(options)}.{hint}")
    first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    return ConfigError(f"{first} ({m.group(1)})" if m else " ".join(msg.split()))


def load_config(overrides: list[str] | None = None, *, config_dir: str | Path | None = None,
                check: bool = True) -> Config:
    """Compose ``configs/config.yaml`` with ``overrides`` (Hydra syntax: ``algo=grpo``, ``trainer.total_steps=2``),
    then (``check``) refuse what cannot train and print what was adjusted (:func:`check_trainable`).

    Raises:
        ConfigError: unknown key (the message lists the valid keys of that level), unknown group option (lists the
            available ones), wrong type, a value a dataclass ``__post_init__`` rejects, or a combination that
            cannot train (:func:`check_trainable`).
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = list(overrides or [])
    register_configs()
    overrides = check_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir or CONFIG_DIR).resolve()), version_base=None):
            composed = compose(config_name="config", overrides=overrides)
        cfg = OmegaConf.to_object(composed)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 (Hydra/OmegaConf/ValueError from __post_init__: re-raised explained)
        raise _explain(exc) from exc
    assert isinstance(cfg, Config)
    if check:
        for note in check_trainable(cfg):
            print(f"config: {note}", file=sys.stderr)
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (printed at start, saved as DIR/config.yaml)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config as a plain nested dict (JSON-serialisable; saved in each checkpoint's ``extra.json``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
