"""The driver's per-step sampling temperature of the non-TGRL algorithms (algorithms.md section 8): TAMPO's
meta-policy draw (``algo=tampo``) or a temperature schedule (``rollout.temperature_schedule=linear:0.9:1.5``, the
GRPO ablation). TGRL's T1 keeps its own rule (``agent_rl.algos.AdaptiveHighTemperature``, ``algo.t_high=auto``).

The loop asks :meth:`StepTemperature.temperature` before each collect and passes the value to the backend as the
step's temperature (``Backend.collect(..., t_high=T)``; ``AlgoConfig.group_temperatures`` then samples every episode
of a non-TGRL group at it): the driver draws, on Ray too, and the value travels with the tasks; under
``trainer.max_staleness`` a group keeps the T of the step it started in (algorithms.md 7). After the update,
:meth:`StepTemperature.observe` turns the learner's additive TAMPO sums (``tampo_sum/*``, summed over learner ranks
by ``agent_rl.distributed.backend.merge_learner_metrics``) into the batch statistic A_B, moves the EMA and returns
the section-8 metrics. :meth:`state_dict` goes into every checkpoint's ``extra.json`` (key :data:`STATE_KEY`).

:class:`TemperatureHooks` is what the training loop (:func:`agent_rl.loop.run`) calls: it holds the run's three
temperature rules (the calibration probe, TGRL's adaptive T1, this step temperature), starts them, asks them before
each collect and after each update, and puts their state in each checkpoint.
"""

from __future__ import annotations

import sys
from typing import Any

from agent_rl import algos
from agent_rl.algos import TAMPO_SUM_PREFIX as SUM_PREFIX
from agent_rl.calibration import STATE_KEY as CALIBRATION_STATE_KEY, Calibration
from agent_rl.config.schema import ConfigError
from agent_rl.learner.config import t_high_value
from agent_rl.rollout.samplers import make_task_sampler
from agent_rl.runtime import t_high_state

#: ``extra.json`` key of the driver's temperature state (TAMPO's E, meta RNG, draws).
STATE_KEY = "tampo_state"
class StepTemperature:
    """The step temperature of one run: ``kind`` = ``tampo`` (a :class:`agent_rl.algos.TampoMetaPolicy`) or
    ``schedule`` (``rollout.temperature_schedule``). Build it with :meth:`from_config` (None when neither applies).

    Raises:
        ConfigError: ``rollout.temperature_schedule`` with ``algo=tgrl`` (T0/T1 are its temperatures) or
            ``algo=tampo`` (it draws its own), ``algo.tampo.scope=group`` on this version (see :meth:`from_config`).
    """

    def __init__(self, kind: str, *, meta: algos.TampoMetaPolicy | None = None,
                 schedule: tuple[str, float, float] | None = None, total_steps: int = 1) -> None:
        self.kind, self.meta, self.schedule, self.total_steps = kind, meta, schedule, int(total_steps)

    @classmethod
    def from_config(cls, cfg: Any) -> StepTemperature | None:
        """From the root config (``cfg.algo``, ``cfg.rollout.temperature_schedule``, ``cfg.trainer.seed`` and
        ``total_steps``)."""
        algo = cfg.algo
        schedule = algos.parse_temperature_schedule(cfg.rollout.temperature_schedule)
        if schedule is not None and algo.name in ("tgrl", "tampo"):
            raise ConfigError(f"rollout.temperature_schedule={cfg.rollout.temperature_schedule!r} sets the temperature "
                             f"of the single-temperature algorithms; algo={algo.name} chooses its own (tgrl: "
                             "algo.t_low / algo.t_high, tampo: its meta-policy): leave it ''")
        if algo.name == "tampo":
            tc = algo.tampo
            if tc.scope != "step":
                # one T per step travels with the tasks to every backend; per-group draws need the T in each
                # GroupSpec (agent_rl.rollout), not wired yet: refused rather than silently shared
                raise ConfigError("algo.tampo.scope=group is not supported yet (each group would need its own drawn "
                                 "temperature in its GroupSpec); use algo.tampo.scope=step, the paper's reading")
            meta = algos.TampoMetaPolicy(tc.temps, ema_alpha=tc.ema_alpha, top_p=tc.top_p, seed=cfg.trainer.seed,
                                         warmup_steps=tc.warmup_steps, scope=tc.scope)
            return cls("tampo", meta=meta)
        if schedule is not None:
            return cls("schedule", schedule=schedule, total_steps=cfg.trainer.total_steps)
        return None

    def temperature(self, step: int) -> float:
        """The temperature of every episode started in 1-based ``step`` (TAMPO: drawn once per step)."""
        if self.meta is not None:
            return self.meta.temperature(step)
        return algos.scheduled_temperature(self.schedule, step, self.total_steps)  # type: ignore[arg-type]

    def step_metrics(self, step: int) -> dict[str, float]:
        """What the step's draw logs (``tampo/t``, ``tampo/pi/<T>``, ``tampo/pi_entropy``, ``tampo/nucleus_size``;
        schedule: ``rollout/temperature``), whether or not the step trains."""
        if self.meta is None:
            return {"rollout/temperature": self.temperature(step)}
        return self.meta.draw_metrics(step)

    def observe(self, step: int, update_metrics: dict[str, float]) -> dict[str, float]:
        """After step ``step``'s update: pops the ``tampo_sum/*`` keys out of ``update_metrics`` (in place), updates
        the EMA once (8.5) and returns ``tampo/adv/<T>`` (A_B), ``tampo/ema/<T>``, ``tampo/tstar_mean_pos``,
        ``tampo/tstar_mean_neg``, ``tampo/nonfinite_frac``. Schedule: {}."""
        sums = {k[len(SUM_PREFIX):]: update_metrics.pop(k) for k in list(update_metrics) if k.startswith(SUM_PREFIX)}
        if self.meta is None or not sums:
            return {}
        temps = self.meta.temps
        n = int(round(sums.get("episodes", 0.0)))
        a_b = self.meta.observe([sums.get(f"adv/{t:g}", 0.0) for t in temps], n)
        out = {f"tampo/adv/{t:g}": a for t, a in zip(temps, a_b)}
        out.update({f"tampo/ema/{t:g}": e for t, e in zip(temps, self.meta.ema)})
        for sign in ("pos", "neg"):
            cnt = sums.get(f"tstar_{sign}_n", 0.0)
            out[f"tampo/tstar_mean_{sign}"] = sums.get(f"tstar_{sign}_sum", 0.0) / cnt if cnt > 0 else 0.0
        out["tampo/nonfinite_frac"] = sums.get("nonfinite", 0.0) / max(n * len(temps), 1)
        return out

    def state_dict(self) -> dict[str, Any] | None:
        """The checkpoint's :data:`STATE_KEY` value (None for a schedule: it is a function of the step)."""
        return self.meta.state_dict() if self.meta is not None else None

    def load_state_dict(self, extra: dict[str, Any], ckpt: Any = None) -> None:
        """Restore from a checkpoint's ``extra`` dict.

        Raises:
            ConfigError: a TAMPO run resumed from a checkpoint without TAMPO state.
            ValueError: a state saved with other candidates.
        """
        if self.meta is None:
            return
        if STATE_KEY not in extra:
            raise ConfigError(f"checkpoint {ckpt} has no TAMPO state (extra.json key {STATE_KEY!r}): it was not "
                             "written by an algo=tampo run, so the meta-policy cannot resume where it stopped")
        self.meta.load_state_dict(extra[STATE_KEY])


