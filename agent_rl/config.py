"""Root config: one dataclass tree composed by Hydra from ``configs/`` (groups env, algo, credit, schedule, model,
engine, trainer) and validated by OmegaConf's structured configs.

``load_config(overrides)`` composes ``configs/config.yaml`` with dotted ``key=value`` overrides (Hydra's compose
API, so ``train.main`` can be called from tests exactly like the CLI), rejects unknown keys with a message naming the
valid ones, and returns the typed :class:`Config` (each dataclass's ``__post_init__`` checks its fields).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys
import time
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import gymnasium
import torch

import envs  # noqa: F401 (registers the built-in ids)
from agent_rl import algos
from agent_rl.engines import engine_names
from agent_rl.engines.config import EngineConfig
from agent_rl.engines.vllm import check_config as check_vllm
from agent_rl.episodes import parse_save_episodes
from agent_rl.eval.config import EvalConfig
from agent_rl.learner.config import AlgoConfig, CreditConfig, ModelConfig, OptimConfig, ScheduleConfig
from agent_rl.models import model_context_length
from agent_rl.rollout import get_prompt
from agent_rl.rollout.config import RolloutConfig, TaskSamplerConfig
from agent_rl.rollout.tools import get_tool_call_format
from envs.families import family_of
from envs.wrappers import WRAPPER_KWARGS

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SCHEMA_NAME = "agent_rl_schema"
SERVER_MODES = ("http", "local")
LOCAL_KINDS = ("thread", "process")


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
    """Prompt format (``agent_rl.rollout.prompts``): alfworld | webshop | textworld | math | code | generic."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor kwargs of the env (``env_kwargs`` of the env client)."""
    data_root_kwarg: str = "data_root"
    """Constructor kwarg that receives ``data.root`` when it is set ("" = none; the env then finds the root through
    ``$AGENT_RL_DATA``, which the trainer also sets)."""
    sampler: TaskSamplerConfig = field(default_factory=TaskSamplerConfig)
    """Training tasks, set by each ``configs/env/*.yaml`` (ALFWorld: the 3553 ``train`` games, ``{"split": "train",
    "index": i}``). Empty by default: Hydra merges dicts, so default options would leak into every env's options."""
    action_format: str = "text"
    """text: the env's text commands in ``<action>`` tags; tools: the model's native tool calls (docs/tools.md):
    the env is made with ``action_format="tools"`` and declares its tools, the prompt passes them to the chat
    template, calls are read by ``model.tool_call_format``."""
    tools: list[str] = field(default_factory=list)
    """Tools given to a task env by name (math, code: ``[python]`` makes an episode multi-turn, calls run in the
    code sandbox); needs ``env.action_format=tools``. Passed to the env as its ``tools`` kwarg."""

    def __post_init__(self) -> None:
        if self.action_format not in ("text", "tools"):
            raise ValueError(f"env.action_format={self.action_format!r} is not valid; valid values: text, tools")
        if self.tools and self.action_format != "tools":
            raise ValueError(f"env.tools={list(self.tools)} needs env.action_format=tools")


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
    max_restarts: int = 3
    """The auto-started server is started again when it dies, this many times per run; then the run stops with an
    error naming the cause (0: stop at the first death)."""
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
        if self.local_kind not in LOCAL_KINDS:
            raise ValueError(f"env_server.local_kind={self.local_kind!r} is not valid; valid values: "
                             f"{', '.join(LOCAL_KINDS)}")


@dataclass
class DataConfig:
    """Data (``data.*``)."""

    root: str = ""
    """The one data root (empty = ``$AGENT_RL_DATA``, the cache, then ../shared/data; see ``envs.data``). When set it
    is passed to envs as ``data_root`` and to an auto-started server as ``$AGENT_RL_DATA``."""


