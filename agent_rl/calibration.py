"""TGRL's calibrated temperatures in the run (``algo.calibration=probe``, algorithms.md section 3b): the probe that
plays candidate temperatures with the policy about to be trained, once, after any warm start and before RL step 1.

What the loop does with it (:func:`agent_rl.loop.run`):

1. :meth:`Calibration.from_config` (None when the probe is off); a resumed run restores the choice from its
   checkpoint (:meth:`Calibration.load_state_dict`, key :data:`STATE_KEY`) and does not probe again.
2. :meth:`Calibration.probe`: P train tasks drawn by a fresh copy of the run's task sampler (same config and seed;
   the run's own sampler does not move, so RL step 1 draws what it would have drawn without the probe; panel tasks
   are never drawn: the sampler draws the train split), ``samples`` episodes per task at every candidate
   temperature, played through the run's own player (engine, env pool, Ray workers) by
   ``Player.play_specs``; the episodes are returned to nobody: never in a batch, never in the episode store.
3. :func:`agent_rl.algos.calibration_scores` scores the pairs; the chosen pair replaces ``algo.t_low`` /
   ``algo.t_high`` for the whole run (``Backend.set_temperatures``: the learner's JS temperatures and every rollout
   worker's); the optional medium filter restricts the training tasks (:class:`KeptTasks`).
4. One ``calibration`` row in ``metrics.jsonl`` (:meth:`Calibration.row`), one line on stderr saying which pair and
   why, the state in every checkpoint's ``extra.json``; the checkpoint's saved config keeps the temperatures the
   run was configured with (:meth:`Calibration.patch_extra`), so a resume's config comparison is unchanged.

Choices (algorithms.md leaves them open): every probe episode is flagged low (``is_high`` False: no
``algo.high_repetition_penalty``), so each temperature is probed as plain sampling at T; a probe group that fails
(an env failure after its retries) leaves its task out of the statistics (``dropped_tasks``), and a probe in which
no task has every temperature stops the run with the reason.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Sequence

from agent_rl.algos.calibration import calibration_scores, candidate_pairs, medium_tasks
from agent_rl.rollout import GroupSpec
from agent_rl.rollout.samplers import make_task_sampler
from agent_rl.types import Episode, Task

#: ``extra.json`` key of the probe's result (a resumed run applies it instead of probing again).
STATE_KEY = "calibration"
#: the rollout seed key of the probe's rounds (the steps' keys are the step and round numbers: never this large);
#: each probe group has its own group id, so a row's seed (``row_seed(seed, group, slot, turn)``) and the probe's
#: samples do not depend on how its groups are split into rounds (``trainer.tasks_per_step`` x G)
SEED_KEY = 2**31 - 7
#: group ids of the probe's groups start here (distinct from every training group id of the run's sampler)
GROUP_ID_BASE = 10**15


def episode_format_rate(ep: Episode) -> float:
    """An episode's format rate (algorithms.md 3b, ext): for math/code, whose grader reports whether it found a
    final answer (its last turn's info ``extracted`` for math, ``reason == "no_code"`` for code), 1 or 0; for every
    other env 1 - the episode's invalid-action fraction (the count of ``episode/invalid_action_frac``: a turn is
    invalid when its action could not be parsed or the env flagged it)."""
    if not ep.turns:
        return 0.0
    info = ep.turns[-1].info or {}
    if "extracted" in info:
        return 0.0 if info["extracted"] in (None, "") else 1.0
    if info.get("reason") == "no_code":
        return 0.0
    return 1.0 - sum(bool(t.invalid) for t in ep.turns) / len(ep.turns)


def probe_records(groups: Sequence[tuple[Any, float, Sequence[Episode]]]) -> list[dict[str, Any]]:
    """``calibration_scores`` records from played groups ``(task id, temperature, episodes)``: the rewards as the
    episodes scored them and the mean episode format rate (:func:`episode_format_rate`)."""
    return [{"task": task, "temperature": float(temp), "rewards": [float(ep.reward) for ep in eps],
             "format_rate": sum(episode_format_rate(ep) for ep in eps) / len(eps)}
            for task, temp, eps in groups if eps]


class KeptTasks:
    """The run's task sampler restricted to the medium filter's tasks (algorithms.md 3b): draw n cycles through the
    kept tasks in their order, each draw a new group id (the position counter of the wrapped sampler, which a
    checkpoint saves as usual). Everything else is the wrapped sampler's."""

    def __init__(self, sampler: Any, tasks: Sequence[Task]) -> None:
        if not tasks:
            raise ValueError("KeptTasks needs at least one task")
        self.inner, self.tasks = sampler, list(tasks)

    def sample(self, n: int) -> list[Task]:
        p = self.inner.position
        out = [dataclasses.replace(self.tasks[(p + i) % len(self.tasks)], group_id=p + i) for i in range(n)]
        self.inner.position += n
        return out

    def __getattr__(self, name: str) -> Any:  # position, observe, step_metrics, state_dict, load_state_dict
        return getattr(self.inner, name)


