"""Config dataclasses of the learner side: algorithm, credit, schedule, optimiser, model.

The root Hydra config (``agent_rl.config.schema``) composes them; ``configs/algo/*.yaml`` holds one preset per algorithm.
Every field has a default; ``__post_init__`` checks fields against each other and raises ``ValueError`` naming the
allowed values. Names that are registry entries (estimators, losses, credit rules, schedules) are checked against the
``agent_rl.algos`` registries by the ``Learner``, whose errors list the valid names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_rl.algos.calibration import candidate_pairs
from agent_rl.resume_rules import MAY_CHANGE, applied

ALGO_NAMES = ("tgrl", "grpo", "drgrpo", "dapo", "rloo", "ppo", "gspo", "tampo")
#: estimators whose baseline is the task's group: with group_size 1 every advantage is 0.
GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "gigpo")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
CREDIT_LEVELS = ("token", "turn")
#: ``algo.behaviour_correction`` values (algorithms.md section 7, "Off-policy correction").
BEHAVIOUR_CORRECTIONS = ("auto", "tis", "mask", "none")


def _check(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not valid; valid values: {', '.join(allowed)}")


@dataclass
class TampoConfig:
    """TAMPO's meta-policy over sampling temperatures (``algo.tampo.*``, algorithms.md section 8; Dang et al., ICLR
    2026, arXiv 2602.11779). Read only when ``algo.name=tampo``."""

    temps: list[float] = field(default_factory=lambda: [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5])
    """The K candidate temperatures, strictly increasing, each > 0."""
    norm: str = "sparsemax"
    """Normalisation of an episode's virtual likelihoods across candidates: sparsemax | softmax | argmax (8.3)."""
    norm_tau: float = 1.0
    """Scale of the normalisation (hat_ell = norm(ell / norm_tau)); the paper gives none (open)."""
    ema_alpha: float = 0.05
    """EMA rate of the batch statistic, once per RL step (8.5; the paper's table 2: 0.01 / 0.05 / 0.1)."""
    top_p: float = 0.7
    """Nucleus of the meta-policy draw (8.7; the paper's table 3: 0 (greedy) / 0.5 / 0.7 / 0.9)."""
    scope: str = "step"
    """step: one T for every group started in the RL step (the paper's reading); group: each group draws its own."""
    warmup_steps: int = 0
    """W: the first W steps draw uniformly over the candidates (open; 0 = off)."""

    def __post_init__(self) -> None:
        self.temps = [float(t) for t in self.temps]
        if not self.temps or any(t <= 0 for t in self.temps) or any(b <= a for a, b in zip(self.temps,
                                                                                             self.temps[1:])):
            raise ValueError(f"algo.tampo.temps={self.temps} must be a non-empty, strictly increasing list of "
                             "temperatures > 0")
        _check("algo.tampo.norm", self.norm, ("sparsemax", "softmax", "argmax"))
        _check("algo.tampo.scope", self.scope, ("step", "group"))
        if not self.norm_tau > 0 or not 0.0 < self.ema_alpha <= 1.0 or not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"algo.tampo: norm_tau={self.norm_tau} must be > 0, ema_alpha={self.ema_alpha} in "
                             f"(0, 1], top_p={self.top_p} in [0, 1]")
        if self.warmup_steps < 0:
            raise ValueError(f"algo.tampo.warmup_steps={self.warmup_steps} must be >= 0")


#: ``optim.warmup_unit`` values: what ``optim.warmup`` counts.
WARMUP_UNITS = ("optimizer_step", "rl_step")
#: ``algo.calibration.mode`` values (algorithms.md section 3b).
CALIBRATION_MODES = ("off", "probe", "auto")