#: ``trainer.warm_start`` values (:func:`resolve_warm_start`)
WARM_STARTS = ("auto", "bc", "none")


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
    resume_allow_changes: bool = False
    """Resume with changed keys of ``RESUME_APPLIED`` (optimiser and loss hyper-parameters, each applied from the
    resumed step on); any other change outside ``RESUME_MAY_CHANGE`` is refused even then. The differences are
    printed either way (docs/training.md, "Resume")."""
    resume_weights_only: bool = False
    """Resume a checkpoint from its policy weights, step and data position only: the optimizer (AdamW moments), the
    LR warm-up, the value head and the mini-batch shuffling restart, as the run prints. Without it a checkpoint
    that lacks ``learner.pt`` (or ``rng.pt``) is refused."""
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
    policy loss, credit rule or schedule with the ``agent_rl.algos`` registries. Kept apart from
    ``env_server.imports`` on purpose: those run inside the env server process (its own container, no torch), these
    in the trainer (no env dependencies); a module that registers both kinds goes in both lists."""
    save_episodes: str = "8"
    """Episode store (``DIR/episodes/step_N.jsonl``, read by ``python -m agent_rl.viewer DIR``, docs/viewer.md):
    none | all | N episodes per step, kept as whole groups drawn at random."""
    eval_every: int = 0
    """Evaluate a small fixed panel (``agent_rl.eval``) before step 1, every this many steps and after the last
    (0 = never); logged as ``eval/<panel>/...`` in metrics.jsonl (step 0 = before training) and TensorBoard."""
    eval_panel: str = ""
    """The panel's split or dataset ("" = the env's default: ALFWorld valid_unseen, WebShop test, math math500,
    code humanevalplus); its tasks are never training tasks (other split / dataset)."""
    eval_tasks: int = 8
    """Tasks of the in-training panel (spread evenly over the split); decoded as ``eval.*`` says (greedy)."""
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
    learner_strategy: str = "ddp"
    """trainer.backend=ray: how the learner ranks split the model (docs/scaling.md, "Memory"): ddp = every rank holds
    the whole model, its gradients and AdamW moments (torch DDP); fsdp = each rank holds 1/num_learners of each
    (torch FSDP2 ``fully_shard`` per decoder layer and at the root; bf16 compute, fp32 reduction and master weights on
    GPU; sharded checkpoints with torch.distributed.checkpoint). Same update either way."""
    fsdp_offload: bool = False
    """trainer.learner_strategy=fsdp on GPU: keep the parameter, gradient and AdamW shards in CPU memory
    (``CPUOffloadPolicy``; the optimiser steps on the CPU, each layer is copied to the GPU for its passes)."""
    max_staleness: int = 0
    """Asynchronous rollouts (algorithms.md section 7, docs/training.md "Asynchronous rollouts"): k >= 1 lets the
    rollout side produce groups for up to k steps ahead while the learner updates, and admits a group only if every
    token's staleness (step - 1 - its policy version) is <= k; 0 = synchronous (today's run exactly)."""
    warm_start: str = "auto"
    """Behaviour-cloning warm start before RL (issue 35, docs/training.md "Warm start"): bc = clone the env's expert
    on train-split tasks (``sft.*``; checkpoints under ``DIR/checkpoints/warm_start/``, rows of kind ``sft`` in the
    same metrics.jsonl), then RL from the cloned weights; none = RL from ``model.*``; auto = bc for the embedded
    default model (``model=smollm2`` without ``model.path``) on an env with an expert (ALFWorld, TextWorld,
    WebShop), none otherwise. Resolved to bc | none when the config is loaded (:func:`resolve_warm_start`)."""

    def __post_init__(self) -> None:
        if self.warm_start not in WARM_STARTS:
            raise ValueError(f"trainer.warm_start={self.warm_start!r} is not valid; valid values: "
                             f"{', '.join(WARM_STARTS)}")
        if self.total_steps < 1 or self.tasks_per_step < 1 or self.save_every < 1:
            raise ValueError("trainer.total_steps, tasks_per_step, save_every must be >= 1")
        parse_save_episodes(self.save_episodes)  # ValueError naming the valid values
        if self.backend not in BACKENDS:
            raise ValueError(f"trainer.backend={self.backend!r} is not valid; valid values: {', '.join(BACKENDS)}")
        if self.num_learners < 1:
            raise ValueError("trainer.num_learners must be >= 1")
        if self.learner_strategy not in LEARNER_STRATEGIES:
            raise ValueError(f"trainer.learner_strategy={self.learner_strategy!r} is not valid; valid values: "
                             f"{', '.join(LEARNER_STRATEGIES)}")
        if self.fsdp_offload and self.learner_strategy != "fsdp":
            raise ValueError("trainer.fsdp_offload=true offloads FSDP shards: it needs trainer.learner_strategy=fsdp")
        if self.max_staleness < 0:
            raise ValueError(f"trainer.max_staleness={self.max_staleness} must be >= 0 (0 = synchronous rollouts)")
        if self.resume_weights_only and not self.resume:
            raise ValueError("trainer.resume_weights_only=true resumes a checkpoint: it needs trainer.resume=auto or "
                             "a checkpoint path (a new run from a checkpoint's weights: model.path=<checkpoint>)")


@dataclass
class SFTConfig:
    """Behaviour cloning (``python -m agent_rl.sft``, ``sft.*``): expert episodes collected once, then epochs of
    cross-entropy on their action tokens (the RL rows). Read only by ``agent_rl.sft``."""

    num_episodes: int = 64
    """Expert episodes to collect (tasks drawn from ``env.sampler``)."""
    epochs: int = 1
    """Passes over the collected rows."""
    batch_size: int = 16
    """Rows per optimizer step."""
    micro_batch_size: int = 8
    """Rows per forward/backward (gradient accumulation up to ``batch_size``)."""
    keep_lost: bool = False
    """Also train on expert episodes that did not win."""
    response_template: str = "<action>{action}</action>"
    """The target response of a turn; ``{action}`` is the expert action."""
    append_eos: bool = True
    """End the target response with the tokenizer's EOS (the chat template's end-of-turn)."""
    concurrency: int = 8
    """Expert episodes played at once while collecting."""
    lr: float = 5.0e-5
    """AdamW learning rate of the cloning steps (0 = ``optim.lr``). 5e-5: the rate SmolLM2's TextWorld cloning used
    (docs/learning.md; the RL presets' 1e-6 would barely move it in a warm start's few steps); ``model=tiny`` sets
    1e-3, its ``optim.lr``. ``optim.lora_lr`` for a LoRA adapter as in RL."""
    expert_kwarg: str | None = None
    """Env constructor kwarg that turns ``info["expert_action"]`` on; None = the env family's (``envs.families``:
    ``expert`` for every built-in env with an expert, and for an env that describes none); "" = the env always
    gives it."""

    def __post_init__(self) -> None:
        if self.num_episodes < 1 or self.epochs < 1 or self.batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("sft.num_episodes, epochs, batch_size, micro_batch_size must be >= 1")
        if "{action}" not in self.response_template:
            raise ValueError("sft.response_template must contain {action}")


@dataclass(frozen=True)
class BackendCapabilities:
    """What a training backend can do (``trainer.backend``); a config asking for more is refused at load time
    (:func:`check_trainable`), never run with a silent difference."""

    prefetch: bool
    """The next step's env resets run during this step's update (the loop asks for it when offered)."""
    refill: bool
    """DAPO's dynamic sampling draws new tasks for the groups it filters (``algo.dapo_max_extra_rounds``)."""
    data_parallel: bool
    """Several learner ranks (``trainer.num_learners > 1``)."""
    rollout_workers: bool
    """Several rollout workers and env-server replicas (``rollout.num_workers``, ``env_server.replicas`` > 1)."""
    sharded_learner: bool = False
    """Learner ranks that shard the model (``trainer.learner_strategy=fsdp``: FSDP2 over a process group)."""


