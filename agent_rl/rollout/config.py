"""Config dataclasses of the rollout side (composed into the root config by ``agent_rl/config/schema.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_rl.algos.tampo import parse_temperature_schedule
from agent_rl.resume_rules import MAY_CHANGE, MUST_MATCH

ROLLOUT_MODES = ("turn", "trajectory")
FORK_SELECT = ("uniform", "entropy", "js", "divergence")
FORK_BUDGETS = ("extra", "episodes", "turns")
FORK_RESTORE = ("replay", "state")
SAMPLER_KINDS = ("index", "seed")


@dataclass
class ForkConfig:
    """Forked groups (``rollout.fork.*``; estimator: docs/algorithms_impl.md "Forked groups"): from each
    base episode of a group, at ``points`` fork turns, ``siblings`` episodes replay the base's actions on fresh
    sessions (same reset seed and options; every replayed prompt and step checked equal to the base's) and sample
    onward with their own sampling-seed slots. Off by default (``points=0``)."""

    points: int = 0
    """Fork turns per base episode (0 = off); fewer where the base has fewer turns t with 1 <= t < its turns."""
    siblings: int = 3
    """K: sibling episodes started at each fork turn."""
    select: str = "uniform"
    """How the fork turns are chosen: ``uniform`` (random among the base's turns 1..K-1, seeded by the rollout seed,
    group and slot), ``entropy`` (the highest mean sampled-token surprisal ``-logprob``, the rollout's estimate of the
    turn's mean token entropy), ``divergence`` (the first turn where the base acts differently from the group's T0
    episode; slot 0's when the group has no T0 episode; at most one point), ``js`` (the highest mean TGRL token JS
    of the turn, algorithms.md 3.3, between softmax(z / algo.t_low) and softmax(z / T1) of the sampling policy's
    logits, T1 the group's high temperature; one scoring forward per base episode, ``fork/select_s``; the hf engine
    only: the learner's JS comes after the rollout, and vLLM returns no full logits)."""
    budget: str = "extra"
    """``extra``: the siblings come on top of the G base episodes (``fork/extra_episodes``); ``episodes``: they are
    taken out of G, the group plays ``max(1, G // (1 + points * siblings))`` bases (its first slots' temperatures; at
    least 2 with ``select=divergence``, and up to a TGRL group's first T1 slot, :func:`agent_rl.rollout.fork.base_count`;
    a budget takes the T1 bases' siblings first, :func:`agent_rl.rollout.fork.budget_order`)
    and forks fill the rest up to G episodes; ``turns``: the same bases, and siblings while the group's generated
    turns stay within G plain episodes' worth (``G * mean base turns``; a sibling generates only its turns after the
    fork, :func:`agent_rl.rollout.fork.turn_budget_jobs`), so more siblings fit than under ``episodes``. What the
    siblings leave of either budget is played as plain episodes of the next slots
    (:func:`agent_rl.rollout.fork.spare_slots`, ``fork/filled_episodes``)."""

    restore: str = "replay"
    """How a sibling gets its base's state at the fork turn: ``replay`` (a fresh session reset with the base's seed
    and options replays the base's actions, each turn checked; for an env whose episodes replay exactly,
    ``envs.families.EnvFamily.deterministic``) or ``state`` (the base's session is snapshotted after each of its
    turns, the env's own ``clone_state()``, and a sibling opens a session in the snapshot of its fork turn,
    ``set_state``, with no replayed env step: for an env that does not replay exactly, or whose steps cost more
    than a copy of its state; the env pool must have ``snapshot``/``restore``, both of this package's do). A
    snapshot is taken at every turn of every base because the fork turns are chosen after the base ends."""

    @property
    def enabled(self) -> bool:
        return self.points > 0 and self.siblings > 0

    def __post_init__(self) -> None:
        if self.select not in FORK_SELECT:
            raise ValueError(f"rollout.fork.select={self.select!r} is not valid; valid values: {', '.join(FORK_SELECT)}")
        if self.budget not in FORK_BUDGETS:
            raise ValueError(f"rollout.fork.budget={self.budget!r} is not valid; valid values: {', '.join(FORK_BUDGETS)}")
        if self.restore not in FORK_RESTORE:
            raise ValueError(f"rollout.fork.restore={self.restore!r} is not valid; valid values: "
                             f"{', '.join(FORK_RESTORE)}")
        if self.points < 0 or self.siblings < 0 or self.points > 64 or self.siblings > 64:
            raise ValueError("rollout.fork.points and rollout.fork.siblings must be in 0..64")
        if self.points > 0 and self.siblings == 0:  # would fork nothing, silently
            raise ValueError(f"rollout.fork.points={self.points} with rollout.fork.siblings=0 forks nothing: set "
                             "siblings >= 1, or points=0 to turn forking off")


@dataclass
class RolloutConfig:
    """How episodes are played (``rollout.*``)."""

    mode: str = "turn"
    """turn: one row per turn (prompt = task + last ``history_length`` turns); trajectory: one row per episode,
    observation tokens masked."""
    max_turns: int = 50
    """The turn budget of an episode, the one knob for it: the trainer passes it to the env as gymnasium's
    ``max_episode_steps`` (TimeLimit, ``truncated=True`` at the last turn) when it is > 1, and the orchestrator never
    plays more turns. The env's registered default (e.g. ALFWorld's 50) only applies to direct ``gymnasium.make``."""
    history_length: int = 2
    """Past (observation, action) pairs in each per-turn prompt (verl-agent/GiGPO convention: 2)."""
    max_prompt_tokens: int = 4096
    """Longest prompt sent to the engine; an episode whose next prompt is longer ends there (truncated); if that
    happens at its first turn the episode fails (its group is dropped)."""
    invalid_penalty: float = 0.0
    """Subtracted from the reward of every step whose action the env did not accept (verl-agent uses 0.1). Applied by
    the env's ``envs.wrappers.InvalidActionPenalty`` (the trainer passes ``invalid_action_penalty`` in the env
    kwargs), so it is the same in-process, behind a server and in evaluation."""
    stop: list[str] = field(default_factory=lambda: ["</action>"])
    """Stop strings of generation (the closing action tag)."""
    max_action_chars: int = 512
    """Actions sent to the env are cut to this many characters."""
    episode_retries: int = field(default=2, metadata=MAY_CHANGE)
    """An episode whose env calls still fail after the client's own retries is re-run from the same task this many
    times; then its whole group is dropped (``rollout/dropped_groups``)."""
    retry_backoff_s: float = field(default=1.0, metadata=MAY_CHANGE)
    """Wait before re-running a failed episode (doubled at each further re-run)."""
    env_timeout_s: float = field(default=300.0, metadata=MAY_CHANGE)
    """Deadline of one env call (reset or step) as seen by the orchestrator."""
    max_concurrent_episodes: int = field(default=0, metadata=MAY_CHANGE)
    """Episodes in flight at once (0 = all episodes of the step)."""
    gen_batch_size: int = field(default=0, metadata=MAY_CHANGE)
    """Prompts per engine call at most (0 = every prompt waiting)."""
    gen_wait_s: float = field(default=0.02, metadata=MAY_CHANGE)
    """Once a prompt waits, how long generation waits for more episodes to ask (unless all live ones already do)."""
    num_workers: int = field(default=1, metadata=MAY_CHANGE)
    """trainer.backend=ray: rollout workers (each an engine replica playing its share of the step's groups)."""
    worker_cpus: float = field(default=1.0, metadata=MAY_CHANGE)
    """trainer.backend=ray: CPUs per rollout worker."""
    worker_gpus: float = field(default=0.0, metadata=MAY_CHANGE)
    """trainer.backend=ray: GPUs per rollout worker (> 0: its engine runs on its GPU)."""
    partial: bool = field(default=False, metadata=MAY_CHANGE)
    """Partial rollouts (``trainer.max_staleness`` >= 1): an episode in flight at a weight sync continues with the new
    weights (each turn keeps its own version); false: a sync waits until the episodes in flight finish under the
    weights they started with (algorithms.md section 7)."""
    temperature_schedule: str = field(default="", metadata=MUST_MATCH)
    """The sampling temperature over the run for the non-TGRL algorithms (algorithms.md 8, an ablation of TAMPO):
    ``""`` = off (``algo.temperature`` every step) or ``linear:T_start:T_end[:steps]`` (step 1 at T_start, step
    ``steps`` (default: the run's last) and after at T_end, e.g. ``linear:0.9:1.5``; give ``steps`` to a run trained
    in resumed chunks); ``agent_rl.algos.parse_temperature_schedule``."""
    max_stale_replays: int = field(default=2, metadata=MAY_CHANGE)
    """A group discarded for staleness (``trainer.max_staleness``) is played again as a fresh group at most this many
    times, then dropped (``async/groups_stale_dropped``)."""

    fork: ForkConfig = field(default_factory=ForkConfig)
    """Forked groups (:class:`ForkConfig`; off by default)."""

    def __post_init__(self) -> None:
        if isinstance(self.fork, dict):
            self.fork = ForkConfig(**self.fork)
        parse_temperature_schedule(self.temperature_schedule)  # ValueError naming the valid forms
        if self.num_workers < 1:
            raise ValueError("rollout.num_workers must be >= 1")
        if self.max_stale_replays < 0:
            raise ValueError(f"rollout.max_stale_replays={self.max_stale_replays} must be >= 0 (0 = a stale group is "
                             "dropped, never played again)")
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout.mode={self.mode!r} is not valid; valid values: {', '.join(ROLLOUT_MODES)}")
        if self.max_turns < 1 or self.history_length < 0 or self.episode_retries < 0:
            raise ValueError("rollout.max_turns >= 1, history_length >= 0, episode_retries >= 0 required")
        if self.max_prompt_tokens < 1 or self.max_action_chars < 1 or self.env_timeout_s <= 0:
            raise ValueError("rollout.max_prompt_tokens >= 1, max_action_chars >= 1, env_timeout_s > 0 required")


@dataclass
class TaskSamplerConfig:
    """How an env's training tasks are drawn (``env.sampler.*``).

    ``index``: options ``{**options, index_key: i}`` with i running over a seeded permutation of ``range(num_tasks)``
    (ALFWorld: ``{"split": "train", "index": i}``, 3553 train games). ``seed``: the same options, and a fresh
    seed per task (envs that pick their task from the reset seed: ChooseItem, Calculator, any gym env).
    """

    kind: str = "seed"
    """index | seed."""
    num_tasks: int = 0
    """Task count of the split (``index`` kind)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Reset options common to every task (e.g. ``{"split": "train"}``)."""
    index_key: str = "index"
    """Option key receiving the task index (``index`` kind)."""

    def __post_init__(self) -> None:
        if self.kind not in SAMPLER_KINDS:
            raise ValueError(f"env.sampler.kind={self.kind!r} is not valid; valid values: {', '.join(SAMPLER_KINDS)}")
        if self.kind == "index" and self.num_tasks < 1:
            raise ValueError("env.sampler.num_tasks must be >= 1 for kind=index")


CURRICULA = ("none", "pass_rate")
"""``trainer.curriculum`` values: none = uniform (epochs of seeded permutations); pass_rate =
:class:`agent_rl.rollout.samplers.PassRateSampler`."""

POOLS = ("too_easy", "learnable", "too_hard", "unseen")
"""The pass-rate curriculum's pools, in this order everywhere (metrics ``curriculum/pool_frac/<pool>``)."""


@dataclass
class PassRateConfig:
    """The pass-rate curriculum (``trainer.curriculum=pass_rate``, ``trainer.pass_rate.*``; the idea of
    prime-rl's difficulty pools and of SkyRL's/AReaL's online pass-rate filters).

    A task's pass rate is an exponential moving average over its groups of the group's fraction of won episodes
    (``rate = (1 - ema) * rate + ema * group_rate``, the first group's rate as is). Pools: unseen (never played, or
    re-admitted), too_easy (``rate >= easy_rate``), too_hard (``rate <= hard_rate``), learnable (between). A task that
    has sat in too_easy or too_hard for ``cooldown_steps`` steps since its last group is re-admitted as unseen (its
    rate is measured afresh), so no pool starves; a pool is drawn with probability ``weights[pool]`` normalised over
    the pools that hold a task, then a task uniformly within it."""

    easy_rate: float = 0.95
    """Pass rate at or above which a task is too easy."""
    hard_rate: float = 0.05
    """Pass rate at or below which a task is too hard."""
    ema: float = 0.5
    """Weight of a task's newest group in its running pass rate (1 = the last group only)."""
    cooldown_steps: int = 10
    """Steps after its last group when a too-easy or too-hard task is re-admitted (unseen)."""
    weights: dict[str, float] = field(default_factory=lambda: {"too_easy": 0.05, "learnable": 0.6, "too_hard": 0.05,
                                                               "unseen": 0.3})
    """Sampling weight of each pool (normalised over the non-empty ones); default favours learnable and unseen."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.hard_rate < self.easy_rate <= 1.0:
            raise ValueError(f"trainer.pass_rate: 0 <= hard_rate < easy_rate <= 1 required (got hard_rate="
                             f"{self.hard_rate}, easy_rate={self.easy_rate})")
        if not 0.0 < self.ema <= 1.0 or self.cooldown_steps < 1:
            raise ValueError("trainer.pass_rate: 0 < ema <= 1 and cooldown_steps >= 1 required")
        unknown = sorted(set(self.weights) - set(POOLS))
        if unknown or any(float(w) < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError(f"trainer.pass_rate.weights={dict(self.weights)} must give pools among {', '.join(POOLS)}"
                             " weights >= 0 with a positive sum")