@dataclass
class CalibrationConfig:
    """TGRL's calibrated temperatures (``algo.calibration=probe``, algorithms.md section 3b): before RL step 1 the
    run plays ``samples`` episodes of ``tasks`` train tasks at every candidate temperature with the policy it is
    about to train, scores every pair (T_low, T_high > T_low) by ``agent_rl.algos.calibration_scores`` and trains
    with the best pair (``agent_rl.calibration``). ``algo.calibration=probe`` / ``=off`` is the short form of
    ``algo.calibration.mode=...`` (``agent_rl.config.compose``)."""

    mode: str = "off"
    """off | probe | auto (probe for ``algo=tgrl`` with a numeric ``t_high``, off for every other algo: what a preset
    that serves every algo sets, e.g. ``trainer=cpu_alfworld``; resolved at load by ``AlgoConfig``)."""
    t_low: list[float] = field(default_factory=lambda: [0.3, 0.4])
    """Candidate T0 values (each > 0)."""
    t_high: list[float] = field(default_factory=lambda: [0.8, 1.0, 1.2])
    """Candidate T1 values (each > 0); only pairs with T_high > T_low are scored."""
    tasks: int = 16
    """P train tasks probed, drawn by a copy of the run's task sampler (its seed; never panel tasks)."""
    samples: int = 4
    """n episodes per task and candidate temperature (the sample variance needs n >= 2 to be non-zero)."""
    filter: bool = False
    """The medium filter: train only on the probed tasks with 0.05 <= max pass <= 0.8, v > 0.01, x >= 0.9 under the
    chosen pair (none qualifies: every task is kept, and the run says so)."""

    def __post_init__(self) -> None:
        _check("algo.calibration.mode", self.mode, CALIBRATION_MODES)
        self.t_low = [float(t) for t in self.t_low]
        self.t_high = [float(t) for t in self.t_high]
        if self.mode == "off":
            return
        try:
            candidate_pairs(self.t_low, self.t_high)
        except ValueError as exc:
            raise ValueError(f"algo.calibration: {exc}") from None
        if isinstance(self.samples, bool) or self.samples < 1:
            raise ValueError(f"algo.calibration.samples={self.samples} must be >= 1 (episodes per task and "
                             "temperature)")
        if isinstance(self.tasks, bool) or self.tasks < 1:
            raise ValueError(f"algo.calibration.tasks={self.tasks} must be >= 1 (train tasks probed)")

    @property
    def on(self) -> bool:
        return self.mode == "probe"


