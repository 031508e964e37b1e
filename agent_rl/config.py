"""Root config: one dataclass tree composed by Hydra from ``configs/`` (groups env, algo, credit, schedule, model,
engine, trainer) and validated by OmegaConf's structured configs.

``load_config(overrides)`` composes ``configs/config.yaml`` with dotted ``key=value`` overrides (Hydra's compose
API, so ``train.main`` can be called from tests exactly like the CLI), rejects unknown keys with a message naming the
valid ones, and returns the typed :class:`Config` (each dataclass's ``__post_init__`` checks its fields).
"""

from __future__ import annotations

import difflib
import re
import time
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from agent_rl.engines.config import EngineConfig
from agent_rl.learner.config import AlgoConfig, CreditConfig, ModelConfig, OptimConfig, ScheduleConfig
from agent_rl.rollout.config import RolloutConfig, TaskSamplerConfig

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SCHEMA_NAME = "agent_rl_schema"
SERVER_MODES = ("http", "local")


class ConfigError(ValueError):
    """A config key, value or group that does not exist or does not validate."""


@dataclass
class EnvConfig:
    """The environment (``env=...``): a registered gymnasium id, its prompt format and its task sampler."""

    name: str = "alfworld"
    """Short name used in run names and logs."""
    id: str = "agent_rl/ALFWorld-v0"
    """Registered gymnasium id (``import envs`` registers the built-ins; ``env_server.imports`` a user's module)."""
    prompt: str = "alfworld"
    """Prompt format (``agent_rl.rollout.prompts``): alfworld | webshop | math | code | generic."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor kwargs of the env (``env_kwargs`` of the env client)."""
    data_root_kwarg: str = "data_root"
    """Constructor kwarg that receives ``data.root`` when it is set ("" = none; the env then finds the root through
    ``$AGENT_RL_DATA``, which the trainer also sets)."""
    sampler: TaskSamplerConfig = field(default_factory=TaskSamplerConfig)
    """Training tasks, set by each ``configs/env/*.yaml`` (ALFWorld: the 3553 ``train`` games, ``{"split": "train",
    "index": i}``). Empty by default: Hydra merges dicts, so default options would leak into every env's options."""


@dataclass
class EnvServerConfig:
    """Where envs run (``env_server.*``)."""

    mode: str = "http"
    """http: env servers over HTTP (``HTTPEnvPool``); local: in-process ``LocalEnvPool`` (tests, quick tries)."""
    urls: list[str] = field(default_factory=list)
    """Server URLs; empty in http mode = start ``python -m servers.serve --env <env.id>`` on a free 127.0.0.1 port
    for the run (stopped at exit)."""
    token: str | None = None
    """Bearer token of the servers."""
    workers: int = 0
    """``--workers`` of the auto-started server (0 = its default)."""
    max_sessions: int = 0
    """``--max-sessions`` of the auto-started server (0 = its default)."""
    imports: list[str] = field(default_factory=list)
    """Modules imported first (by the auto-started server: ``--import``; by the trainer in local mode), e.g. a user's
    module calling ``gymnasium.register``."""
    startup_timeout_s: float = 300.0
    """How long to wait for the auto-started server's ``/health``."""
    local_workers: int = 0
    """Local mode: worker threads/processes of ``LocalEnvPool`` (0 = its default)."""
    local_kind: str = "thread"
    """Local mode: thread | process."""
    replicas: int = 1
    """trainer.backend=ray, http mode without urls: env-server replicas started as Ray actors (spread over nodes)."""
    replica_cpus: float = 1.0
    """trainer.backend=ray: CPUs reserved per env-server replica."""

    def __post_init__(self) -> None:
        if self.mode not in SERVER_MODES:
            raise ValueError(f"env_server.mode={self.mode!r} is not valid; valid values: {', '.join(SERVER_MODES)}")


@dataclass
class DataConfig:
    """Data (``data.*``)."""

    root: str = ""
    """The one data root (empty = ``$AGENT_RL_DATA``, the cache, then ../shared/data; see ``envs.data``). When set it
    is passed to envs as ``data_root`` and to an auto-started server as ``$AGENT_RL_DATA``."""


