"""The root config: one dataclass tree composed by Hydra from ``configs/`` (groups env, algo, credit, schedule, model,
engine, trainer) and validated by OmegaConf's structured configs. This module is the schema; its other jobs each
have a module of their own in this package:

- :mod:`agent_rl.config.compose`: ``load_config(overrides)`` composes ``configs/config.yaml`` with dotted ``key=value``
  overrides (Hydra's compose API), rejects unknown keys naming the valid ones, and returns the typed :class:`Config`
  (each dataclass's ``__post_init__`` checks its fields); ``to_yaml``, ``config_dict``;
- :mod:`agent_rl.config.trainable`: ``check_trainable(cfg)``, what cannot train refused at load time;
- :mod:`agent_rl.resume`: ``compare_for_resume``, reading the resume rule each field declares in its metadata
  (:mod:`agent_rl.resume_rules`: may change, applied, must match).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from agent_rl.algos.fork import FORK_ESTIMATORS
from agent_rl.config.eval import EvalConfig
from agent_rl.engines import engine_caps, engine_names
from agent_rl.engines.config import EngineConfig, sampler_rounds
from agent_rl.episodes import parse_save_episodes
from agent_rl.gateway.config import ExternalConfig
from agent_rl.learner.config import AlgoConfig, CreditConfig, ModelConfig, OptimConfig, ScheduleConfig
from agent_rl.resume_rules import MAY_CHANGE, MUST_MATCH, applied
from agent_rl.trackers import LOGGERS, TrackingConfig
from agent_rl.rollout.config import CURRICULA, PassRateConfig, RolloutConfig, TaskSamplerConfig
from envs.families import describe

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
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
    external: ExternalConfig = field(default_factory=ExternalConfig)
    """``env=external``: an agent program trained through the gateway (``agent_rl.gateway``, docs/gateway.md)."""

    tasks: str = ""
    """A task file (docs/training.md "Your own tasks"): JSONL, JSON, parquet, CSV, a ``save_to_disk``
    folder or a hub name, read by :func:`agent_rl.task_files.load_tasks`. Each row, mapped by ``env.task_fields``, is one
    task's reset options (its content, never a path: it reaches an env server as is); it replaces ``env.sampler``
    (epochs of seeded permutations over the rows). "" = the env's own tasks (``env.sampler``)."""
    task_fields: dict[str, str] = field(default_factory=dict)
    """``{task key: column}`` of ``env.tasks`` (math: problem, answer, solution; code: prompt, tests or entry_point +
    test, setup, language; a gym env: its reset options). Empty: every column under its own name."""
    task_split: str = ""
    """Split of ``env.tasks`` ("" = train, or the one split of a saved dataset; ``train[:100]`` slices a file)."""
    task_filter: dict[str, Any] = field(default_factory=dict)
    """Rows of ``env.tasks`` kept: ``{column: value or list of values}`` ({} = all)."""

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
    """Bearer token of the servers (``None``: ``$AGENT_RL_SERVER_TOKEN`` for ``env_server.urls``; the run's own
    server or Ray replicas then get a token the run makes, passed in their environment, never on argv)."""
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


#: ``trainer.warm_start`` values (:func:`agent_rl.config.trainable.resolve_warm_start`)
WARM_STARTS = ("auto", "bc", "dagger", "none")


