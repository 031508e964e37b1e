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
"""

from __future__ import annotations

from typing import Any

from agent_rl import algos
from agent_rl.config import ConfigError
from agent_rl.algos import TAMPO_SUM_PREFIX as SUM_PREFIX

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
