"""The one training loop, over a small :class:`Backend` protocol.

One step, top to bottom (:func:`run`)::

    collect (whole groups) -> build the batch -> update -> store episodes -> sync weights -> evaluate when due
        -> log -> checkpoint (with the config) -> prune

Around it, objects it calls: the run's temperature rules (:class:`agent_rl.temperature.TemperatureHooks`: the
calibration probe, TGRL's adaptive T1, TAMPO's draw or a temperature schedule), the one metrics sink
(:class:`agent_rl.logging.MetricsLogger`: ``metrics.jsonl`` and the trackers, TensorBoard, W&B, MLflow) and the
steps that must not pass silently (:class:`LoudSteps`).

Every run is this loop: RL on one process (:class:`agent_rl.local.LocalBackend`), RL on Ray actors
(:class:`agent_rl.distributed.backend.RayBackend`), behaviour cloning
(:class:`agent_rl.sft.BehaviourCloningBackend`: expert rows collected once, then epochs over them, cross-entropy
updates). The loop decides the order, the cadence (``trainer.eval_every``, ``trainer.save_every``,
``trainer.keep_checkpoints``), what is logged and what a checkpoint holds; it never branches on the backend's kind.
*When* episodes are played is the run's schedule (:mod:`agent_rl.rollout.schedule`, chosen once from the config:
synchronous rounds, a staleness-bounded stream, fixed expert rows); *where* is the backend's player (what
``Backend.open`` returns). What a backend cannot do is declared in :data:`agent_rl.config.schema.BACKENDS` and refused
when the config is loaded, never a silent difference.

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

from agent_rl.config.schema import Config, ConfigError
from agent_rl.episodes import parse_save_episodes, save_step_episodes
from agent_rl.eval.training import TrainingEval
from agent_rl.logging import KIND_PHASE, NO_SIGNAL, SKIPPED_NONFINITE, MetricsLogger
from agent_rl.progress import step_phase
from agent_rl.rollout import build_rollout_batch
from agent_rl.rollout.schedule import ExpertRows, Player, Schedule, choose_schedule
from agent_rl.rollout.samplers import make_task_sampler
from agent_rl.task_files import TaskFileError
from agent_rl.runtime import checkpoint_extra, checkpoint_step, pad_token_id, prune_checkpoints, resume_path
from agent_rl.temperature import TemperatureHooks
from agent_rl.trackers import Trackers
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
              eval_at_start: bool = True, trackers: Trackers | None = None) -> dict[str, Any]:
    """Run steps ``start..total_steps`` of ``backend`` (``start`` = 1, or the step after the checkpoint
    ``trainer.resume`` names); returns the last step's logged row ({} when nothing was left to train).

    A warm-started run is two calls (:mod:`agent_rl.warm_start`), each with its ``phase`` (``agent_rl.logging.PHASES``,
    on its rows, only its own dropped on a restart; default: the backend kind's), ``checkpoints`` (default
    ``DIR/checkpoints``, where ``trainer.resume=auto`` looks) and ``eval_dir`` (default ``DIR/eval``);
    ``eval_at_start=False`` skips the step-0 panel (after a warm start its last panel played the same weights).
    ``trackers`` (W&B, MLflow; the caller closes them) get every row and checkpoint path through the logger.

    Raises:
        FirstStepFailed: every episode of the first step failed.
        NonFiniteUpdates: ``trainer.max_nonfinite_skips`` updates in a row skipped (non-finite).
        ConfigError: the eval panel is not held out (before anything starts).
    """
    t = cfg.trainer
    ckpt_dir = checkpoints or out / "checkpoints"
    evaluator = TrainingEval(cfg, out, progress, folder=eval_dir)
    sampler = _task_sampler(cfg)
    ckpt = resume_path(cfg, out, folder=ckpt_dir)
    start = checkpoint_step(ckpt) + 1 if ckpt is not None else 1
    logger: MetricsLogger | None = None
    schedule: Schedule | None = None
    try:
        extra = await backend.start(ckpt)
        total = backend.total_steps
        if not _resume(backend, sampler, extra, ckpt, start, total):
            return {}
        player = await backend.open()
        schedule = choose_schedule(cfg, player, progress, total_steps=total, version=start - 1)
        temperatures = TemperatureHooks(cfg, plays_episodes=schedule.plays_episodes)  # calibration, T1, TAMPO
        sampler = await temperatures.start(backend, player, sampler, extra, ckpt, progress)
        logger = MetricsLogger(out, total_steps=total, start_step=start, tensorboard="tensorboard" in t.loggers,
                               progress=False, phase=phase or KIND_PHASE[backend.kind], trackers=trackers)
        if temperatures.calibration_row is not None:  # the probe's row, before the first train row
            logger.log_calibration(temperatures.calibration_row)
        if start == 1 and eval_at_start and evaluator.due(0, total):  # the panel before training, as step 0
            logger.log(0, evaluator.metrics(0, await backend.evaluate(0, evaluator)), kind="eval")
        loud = LoudSteps(start, total, t.max_nonfinite_skips)
        for step in range(start, total + 1):
            # 1. Collect the step's complete groups (TGRL: 1 at T0 + 3 at T1 each; warm-up all at T1).
            t_high = temperatures.temperature(step)
            result = await schedule.collect(step, sampler.sample, t_high=t_high)
            metrics = _collect_metrics(step, result, sampler, schedule, temperatures.collect_metrics(step, t_high),
                                       resumed=extra if step == start else None)
            loud.collected(step, result)
            schedule.prefetch(step, sampler.sample)  # the next step's env resets run during this update
            # 2. The rows (``build_rollout_batch``, the one place RL rows are made).
            batch = _batch(cfg, backend, result)
            update_metrics, refused = await _update(backend, schedule, batch, step, progress, total)
            if update_metrics is not None:  # 3. updated; 4. store the step's episodes; 5. sync the engines
                metrics.update(update_metrics)
                metrics.update(temperatures.observe(step, update_metrics, metrics))
                if result.episodes:
                    await _store_episodes(cfg, out, step, backend, result.episodes, batch)
            else:  # loud: a run that never trains must not look like one that did
                loud.idle(step, result, refused)
            metrics["batch/rows"] = batch.num_rows if update_metrics is not None else 0
            await schedule.sync(step, trained=update_metrics is not None)  # v = s after step s (section 7)
            metrics.update(await backend.engine_metrics())
            # 6. Evaluate when due (the panel plays with the weights the engines now hold).
            if evaluator.due(step, total):
                metrics.update(evaluator.metrics(step, await backend.evaluate(step, evaluator)))
            # 7. Log; 8. checkpoint (the data position excludes tasks drawn but not trained: a resume replays them).
            progress.end()
            record = logger.log(step, {**metrics, **schedule.step_metrics()}, kind=backend.kind)
            loud.logged(step, record, metrics)
            if step % t.save_every == 0 or step == total:
                progress.phase(step_phase(progress, step, total, "checkpoint"))
                await backend.save(ckpt_dir / f"step_{step}", _checkpoint_extra(cfg, step, sampler, schedule,
                                                                               temperatures))
                logger.checkpoint(step, ckpt_dir / f"step_{step}")  # its path to the trackers
                prune_checkpoints(ckpt_dir, t.keep_checkpoints)
        loud.end(schedule.plays_episodes)
        return record
    finally:
        await _close(progress, logger, schedule, backend)


def _task_sampler(cfg: Config) -> Any:
    """The run's task sampler (``env.tasks``, its description printed; ``trainer.curriculum``).

    Raises:
        ConfigError: ``env.tasks`` names a file that cannot be read as tasks.
    """
    try:
        return make_task_sampler(cfg, announce=lambda text: print(text, file=sys.stderr))
    except (TaskFileError, FileNotFoundError) as exc:
        raise ConfigError(f"env.tasks={cfg.env.tasks!r}: {exc}") from None


def _resume(backend: Backend, sampler: Any, extra: dict[str, Any] | None, ckpt: Path | None, start: int,
            total: int) -> bool:
    """Put the checkpoint's data position (``extra``; None: a fresh run) into ``sampler`` and say the resume;
    False (said on stderr) when the checkpoint is at or past the last step: nothing to train."""
    if extra is not None:
        sampler.load_state_dict(extra.get("sampler", {"position": 0}))
        print(f"resumed from {ckpt} at step {start} (actor/lr {backend.lr:.6g})", file=sys.stderr)
    if start > total:
        print(f"nothing to train: the checkpoint is at step {start - 1} and trainer.total_steps={total}; "
              "raise trainer.total_steps to train further", file=sys.stderr)
        return False
    return True


def _collect_metrics(step: int, result: Any, sampler: Any, schedule: Schedule, temperature_metrics: dict[str, float],
                     *, resumed: dict[str, Any] | None) -> dict[str, Any]:
    """The step's metrics after its collect: the rollout's, the curriculum's (``sampler`` observes the step's
    outcomes before the next draws, the prefetch's included), the step temperature's, and at the first step after a
    resume (``resumed``: the checkpoint's ``extra``) the groups it plays again (section 7, Checkpoints)."""
    metrics: dict[str, Any] = dict(result.metrics)
    if schedule.plays_episodes:
        sampler.observe(step, result.outcomes)
        metrics.update(sampler.step_metrics())
    metrics.update(temperature_metrics)
    if resumed is not None and schedule.plays_episodes:
        metrics["async/groups_replayed_after_resume"] = float(resumed.get("groups_in_flight", 0))
    return metrics


def _batch(cfg: Config, backend: Backend, result: Any) -> RolloutBatch | None:
    """The step's rows: the schedule's (fixed expert rows), else built from its episodes (None: no episode)."""
    if result.batch is None and result.episodes:
        return build_rollout_batch(result.episodes, pad_token_id=pad_token_id(backend.tokenizer),
                                   mode=cfg.rollout.mode)
    return result.batch


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


async def _store_episodes(cfg: Config, out: Path, step: int, backend: Backend, episodes: list[Any],
                          batch: RolloutBatch | None) -> None:
    """The step's episodes into the episode store (``trainer.save_episodes``), with the update's per-token tensors
    when any episode is kept."""
    t = cfg.trainer
    stats = await backend.token_stats() if parse_save_episodes(t.save_episodes) != 0 else None
    await asyncio.to_thread(save_step_episodes, out, step, episodes, t.save_episodes, tokenizer=backend.tokenizer,
                            batch=batch, token_stats=stats, seed=t.seed)


def _checkpoint_extra(cfg: Config, step: int, sampler: Any, schedule: Schedule,
                      temperatures: TemperatureHooks) -> dict[str, Any]:
    """The ``extra.json`` of step ``step``'s checkpoint: the data position (tasks drawn but not trained left out: a
    resume plays them again) with the curriculum's state, the temperature rules' states, the engines' version
    counter (section 7: v = s after step s) and the groups in flight."""
    extra = checkpoint_extra(cfg, step, sampler.position - schedule.pending_tasks,
                             t_high_state=temperatures.t_high_state())
    extra["sampler"] = sampler.state_dict(extra["sampler"]["position"])
    extra.update(temperatures.step_state())
    extra["policy_version"] = step
    extra["groups_in_flight"] = schedule.groups_in_flight
    temperatures.patch_extra(extra)  # the calibration's choice, and the config's temperatures as configured
    return extra


async def _close(progress: Any, logger: MetricsLogger | None, schedule: Schedule | None, backend: Backend) -> None:
    """Release what the run opened, the backend last (also after a failed start)."""
    progress.end()
    if logger is not None:
        logger.close()
    try:
        if schedule is not None:
            await schedule.aclose()
    finally:
        await backend.close()


# ------------------------------------------------------------------------------------------------ loud steps
class LoudSteps:
    """The run's steps that must not pass silently: dropped groups (a run whose first step played nothing stops),
    steps that trained on nothing, steps without a learning signal, updates skipped for a non-finite value (too many
    in a row stop the run). Counts them and says the totals at the end (:meth:`end`)."""

    def __init__(self, start: int, total: int, max_nonfinite_skips: int) -> None:
        self.start, self.total, self.max_nonfinite_skips = start, total, max_nonfinite_skips
        self.idle_steps = 0  # steps that trained on nothing (every group dropped or filtered)
        self.no_signal_steps = 0  # steps whose groups all had equal rewards (said on its line and at the end)
        self.nonfinite_skips = 0  # steps in a row whose update the learner refused (non-finite)

    def collected(self, step: int, result: Any) -> None:
        """After the collect: warn about dropped groups (:func:`check_dropped_groups`).

        Raises:
            FirstStepFailed: every episode of the run's first step failed.
        """
        check_dropped_groups(step, self.start, result.failures, bool(result.episodes) or result.batch is not None,
                             result.filtered_groups)

    def idle(self, step: int, result: Any, refused: str | None) -> None:
        """The step trains on nothing: its loud line (:func:`warn_idle_step`)."""
        self.idle_steps += 1
        warn_idle_step(step, result.dropped_groups, result.filtered_groups, refused)

    def logged(self, step: int, record: dict[str, Any], metrics: dict[str, Any]) -> None:
        """After the step's row ``record`` (of ``metrics``): a skipped update, a step without a learning signal.

        Raises:
            NonFiniteUpdates: ``trainer.max_nonfinite_skips`` updates in a row skipped.
        """
        self.nonfinite_skips = self.nonfinite_skips + 1 if record.get(SKIPPED_NONFINITE) else 0
        check_nonfinite_skips(step, self.nonfinite_skips, self.max_nonfinite_skips, record)
        if no_learning_signal(metrics):
            self.no_signal_steps += 1
            print(f"step {step}: {NO_SIGNAL} in all {int(metrics.get('rollout/groups', 0))} group(s); "
                  "every advantage is 0, the update changes nothing", file=sys.stderr)

    def end(self, plays_episodes: bool) -> None:
        """The run's totals: steps that trained on nothing; under RL (``plays_episodes``) steps without a signal."""
        steps = self.total - self.start + 1
        warn_idle_run(self.idle_steps, steps)
        if plays_episodes and self.no_signal_steps:  # RL steps only (behaviour cloning plays none)
            print(f"WARNING: {self.no_signal_steps} of {steps} step(s) had {NO_SIGNAL} "
                  f"({self.no_signal_steps / steps:.0%})", file=sys.stderr)


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