@dataclass
class TrainerConfig:
    """The training loop (``trainer=default``)."""

    total_steps: int = field(default=200, metadata=MAY_CHANGE)
    """Training steps N (one rollout + one learner update each); schedules use it."""
    max_nonfinite_skips: int = field(default=3, metadata=MAY_CHANGE)
    """Stop the run (with the cause) after this many steps in a row whose update the learner skipped for a
    non-finite advantage, loss or gradient (``actor/skipped_nonfinite``); 0: never stop."""
    tasks_per_step: int = field(default=8, metadata=MUST_MATCH)
    """Groups (tasks) per step; rows = tasks_per_step x G x turns."""
    output_dir: str = field(default="", metadata=MAY_CHANGE)
    """Run directory (config.yaml, metrics.jsonl, tb/, checkpoints/); empty = runs/<env>-<algo>-<time>."""
    save_every: int = field(default=50, metadata=MAY_CHANGE)
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = field(default=2, metadata=MAY_CHANGE)
    """Checkpoints kept (oldest deleted first; 0 = keep all)."""
    resume: str = field(default="", metadata=MAY_CHANGE)
    """"" = fresh run; auto = continue from the latest checkpoint in output_dir if any; or a checkpoint path."""
    resume_allow_changes: bool = field(default=False, metadata=MAY_CHANGE)
    """Resume with changed keys of ``RESUME_APPLIED`` (optimiser and loss hyper-parameters, each applied from the
    resumed step on); any other change outside ``RESUME_MAY_CHANGE`` is refused even then. The differences are
    printed either way (docs/training.md, "Resume")."""
    resume_weights_only: bool = field(default=False, metadata=MAY_CHANGE)
    """Resume a checkpoint from its policy weights, step and data position only: the optimizer (AdamW moments), the
    LR warm-up, the value head and the mini-batch shuffling restart, as the run prints. Without it a checkpoint
    that lacks ``learner.pt`` (or ``rng.pt``) is refused."""
    seed: int = field(default=0, metadata=MUST_MATCH)
    """Seed of python, numpy, torch and the task sampler."""
    device: str = field(default="auto", metadata=MAY_CHANGE)
    """auto (cuda when available) | cpu | cuda | cuda:N."""
    loggers: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"], metadata=MAY_CHANGE)
    """Where metrics go (:mod:`agent_rl.trackers`): jsonl (``DIR/metrics.jsonl``, always on), tensorboard
    (``DIR/tb``), wandb (W&B; offline in ``DIR/wandb`` without credentials), mlflow (the file store ``DIR/mlruns``
    unless ``trainer.tracking.mlflow_uri``). Replaces ``trainer.tensorboard`` (false = ``[jsonl]``)."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig, metadata=MAY_CHANGE)
    """Project, run name, tags, W&B mode and MLflow URI of the wandb / mlflow loggers."""
    progress: bool = field(default=True, metadata=MAY_CHANGE)
    """Console progress bar with key numbers (a plain line per step when off)."""
    imports: list[str] = field(default_factory=list, metadata=MUST_MATCH)
    """Modules imported before the learner is built, e.g. one that registers a user's own advantage estimator,
    policy loss, credit rule or schedule with the ``agent_rl.algos`` registries. Kept apart from
    ``env_server.imports`` on purpose: those run inside the env server process (its own container, no torch), these
    in the trainer (no env dependencies); a module that registers both kinds goes in both lists."""
    save_episodes: str = field(default="8", metadata=MAY_CHANGE)
    """Episode store (``DIR/episodes/step_N.jsonl``, read by ``python -m agent_rl.viewer DIR``, docs/viewer.md):
    none | all | N episodes per step, kept as whole groups drawn at random."""
    eval_every: int = field(default=0, metadata=MUST_MATCH)
    """Evaluate a small fixed panel (``agent_rl.eval``) before step 1, every this many steps and after the last
    (0 = never); logged as ``eval/<panel>/...`` in metrics.jsonl (step 0 = before training) and TensorBoard."""
    eval_panel: str = field(default="", metadata=MUST_MATCH)
    """The panel's split or dataset ("" = the env's default: ALFWorld valid_unseen, WebShop test, math math500,
    code humanevalplus); its tasks are never training tasks (other split / dataset)."""
    eval_tasks: int = field(default=8, metadata=MUST_MATCH)
    """Tasks of the in-training panel (spread evenly over the split); decoded as ``eval.*`` says (greedy)."""
    backend: str = field(default="local", metadata=MAY_CHANGE)
    """local: one process; ray: learner ranks, rollout workers, env-server replicas as Ray actors (docs/scaling.md)."""
    ray_address: str = field(default="", metadata=MAY_CHANGE)
    """trainer.backend=ray: cluster to join ("auto" = the running one; "" = $RAY_ADDRESS, else a local cluster)."""
    num_learners: int = field(default=1, metadata=MAY_CHANGE)
    """trainer.backend=ray: data-parallel learner ranks (torch DDP; the batch is split by whole groups)."""
    learner_cpus: float = field(default=1.0, metadata=MAY_CHANGE)
    """trainer.backend=ray: CPUs per learner rank (also its torch threads)."""
    learner_gpus: float = field(default=0.0, metadata=MAY_CHANGE)
    """trainer.backend=ray: GPUs per learner rank (> 0: the rank trains on its GPU, NCCL between ranks)."""
    learner_strategy: str = field(default="ddp", metadata=MAY_CHANGE)
    """trainer.backend=ray: how the learner ranks split the model (docs/scaling.md, "Memory"): ddp = every rank holds
    the whole model, its gradients and AdamW moments (torch DDP); fsdp = each rank holds 1/num_learners of each
    (torch FSDP2 ``fully_shard`` per decoder layer and at the root; bf16 compute, fp32 reduction and master weights on
    GPU; sharded checkpoints with torch.distributed.checkpoint). Same update either way."""
    fsdp_offload: bool = field(default=False, metadata=MAY_CHANGE)
    """trainer.learner_strategy=fsdp on GPU: keep the parameter, gradient and AdamW shards in CPU memory
    (``CPUOffloadPolicy``; the optimiser steps on the CPU, each layer is copied to the GPU for its passes)."""
    max_staleness: int = field(default=0, metadata=MAY_CHANGE)
    """Asynchronous rollouts (algorithms.md section 7, docs/training.md "Asynchronous rollouts"): k >= 1 lets the
    rollout side produce groups for up to k steps ahead while the learner updates, and admits a group only if every
    token's staleness (step - 1 - its policy version) is <= k; 0 = synchronous (today's run exactly)."""
    warm_start: str = field(default="auto", metadata=MUST_MATCH)
    """Behaviour-cloning warm start before RL (docs/training.md "Warm start"): bc = clone the env's expert
    on train-split tasks (``sft.*``; checkpoints under ``DIR/checkpoints/warm_start/``, rows of kind ``sft`` in the
    same metrics.jsonl), then RL from the cloned weights; dagger = bc, then ``sft.dagger_rounds`` DAgger rounds
    (the policy plays, the expert labels each state it reached, the aggregate is cloned again; an env whose expert
    labels any state: ALFWorld); none = RL from ``model.*``; auto = for the embedded default model
    (``model=smollm2`` without ``model.path``) dagger on an env with a state expert (ALFWorld), bc on an env with
    an expert (TextWorld, WebShop), none otherwise. Resolved to bc | none when the config is loaded
    (:func:`agent_rl.config.trainable.resolve_warm_start`)."""

    curriculum: str = field(default="none", metadata=MUST_MATCH)
    """Which training tasks are drawn: none = uniformly (``env.sampler`` / ``env.tasks``: epochs of seeded
    permutations); pass_rate = the pass-rate curriculum (``trainer.pass_rate``; needs a task list, ``env.tasks`` or
    ``env.sampler.kind=index``)."""
    pass_rate: PassRateConfig = field(default_factory=PassRateConfig, metadata=MUST_MATCH)
    """The pass-rate curriculum's pools, weights and cooldown (``trainer.curriculum=pass_rate``)."""

    def __post_init__(self) -> None:
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown:
            raise ValueError(f"trainer.loggers={list(self.loggers)}: unknown {unknown}; valid values: {', '.join(LOGGERS)}")
        if self.curriculum not in CURRICULA:
            raise ValueError(f"trainer.curriculum={self.curriculum!r} is not valid; valid values: {', '.join(CURRICULA)}")
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
    lr: float = field(default=5.0e-5, metadata=MAY_CHANGE)
    """AdamW learning rate of the cloning steps (0 = ``optim.lr``). 5e-5: the rate SmolLM2's TextWorld cloning used
    (docs/learning.md; the RL presets' 1e-6 would barely move it in a warm start's few steps); ``model=tiny`` sets
    1e-3, its ``optim.lr``. ``optim.lora_lr`` for a LoRA adapter as in RL."""
    expert_kwarg: str | None = None
    """Env constructor kwarg that turns ``info["expert_action"]`` on; None = the env family's (``envs.families``:
    ``expert`` for every built-in env with an expert, and for an env that describes none); "" = the env always
    gives it."""
    dagger_rounds: int = 2
    """``trainer.warm_start=dagger``: rounds after round 0 (the expert's episodes, cloned as ``bc`` does); each plays
    the current policy, labels every turn with the expert's action for its state and clones the aggregate again
    (DAgger, Ross et al. 2011; ``agent_rl.dagger``)."""
    dagger_episodes: int = 8
    """Episodes a DAgger round plays (train-split tasks, drawn after round 0's)."""
    dagger_steps: int = 4
    """Optimizer steps of ``batch_size`` rows a DAgger round trains, over every round's rows so far (the aggregate)."""
    dagger_beta: float = 0.5
    """p of the mixing schedule beta_i = p**i (Ross et al. 2011, section 3): round i plays round(beta_i x
    ``dagger_episodes``) of its episodes with the expert, the rest with the current policy (0: the policy only)."""
    dagger_temperature: float = 0.0
    """Sampling temperature of the policy's DAgger episodes (0 = greedy, the panel's decoding)."""

    def __post_init__(self) -> None:
        if self.num_episodes < 1 or self.epochs < 1 or self.batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("sft.num_episodes, epochs, batch_size, micro_batch_size must be >= 1")
        if self.dagger_rounds < 0 or self.dagger_episodes < 1 or self.dagger_steps < 1:
            raise ValueError("sft.dagger_rounds must be >= 0, sft.dagger_episodes and sft.dagger_steps >= 1")
        if not 0.0 <= self.dagger_beta <= 1.0 or self.dagger_temperature < 0:
            raise ValueError(f"sft.dagger_beta={self.dagger_beta} must be in [0, 1] and sft.dagger_temperature="
                             f"{self.dagger_temperature} >= 0")
        if "{action}" not in self.response_template:
            raise ValueError("sft.response_template must contain {action}")