#: ``trainer.backend`` -> its capabilities (``agent_rl.local.LocalBackend``, ``agent_rl.distributed.backend``).
BACKENDS: dict[str, BackendCapabilities] = {
    "local": BackendCapabilities(prefetch=True, refill=True, data_parallel=False, rollout_workers=False),
    "ray": BackendCapabilities(prefetch=False, refill=True, data_parallel=True, rollout_workers=True,
                               sharded_learner=True),
}

#: ``trainer.learner_strategy`` values (``agent_rl.distributed.data_parallel`` / ``agent_rl.distributed.fsdp``).
LEARNER_STRATEGIES = ("ddp", "fsdp")


@dataclass
class Config:
    """The whole run. Groups: env, algo, credit, schedule, model, engine, trainer; plus rollout, optim,
    env_server, data, eval, sft set in ``configs/config.yaml`` and on the command line."""

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
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        # Derived defaults that span groups (algo depends on engine).
        if self.algo.dapo_overlong_max_len <= 0:
            self.algo.dapo_overlong_max_len = self.engine.max_new_tokens
        if self.algo.dapo_overlong_cache_len <= 0:
            self.algo.dapo_overlong_cache_len = max(1, self.algo.dapo_overlong_max_len // 5)

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """``gymnasium.make`` kwargs of every training env: :meth:`make_env_kwargs` with ``rollout.max_turns`` and
        ``rollout.invalid_penalty``."""
        return self.make_env_kwargs(self.rollout.max_turns, self.rollout.invalid_penalty)

    def make_env_kwargs(self, max_turns: int, invalid_penalty: float = 0.0) -> dict[str, Any]:
        """``gymnasium.make`` kwargs: ``env.kwargs``, ``{env.data_root_kwarg: data.root}`` when ``data.root`` is set,
        the turn budget ``max_episode_steps = max_turns`` (gymnasium's TimeLimit: the env itself truncates at the
        rollout's last turn, so the two can never disagree) for multi-turn budgets (with ``max_turns=1``, single-turn
        envs, the env's own registration decides, so a one-step answer is terminated, not truncated), and
        ``invalid_action_penalty`` when > 0 (``envs.wrappers.InvalidActionPenalty``, applied by ``make_env``), and
        ``action_format="tools"`` (with ``tools`` when ``env.tools`` is set) for ``env.action_format=tools``."""
        kwargs = dict(self.env.kwargs)
        if self.env.action_format == "tools":
            kwargs["action_format"] = "tools"
            if self.env.tools:
                kwargs["tools"] = list(self.env.tools)
        if self.data.root and self.env.data_root_kwarg:
            kwargs.setdefault(self.env.data_root_kwarg, self.data.root)
        if max_turns > 1:
            kwargs["max_episode_steps"] = max_turns
        if invalid_penalty:
            kwargs["invalid_action_penalty"] = invalid_penalty
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


# ------------------------------------------------------------------------------------------ trainable configs
DEVICE_HELP = "auto, cpu, cuda, cuda:N"


def _registry_checks(cfg: Config) -> None:
    """Registry names (after ``trainer.imports``, which may register a user's entries): ``ValueError`` listing the
    valid names."""
    if not cfg.algo.uses_critic:
        algos.get_adv_estimator(cfg.algo.adv_estimator)
    algos.get_policy_loss(cfg.algo.policy_loss)
    levels = algos.CREDIT_RULES.meta(cfg.credit.name).get("levels", ("token", "turn"))
    if cfg.credit.level not in levels:
        raise ValueError(f"credit={cfg.credit.name} is not defined at credit.level={cfg.credit.level}; "
                         f"it supports {list(levels)}")
    rule_params = _keyword_params(algos.get_credit_rule(cfg.credit.name), skip=3)  # (inputs, S, level, ...)
    unknown = sorted(set(cfg.credit.kwargs) - set(rule_params)) if rule_params is not None else []
    if unknown:
        raise ValueError(f"credit.kwargs {', '.join(unknown)} not accepted by credit={cfg.credit.name}; valid keys: "
                         f"{', '.join(rule_params or []) or '(none)'}")
    algos.get_schedule(cfg.schedule.kind)
    if cfg.engine.name not in engine_names():
        close = difflib.get_close_matches(cfg.engine.name, engine_names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown engine {cfg.engine.name!r} (engine.name); valid names: {engine_names()}.{hint}")
    get_prompt(cfg.env.prompt)
    if cfg.env.action_format == "tools":
        get_tool_call_format(cfg.model.tool_call_format)


def _keyword_params(fn: Any, skip: int = 0) -> list[str] | None:
    """Keyword parameter names of ``fn`` after its first ``skip`` parameters; None if it takes ``**kwargs`` (or
    cannot be inspected), so any key is accepted."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params[skip:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _import_all(key: str, modules: list[str]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"{key}: cannot import {module!r} ({exc}); the module must be importable from the "
                              "working directory or PYTHONPATH") from None


def _env_checks(cfg: Config) -> None:
    """``env.id`` registered (built-ins and ``env_server.imports``) and ``env.kwargs`` accepted by its constructor.
    Skipped for env servers given by URL (their registry is theirs). The turn budget has one key, rollout.max_turns."""
    if "max_episode_steps" in cfg.env.kwargs:
        raise ConfigError("env.kwargs.max_episode_steps is not a key here: the turn budget is rollout.max_turns "
                          "(passed to the env as gymnasium's max_episode_steps)")
    if cfg.env_server.mode == "http" and cfg.env_server.urls:
        return
    _import_all("env_server.imports", cfg.env_server.imports)
    spec = gymnasium.registry.get(cfg.env.id)
    if spec is None:
        ids = sorted(k for k in gymnasium.registry if "/" in k)
        close = difflib.get_close_matches(cfg.env.id, list(gymnasium.registry), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"env.id={cfg.env.id!r} is not a registered gymnasium id; registered: {', '.join(ids)} "
                          f"(a user's env: env_server.imports=[module] calling gymnasium.register).{hint}")
    entry = spec.entry_point
    try:
        ctor = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception:  # noqa: BLE001 (an entry point that cannot be loaded here fails, with its reason, when built)
        return
    accepted = _keyword_params(ctor)
    if accepted is None:
        return
    unknown = sorted(set(cfg.env_kwargs) - set(accepted) - {"max_episode_steps", *WRAPPER_KWARGS})  # make_env's
    for key, what in (("action_format", "env.action_format=tools"), ("tools", f"env.tools={list(cfg.env.tools)}")):
        if key in unknown and key not in cfg.env.kwargs:
            raise ConfigError(f"{what}: {cfg.env.id} ({entry}) takes no {key!r} argument, so it offers no tool "
                              "interface; a tool env takes action_format='tools' and declares its tools "
                              "(docs/tools.md)")
    if unknown:
        raise ConfigError(f"env.kwargs {', '.join(unknown)} not accepted by {cfg.env.id} ({entry}); valid keys: "
                          f"{', '.join(sorted(accepted)) or '(none)'}")


def _device_checks(cfg: Config) -> None:
    name = cfg.trainer.device
    if name == "auto":
        return
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"trainer.device={name!r} is not a device; valid: {DEVICE_HELP}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name!r} but torch finds no CUDA device; use trainer.device=cpu (or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"trainer.device={name!r}: only {torch.cuda.device_count()} CUDA device(s)")


def fit_prompt_budget(cfg: Config, context: int | None, source: str) -> str | None:
    """Keep every row inside the model's context: ``rollout.max_prompt_tokens + engine.max_new_tokens <= context``
    (a row is at most one prompt plus one response, also in trajectory mode, whose prompt holds the history).
    A larger prompt budget is capped to ``context - max_new_tokens`` in place (returns the one-line note to print);
    ``engine.max_new_tokens >= context`` is refused (ConfigError). ``context`` None (unknown) checks nothing."""
    if not context:
        return None
    budget, new = cfg.rollout.max_prompt_tokens, cfg.engine.max_new_tokens
    if new >= context:
        raise ConfigError(f"engine.max_new_tokens={new} does not fit the model's context of {context} positions "
                          f"({source}); lower it below {context}")
    if budget + new <= context:
        return None
    cfg.rollout.max_prompt_tokens = context - new
    return (f"rollout.max_prompt_tokens capped {budget} -> {context - new}: the model's context is {context} "
            f"positions ({source}) and engine.max_new_tokens={new}")


def check_trainable(cfg: Config) -> list[str]:
    """Refuse at load time what cannot train, and say what was adjusted (issue 10, docs/training.md "Refused
    configs"). Imports ``trainer.imports`` (a user's registry entries) and, for in-process or auto-started envs,
    ``env_server.imports``.

    Checks: registry names (estimator, policy loss, credit rule and level, schedule, engine, prompt format); the env
    id and its constructor kwargs; ``trainer.device``; the model's context (prompt budget capped, see
    :func:`fit_prompt_budget`); batch-level estimators need >= 2 episodes per step; gigpo needs per-turn rows; DAPO
    overlong ``L_c <= L_max``.
    Single-group checks (``algo=dapo`` with G < 2, group estimators with G = 1, temperatures 0) are in the
    dataclasses' ``__post_init__``.

    Returns:
        one-line notes (adjustments and warnings) that :func:`load_config` prints.
    Raises:
        ConfigError: what, where, and the valid choices.
    """
    notes: list[str] = []
    _import_all("trainer.imports", cfg.trainer.imports)
    notes += resolve_warm_start(cfg)  # issue 35: trainer.warm_start auto -> bc | none, bc without an expert refused
    try:
        _registry_checks(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _env_checks(cfg)
    _device_checks(cfg)
    if cfg.model.path and not Path(cfg.model.path).is_dir():
        raise ConfigError(f"model.path={cfg.model.path!r} is not a folder (a saved model or checkpoint)")
    if cfg.model.name.startswith(("/", "./", "../", "~")) and not Path(cfg.model.name).expanduser().is_dir():
        raise ConfigError(f"model.name={cfg.model.name!r} looks like a local path but is not a folder; valid: "
                          "smollm2, tiny, a hub id (org/name) or an existing folder")
    context = model_context_length(cfg.model)
    source = f"model={cfg.model.name}"
    if cfg.engine.name == "vllm":  # vLLM found, recent enough, head size and context it can run (engines/vllm.py)
        try:
            notes += check_vllm(cfg, context)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if cfg.engine.max_model_len and (not context or cfg.engine.max_model_len < context):
            context, source = cfg.engine.max_model_len, "engine.max_model_len"
    note = fit_prompt_budget(cfg, context, source)
    if note:
        notes.append(note)
    algo = cfg.algo
    if algo.adv_estimator == "reinforce_pp" and cfg.trainer.tasks_per_step * algo.group_size < 2:
        raise ConfigError("algo.adv_estimator=reinforce_pp whitens over the step's episodes: trainer.tasks_per_step x "
                          f"algo.group_size = {cfg.trainer.tasks_per_step * algo.group_size} gives advantage 0; "
                          "use >= 2 episodes per step")
    if cfg.env.tools and cfg.rollout.max_turns < 2:
        raise ConfigError(f"env.tools={list(cfg.env.tools)} makes an episode multi-turn (tool calls, then the final "
                          f"answer) but rollout.max_turns={cfg.rollout.max_turns}; set rollout.max_turns >= 2 "
                          "(env=math_python uses 4)")
    if algo.adv_estimator == "gigpo" and cfg.rollout.mode != "turn":
        raise ConfigError("algo.adv_estimator=gigpo groups turns by their observation: it needs rollout.mode=turn "
                          f"(got {cfg.rollout.mode})")
    if algo.dapo_overlong and algo.dapo_overlong_cache_len > algo.dapo_overlong_max_len:
        raise ConfigError(f"algo.dapo_overlong_cache_len={algo.dapo_overlong_cache_len} must be <= "
                          f"algo.dapo_overlong_max_len={algo.dapo_overlong_max_len}")
    _backend_checks(cfg)
    notes += _async_checks(cfg)
    mini = algo.num_mini_batches
    if mini > cfg.trainer.tasks_per_step:
        notes.append(f"algo.num_mini_batches={mini} > trainer.tasks_per_step={cfg.trainer.tasks_per_step}: "
                     "mini-batches hold whole groups, so a step makes at most tasks_per_step optimiser steps")
    if algo.high_repetition_penalty != 1.0:
        notes.append(f"warning: algo.high_repetition_penalty={algo.high_repetition_penalty} samples T1 rows from "
                     "the penalised distribution while the learner's log-probs are unpenalised (off-policy by that "
                     "much; the reference code does the same); algo.behaviour_correction=tis weights each token by "
                     "min(exp(old_logp - logp_beh), cap) and so corrects it (auto: tis only when "
                     "trainer.max_staleness >= 1)")
    return notes


def resolve_warm_start(cfg: Config) -> list[str]:
    """``trainer.warm_start`` resolved in place: auto -> bc for the embedded default model (``model.name=smollm2``,
    no ``model.path``) on an env whose family describes an expert (``envs.families``: ALFWorld's handcoded expert,
    TextWorld's walkthroughs, WebShop's oracle) with text actions, else none. Returns the note to print.

    Raises:
        ConfigError: ``bc`` on an env without an expert (a family that describes none, e.g. math and code; an env
            that describes no family, unless ``sft.expert_kwarg`` names its expert kwarg) or with tool-call actions.
    """
    t = cfg.trainer
    family = family_of(cfg.env.id)
    # the env has an expert: its family names the expert kwarg, or (an env without a family) sft.expert_kwarg is set
    expert = bool(family.expert_kwarg) if family is not None else cfg.sft.expert_kwarg is not None
    if t.warm_start == "auto":
        t.warm_start = "bc" if (cfg.model.name == "smollm2" and not cfg.model.path and expert and
                                cfg.env.action_format == "text") else "none"
        if t.warm_start == "bc":
            return [f"trainer.warm_start=auto -> bc: model={cfg.model.name} is the embedded default and {cfg.env.id} "
                    "has an expert; it is cloned first (sft.*), then RL (trainer.warm_start=none: RL only)"]
        return []
    if t.warm_start == "bc":
        if not expert:
            why = (f"its family ({family.name}, envs.families) describes no expert" if family is not None else
                   "it describes no env family (envs.families.register_family) and sft.expert_kwarg is not set")
            raise ConfigError(f"trainer.warm_start=bc clones the env's expert, but {cfg.env.id} has none: {why}; "
                              "use trainer.warm_start=none (or auto)")
        if cfg.env.action_format != "text":
            raise ConfigError("trainer.warm_start=bc needs env.action_format=text: the env experts give text "
                              "commands, and their tool-call form (docs/tools.md) is not written yet")
    return []


def _async_checks(cfg: Config) -> list[str]:
    """Asynchronous rollouts (``trainer.max_staleness`` >= 1) that cannot work are refused; keys that only act with
    them are noted when set without them."""
    k, r = cfg.trainer.max_staleness, cfg.rollout
    if k == 0:
        return ["note: rollout.partial=true has no effect with trainer.max_staleness=0 (synchronous rollouts: no "
                "weight sync happens during an episode)"] if r.partial else []
    if cfg.engine.sleep_mode:
        raise ConfigError(f"engine.sleep_mode=true frees the engine's GPU memory during every update, but "
                          f"trainer.max_staleness={k} keeps it generating then; set engine.sleep_mode=false or "
                          "trainer.max_staleness=0")
    return []


def _backend_checks(cfg: Config) -> None:
    """What ``trainer.backend`` cannot do (:data:`BACKENDS`) is refused here, with the backend that can."""
    t, caps = cfg.trainer, BACKENDS[cfg.trainer.backend]
    asks = [(t.num_learners > 1, "data_parallel", f"trainer.num_learners={t.num_learners}"),
            (cfg.rollout.num_workers > 1, "rollout_workers", f"rollout.num_workers={cfg.rollout.num_workers}"),
            (cfg.env_server.replicas > 1, "rollout_workers", f"env_server.replicas={cfg.env_server.replicas}"),
            (cfg.algo.dapo_dynamic_sampling and cfg.algo.dapo_max_extra_rounds > 0, "refill",
             f"algo.dapo_dynamic_sampling with algo.dapo_max_extra_rounds={cfg.algo.dapo_max_extra_rounds}"),
            (t.learner_strategy == "fsdp", "sharded_learner", "trainer.learner_strategy=fsdp")]
    for asked, capability, what in asks:
        if asked and not getattr(caps, capability):
            able = [name for name, c in BACKENDS.items() if getattr(c, capability)]
            raise ConfigError(f"{what} needs a backend with {capability.replace('_', ' ')} (trainer.backend="
                              f"{'|'.join(able)}); trainer.backend={t.backend} has none")
    if t.num_learners > t.tasks_per_step:
        raise ConfigError(f"trainer.tasks_per_step={t.tasks_per_step} < trainer.num_learners={t.num_learners}: every "
                          "learner rank needs at least one whole group")
    if t.learner_strategy == "fsdp" and cfg.algo.uses_critic:
        raise ConfigError(f"trainer.learner_strategy=fsdp does not shard the value head of algo={cfg.algo.name}; "
                          "use trainer.learner_strategy=ddp")
    if t.fsdp_offload and t.learner_gpus <= 0:
        raise ConfigError("trainer.fsdp_offload=true moves the FSDP shards from GPU to CPU memory: it needs "
                          "trainer.learner_gpus > 0 (a CPU learner's shards are in CPU memory already)")


# ------------------------------------------------------------------------------------------------------ resume
RESUME_MAY_CHANGE = (
    # length and bookkeeping of the run
    "trainer.total_steps", "trainer.save_every", "trainer.keep_checkpoints", "trainer.resume",
    "trainer.resume_allow_changes", "trainer.resume_weights_only", "trainer.output_dir", "trainer.tensorboard",
    "trainer.progress", "trainer.save_episodes",
    # where things run and how fast (same algorithm, same data)
    "trainer.device", "engine.batch_size", "engine.num_threads", "engine.gpu_memory_utilization", "env_server.",
    "engine.kv_cache_gb", "engine.enforce_eager", "engine.tensor_parallel_size", "engine.sleep_mode",
    "engine.multiprocessing", "engine.sync_dir",
    "trainer.backend", "trainer.ray_address", "trainer.num_learners", "trainer.learner_cpus", "trainer.learner_gpus",
    # the learner's layout over its ranks: every checkpoint resumes into every strategy and rank count (ddp and
    # single learners read a sharded checkpoint's optimizer through torch.distributed.checkpoint, which reshards)
    "trainer.learner_strategy", "trainer.fsdp_offload",
    "rollout.num_workers", "rollout.worker_cpus", "rollout.worker_gpus",
    # the staleness bound and how the producer replays (the algorithm's data, not its state: section 7)
    "trainer.max_staleness", "rollout.partial", "rollout.max_stale_replays",
    "data.root", "rollout.max_concurrent_episodes", "rollout.gen_batch_size", "rollout.gen_wait_s",
    "rollout.env_timeout_s", "rollout.retry_backoff_s", "rollout.episode_retries",
    # memory layout of the same update (gradient accumulation, chunking, recomputation, attention kernel)
    "algo.micro_batch_size", "algo.micro_batch_tokens", "algo.logits_chunk_size", "algo.compile_js", "model.gradient_checkpointing",
    "model.attn_implementation",
    # evaluation settings (they do not touch training)
    "eval.",
    # behaviour cloning's own keys (an RL run reads none; a behaviour-cloning resume may add epochs)
    "sft.",
)
"""Keys (or prefixes ending in ".") a resumed run may change freely: they do not change what is trained. Keys of
:data:`RESUME_APPLIED` may change with ``trainer.resume_allow_changes=true``; every other key must match the
checkpoint's config (algorithm, credit, model, env and its tasks, rollout format, sampling, seeds), with or
without it. Differences of each class are printed."""

RESUME_APPLIED: dict[str, str] = {
    # the optimiser: the restored AdamW state holds its own copies of these, so they are written back explicitly
    "optim.lr": "Learner.load_state_dict -> restore_optimizer: every param group's lr and initial_lr, and the LR "
                "schedule rebuilt at the restored optimiser step (logged as actor/lr)",
    "optim.lora_lr": "Learner / BehaviourCloner -> OptimConfig.for_lora, then restore_optimizer: the LoRA adapter's "
                     "lr and initial_lr (model.lora.rank > 0; logged as actor/lr)",
    "optim.warmup": "restore_optimizer: the warm-up schedule rebuilt from the config at the restored optimiser step "
                    "(logged as actor/lr)",
    "optim.weight_decay": "restore_optimizer: every param group's weight_decay",
    "optim.betas": "restore_optimizer: every param group's betas",
    "optim.eps": "restore_optimizer: every param group's eps",
    # read from the run's config at every optimiser step / micro-batch (the learner is built from it)
    "optim.max_grad_norm": "Learner._optimise: the gradient-norm clip of every optimiser step",
    "algo.clip_low": "Learner._micro_loss: the policy loss's clip range",
    "algo.clip_high": "Learner._micro_loss: the policy loss's clip range",
    "algo.dual_clip": "Learner._micro_loss: the policy loss's dual clip",
    "algo.ent_coef": "Learner._micro_loss: the entropy bonus",
    "algo.kl_coef": "Learner._micro_loss: the KL term (its reference is the run's initial policy, model.*)",
    "algo.adv_clip": "Learner._plan: the clamp of the token advantages",
    "algo.behaviour_correction": "Learner._micro_loss: the behaviour weights of the policy-gradient term (auto: "
                                 "resolved by the resumed run's trainer.max_staleness)",
    "algo.behaviour_weight_cap": "Learner._micro_loss: the cap C of the behaviour weights",
    # the credit strength S(step, N): a pure function of the step, recomputed every step
    "schedule.kind": "Learner._plan: the credit strength S of every step",
    "schedule.m": "Learner._plan: the credit strength S of every step",
    "schedule.s_min_ratio": "Learner._plan: the credit strength S of every step",
    "schedule.s_max_ratio": "Learner._plan: the credit strength S of every step",
    "schedule.value": "Learner._plan: the credit strength S of every step",
}
"""Keys a resumed run may change with ``trainer.resume_allow_changes=true``, each with the code that applies the
new value from the first resumed step on (both backends build their learner from the resumed run's config and
restore the checkpoint through ``Learner.load_state_dict``). Every other change outside
:data:`RESUME_MAY_CHANGE` is refused even with ``trainer.resume_allow_changes=true``: nothing would apply it, or
applying it would make the checkpoint's state meaningless (another model, env, task order or algorithm)."""


def config_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config as a plain nested dict (JSON-serialisable; saved in each checkpoint's ``extra.json``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def _schema_node(path: list[str]) -> Any:
    """The dataclass type at dotted ``path`` of the Config tree, ``dict`` for a free-form dict field (``env.kwargs``,
    ``credit.kwargs``, ``env.sampler.options``: compared whole), None for a path the schema does not have."""
    node: Any = Config
    for part in path:
        if not (isinstance(node, type) and is_dataclass(node)):
            return dict
        node = _field_types(node).get(part)
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


def may_change_on_resume(key: str) -> bool:
    """Whether dotted ``key`` is in :data:`RESUME_MAY_CHANGE`."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUME_MAY_CHANGE)


_MISSING = "(absent)"


def compare_for_resume(saved: dict[str, Any] | None, cfg: Config, *, source: str = "the checkpoint") -> list[str]:
    """Compare the config a checkpoint was trained under (``saved``, nested dict) with ``cfg`` before resuming.

    Returns the lines to print: one per differing key, ``resume: KEY: OLD -> NEW (may change | applied: HOW |
    new key | removed key)``, a warning when keys of :data:`RESUME_APPLIED` changed, plus a note when
    ``total_steps`` changes under a schedule that depends on it. Keys added or removed by a code upgrade are
    reported, not refused.

    Raises:
        ConfigError: a key outside :data:`RESUME_MAY_CHANGE` and :data:`RESUME_APPLIED` differs (with or without
            ``trainer.resume_allow_changes``), or a key of :data:`RESUME_APPLIED` differs and
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
        elif may_change_on_resume(key):
            kind = "may change"
        elif key in RESUME_APPLIED:
            kind = f"applied: {RESUME_APPLIED[key]}"
            applied.append(f"{key}: {a!r} -> {b!r}")
        else:
            kind = "must match"
            fixed.append(f"{key}: {a!r} -> {b!r}")
        lines.append(f"resume: {key}: {a!r} -> {b!r} ({kind})")
    can_change = ", ".join(RESUME_APPLIED)
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
