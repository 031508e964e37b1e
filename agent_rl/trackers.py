"""Experiment trackers beside ``metrics.jsonl`` (``trainer.loggers``): TensorBoard, Weights & Biases and MLflow, each
one :class:`Tracker` behind one :class:`Trackers` group. :class:`agent_rl.logging.MetricsLogger` writes the JSONL
file (always on) and hands every row it writes to the group; the training loop talks to the logger only.

- W&B and MLflow (:data:`TRACKER_TYPES`) are the run's: :meth:`Trackers.open` starts them once per command (the
  driver's), ``DIR/trackers.json`` keeps their run ids, a resume continues them.
- TensorBoard (:class:`TensorBoardTracker`) writes the files of one phase: the logger of each phase opens it
  (``DIR/tb``; the warm start's steps restart at 1, so its events go to ``DIR/tb/warm_start``), attaches it to the
  group (:meth:`Trackers.attach`) and closes it with the phase.

What goes to each tracker: every metrics row (``train``, ``eval`` and ``sft`` rows, at their step; W&B: the
row's values in one ``log`` call, MLflow: one ``log_batch``, TensorBoard: one scalar per value), the resolved config
(W&B: the run config; MLflow: one param per flattened key, cut to MLflow's 6,000-character limit, and ``config.yaml``
as an artifact), every checkpoint's path (W&B summary / MLflow tag ``checkpoint/step_N``), and at the end
``config.yaml``, ``curves.png`` and ``summary.md`` as files / artifacts.

Defaults (docs/training.md "Trackers"):

- W&B: ``mode`` is ``trainer.tracking.wandb_mode``, else ``$WANDB_MODE``, else ``online`` when the machine holds W&B
  credentials (``$WANDB_API_KEY`` or a ``~/.netrc`` entry for api.wandb.ai), else ``offline``: the run is written
  to ``DIR/wandb/offline-run-*`` and ``wandb sync DIR/wandb/offline-run-*`` uploads it later. A resumed run
  continues the same W&B run (its id is kept in ``DIR/trackers.json``).
- MLflow: the tracking URI is ``trainer.tracking.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``, else the file store
  ``DIR/mlruns`` (MLflow 3 keeps that backend in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE=true``, which is
  set for it). A resumed run continues the same MLflow run.

A resume follows the run's history (:meth:`Trackers.rewind`, called where ``metrics.jsonl`` drops the rows of the
steps a resumed run plays again): every tracker then holds the re-run's values at those steps, and only them, as
``metrics.jsonl`` does.

- TensorBoard: nothing is dropped; the resumed process writes a new event file beside the old ones.

- W&B: the run is rewound (``wandb.init(resume_from="<id>?_step=<S-1>")``, W&B's documented rewind: the history
  after step S-1 is truncated and logging goes on at S, the original kept archived). Rewind is a W&B preview
  feature: a server that refuses it gets a warning and the plain resume (``resume="allow"``), where W&B ignores
  the replayed steps ("less than the current step"). Offline, the rewind point is written in the run record and
  ``wandb sync`` applies it.
- MLflow keeps every value logged at a step and has no call to delete metric values, so a rewind is a new run: the
  run's params, tags, ``config.json`` and the history of the steps before S are copied into it, the old run is
  tagged ``agent_rl.replaced_by`` and deleted (MLflow's soft delete: ``mlflow runs restore`` brings it back with
  every value it held), and ``DIR/trackers.json`` names the new run. A run without values from step S on is kept.

Only the process that runs the training loop opens trackers (the Ray driver; learner and rollout actors never do).
A tracker that fails to start, or to log, warns once on stderr and is dropped: a dashboard never stops a run.
"""

from __future__ import annotations

import contextlib
import json
import netrc
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")
"""``trainer.loggers`` values; ``jsonl`` is always on (listed or not)."""

WANDB_MODES = ("", "online", "offline", "disabled")

STATE_FILE = "trackers.json"
"""``DIR/trackers.json``: the W&B run id and the MLflow run id of the run (a resume continues them)."""

MLFLOW_PARAM_CHARS = 6000
"""MLflow's longest param value (longer config values are cut, ending in ``...``)."""