class TemperatureHooks:
    """The sampling temperatures of one run, chosen by up to three rules, each None when off:

    - ``calibration``: ``algo.calibration=probe`` (algorithms.md 3b), the pair (T0, T1) chosen by a probe before RL
      step 1, or restored from the checkpoint (a resumed run never probes again);
    - ``t_rule``: ``algo.t_high=auto`` (section 3), TGRL's adaptive T1, picked before each collect, observed after
      each update;
    - ``step_temperature``: the non-TGRL algorithms' one temperature per step (section 8), TAMPO's meta-policy draw
      or ``rollout.temperature_schedule`` (:class:`StepTemperature`), drawn before each collect, observed after each
      update.

    A run that plays no episodes (``plays_episodes`` false: behaviour cloning) has none of them. The loop calls
    :meth:`start` once, then per step :meth:`temperature`, :meth:`collect_metrics`, :meth:`observe`, and at each
    checkpoint :meth:`t_high_state`, :meth:`step_state` and :meth:`patch_extra`.
    """

    def __init__(self, cfg: Any, *, plays_episodes: bool) -> None:
        self.cfg = cfg
        self.plays_episodes = plays_episodes
        self.calibration: Calibration | None = None
        self.t_rule: algos.AdaptiveHighTemperature | None = None
        self.step_temperature: StepTemperature | None = None
        self.calibration_row: dict[str, Any] | None = None
        """The probe's ``calibration`` row of ``metrics.jsonl`` (None: no probe ran in this process)."""

    async def start(self, backend: Any, player: Any, sampler: Any, extra: dict[str, Any] | None, ckpt: Any,
                    progress: Any) -> Any:
        """Build the rules and restore them from checkpoint ``ckpt``'s ``extra`` (None: a fresh run); with
        calibration, probe (fresh) or restore the pair, set it in ``cfg.algo`` and on ``backend``
        (``Backend.set_temperatures``). Returns the training task sampler: ``sampler``, or the calibration's
        medium-filtered one.

        Raises:
            ConfigError: a checkpoint without the state a rule restores; a rule the config refuses
                (:class:`agent_rl.config.schema.ConfigError`).
        """
        cfg = self.cfg
        self.calibration = Calibration.from_config(cfg) if self.plays_episodes else None
        if self.calibration is not None:
            sampler = await self._calibrate(backend, player, sampler, extra, ckpt, progress)
        # after the calibration: its chosen pair replaces algo.t_high
        if cfg.algo.t_high == "auto" and self.plays_episodes:
            self.t_rule = algos.AdaptiveHighTemperature(cfg.algo)
            if extra is not None:
                self.t_rule.load_state_dict(t_high_state(extra, ckpt))
        self.step_temperature = StepTemperature.from_config(cfg) if self.plays_episodes else None
        if self.step_temperature is not None and extra is not None:
            self.step_temperature.load_state_dict(extra, ckpt)
        return sampler

    async def _calibrate(self, backend: Any, player: Any, sampler: Any, extra: dict[str, Any] | None, ckpt: Any,
                         progress: Any) -> Any:
        """The calibration's part of :meth:`start`; prints the plan and the choice (or the restored pair)."""
        cfg, calibration = self.cfg, self.calibration
        assert calibration is not None
        if extra is not None and CALIBRATION_STATE_KEY in extra:
            calibration.load_state_dict(extra[CALIBRATION_STATE_KEY])
        else:
            print(calibration.plan_line(), file=sys.stderr)
            await calibration.probe(player, make_task_sampler(cfg, curriculum=False), progress)
            self.calibration_row = calibration.row()
        calibration.apply(cfg)
        await backend.set_temperatures(cfg.algo.t_low, cfg.algo.t_high)
        sampler = calibration.restrict(sampler)
        print(calibration.summary_line() if self.calibration_row is not None else
              f"calibration: T0={cfg.algo.t_low:g}, T1={cfg.algo.t_high:g} restored from {ckpt} (no new probe)",
              file=sys.stderr)
        return sampler

    def temperature(self, step: int) -> float | None:
        """The T1 (TGRL) or the one temperature (step temperature) of the episodes of ``step``, passed to the
        collect as ``t_high``; None: the config's (``algo.t_high``)."""
        t_high = self.t_rule.t_high(step) if self.t_rule is not None else None
        if self.step_temperature is not None:
            t_high = self.step_temperature.temperature(step)
        return t_high

    def collect_metrics(self, step: int, t_high: float | None) -> dict[str, float]:
        """What the step's temperature logs, whether or not the step trains: the step temperature's draw
        (:meth:`StepTemperature.step_metrics`) and, under TGRL, the step's T1 (``tgrl/t_high``, fixed or picked);
        ``t_high``: :meth:`temperature`'s value for ``step``."""
        metrics = self.step_temperature.step_metrics(step) if self.step_temperature is not None else {}
        if self.plays_episodes and self.cfg.algo.is_tgrl:
            metrics["tgrl/t_high"] = t_high if t_high is not None else t_high_value(self.cfg.algo)
        return metrics

    def observe(self, step: int, update_metrics: dict[str, float], metrics: dict[str, Any]) -> dict[str, float]:
        """After step ``step``'s update: the adaptive T1 observes ``tgrl/delta_R`` of ``update_metrics``, the step
        temperature pops the ``tampo_sum/*`` keys out of ``metrics`` (the step's metrics, the update's included; in
        place) and moves its EMA (section 8.5). Returns the step temperature's metrics (TAMPO: ``tampo/adv/<T>``,
        ...; else {})."""
        if self.t_rule is not None and "tgrl/delta_R" in update_metrics:
            self.t_rule.observe(step, update_metrics["tgrl/delta_R"],
                                informative_groups=update_metrics.get("tgrl/delta_R_groups"))
        return self.step_temperature.observe(step, metrics) if self.step_temperature is not None else {}

    def t_high_state(self) -> dict[str, Any] | None:
        """The adaptive T1's checkpoint state (``agent_rl.runtime.checkpoint_extra``'s ``t_high_state``); None: off."""
        return self.t_rule.state_dict() if self.t_rule is not None else None

    def step_state(self) -> dict[str, Any]:
        """The step temperature's entry of a checkpoint's ``extra`` (``{STATE_KEY: state}``; {} when it has none)."""
        state = self.step_temperature.state_dict() if self.step_temperature is not None else None
        return {STATE_KEY: state} if state is not None else {}

    def patch_extra(self, extra: dict[str, Any]) -> None:
        """The calibration's state into a checkpoint's ``extra`` (:meth:`agent_rl.calibration.Calibration.patch_extra`:
        the saved config keeps the configured pair)."""
        if self.calibration is not None:
            self.calibration.patch_extra(extra)