@dataclass
class AlgoConfig:
    """One RL algorithm (``algo=...``). Defaults are TGRL's (algorithms.md section 3); presets override them."""

    name: str = "tgrl"
    """Algorithm: tgrl | grpo | drgrpo | dapo | rloo | ppo | gspo. ``tgrl`` enables JS credit + low-row zeroing,
    ``ppo`` adds a value head and GAE."""
    adv_estimator: str = "grpo"
    """Advantage estimator (algorithms.md section 1): grpo | drgrpo | rloo | reinforce_pp | gae (``algo=ppo``)."""
    policy_loss: str = "ppo_clip"
    """Policy loss (algorithms.md section 2): ppo_clip | gspo (Zheng et al. 2025)."""
    loss_agg: str = "token_mean"
    """token_mean | seq_mean_token_mean | seq_mean_token_sum_norm (Dr.GRPO, Liu et al. 2025)."""
    loss_max_len: int = 0
    """L_max of ``seq_mean_token_sum_norm``: a constant divisor (Dr.GRPO, Liu et al. 2025, divides the summed token
    losses by the generation budget, their ``generate_max_length``; the ``drgrpo`` preset sets it to
    ``engine.max_new_tokens`` and ``algo=drgrpo`` refuses 0). 0 (other algorithms only): the longest response of
    the batch, which makes a row's loss depend on the rows beside it."""
    clip_low: float = field(default=0.2, metadata=applied("Learner._micro_loss: the policy loss's clip range"))
    """PPO clip range below 1 (eps_low)."""
    clip_high: float = field(default=0.2, metadata=applied("Learner._micro_loss: the policy loss's clip range"))
    """PPO clip range above 1 (eps_high; DAPO clip-higher uses 0.28)."""
    dual_clip: float = field(default=3.0, metadata=applied("Learner._micro_loss: the policy loss's dual clip"))
    """Dual-clip constant c for A < 0 (Ye et al. 2020)."""
    kl_coef: float = field(default=0.0, metadata=applied(
        "Learner._micro_loss: the KL term (its reference is the run's initial policy, model.*)"))
    """Weight of the k3 KL to a frozen reference model (0 = no reference model is kept)."""
    ent_coef: float = field(default=0.0, metadata=applied("Learner._micro_loss: the entropy bonus"))
    """Entropy bonus weight (loss -= ent_coef * entropy)."""
    std: str = "sample"
    """GRPO std: sample (N-1) | population."""
    temperature: float = 1.0
    """Sampling temperature of every episode of the non-TGRL algorithms (GRPO@T0: 0.3, GRPO@T1: 1.2). TGRL ignores it:
    its episodes are sampled at ``t_low`` / ``t_high`` (all at ``t_high`` in warm-up); see
    :meth:`group_temperatures`."""
    t_low: float = 0.3
    """TGRL T0 (section 3)."""
    t_high: Any = 1.2
    """TGRL T1: a number (> 0; the paper's fixed T1, 1.2) or ``auto`` (algorithms.md section 3, adaptive high
    temperature: a discounted UCB over ``t_high_ladder`` on ``tgrl/delta_R``, ``agent_rl.algos.AdaptiveHighTemperature``;
    TGRL only). Typed ``Any`` because OmegaConf 2.3 unions refuse ints; checked and normalised to a float or "auto"
    here. Code that needs a number calls :func:`t_high_value`."""
    t_high_ladder: list[float] = field(default_factory=lambda: [1.0, 1.2, 1.4])
    """``t_high=auto``: the rungs T1 is chosen from, strictly increasing, each > ``t_low`` (warm-up: the middle rung,
    :func:`t_high_value`)."""
    t_high_discount: float = 0.9
    """``t_high=auto``: the discount g of the UCB's statistics, in (0, 1] (1 = plain UCB1)."""
    t_high_ucb_c: float = 1.0
    """``t_high=auto``: the exploration constant c of the UCB bonus (>= 0; 1.0 for delta_R in [-1, 1])."""
    n_low: int = 1
    """TGRL episodes per group at T0."""
    n_high: int = 3
    """TGRL episodes per group at T1."""
    group_size: int = 0
    """G episodes per task. 0 = derived: ``n_low + n_high`` for TGRL, 4 for the others. Under TGRL a non-zero value
    must equal ``n_low + n_high`` (set those instead)."""
    warmup_steps: int = 20
    """TGRL warm-up: the steps s < ``warmup_steps`` (1-based; 20: steps 1..19) sample everything at T1 and use plain
    GRPO (algorithms.md section 3, step 7); 0 or 1: no warm-up."""
    js_quantile_clip: bool = True
    """Clip JS weights to the trajectory's 5th..95th percentiles (TGRL step 4). The one key for it: the ``js``
    credit rule and TGRL's JS stage both read it."""
    logits_chunk_size: int = field(default=1024, metadata=MAY_CHANGE)
    """Tokens per chunk of every logits-sized computation (the (n, V) logits and from them log-probs, entropy, JS, in
    the no-grad and the grad pass): bounds memory to a few (chunk, V) buffers."""
    compile_js: bool = field(default=False, metadata=MAY_CHANGE)
    """``torch.compile`` the JS in fixed-size chunks (of ``logits_chunk_size`` rows): measured 2.7x faster on CPU after
    a one-off compile of ~30 s per process (needs a C compiler); worth it for long runs, off for tests."""
    low_rows_in_denominator: bool = True
    """TGRL low rows (advantage 0) still count in the token-mean denominator (reference code)."""
    high_repetition_penalty: float = 1.0
    """Repetition penalty on high rows at sampling time (reference code uses 1.05; rollout side)."""
    adv_clip: float = field(default=10.0, metadata=applied("Learner._plan: the clamp of the token advantages"))
    """Clamp of the TGRL token advantage (algorithms.md section 3, step 5)."""
    ppo_epochs: int = 1
    """Passes over the batch per step."""
    num_mini_batches: int = 1
    """Optimiser steps per epoch: the batch's groups are shuffled and split into this many mini-batches of whole
    groups (every row of an episode in one). 1 = one step per batch (old log-probs then equal the new ones and the
    PPO clip never binds); TGRL's reference recipe uses 4. Capped at the number of groups in the batch."""
    micro_batch_size: int = field(default=4, metadata=MAY_CHANGE)
    """Rows per forward/backward (gradient accumulation inside a mini-batch) when ``micro_batch_tokens`` is 0."""
    micro_batch_tokens: int = field(default=0, metadata=MAY_CHANGE)
    """Token budget of a micro-batch (0 = off: ``micro_batch_size`` rows each). On: the rows are sorted by length and
    packed so that each micro-batch's padded size (rows x longest row) stays within this many tokens (a row longer
    than the budget goes alone), like verl's dynamic batch size; the loss is the same (every micro-batch divides by
    its mini-batch's denominator)."""
    gamma: float = 1.0
    """GAE discount (``algo=ppo``)."""
    lam: float = 1.0
    """GAE lambda (``algo=ppo``)."""
    vf_coef: float = 0.5
    """Value loss weight (``algo=ppo``)."""
    value_clip: float = 0.2
    """Value clip range (``algo=ppo``; 0 = no clipping)."""
    dapo_dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more (rollout side, ``dapo_keep_groups``)."""
    dapo_max_extra_rounds: int = 3
    """DAPO: at most this many extra sampling rounds per step."""
    dapo_overlong: bool = False
    """DAPO overlong reward shaping (Yu et al. 2025): add R_len to the episode reward."""
    dapo_overlong_max_len: int = 0
    """L_max of the overlong shaping (0 = engine max_new_tokens, filled in by the root config)."""
    dapo_overlong_cache_len: int = 0
    """L_c of the overlong shaping (0 = L_max // 5, DAPO's 4096 of 20480, filled in by the root config)."""
    behaviour_correction: str = field(default="auto", metadata=applied(
        "Learner._micro_loss: the behaviour weights of the policy-gradient term (auto: resolved by the resumed run's "
        "trainer.max_staleness)"))
    """Off-policy correction of the policy-gradient term by the behaviour weight w = min(exp(old_logp - logp_beh), C)
    (algorithms.md section 7; ``logp_beh`` = the batch's ``engine_logprobs``): auto | tis | mask | none. ``auto``:
    ``tis`` when ``trainer.max_staleness`` > 0 or the engine samples in another precision than the learner trains
    (``engine.dtype`` other than ``model.dtype``: the sampler is the rounded policy, Yao et al. 2025's case),
    ``none`` otherwise (synchronous runs in one precision unchanged);
    :func:`resolve_behaviour_correction`. ``tis``: truncated importance sampling, each token's policy-gradient loss
    times w (Yao et al. 2025); ``mask``: tokens with exp(old_logp - logp_beh) > C get weight 0, the others 1 (AReaL,
    Fu et al. 2025); ``none``: weight 1."""
    behaviour_weight_cap: float = field(default=2.0, metadata=applied(
        "Learner._micro_loss: the cap C of the behaviour weights"))
    """C, the cap of the behaviour weight (must be > 1)."""
    tampo: TampoConfig = field(default_factory=TampoConfig)
    """``algo=tampo``: the meta-policy over sampling temperatures (algorithms.md section 8)."""
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    """TGRL's calibrated temperatures (``algo.calibration=probe``, algorithms.md section 3b): the pair (T0, T1) is
    chosen by a probe before RL step 1 and replaces ``t_low`` / ``t_high`` for the whole run."""

    def __post_init__(self) -> None:
        _check("algo.name", self.name, ALGO_NAMES)
        # adv_estimator / policy_loss / credit / schedule names are registry entries (users add their own): the
        # Learner checks them against the registries of agent_rl.algos, whose errors list the valid names.
        _check("algo.loss_agg", self.loss_agg, LOSS_AGGS)
        _check("algo.std", self.std, ("sample", "population"))
        if self.name == "tgrl":
            if self.group_size not in (0, self.n_low + self.n_high):
                raise ValueError(f"algo.group_size={self.group_size} must equal n_low + n_high = "
                                 f"{self.n_low + self.n_high} for tgrl (it is derived from them: leave it 0)")
            self.group_size = self.n_low + self.n_high
        elif self.group_size == 0:
            self.group_size = 4
        if self.name == "drgrpo" and self.loss_max_len <= 0:
            raise ValueError(f"algo=drgrpo needs algo.loss_max_len > 0 (got {self.loss_max_len}): Dr.GRPO divides the "
                             "summed token losses by a constant, the generation budget (engine.max_new_tokens, the "
                             "preset's value); 0 would divide by each batch's longest response, so a row's loss would "
                             "change with the rows beside it (Liu et al. 2025)")
        if (self.name == "ppo") != (self.adv_estimator == "gae"):
            raise ValueError("algo.adv_estimator=gae goes with algo.name=ppo (and only with it)")
        if self.group_size < 1 or self.n_low < 0 or (self.name == "tgrl" and self.n_high < 1):
            raise ValueError("algo.group_size >= 1, n_low >= 0 and (tgrl) n_high >= 1 required (TGRL trains T1 rows)")
        if self.dapo_dynamic_sampling and self.group_size < 2:
            raise ValueError(f"algo.dapo_dynamic_sampling needs algo.group_size >= 2 (got {self.group_size}): a group "
                             "of one reward is always all-equal, so every group would be filtered and nothing trained")
        if self.group_size < 2 and self.adv_estimator in GROUP_ESTIMATORS:
            raise ValueError(f"algo.group_size={self.group_size} with algo.adv_estimator={self.adv_estimator} gives "
                             "every advantage 0 (a group of one has no baseline to compare with): use group_size >= 2 "
                             "or algo.adv_estimator=reinforce_pp (batch baseline)")
        self.t_high = _parse_t_high(self.t_high)
        self.t_high_ladder = [float(t) for t in self.t_high_ladder]
        if self.t_high == "auto":
            if self.name != "tgrl":
                raise ValueError(f"algo.t_high=auto is TGRL's adaptive T1 (it picks T1 from tgrl/delta_R, the gain of "
                                 f"the T1 episodes over the T0 ones); algo.name={self.name} has no T0/T1 groups: "
                                 "give a number")
            ladder = self.t_high_ladder
            if not ladder or any(b <= a for a, b in zip(ladder, ladder[1:])):
                raise ValueError(f"algo.t_high_ladder={ladder} must be a non-empty, strictly increasing list of "
                                 "temperatures")
            if ladder[0] <= self.t_low:
                raise ValueError(f"algo.t_high_ladder={ladder}: every rung must exceed algo.t_low={self.t_low} "
                                 "(T1 is the high temperature)")
            if not 0.0 < self.t_high_discount <= 1.0:
                raise ValueError(f"algo.t_high_discount={self.t_high_discount} must be in (0, 1]")
            if self.t_high_ucb_c < 0:
                raise ValueError(f"algo.t_high_ucb_c={self.t_high_ucb_c} must be >= 0")
        if self.calibration.mode == "auto":
            self.calibration.mode = "probe" if self.name == "tgrl" and self.t_high != "auto" else "off"
        if self.calibration.on:
            if self.name != "tgrl":
                raise ValueError(f"algo.calibration=probe chooses TGRL's two temperatures (T0, T1); algo.name="
                                 f"{self.name} samples at one temperature: use algo=tgrl or algo=tgrl_small")
            if self.t_high == "auto":
                raise ValueError("algo.calibration=probe fixes T1 for the whole run and algo.t_high=auto picks it "
                                 "every step: choose one (algorithms.md sections 3 and 3b)")
        if min(self.t_low, t_high_value(self), self.temperature) <= 0:
            raise ValueError("algo temperatures must be > 0")
        if min(self.micro_batch_size, self.num_mini_batches, self.ppo_epochs, self.logits_chunk_size) < 1:
            raise ValueError("algo.micro_batch_size, num_mini_batches, ppo_epochs, logits_chunk_size must be >= 1")
        if self.micro_batch_tokens < 0:
            raise ValueError(f"algo.micro_batch_tokens={self.micro_batch_tokens} must be >= 0 (0 = off)")
        if min(self.n_low, self.n_high) < 0 or self.group_size < 1:
            raise ValueError("algo.n_low, n_high must be >= 0 and the group size >= 1")
        _check("algo.behaviour_correction", self.behaviour_correction, BEHAVIOUR_CORRECTIONS)
        if isinstance(self.behaviour_weight_cap, bool) or not float(self.behaviour_weight_cap) > 1.0:
            raise ValueError(f"algo.behaviour_weight_cap={self.behaviour_weight_cap!r} must be > 1 (the cap C of the "
                             "behaviour weight min(exp(old_logp - logp_beh), C); a cap <= 1 would down-weight every "
                             "on-policy token)")
        self.behaviour_weight_cap = float(self.behaviour_weight_cap)

    @property
    def is_tgrl(self) -> bool:
        return self.name == "tgrl"

    @property
    def uses_critic(self) -> bool:
        return self.adv_estimator == "gae"

    def in_warmup(self, step: int) -> bool:
        """TGRL's warm-up (step 7 of algorithms.md, TGRL): 1-based ``step < warmup_steps`` (20: steps 1..19, as the
        reference's ``global_steps < warmup_steps``); always False for the other algorithms. The one place the rule
        lives: sampling and the learner both ask here."""
        return self.is_tgrl and step < self.warmup_steps

    @property
    def is_tampo(self) -> bool:
        return self.name == "tampo"

    def group_temperatures(self, step: int, t_high: float | None = None) -> list[tuple[float, bool]]:
        """``(temperature, is_high)`` of the G episodes of a group at 1-based ``step``: TGRL ``n_low`` at ``t_low``
        then ``n_high`` at T1 (warm-up: all G at T1, all flagged high); the others ``group_size`` at ``temperature``
        (flagged low). T1 is ``t_high`` when given (``algo.t_high=auto``: the step's pick of
        ``agent_rl.algos.AdaptiveHighTemperature``), else :func:`t_high_value`. For the other algorithms a given
        ``t_high`` is the step's one temperature instead of ``temperature``: TAMPO's draw (algorithms.md 8) or
        ``rollout.temperature_schedule`` (``agent_rl.temperature.StepTemperature``)."""
        if not self.is_tgrl:
            t = float(self.temperature) if t_high is None else float(t_high)
            if t <= 0:
                raise ValueError(f"the step's temperature {t} must be > 0")
            return [(t, False)] * self.group_size
        t1 = float(t_high) if t_high is not None else t_high_value(self)
        if t1 <= 0:
            raise ValueError(f"t_high={t_high} must be > 0")
        if self.in_warmup(step):
            return [(t1, True)] * self.group_size
        return [(float(self.t_low), False)] * self.n_low + [(t1, True)] * self.n_high


def _parse_t_high(value: Any) -> float | str:
    """``algo.t_high`` as given (a number, a numeric string or ``auto``) -> a float or ``"auto"``.

    Raises:
        ValueError: anything else (bool, another word).
    """
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return "auto"
        try:
            return float(value)
        except ValueError:
            pass
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"algo.t_high={value!r} is not valid: give a temperature (> 0) or auto (adaptive T1, "
                     "algorithms.md section 3)")