class Calibration:
    """The probe of one run and its result (see the module docstring).

    Args:
        cfg: the run's root config (``algo.calibration``, ``algo.t_low`` / ``t_high`` as configured).
    """

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.spec = cfg.algo.calibration
        self.configured = {"t_low": float(cfg.algo.t_low), "t_high": float(cfg.algo.t_high)}
        self.result: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> Calibration | None:
        return cls(cfg) if cfg.algo.calibration.on else None

    @property
    def temperatures(self) -> list[float]:
        """Every candidate temperature of a scored pair, ascending."""
        return sorted({t for pair in candidate_pairs(self.spec.t_low, self.spec.t_high) for t in pair})

    def plan_line(self) -> str:
        """What the probe will play (printed before it runs)."""
        s = self.spec
        return (f"calibration (algorithms.md 3b): probe {s.tasks} train task(s) x {s.samples} episode(s) at each of "
                f"T = {', '.join(f'{t:g}' for t in self.temperatures)} with the policy about to be trained, score "
                f"the pairs T_low in {s.t_low} x T_high in {s.t_high}, train with the best"
                + ("; medium filter on" if s.filter else ""))

    async def probe(self, player: Any, sampler: Any, progress: Any) -> dict[str, Any]:
        """Play the probe through ``player`` (``play_specs``) on ``sampler``'s first ``tasks`` draws, score it and
        keep the result (:attr:`result`).

        Returns:
            ``{"pairs", "chosen", "tasks", "dropped_tasks", "kept_tasks", "filter", "episodes", "failed_groups",
            "wall_s", "records"}`` (``kept_tasks``: the medium filter's, None when it is off or nothing
            qualified; ``filter``: ``off`` | ``kept`` | ``fallback``).
        Raises:
            RuntimeError: no probed task was played at every candidate temperature.
        """
        s, temps = self.spec, self.temperatures
        t0 = time.perf_counter()
        tasks = sampler.sample(s.tasks)
        specs, keys = [], []
        for i, task in enumerate(tasks):
            for j, temp in enumerate(temps):
                gid = GROUP_ID_BASE + i * len(temps) + j
                specs.append(GroupSpec(dataclasses.replace(task, group_id=gid), [(temp, False)] * s.samples))
                keys.append((task.group_id, temp))
        progress.phase("calibration probe", total=len(specs) * s.samples)
        # in rounds of about a training step's episodes (trainer.tasks_per_step x G at once), so the probe holds
        # the engine and the env pool no fuller than a step does
        per_round = max(1, self.cfg.trainer.tasks_per_step * self.cfg.algo.group_size // s.samples)
        by_gid: dict[int, list[Episode]] = {}
        failures: list[str] = []
        dropped = n_episodes = 0
        for a in range(0, len(specs), per_round):  # one seed key: a row's sample depends on its group id, not round
            played = await player.play_specs(specs[a:a + per_round], SEED_KEY)
            for ep in played.episodes:
                by_gid.setdefault(ep.task.group_id, []).append(ep)
            failures += played.failures
            dropped += int(played.dropped_groups)
            n_episodes += len(played.episodes)
        groups = [(task_id, temp, by_gid.get(spec.task.group_id, []))
                  for (task_id, temp), spec in zip(keys, specs)]
        records = probe_records(groups)
        try:
            scored = calibration_scores(records, s.t_low, s.t_high)
        except ValueError as exc:
            raise RuntimeError(f"the calibration probe cannot choose temperatures: {exc} ({dropped} of "
                               f"{len(specs)} probe group(s) failed; first reason: {(failures or ['none'])[0]})"
                               ) from None
        chosen = scored["chosen"]
        kept, how = None, "off"
        if s.filter:
            ids = medium_tasks(records, chosen["t_low"], chosen["t_high"])
            kept, how = (ids, "kept") if ids else (None, "fallback")
        self.result = {**scored, "kept_tasks": kept, "filter": how, "episodes": n_episodes,
                       "failed_groups": dropped, "wall_s": time.perf_counter() - t0,
                       "records": records}
        self._tasks = {t.group_id: t for t in tasks}
        progress.end()
        return self.result

    def apply(self, cfg: Any) -> None:
        """The chosen pair into ``cfg.algo`` (the driver's config; ``Backend.set_temperatures`` tells the rest)."""
        assert self.result is not None
        cfg.algo.t_low = float(self.result["chosen"]["t_low"])
        cfg.algo.t_high = float(self.result["chosen"]["t_high"])

    def restrict(self, sampler: Any) -> Any:
        """The training sampler under the medium filter: :class:`KeptTasks` over the kept probed tasks, else
        ``sampler`` itself. A resumed run rebuilds the kept tasks from a fresh copy of the sampler (the same draws).

        Raises:
            agent_rl.config.schema.ConfigError: the filter with ``trainer.curriculum=pass_rate`` (two task selections).
        """
        assert self.result is not None
        kept = self.result.get("kept_tasks")
        if not kept:
            return sampler
        tasks = getattr(self, "_tasks", None)
        if tasks is None:  # resumed: the probe's draws again, from a fresh copy of the run's sampler
            tasks = {t.group_id: t for t in make_task_sampler(self.cfg, curriculum=False).sample(self.spec.tasks)}
        return KeptTasks(sampler, [tasks[i] for i in kept])

    def summary_line(self) -> str:
        """One line: the chosen pair, why (its score against the runner-up), the probe's size and wall."""
        r = self.result
        assert r is not None
        pairs = sorted(r["pairs"], key=lambda p: -p["score"])
        best = next(p for p in pairs if (p["t_low"], p["t_high"]) == (r["chosen"]["t_low"], r["chosen"]["t_high"]))
        rest = [p for p in pairs if p is not best]
        why = (f"score {best['score']:.3f} (gain_std {best['gain_std']:.3f}, pos {best['pos']:.2f}, var "
               f"{best['var']:.3f}, format {best['ext']:.2f}, eligible {best['elig']:.2f})")
        if rest:
            why += f" against {rest[0]['score']:.3f} for ({rest[0]['t_low']:g}, {rest[0]['t_high']:g})"
        line = (f"calibration: T0={r['chosen']['t_low']:g}, T1={r['chosen']['t_high']:g} chosen over "
                f"{len(r['pairs'])} pair(s): {why}; {len(r['tasks'])} task(s) scored, {r['episodes']} probe "
                f"episode(s) in {r['wall_s']:.0f} s (never trained on)")
        if r["dropped_tasks"]:
            line += f"; {len(r['dropped_tasks'])} task(s) left out (a probe group failed)"
        if r["filter"] == "kept":
            line += f"; medium filter: training on {len(r['kept_tasks'])} probed task(s)"
        elif r["filter"] == "fallback":
            line += "; medium filter: no probed task qualified, every task is kept (the reference's fallback)"
        return line

    def row(self) -> dict[str, Any]:
        """The ``calibration`` row of ``metrics.jsonl``: ``pairs`` (dicts of ``PAIR_KEYS``), ``chosen``, and the
        probe's ``tasks``, ``dropped_tasks``, ``kept_tasks``, ``filter``, ``episodes``, ``failed_groups``,
        ``wall_s``, ``configured`` (the pair the config gave)."""
        r = self.result
        assert r is not None
        return {k: r[k] for k in ("pairs", "chosen", "tasks", "dropped_tasks", "kept_tasks", "filter", "episodes",
                                  "failed_groups", "wall_s")} | {"configured": dict(self.configured)}

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's :data:`STATE_KEY` entry (JSON-serialisable)."""
        assert self.result is not None
        return {k: v for k, v in self.result.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.result = dict(state)

    def patch_extra(self, extra: dict[str, Any]) -> None:
        """Add the state to a checkpoint's ``extra`` and keep its saved config's ``algo.t_low`` / ``t_high`` as
        configured (the chosen pair is state, not config: a resume's comparison sees the config it was given)."""
        extra[STATE_KEY] = self.state_dict()
        algo = extra.get("config", {}).get("algo")
        if isinstance(algo, dict):
            algo.update(self.configured)