@dataclass(frozen=True)
class BackendCapabilities:
    """What a training backend can do (``trainer.backend``); a config asking for more is refused at load time
    (:func:`agent_rl.config.trainable.check_trainable`), never run with a silent difference."""

    data_parallel: bool
    """Several learner ranks (``trainer.num_learners > 1``)."""
    rollout_workers: bool
    """Several rollout workers and env-server replicas (``rollout.num_workers``, ``env_server.replicas`` > 1)."""
    sharded_learner: bool = False
    """Learner ranks that shard the model (``trainer.learner_strategy=fsdp``: FSDP2 over a process group)."""


#: ``trainer.backend`` -> its capabilities (``agent_rl.local.LocalBackend``, ``agent_rl.distributed.backend``).
BACKENDS: dict[str, BackendCapabilities] = {
    "local": BackendCapabilities(data_parallel=False, rollout_workers=False),
    "ray": BackendCapabilities(data_parallel=True, rollout_workers=True,
                               sharded_learner=True),
}

#: ``trainer.learner_strategy`` values (``agent_rl.distributed.data_parallel`` / ``agent_rl.distributed.fsdp``).
LEARNER_STRATEGIES = ("ddp", "fsdp")


@dataclass
class Config:
    """The whole run. Groups: env, algo, credit, schedule, model, engine, trainer; plus rollout, optim,
    env_server, data, eval, sft set in ``configs/config.yaml`` and on the command line."""

    # metadata: each group's resume rule (agent_rl.resume_rules), for its fields that declare none
    env: EnvConfig = field(default_factory=EnvConfig, metadata=MUST_MATCH)
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata=MUST_MATCH)
    credit: CreditConfig = field(default_factory=CreditConfig, metadata=MUST_MATCH)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig, metadata=applied(
        "Learner._plan: the credit strength S of every step"))  # a pure function of the step
    model: ModelConfig = field(default_factory=ModelConfig, metadata=MUST_MATCH)
    engine: EngineConfig = field(default_factory=EngineConfig, metadata=MUST_MATCH)
    optim: OptimConfig = field(default_factory=OptimConfig, metadata=MUST_MATCH)
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata=MUST_MATCH)
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata=MUST_MATCH)
    env_server: EnvServerConfig = field(default_factory=EnvServerConfig, metadata=MAY_CHANGE)
    data: DataConfig = field(default_factory=DataConfig, metadata=MAY_CHANGE)
    eval: EvalConfig = field(default_factory=EvalConfig, metadata=MAY_CHANGE)  # evaluation only
    sft: SFTConfig = field(default_factory=SFTConfig, metadata=MAY_CHANGE)  # an RL run reads none

    def __post_init__(self) -> None:
        if self.trainer.curriculum == "pass_rate" and not self.env.tasks and self.env.sampler.kind != "index":
            raise ValueError(f"trainer.curriculum=pass_rate needs a task list: env.tasks=PATH or an env whose "
                             f"env.sampler.kind is index (env={self.env.name} draws a new task from each seed)")
        # Derived defaults that span groups (algo depends on engine; an external program's file tasks need no env).
        if self.env.name == "external" and not self.env.external.enabled:
            raise ValueError("env=external needs its agent program: env.external.program=MODULE:FUNCTION or "
                             "env.external.command='...' (docs/gateway.md)")
        fork = self.rollout.fork
        if fork.enabled and (self.algo.uses_critic or self.algo.adv_estimator not in FORK_ESTIMATORS):
            raise ValueError(f"rollout.fork needs a group estimator with a per-group baseline: algo.adv_estimator "
                             f"one of {', '.join(FORK_ESTIMATORS)} (got {self.algo.adv_estimator}; gigpo, "
                             "reinforce_pp and ppo's critic bring their own step or critic credit)")
        # an engine registered later (trainer.imports) is checked by the orchestrator when it is built
        if fork.enabled and fork.select == "js" and self.engine.name in engine_names() \
                and not engine_caps(self.engine.name).token_js:
            raise ValueError(f"rollout.fork.select=js scores the base episodes' token JS with the engine's full logits "
                             f"(engine={self.engine.name} returns no full logits: EngineCaps.token_js): use engine=hf, "
                             "or select=entropy / uniform / divergence")
        eng = self.engine
        if eng.name == "vllm_server" and eng.sync_check and sampler_rounds(self) and eng.sync_check_tol < 1e-2:
            raise ValueError(f"engine.dtype={eng.dtype} beside model.dtype={self.model.dtype}: the servers' log-probs "
                             f"differ from the learner's by the rounding (~1e-2), and the sync check after every sync "
                             f"fails over engine.sync_check_tol={eng.sync_check_tol}: raise engine.sync_check_tol "
                             "(e.g. 0.5) or set engine.sync_check=false")
        if fork.enabled and fork.points >= self.rollout.max_turns:
            raise ValueError(f"rollout.fork.points={fork.points} fork turns need episodes of more turns than "
                             f"rollout.max_turns={self.rollout.max_turns} (a fork turn t is 1..max_turns-1)")
        if fork.enabled and fork.restore == "replay" and not self.env.external.enabled:
            declared = describe(self.env.id, self.env.name).deterministic
            if declared is not None and not declared(self.env_kwargs):
                raise ValueError(f"rollout.fork replays a base's actions, and {self.env.id} with these env kwargs "
                                 "declares that its episodes do not replay exactly (envs.families.EnvFamily."
                                 "deterministic; math with the python tool: env.action_format=text; an env with "
                                 "clone_state/set_state: rollout.fork.restore=state)")
        if self.env.external.enabled:  # env=external (agent_rl.gateway, docs/gateway.md)
            if fork.enabled:
                raise ValueError("env=external does not fork groups (rollout.fork.points=0): a sibling replays its "
                                 "base's actions on the env, and an agent program cannot be replayed")
            if self.env.external.from_file:
                self.env_server.mode = "local"  # nothing is started: the tasks are the file's rows
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


def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved type of dataclass ``cls`` (``from __future__ import annotations`` makes them strings)."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}