def t_high_value(algo: AlgoConfig) -> float:
    """The numeric T1 of ``algo``: ``algo.t_high`` when it is a number; for ``algo.t_high=auto`` the middle rung of
    ``algo.t_high_ladder`` (index ``(len - 1) // 2``: 1.2 of the default [1.0, 1.2, 1.4]), the T1 of the warm-up
    and of code that needs one number without the run's adaptive state."""
    if algo.t_high == "auto":
        return ladder_middle(algo.t_high_ladder)
    return float(algo.t_high)


def ladder_middle(ladder: list[float]) -> float:
    """The middle rung of a T1 ladder (index ``(len - 1) // 2``, the lower middle of an even count): the T1 of
    ``algo.t_high=auto``'s warm-up."""
    return float(ladder[(len(ladder) - 1) // 2])


def resolve_behaviour_correction(algo: AlgoConfig, max_staleness: int, sampler_rounds: bool = False) -> str:
    """The behaviour correction the learner applies: ``algo.behaviour_correction``, with ``auto`` resolved by the
    staleness bound k = ``trainer.max_staleness`` and ``sampler_rounds`` (the engine samples in another precision
    than the learner's weights, ``engine.dtype``): ``tis`` when k > 0 or ``sampler_rounds``, else ``none`` (a
    synchronous run in one precision: its loss is then exactly the uncorrected one). Returns ``"tis"``, ``"mask"``
    or ``"none"``.

    Raises:
        ValueError: an unknown ``algo.behaviour_correction`` (``max_staleness`` is validated once, by
            ``TrainerConfig``).
    """
    _check("algo.behaviour_correction", algo.behaviour_correction, BEHAVIOUR_CORRECTIONS)
    if algo.behaviour_correction == "auto":
        return "tis" if max_staleness > 0 or sampler_rounds else "none"
    return algo.behaviour_correction


@dataclass
class CreditConfig:
    """Credit rule (``credit=...``, algorithms.md section 5)."""

    name: str = "uniform"
    """uniform | js | tp | forking | entropy_adv | empg. The one default is ``configs/config.yaml``'s (uniform);
    ``algo=tgrl``'s preset selects ``js`` (TGRL's own credit), ``credit=`` any rule for any algorithm."""
    level: str = "token"
    """token | turn (which levels each rule supports: see ``agent_rl.algos.apply_credit``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the rule (e.g. alpha, kappa, zeta)."""

    def __post_init__(self) -> None:
        _check("credit.level", self.level, CREDIT_LEVELS)



@dataclass
class ScheduleConfig:
    """Temporal schedule of the credit strength S (``schedule=...``, algorithms.md section 4)."""

    kind: str = "none"
    """linear | sigmoid | power | constant | none."""
    m: float = 0.99
    """Initial strength m."""
    s_min_ratio: float = 0.0
    """s_min = floor(N * s_min_ratio)."""
    s_max_ratio: float = 0.8
    """s_max = floor(N * s_max_ratio): S is 0 from there on."""
    value: float | None = None
    """Fixed S for every step, overriding ``kind`` (static credit, e.g. ``credit=tp schedule.value=0.5``; static
    Forking-Tok is S = 1, ``schedule=constant``); None = follow ``kind``."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.s_min_ratio < self.s_max_ratio <= 1.0:
            raise ValueError("schedule needs 0 <= s_min_ratio < s_max_ratio <= 1")
        if self.value is not None and not 0.0 <= self.value <= 1.0:
            raise ValueError(f"schedule.value={self.value} must be in [0, 1] (or None)")


@dataclass
class OptimConfig:
    """AdamW (Loshchilov & Hutter 2019) with linear warm-up then constant learning rate."""

    lr: float = field(default=1e-6, metadata=applied(
        "Learner.load_state_dict -> restore_optimizer: every param group's lr and initial_lr, and the LR schedule "
        "rebuilt at the restored optimiser step (logged as actor/lr)"))
    """Peak learning rate."""
    weight_decay: float = field(default=0.01, metadata=applied("restore_optimizer: every param group's weight_decay"))
    """Decoupled weight decay."""
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=applied(
        "restore_optimizer: every param group's betas"))
    """Adam betas."""
    eps: float = field(default=1e-8, metadata=applied("restore_optimizer: every param group's eps"))
    """Adam epsilon."""
    max_grad_norm: float = field(default=1.0, metadata=applied(
        "Learner._optimise: the gradient-norm clip of every optimiser step"))
    """Global gradient-norm clip (0 = off)."""
    warmup: int = field(default=0, metadata=applied(
        "restore_optimizer: the warm-up schedule rebuilt from the config at the restored optimiser step (logged as "
        "actor/lr)"))
    """Length of the linear LR warm-up, in ``warmup_unit``s (0: constant lr)."""
    warmup_unit: str = field(default="optimizer_step", metadata=applied(
        "Learner.update: the lr of each RL step (rl_step) or the schedule rebuilt at the restored optimiser step"))
    """What ``warmup`` counts: ``optimizer_step`` (lr after n optimiser steps = lr * min(1, (n + 1) / warmup)) or
    ``rl_step`` (the TGRL reference's scheduler, stepped once per RL step: lr at RL step s (1-based) = lr *
    min(1, (s - 1) / warmup), so RL step 1 runs at lr 0; algorithms.md section 3, the ``algo=tgrl`` preset)."""
    lora_lr: float = field(default=0.0, metadata=applied(
        "Learner / BehaviourCloner -> OptimConfig.for_lora, then restore_optimizer: the LoRA adapter's lr and "
        "initial_lr (model.lora.rank > 0; logged as actor/lr)"))
    """Peak learning rate of the LoRA adapter (``model.lora.rank > 0``), which then replaces ``lr``; 0 = derived:
    ``LORA_LR_FACTOR`` (10) x ``optim.lr``, i.e. 1e-5 under the presets' full fine-tuning 1e-6 (``model=tiny``'s
    preset sets 3e-3: 10x its 1e-3 overshoots, docs/training.md "LoRA").
    Source: LoRA needs about 10x the full fine-tuning learning rate (Schulman et al. 2025, "LoRA Without Regret",
    Thinking Machines; their cookbook's ``get_lr`` uses the fixed factor 10, and LoRA matches full fine-tuning in
    RL at that rate); peft's and QLoRA's supervised recipes use 1e-4..2e-4, but RL runs on instruct models (the
    anchors' 7B agents, GRPO) train full weights at 1e-6, so 10x that is the conservative RL choice. Whether
    ``optim.lr`` was set by the user or by a preset cannot be told apart (every model preset sets it), hence a key
    of its own."""

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]  (yaml gives a list)
        if self.lr <= 0 or self.warmup < 0 or len(self.betas) != 2:
            raise ValueError("optim.lr must be > 0, optim.warmup >= 0, optim.betas two floats")
        _check("optim.warmup_unit", self.warmup_unit, WARMUP_UNITS)
        if self.lora_lr < 0:
            raise ValueError(f"optim.lora_lr={self.lora_lr} must be >= 0 (0 = {LORA_LR_FACTOR:g} x optim.lr)")

    def for_lora(self) -> "OptimConfig":
        """This config with ``lr`` = the adapter's learning rate (``lora_lr``, or ``LORA_LR_FACTOR x lr`` when 0):
        what the learner and the behaviour cloner optimise a LoRA adapter with."""
        from dataclasses import replace

        return replace(self, lr=self.lora_lr if self.lora_lr > 0 else LORA_LR_FACTOR * self.lr, lora_lr=0.0)


#: ``optim.lora_lr = 0``: the adapter's learning rate is this factor times ``optim.lr`` (see ``OptimConfig.lora_lr``).
LORA_LR_FACTOR = 10.0
#: default ``model.lora.target_modules``: every projection of a Llama / Qwen2 / Qwen3 / Mistral decoder layer
#: (attention q, k, v, o and the MLP's gate, up, down); not the embeddings or ``lm_head``.
LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoRAConfig:
    """LoRA adapter of the trained policy (``model.lora.*``; ``agent_rl.lora``, peft's ``LoraConfig``): each target
    linear layer W computes ``W x + (alpha / rank) B A x``, W frozen, A (rank, d_in) and B (d_out, rank) trained."""

    rank: int = 0
    """Adapter rank r; 0 = LoRA off (full fine-tuning). Typical: 8..64 (LoRA Without Regret: RL learns well even at
    small ranks)."""
    alpha: float = 32.0
    """Scale numerator: the update is multiplied by ``alpha / rank`` (peft's ``lora_alpha``). 32 with rank 16 (2x,
    the common choice) or rank 32 (1x, Thinking Machines' default)."""
    dropout: float = 0.0
    """Dropout on the adapter's input (peft's ``lora_dropout``), in [0, 1). 0 keeps old and new log-probs of the
    PPO ratio comparable (dropout would make the grad pass stochastic against the no-grad one)."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_DEFAULT_TARGETS))
    """Names of the linear modules that get an adapter (matched against the end of each module path, as peft does).
    Default: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (all of a Llama / Qwen / SmolLM2 /
    ``model=tiny`` layer; "Even in small data settings, LoRA performs better when applied to all weight matrices,
    especially MLP"). Names the loaded model does not have are refused with its available names."""

    def __post_init__(self) -> None:
        self.target_modules = list(self.target_modules)
        if self.rank < 0:
            raise ValueError(f"model.lora.rank={self.rank} must be >= 0 (0 = LoRA off)")
        if self.rank > 0:
            if self.alpha <= 0:
                raise ValueError(f"model.lora.alpha={self.alpha} must be > 0 (the update is scaled by alpha / rank)")
            if not 0.0 <= self.dropout < 1.0:
                raise ValueError(f"model.lora.dropout={self.dropout} must be in [0, 1)")
            if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
                raise ValueError(f"model.lora.target_modules={self.target_modules} must be a non-empty list of module "
                                 f"names (default: {list(LORA_DEFAULT_TARGETS)})")


@dataclass
class ModelConfig:
    """Which policy to load (``model=...``); see ``agent_rl.models.load_policy``."""

    name: str = "smollm2"
    """``smollm2`` (embedded default, offline), ``tiny`` (random small Llama for tests) or a hub name / local dir."""
    path: str = ""
    """Local directory that overrides ``name`` for hub models (a saved checkpoint, a pre-downloaded model)."""
    dtype: str = "float32"
    """Weights dtype: float32 | bfloat16 | float16 (the learner keeps fp32 master weights on CPU)."""
    gradient_checkpointing: bool = field(default=False, metadata=MAY_CHANGE)
    """Recompute activations in backward (GPU presets turn it on)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained`` for hub models."""
    attn_implementation: str = field(default="sdpa", metadata=MAY_CHANGE)
    """Attention kernel (sdpa | eager | flash_attention_2)."""
    tiny_hidden_size: int = 64
    """``model=tiny``: hidden size."""
    tiny_num_layers: int = 2
    """``model=tiny``: decoder layers."""
    seed: int = 0
    """``model=tiny``: seed of the random weights."""
    tool_call_format: str = "hermes"
    """How the model writes tool calls (``env.action_format=tools``; ``agent_rl.rollout.tool_calls``): hermes
    (``<tool_call>{json}</tool_call>``: Qwen2.5, Qwen3, SmolLM2) | llama3_json (Llama 3.1+) | a registered one. Set
    by each model preset; set it for any other model."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapter of the trained policy (``model.lora.rank=16``; :class:`LoRAConfig`, docs/training.md "LoRA");
    rank 0 (the default) trains every weight."""

    def __post_init__(self) -> None:
        _check("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if isinstance(self.lora, dict):  # a plain dict (ModelConfig(lora={...}))
            self.lora = LoRAConfig(**self.lora)