@dataclass
class TrackingConfig:
    """Where and as what the run is tracked (``trainer.tracking.*``; read only with ``wandb`` / ``mlflow`` in
    ``trainer.loggers``)."""

    project: str = "agent_rl"
    """W&B project and MLflow experiment name."""
    run_name: str = ""
    """The run's name in both ("" = the run directory's name)."""
    tags: list[str] = field(default_factory=list)
    """Tags of the run (W&B tags; MLflow tags with an empty value); the env, algo and model names are added."""
    wandb_mode: str = ""
    """online | offline | disabled; "" = ``$WANDB_MODE``, else online with W&B credentials, else offline."""
    mlflow_uri: str = ""
    """MLflow tracking URI ("" = ``$MLFLOW_TRACKING_URI``, else the file store ``DIR/mlruns``)."""

    def __post_init__(self) -> None:
        if self.wandb_mode not in WANDB_MODES:
            raise ValueError(f"trainer.tracking.wandb_mode={self.wandb_mode!r} is not valid; valid values: "
                             "online, offline, disabled, '' (see docs/training.md, Trackers)")


class Tracker(Protocol):
    """One tracker; every call may raise (:class:`Trackers` turns that into one warning). A tracker of the run
    (W&B, MLflow) also has ``run_id`` (kept in ``DIR/trackers.json``)."""

    name: str

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        """One metrics row (finite values only) of ``kind`` at ``step``."""

    def rewind(self, step: int) -> None:
        """The run goes on at ``step`` (a resume): drop the values of steps >= ``step``."""

    def checkpoint(self, step: int, path: Path) -> None:
        """Checkpoint ``path`` of ``step`` was written."""

    def files(self, paths: list[Path]) -> None:
        """Files of the run to keep with it (config.yaml, curves.png, summary.md)."""

    def close(self) -> None:
        """Finish the run (its data flushed)."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def wandb_mode(setting: str) -> str:
    """The W&B mode of the run (module docstring): the setting, ``$WANDB_MODE``, else online with credentials."""
    if setting:
        return setting
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


class WandbTracker:
    """A W&B run in ``DIR/wandb`` (module docstring)."""

    name = "wandb"

    def __init__(self, out: Path, config: dict[str, Any], tracking: TrackingConfig, run_name: str, tags: list[str],
                 run_id: str | None) -> None:
        import wandb  # deferred: the optional tracker client

        self.mode = wandb_mode(tracking.wandb_mode)
        self.out = out
        self._init_kw = dict(project=tracking.project, name=run_name, config=config, tags=tags, dir=str(out),
                             mode=self.mode, settings=wandb.Settings(silent=True, console="off"))
        self._run: Any = None
        if run_id is None:
            self._run = self._init(id=None)
            run_id = self._run.id
        self.run_id = run_id  # a resumed run starts at its rewind point or first call (``run``)

    def _init(self, **kw: Any) -> Any:
        import wandb

        try:
            return wandb.init(**self._init_kw, **kw)
        except Exception:  # noqa: BLE001 (retried once; a second failure is the tracker's warning)
            # wandb keeps one service process per Python process; when it has gone (killed, or shut down by a
            # forked child's exit) every later init fails (MailboxClosedError, ConnectionResetError): drop it and
            # start a fresh one, once (teardown forgets the dead one first, then may fail telling it to stop)
            with contextlib.suppress(Exception):
                wandb.teardown()
            return wandb.init(**self._init_kw, **kw)

    @property
    def run(self) -> Any:
        """The W&B run; a resumed run not rewound continues where it was (``resume="allow"``)."""
        if self._run is None:
            self._run = self._init(id=self.run_id, resume="allow")
        return self._run

    def rewind(self, step: int) -> None:
        """Resume the run rewound to ``step - 1`` (W&B's ``resume_from``; module docstring); a server that refuses
        the rewind gets a warning and the plain resume. A run started fresh in this process has nothing to drop."""
        if self._run is not None:
            return
        try:
            self._run = self._init(resume_from=f"{self.run_id}?_step={max(step - 1, 0)}")
        except Exception as exc:  # noqa: BLE001 (a server without the rewind preview)
            _warn(self.name, f"could not rewind run {self.run_id} to step {step - 1}; resumed without a rewind, "
                  f"so W&B ignores the values of steps {step} and on until it passes its last step", exc)
            self._run = self._init(id=self.run_id, resume="allow")

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        self.run.log(metrics, step=step)

    def checkpoint(self, step: int, path: Path) -> None:
        self.run.summary[f"checkpoint/step_{step}"] = str(path)

    def files(self, paths: list[Path]) -> None:
        for path in paths:  # copied into the run's files (a symlink would make wandb warn for each)
            shutil.copyfile(path, Path(self.run.dir) / path.name)
            self.run.save(str(Path(self.run.dir) / path.name), base_path=self.run.dir, policy="now")

    def close(self) -> None:
        """Finish the run and stop this process's W&B service (the next run of the process starts its own, so
        none inherits a service that died in between)."""
        import wandb

        if self._run is not None:
            self._run.finish()
        wandb.teardown()


def path_safe_names(keys: list[str], logged: set[str], dirs: set[str], names: dict[str, str]) -> dict[str, str]:
    """MLflow names for metric ``keys``, such that no name is a ``/``-path prefix of another: MLflow's file store
    writes metric ``a/b`` as the file ``metrics/a/b``, so ``eval/p/success`` and ``eval/p/success/Algebra`` (a
    panel's success and its per-type breakdown) cannot both be files there. A new key keeps its name unless it
    collides with a name already logged; then its last ``/`` becomes ``.`` until it does not
    (``eval/p/success/Algebra`` -> ``eval/p/success.Algebra``). Keys are named in (depth, name) order, so a parent
    keeps its name over the children first seen with it; a resumed run passes its logged names first, and a key
    renamed before gets the same name again (a name equal to a logged one is that metric's, not a collision).
    ``names`` (key -> name), ``logged`` (names) and ``dirs`` (their ``/`` prefixes) are the run's state, updated in
    place; returns ``names`` restricted to ``keys``."""
    for key in sorted((k for k in keys if k not in names), key=lambda k: (k.count("/"), k)):
        name = key
        while "/" in name and (name in dirs or any(name[:i] in logged for i, c in enumerate(name) if c == "/")):
            head, _, tail = name.rpartition("/")
            name = f"{head}.{tail}"
        names[key] = name
        logged.add(name)
        dirs.update(name[:i] for i, c in enumerate(name) if c == "/")
    return {k: names[k] for k in keys}


class MLflowTracker:
    """An MLflow run (module docstring), through ``MlflowClient`` (no global active run). Metric names are the
    project's, except where one would be a ``/``-path prefix of another (:func:`path_safe_names`: MLflow's file store
    cannot hold both ``eval/p/success`` and ``eval/p/success/Algebra``; the breakdown is logged as
    ``eval/p/success.Algebra``)."""

    name = "mlflow"

    def __init__(self, out: Path, config: dict[str, Any], tracking: TrackingConfig, run_name: str, tags: list[str],
                 run_id: str | None) -> None:
        uri = tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or (out / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):  # MLflow 3: the file store works behind this opt-in (maintenance mode)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param, RunTag  # deferred: the optional tracker client
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        self._config = config
        if run_id is None:
            experiment = self.client.get_experiment_by_name(tracking.project)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(tracking.project)
            run = self.client.create_run(experiment_id, run_name=run_name, tags={t: "" for t in tags})
            run_id = run.info.run_id
            params = [Param(k, self._param(v)) for k, v in flatten(config).items()]
            for i in range(0, len(params), 100):  # log_batch takes at most 100 params per call
                self.client.log_batch(run_id, params=params[i:i + 100])
            self.client.log_dict(run_id, config, "config.json")
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self._tag = RunTag
        self._param_type = Param
        self._names: dict[str, str] = {}  # metric key -> its MLflow name (path_safe_names)
        self._logged: set[str] = set()
        self._dirs: set[str] = set()
        if run_id is not None:  # a resumed run's names stand: new keys must not collide with them
            existing = list(self.client.get_run(run_id).data.metrics)
            path_safe_names(existing, self._logged, self._dirs, self._names)

    @staticmethod
    def _param(value: Any) -> str:
        text = json.dumps(value) if not isinstance(value, str) else value
        return text if len(text) <= MLFLOW_PARAM_CHARS else text[:MLFLOW_PARAM_CHARS - 3] + "..."

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        from mlflow.entities import Metric  # deferred: the optional tracker client

        now = int(time.time() * 1000)
        names = path_safe_names(list(metrics), self._logged, self._dirs, self._names)
        batch = [Metric(names[k], v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # log_batch takes at most 1000 metrics per call
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def rewind(self, step: int) -> None:
        """Replace the run by a copy of its steps before ``step`` when it holds values of steps >= ``step``
        (module docstring): params, tags (checkpoints of later steps left out), ``config.json`` and each metric's
        history before ``step``; the old run is tagged ``agent_rl.replaced_by`` and soft-deleted."""
        from mlflow.entities import Metric

        old = self.client.get_run(self.run_id)
        histories = {key: self.client.get_metric_history(self.run_id, key) for key in old.data.metrics}
        if not any(m.step >= step for history in histories.values() for m in history):
            return
        tags = {k: v for k, v in old.data.tags.items() if not k.startswith("mlflow.")
                and not (k.startswith("checkpoint/step_") and k[len("checkpoint/step_"):].isdigit()
                         and int(k[len("checkpoint/step_"):]) >= step)}
        new = self.client.create_run(old.info.experiment_id, run_name=old.info.run_name,
                                     tags={**tags, "agent_rl.rewound_from": f"{self.run_id} at step {step}"})
        new_id = new.info.run_id
        params = [self._param_type(k, v) for k, v in old.data.params.items()]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(new_id, params=params[i:i + 100])
        self.client.log_dict(new_id, self._config, "config.json")
        kept = [Metric(m.key, m.value, m.timestamp, m.step) for history in histories.values() for m in history
                if m.step < step]
        for i in range(0, len(kept), 1000):  # log_batch takes at most 1000 metrics per call
            self.client.log_batch(new_id, metrics=kept[i:i + 1000])
        self.client.set_tag(self.run_id, "agent_rl.replaced_by", f"{new_id} (resumed at step {step})")
        self.client.set_terminated(self.run_id, status="KILLED")
        self.client.delete_run(self.run_id)
        self.run_id = new_id

    def checkpoint(self, step: int, path: Path) -> None:
        self.client.set_tag(self.run_id, f"checkpoint/step_{step}", str(path))

    def files(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TensorBoardTracker:
    """TensorBoard event files of one phase in ``folder`` (module docstring): each row's values as scalars at its
    step, flushed after every row. Build it with :meth:`for_phase`."""

    name = "tensorboard"

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # deferred: the optional tensorboard package

        self._writer = SummaryWriter(str(folder))

    @classmethod
    def for_phase(cls, out: Path, phase: str | None) -> "TensorBoardTracker | None":
        """The tracker of run directory ``out``'s phase ``phase`` (``DIR/tb``; ``warm_start``: ``DIR/tb/warm_start``,
        its steps restart at 1); None when the tensorboard package is missing (the JSONL file still has every row)."""
        try:
            return cls(out / "tb" / ("warm_start" if phase == "warm_start" else ""))
        except ImportError:
            return None

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def rewind(self, step: int) -> None:
        """Nothing is dropped: the resumed process writes a new event file (module docstring)."""

    def checkpoint(self, step: int, path: Path) -> None:
        """Checkpoints are not shown in TensorBoard."""

    def files(self, paths: list[Path]) -> None:
        """The run's files stay in its directory, beside ``DIR/tb``."""

    def close(self) -> None:
        self._writer.close()