@dataclass
class TrainerConfig:
    """The training loop (``trainer=default``)."""

    total_steps: int = 200
    """Training steps N (one rollout + one learner update each); schedules use it."""
    tasks_per_step: int = 8
    """Groups (tasks) per step; rows = tasks_per_step x G x turns."""
    output_dir: str = ""
    """Run directory (config.yaml, metrics.jsonl, tb/, checkpoints/); empty = runs/<env>-<algo>-<time>."""
    save_every: int = 50
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept (oldest deleted first; 0 = keep all)."""
    resume: str = ""
    """"" = fresh run; auto = continue from the latest checkpoint in output_dir if any; or a checkpoint path."""
    seed: int = 0
    """Seed of python, numpy, torch and the task sampler."""
    device: str = "auto"
    """auto (cuda when available) | cpu | cuda | cuda:N."""
    tensorboard: bool = True
    """Write TensorBoard events under DIR/tb."""
    progress: bool = True
    """Console progress bar with key numbers (a plain line per step when off)."""
    imports: list[str] = field(default_factory=list)
    """Modules imported before the learner is built, e.g. one that registers a user's own advantage estimator,
    policy loss, credit rule or schedule with the ``agent_rl.algos`` registries."""
    backend: str = "local"
    """local: one process; ray: learner ranks, rollout workers, env-server replicas as Ray actors (docs/scaling.md)."""
    ray_address: str = ""
    """trainer.backend=ray: cluster to join ("auto" = the running one; "" = $RAY_ADDRESS, else a local cluster)."""
    num_learners: int = 1
    """trainer.backend=ray: data-parallel learner ranks (torch DDP; the batch is split by whole groups)."""
    learner_cpus: float = 1.0
    """trainer.backend=ray: CPUs per learner rank (also its torch threads)."""
    learner_gpus: float = 0.0
    """trainer.backend=ray: GPUs per learner rank (> 0: the rank trains on its GPU, NCCL between ranks)."""

    def __post_init__(self) -> None:
        if self.total_steps < 1 or self.tasks_per_step < 1 or self.save_every < 1:
            raise ValueError("trainer.total_steps, tasks_per_step, save_every must be >= 1")
        if self.backend not in ("local", "ray"):
            raise ValueError(f"trainer.backend={self.backend!r} is not valid; valid values: local, ray")
        if self.num_learners < 1:
            raise ValueError("trainer.num_learners must be >= 1")


@dataclass
class Config:
    """The whole run. Groups: env, algo, credit, schedule, model, engine, trainer; plus rollout, optim,
    env_server, data set in ``configs/config.yaml`` and on the command line."""

    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    env_server: EnvServerConfig = field(default_factory=EnvServerConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        # Derived defaults that span groups (algo depends on engine).
        if self.algo.dapo_overlong_max_len <= 0:
            self.algo.dapo_overlong_max_len = self.engine.max_new_tokens
        if self.algo.dapo_overlong_cache_len <= 0:
            self.algo.dapo_overlong_cache_len = max(1, self.algo.dapo_overlong_max_len // 5)

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """Env constructor kwargs: ``env.kwargs`` plus ``{env.data_root_kwarg: data.root}`` when ``data.root`` is set."""
        kwargs = dict(self.env.kwargs)
        if self.data.root and self.env.data_root_kwarg:
            kwargs.setdefault(self.env.data_root_kwarg, self.data.root)
        return kwargs

    @property
    def run_name(self) -> str:
        return f"{self.env.name}-{self.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def register_configs() -> None:
    """Register the schema in Hydra's ConfigStore (``configs/config.yaml`` lists it first in its defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)


# ---------------------------------------------------------------------------------------------- unknown keys
def _field_types(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def _check_key(path: list[str], full: str) -> bool:
    """Raise ConfigError when the dotted ``path`` is not a field of the Config tree; True when the path goes inside
    a free-form dict field (``env.kwargs``, ``credit.kwargs``, ``env.sampler.options``), which accepts any key."""
    node: Any = Config
    for depth, part in enumerate(path):
        if not (isinstance(node, type) and is_dataclass(node)):
            return True
        types = _field_types(node)
        if part not in types:
            where = ".".join(path[:depth]) or "the root config"
            valid = sorted(types)
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f" Did you mean {'.'.join(path[:depth] + close)!r}?" if close else ""
            raise ConfigError(f"unknown config key {full!r}: {where} has no key {part!r}; valid keys of {where}: "
                              f"{', '.join(valid)}.{hint}")
        node = types[part]
    return False


def check_overrides(overrides: list[str]) -> list[str]:
    """Reject overrides whose key is not in the Config tree, naming the valid keys (group selections such as
    ``algo=grpo`` are checked by Hydra, whose error lists the available options). Returns the overrides with keys
    inside free-form dict fields turned into Hydra's add-or-set form (``env.kwargs.x=1`` -> ``++env.kwargs.x=1``)."""
    groups = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()}
    result = []
    for ov in overrides:
        key = re.split(r"=", ov, maxsplit=1)[0].lstrip("+~").split("@")[0]
        if key in groups or key.startswith("hydra"):
            result.append(ov)
            continue
        free = _check_key(key.split("."), key)
        result.append(f"++{ov}" if free and not ov.startswith(("+", "~")) else ov)
    return result


def _explain(exc: Exception) -> ConfigError:
    """Turn an OmegaConf/Hydra error into a ConfigError that names the valid keys where it can."""
    cause = exc.__cause__
    msg = str(exc) if cause is None else f"{exc}: {cause}"
    m = re.search(r"full_key: ([\w.\[\]]+)", msg)
    if m:
        try:
            _check_key(m.group(1).split("."), m.group(1))
        except ConfigError as err:
            return ConfigError(f"{err}\n({msg.strip()})")
    return ConfigError(msg)


def load_config(overrides: list[str] | None = None, *, config_dir: str | Path | None = None) -> Config:
    """Compose ``configs/config.yaml`` with ``overrides`` (Hydra syntax: ``algo=grpo``, ``trainer.total_steps=2``).

    Raises:
        ConfigError: unknown key (the message lists the valid keys of that level), unknown group option (lists the
            available ones), wrong type, or a value a dataclass ``__post_init__`` rejects.
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
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (printed at start, saved as DIR/config.yaml)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
