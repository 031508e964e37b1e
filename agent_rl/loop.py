"""The one training loop, over a small :class:`Backend` protocol.

One step, top to bottom (:func:`run`)::

    collect (whole groups) -> build the batch -> update -> store episodes -> sync weights -> evaluate when due
        -> log -> checkpoint (with the config) -> prune

Every run is this loop: RL on one process (:class:`agent_rl.local.LocalBackend`), RL on Ray actors
(:class:`agent_rl.distributed.backend.RayBackend`), behaviour cloning
(:class:`agent_rl.sft.BehaviourCloningBackend`: expert rows collected once, then epochs over them, cross-entropy
updates). The loop decides the order, the cadence (``trainer.eval_every``, ``trainer.save_every``,
``trainer.keep_checkpoints``), what is logged and what a checkpoint holds; it never branches on the backend's kind.
*When* episodes are played is the run's schedule (:mod:`agent_rl.rollout.schedule`, chosen once from the config:
synchronous rounds, a staleness-bounded stream, fixed expert rows); *where* is the backend's player (what
``Backend.open`` returns). What a backend cannot do is declared in :data:`agent_rl.config.BACKENDS` and refused when
the config is loaded, never a silent difference.

``collect`` returns complete groups, each with the policy version that sampled it (``RolloutResult.versions``;
every turn carries its own, ``Turn.policy_version``), and the tasks drawn but not trained yet (the schedule's
``pending_tasks``: prefetched resets, or groups produced ahead under ``trainer.max_staleness``) stay out of a
checkpoint's data position, so a resume plays them again. Asynchronous rollouts (``trainer.max_staleness`` >= 1,
algorithms.md section 7) are the stream schedule: its :class:`agent_rl.rollout.producer.AsyncProducer` keeps playing
groups while ``update`` runs, ``collect`` returns the step's admitted groups, ``sync`` gives the producer the new
version (also after a step that trained nothing: the version is the step count); each checkpoint saves the version
counter and the groups in flight. ``update`` hides the learner's strategy (one learner, DDP ranks, FSDP, LoRA); the
engines' lifecycle (build, sync, close) is the backend's.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Protocol

from agent_rl.algos import AdaptiveHighTemperature
from agent_rl.calibration import STATE_KEY as CALIBRATION_STATE_KEY, Calibration
from agent_rl.config import Config, ConfigError
from agent_rl.episodes import parse_save_episodes, save_step_episodes
from agent_rl.eval.training import TrainingEval
from agent_rl.learner.config import t_high_value
from agent_rl.logging import KIND_PHASE, NO_SIGNAL, SKIPPED_NONFINITE, MetricsLogger
from agent_rl.progress import step_phase
from agent_rl.rollout import build_rollout_batch
from agent_rl.rollout.schedule import ExpertRows, Player, Schedule, choose_schedule
from agent_rl.rollout.tasks import make_task_sampler
from agent_rl.tasks import TaskFileError
from agent_rl.runtime import (checkpoint_extra, checkpoint_step, pad_token_id, prune_checkpoints, resume_path,
                              t_high_state)
from agent_rl.temperature import STATE_KEY as TEMPERATURE_STATE_KEY, StepTemperature
from agent_rl.types import RolloutBatch


class FirstStepFailed(RuntimeError):
    """Every episode of the run's first step failed (bad env options or kwargs, an unreachable env server): nothing
    can train. The CLI prints it as one line."""


class NonFiniteUpdates(RuntimeError):
    """``trainer.max_nonfinite_skips`` steps in a row had their update skipped for a non-finite advantage, loss or
    gradient (``actor/skipped_nonfinite``): the run stops with the cause rather than train on nothing."""


class SkipUpdate(Exception):
    """Raised by ``Backend.update`` for a batch it cannot train (Ray: fewer groups than learner ranks); the message
    says why. The step is loud and trains nothing."""


class Backend(Protocol):
    """What the loop asks of a backend, in the order it asks (one process, Ray actors, behaviour cloning). *When*
    episodes are played is the schedule's (:mod:`agent_rl.rollout.schedule`); a backend offers *where*.

    Attributes:
        kind: the ``metrics.jsonl`` row kind of a step (``train`` | ``sft``).
        tokenizer: the policy's tokenizer (rows, the episode store).
        total_steps: the run's last step (``trainer.total_steps``; behaviour cloning: epochs x optimizer steps per
            epoch, known after :meth:`start`).
        lr: the learning rate of the next optimiser step (printed at a resume).
    """

    kind: str
    tokenizer: Any
    total_steps: int
    lr: float

    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        """Build the learner side and restore checkpoint ``ckpt`` into it and the engines (None: a fresh run);
        returns the checkpoint's ``extra`` dict."""

    async def open(self) -> Player | ExpertRows:
        """Bring up what playing episodes needs (env pool or servers, rollout workers), once there is a step to
        run; returns where the step's groups are played (behaviour cloning: its fixed rows)."""

    async def update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """One update on ``batch``; returns its metrics. Raises :class:`SkipUpdate` for a batch it cannot train."""

    async def set_temperatures(self, t_low: float, t_high: float) -> None:
        """TGRL's calibrated (T0, T1) (``algo.calibration=probe``, algorithms.md 3b) into everything that samples or
        computes JS with them (the learner ranks, the rollout workers); called once, before RL step 1."""

    async def token_stats(self) -> dict[str, Any] | None:
        """The last update's per-token tensors, (B, L) in the batch's row order (the episode store)."""

    async def engine_metrics(self) -> dict[str, float]:
        """The step's engine metrics, once per step after the weight sync (``vllm_server``: weight version, sync
        time, probe gap, prefix-cache hit rate, requests in flight; others: none)."""

    async def evaluate(self, step: int, evaluator: TrainingEval) -> list[dict[str, Any]]:
        """The in-training panel with the current weights; one result dict per panel."""

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write checkpoint ``path`` with ``extra`` as its ``extra.json``."""

    async def close(self) -> None:
        """Release everything (engines, env pools and servers, actors); safe after a failed start."""


# ------------------------------------------------------------------------------------------------ the loop
async def run(cfg: Config, out: Path, backend: Backend, progress: Any, *, phase: str | None = None,
              checkpoints: Path | None = None, eval_dir: Path | None = None,
              eval_at_start: bool = True, trackers: Any = None) -> dict[str, Any]:
    """Run steps ``start..total_steps`` of ``backend`` (``start`` = 1, or the step after the checkpoint
    ``trainer.resume`` names); returns the last step's logged row ({} when nothing was left to train).

    The phase hooks (issue 35, a warm-started run is two calls: :mod:`agent_rl.warm_start`): ``phase`` is written on
    the eval rows (``agent_rl.logging.PHASES``; default: the backend kind's, ``warm_start`` for behaviour cloning,
    ``rl`` for RL; only its own rows are dropped on a restart), ``checkpoints`` the
    folder of the phase's ``step_N`` (default ``DIR/checkpoints``; ``trainer.resume=auto`` looks there), ``eval_dir``
    that of its panels' files (default ``DIR/eval``: ``step_N/<panel>.json``); ``eval_at_start=False`` skips the
    step-0 panel (the RL phase after a warm start: the warm start's last panel played the same weights).
    ``trackers`` (:class:`agent_rl.trackers.Trackers`, issue 39) get every logged row and checkpoint path; the
    caller closes them.

    Raises:
        FirstStepFailed: every episode of the first step failed.
        NonFiniteUpdates: ``trainer.max_nonfinite_skips`` updates in a row skipped (non-finite).
        ConfigError: the eval panel is not held out (before anything starts).
    """
    t = cfg.trainer
    phase = phase or KIND_PHASE[backend.kind]  # issue 35 phase hooks
    ckpt_dir = checkpoints or out / "checkpoints"
    evaluator = TrainingEval(cfg, out, progress, folder=eval_dir)
    try:  # env.tasks (its description printed), trainer.curriculum
        sampler = make_task_sampler(cfg, announce=lambda text: print(text, file=sys.stderr))
    except (TaskFileError, FileNotFoundError) as exc:
        raise ConfigError(f"env.tasks={cfg.env.tasks!r}: {exc}") from None
    ckpt = resume_path(cfg, out, folder=ckpt_dir)
    start = checkpoint_step(ckpt) + 1 if ckpt is not None else 1
    record: dict[str, Any] = {}
    logger: MetricsLogger | None = None
    schedule: Schedule | None = None
    try:
        extra = await backend.start(ckpt)
        total = backend.total_steps
        if extra is not None:
            sampler.load_state_dict(extra.get("sampler", {"position": 0}))
            print(f"resumed from {ckpt} at step {start} (actor/lr {backend.lr:.6g})", file=sys.stderr)
        if start > total:
            print(f"nothing to train: the checkpoint is at step {start - 1} and trainer.total_steps={total}; "
                  "raise trainer.total_steps to train further", file=sys.stderr)
            return {}
        player = await backend.open()
        schedule = choose_schedule(cfg, player, progress, total_steps=total, version=start - 1)
        # algo.calibration=probe (algorithms.md 3b): the pair (T0, T1) chosen by a probe before RL step 1, or
        # restored from the checkpoint (a resumed run never probes again)
        calibration = Calibration.from_config(cfg) if schedule.plays_episodes else None
        probed = False
        if calibration is not None:
            if extra is not None and CALIBRATION_STATE_KEY in extra:
                calibration.load_state_dict(extra[CALIBRATION_STATE_KEY])
            else:
                print(calibration.plan_line(), file=sys.stderr)
                await calibration.probe(player, make_task_sampler(cfg, curriculum=False), progress)
                probed = True
            calibration.apply(cfg)
            await backend.set_temperatures(cfg.algo.t_low, cfg.algo.t_high)
            sampler = calibration.restrict(sampler)
            print(calibration.summary_line() if probed else
                  f"calibration: T0={cfg.algo.t_low:g}, T1={cfg.algo.t_high:g} restored from {ckpt} (no new probe)",
                  file=sys.stderr)
        # algo.t_high=auto: the adaptive T1 (algorithms.md section 3), picked before each collect, observed after
        # each update, saved in every checkpoint's extra.json
        t_rule = AdaptiveHighTemperature(cfg.algo) if cfg.algo.t_high == "auto" and schedule.plays_episodes else None
        if t_rule is not None and extra is not None:
            t_rule.load_state_dict(t_high_state(extra, ckpt))
        # [tampo hook] the step temperature of the non-TGRL algorithms (algorithms.md 8): TAMPO's meta-policy draw or
        # rollout.temperature_schedule; drawn here (the driver), observed after each update, saved in extra.json
        temp_rule = StepTemperature.from_config(cfg) if schedule.plays_episodes else None
        if temp_rule is not None and extra is not None:
            temp_rule.load_state_dict(extra, ckpt)
        logger = MetricsLogger(out, total_steps=total, start_step=start, tensorboard="tensorboard" in t.loggers,
                               progress=False, phase=phase, trackers=trackers)  # one line per step; the live display is `progress`
        if probed:  # the probe's row, before the first train row
            logger.log_calibration(calibration.row())
        if start == 1 and eval_at_start and evaluator.due(0, total):  # the panel before training, as step 0
            record = logger.log(0, evaluator.metrics(0, await backend.evaluate(0, evaluator)), kind="eval")
        keep_episodes = parse_save_episodes(t.save_episodes)
        idle_steps = 0  # steps that trained on nothing (every group dropped or filtered)
        no_signal_steps = 0  # steps whose groups all had equal rewards (issue 35: said on its line and at the end)
        nonfinite_skips = 0  # steps in a row whose update the learner refused (non-finite)
        for step in range(start, total + 1):
            # 1. Collect the step's complete groups (TGRL: 1 at T0 + 3 at T1 each; warm-up all at T1).
            t_high = t_rule.t_high(step) if t_rule is not None else None
            if temp_rule is not None:  # [tampo hook] the step's one temperature travels as t_high (non-TGRL)
                t_high = temp_rule.temperature(step)
            result = await schedule.collect(step, sampler.sample, t_high=t_high)
            metrics: dict[str, Any] = dict(result.metrics)
            if schedule.plays_episodes:  # the curriculum learns before the next draws (prefetch below)
                sampler.observe(step, result.outcomes)
                metrics.update(sampler.step_metrics())
            if temp_rule is not None:  # [tampo hook] tampo/t, tampo/pi/<T>, ... (or rollout/temperature)
                metrics.update(temp_rule.step_metrics(step))
            if step == start and extra is not None and schedule.plays_episodes:  # section 7, Checkpoints
                metrics["async/groups_replayed_after_resume"] = float(extra.get("groups_in_flight", 0))
            if schedule.plays_episodes and cfg.algo.is_tgrl:  # the step's T1, fixed or picked (section 3)
                metrics["tgrl/t_high"] = t_high if t_high is not None else t_high_value(cfg.algo)
            check_dropped_groups(step, start, result.failures, bool(result.episodes) or result.batch is not None,
                                 result.filtered_groups)
            schedule.prefetch(step, sampler.sample)  # the next step's env resets run during this update
            # 2. The rows (``build_rollout_batch``, the one place RL rows are made).
            batch = result.batch
            if batch is None and result.episodes:
                batch = build_rollout_batch(result.episodes, pad_token_id=pad_token_id(backend.tokenizer),
                                            mode=cfg.rollout.mode)
            update_metrics, refused = await _update(backend, schedule, batch, step, progress, total)
            if update_metrics is not None:  # 3. updated; 4. store the step's episodes; 5. sync the engines
                metrics.update(update_metrics)
                if t_rule is not None and "tgrl/delta_R" in update_metrics:
                    t_rule.observe(step, update_metrics["tgrl/delta_R"],
                                   informative_groups=update_metrics.get("tgrl/delta_R_groups"))
                if temp_rule is not None:  # [tampo hook] A_B -> EMA, once per RL step (8.5)
                    metrics.update(temp_rule.observe(step, metrics))
                if result.episodes:
                    stats = await backend.token_stats() if keep_episodes != 0 else None
                    await asyncio.to_thread(save_step_episodes, out, step, result.episodes, t.save_episodes,
                                            tokenizer=backend.tokenizer, batch=batch, token_stats=stats, seed=t.seed)
            else:  # loud: a run that never trains must not look like one that did
                idle_steps += 1
                warn_idle_step(step, result.dropped_groups, result.filtered_groups, refused)
            metrics["batch/rows"] = batch.num_rows if update_metrics is not None else 0
            await schedule.sync(step, trained=update_metrics is not None)  # v = s after step s (section 7)
            metrics.update(await backend.engine_metrics())
            # 6. Evaluate when due (the panel plays with the weights the engines now hold).
            if evaluator.due(step, total):
                metrics.update(evaluator.metrics(step, await backend.evaluate(step, evaluator)))
            # 7. Log; 8. checkpoint (the data position excludes tasks drawn but not trained: a resume replays them).
            progress.end()
            record = logger.log(step, {**metrics, **schedule.step_metrics()}, kind=backend.kind)
            nonfinite_skips = nonfinite_skips + 1 if record.get(SKIPPED_NONFINITE) else 0
            check_nonfinite_skips(step, nonfinite_skips, t.max_nonfinite_skips, record)
            if no_learning_signal(metrics):
                no_signal_steps += 1
                print(f"step {step}: {NO_SIGNAL} in all {int(metrics.get('rollout/groups', 0))} group(s); "
                      "every advantage is 0, the update changes nothing", file=sys.stderr)
            if step % t.save_every == 0 or step == total:
                progress.phase(step_phase(progress, step, total, "checkpoint"))
                ckpt_extra = checkpoint_extra(cfg, step, sampler.position - schedule.pending_tasks,
                                              t_high_state=t_rule.state_dict() if t_rule is not None else None)
                ckpt_extra["sampler"] = sampler.state_dict(ckpt_extra["sampler"]["position"])  # + the curriculum's
                if temp_rule is not None and temp_rule.state_dict() is not None:  # [tampo hook]
                    ckpt_extra[TEMPERATURE_STATE_KEY] = temp_rule.state_dict()
                ckpt_extra["policy_version"] = step  # the engines' version counter (section 7: v = s after step s)
                ckpt_extra["groups_in_flight"] = schedule.groups_in_flight
                if calibration is not None:  # the choice, and the config's temperatures as configured
                    calibration.patch_extra(ckpt_extra)
                await backend.save(ckpt_dir / f"step_{step}", ckpt_extra)
                if trackers is not None:
                    trackers.checkpoint(step, ckpt_dir / f"step_{step}")
                prune_checkpoints(ckpt_dir, t.keep_checkpoints)
        warn_idle_run(idle_steps, total - start + 1)
        if schedule.plays_episodes and no_signal_steps:  # RL steps only (behaviour cloning plays none)
            print(f"WARNING: {no_signal_steps} of {total - start + 1} step(s) had {NO_SIGNAL} "
                  f"({no_signal_steps / (total - start + 1):.0%})", file=sys.stderr)
        return record
    finally:
        progress.end()
        if logger is not None:
            logger.close()
        try:
            if schedule is not None:
                await schedule.aclose()
        finally:
            await backend.close()


async def _update(backend: Backend, schedule: Schedule, batch: RolloutBatch | None, step: int, progress: Any,
                  total: int) -> tuple[dict[str, float] | None, str | None]:
    """The step's update: ``(metrics with the schedule's time/overlap_s, None)``; ``(None, why)`` when there is no
    batch (``why`` None) or the backend cannot train it (:class:`SkipUpdate`)."""
    if batch is None:
        return None, None
    progress.phase(step_phase(progress, step, total, "update"))
    mark = schedule.update_started()
    try:
        metrics = await backend.update(batch, step)
    except SkipUpdate as why:
        return None, str(why)
    return {**metrics, **schedule.update_metrics(mark)}, None


# ------------------------------------------------------------------------------------------------ loud steps
def check_dropped_groups(step: int, start: int, failures: list[Any], has_rows: bool, filtered_groups: int) -> None:
    """Warn about the step's dropped groups (a broken env, bad env.kwargs or missing data would otherwise fail
    silently).

    Raises:
        FirstStepFailed: every episode of the run's first step failed (none kept, none filtered by DAPO).
    """
    if not failures:
        return
    print(f"warning: step {step}: {len(failures)} group(s) dropped; first reason: {failures[0]}", file=sys.stderr)
    if step == start and not has_rows and not filtered_groups:
        raise FirstStepFailed(f"every episode of step {step} failed, nothing to train on; "
                              f"first reason: {failures[0]}")


def check_nonfinite_skips(step: int, in_a_row: int, limit: int, record: dict[str, Any]) -> None:
    """Say a step whose update was skipped for a non-finite value (``in_a_row``: such steps up to this one).

    Raises:
        NonFiniteUpdates: ``in_a_row`` reached ``limit`` (``trainer.max_nonfinite_skips``; 0: never).
    """
    if not in_a_row:
        return
    numbers = ", ".join(f"{k}={record.get(k)}" for k in ("actor/pg_loss", "actor/grad_norm", "actor/optimizer_steps"))
    cause = (f"a non-finite advantage, loss or gradient ({numbers}; the learner's warning names which); a "
             "non-finite number from outside (reward, engine log-prob) or an unstable update (learning rate, "
             "precision)")
    print(f"WARNING: step {step}: update skipped, nothing applied: {cause}", file=sys.stderr)
    if limit and in_a_row >= limit:
        raise NonFiniteUpdates(f"{in_a_row} updates in a row (steps {step - in_a_row + 1}..{step}) were skipped for "
                               f"{cause}; trainer.max_nonfinite_skips={limit}")


def warn_idle_step(step: int, dropped_groups: int, filtered_groups: int, refused: str | None = None) -> None:
    """The loud line of a step that trains on nothing (a run that never trains must not look like one that did);
    ``refused``: why the backend could not train the step's batch."""
    if refused is not None:
        print(f"WARNING: step {step} trains on nothing: {refused}; no update", file=sys.stderr)
        return
    print(f"WARNING: step {step} trains on nothing (0 episodes: {dropped_groups} group(s) dropped, {filtered_groups} "
          "filtered as all-equal by DAPO dynamic sampling); no update", file=sys.stderr)


def no_learning_signal(metrics: dict[str, Any]) -> bool:
    """Whether a ``train`` step's every group had zero reward variance (``rollout/groups_equal_frac`` = 1 over >= 1
    group; ``agent_rl.rollout.orchestrator.rollout_metrics``): every group advantage is 0. False for other rows."""
    return bool(metrics.get("rollout/groups")) and metrics.get("rollout/groups_equal_frac") == 1.0


def warn_idle_run(idle_steps: int, steps: int) -> None:
    """The loud line at the end of a run with steps that trained on nothing."""
    if idle_steps:
        print(f"WARNING: {idle_steps} of {steps} step(s) trained on nothing (see the warnings above)",
              file=sys.stderr)