TRACKER_TYPES: dict[str, type] = {"wandb": WandbTracker, "mlflow": MLflowTracker}
"""The trackers of a run, started by :meth:`Trackers.open` (TensorBoard is a phase's: :class:`TensorBoardTracker`)."""


class Trackers:
    """Where metrics rows go besides ``metrics.jsonl``: the run's trackers (``trainer.loggers`` minus jsonl and
    tensorboard, started by :meth:`open`, in ``trackers``) and the trackers of the current phase's files
    (TensorBoard, :meth:`attach`); every call goes to each, and a tracker that raises warns once and is dropped (the
    run goes on)."""

    def __init__(self, trackers: list[Any] | None = None, state_path: Path | None = None,
                 state: dict[str, str] | None = None) -> None:
        self.trackers = list(trackers or [])
        self.attached: list[Any] = []
        self.state_path = state_path
        self.state = dict(state or {})

    @classmethod
    def open(cls, loggers: list[str], out: Path, config: dict[str, Any], tracking: TrackingConfig, *,
             resume: bool, tags: list[str] = ()) -> "Trackers":
        """Start each tracker of ``loggers`` for run directory ``out`` (``resume``: continue the runs named in
        ``DIR/trackers.json``); one that fails to start warns and is left out."""
        state_path = out / STATE_FILE
        try:
            state = json.loads(state_path.read_text()) if resume and state_path.is_file() else {}
        except (OSError, ValueError):
            state = {}
        run_name = tracking.run_name or out.name
        all_tags = list(dict.fromkeys([*tracking.tags, *tags]))
        started = []
        for name in loggers:
            if name not in TRACKER_TYPES:
                continue
            try:
                started.append(TRACKER_TYPES[name](out, config, tracking, run_name, all_tags, state.get(name)))
            except Exception as exc:  # noqa: BLE001 (any client error: a dashboard never stops a run)
                _warn(name, "could not start", exc)
        if started:
            for t in started:
                where = f"mode {t.mode}, {out / 'wandb'}" if t.name == "wandb" else t.uri
                print(f"trackers: {t.name} run {t.run_id} ({where})", file=sys.stderr)
        trackers = cls(started, state_path=state_path, state=state)
        trackers._save_state()
        return trackers

    def _save_state(self) -> None:
        """``DIR/trackers.json``: each tracker's run id (a resume continues them)."""
        if self.state_path is None or not self.trackers:
            return
        self.state.update({t.name: t.run_id for t in self.trackers})
        self.state_path.write_text(json.dumps(self.state, indent=1) + "\n", encoding="utf-8")

    def rewind(self, step: int) -> None:
        """A resumed run goes on at ``step``: every tracker drops its values of steps >= ``step``, as
        ``metrics.jsonl`` does (module docstring); a tracker that now runs under another id is saved as such."""
        ids = [t.run_id for t in self.trackers]
        self._each("rewind", step)
        if [t.run_id for t in self.trackers] != ids:
            for tracker in self.trackers:
                print(f"trackers: {tracker.name} run {tracker.run_id} (rewound to step {step - 1})",
                      file=sys.stderr)
            self._save_state()

    def attach(self, tracker: Tracker) -> None:
        """Add a tracker of the current phase's files (TensorBoard) after the run's trackers, until :meth:`detach`."""
        self.attached.append(tracker)

    def detach(self, tracker: Tracker) -> None:
        """Close an attached tracker (the phase ended) and stop sending it rows; one dropped before is left alone."""
        if tracker in self.attached:
            self._call(self.attached, tracker, "close")
            if tracker in self.attached:
                self.attached.remove(tracker)

    def _each(self, call: str, *args: Any) -> None:
        for group in (self.trackers, self.attached):
            for tracker in list(group):
                self._call(group, tracker, call, *args)

    @staticmethod
    def _call(group: list[Any], tracker: Any, call: str, *args: Any) -> None:
        """``tracker.<call>(*args)``; a tracker that raises warns and leaves ``group``."""
        try:
            getattr(tracker, call)(*args)
        except Exception as exc:  # noqa: BLE001 (as in open)
            _warn(tracker.name, f"failed in {call}; it is off for the rest of the run", exc)
            group.remove(tracker)

    def log(self, step: int, row: dict[str, Any]) -> None:
        """One ``metrics.jsonl`` row: its numeric values at ``step`` (``step``, ``kind``, ``phase`` and nulls left
        out; the row kind is passed along)."""
        metrics = {k: float(v) for k, v in row.items() if k not in ("step", "kind", "phase")
                   and isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._each("log", step, metrics, str(row.get("kind", "train")))

    def checkpoint(self, step: int, path: Path) -> None:
        self._each("checkpoint", step, path)

    def finish(self, paths: list[Path]) -> None:
        """Keep the run's files that exist (``config.yaml``, ``curves.png``, ``summary.md``) and close every run."""
        self._each("files", [p for p in paths if p.is_file()])
        self.close()

    def close(self) -> None:
        self._each("close")
        self.trackers = []
        self.attached = []


def _warn(name: str, what: str, exc: BaseException) -> None:
    print(f"warning: tracker {name} {what}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]} "
          "(the run goes on; metrics.jsonl has every row)", file=sys.stderr)
