"""Training-task samplers: a resumable stream of :class:`~agent_rl.types.Task` (one per group).

:class:`TaskSampler` draws uniformly (epochs of seeded permutations, or a fresh seed per task); :class:`PassRateSampler`
is the pass-rate curriculum beside it (``trainer.curriculum=pass_rate``). :func:`make_task_sampler` builds
the run's from the config (``env.sampler``, or the rows of ``env.tasks`` read by :func:`agent_rl.task_files.load_tasks`).
The loop tells a sampler every finished group (:meth:`TaskSampler.observe`, DAPO-filtered groups included) before it
draws the next step's tasks, and saves :meth:`TaskSampler.state_dict` in each checkpoint.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from agent_rl.rollout.config import POOLS, PassRateConfig, TaskSamplerConfig
from agent_rl.task_files import load_tasks
from agent_rl.types import Task

GroupOutcome = tuple[Task, Sequence[bool]]
"""A finished group: its task and whether each episode was won (``Episode.won``)."""


class TaskSampler:
    """Draws tasks for groups; its whole state is ``position`` (saved in checkpoints as the data position).

    ``index`` kind: epoch e visits ``permutation_e(range(num_tasks))`` (``default_rng([seed, e])``); ``seed`` kind:
    task p gets the seed ``default_rng([seed, p]).integers(2**31)``. Both are pure functions of (seed, position),
    so a resumed run draws exactly the tasks the uninterrupted run would have drawn. With ``rows`` (a task file's
    mapped rows) the sampler is of ``index`` kind over them and row i is task i's reset options (its content);
    ``env.sampler.options`` are not added (they select the env's own datasets).
    """

    def __init__(self, env_id: str, cfg: TaskSamplerConfig, *, env_kwargs: dict[str, Any] | None = None,
                 seed: int = 0, rows: Sequence[dict[str, Any]] | None = None) -> None:
        self.env_id, self.cfg, self.env_kwargs, self.seed = env_id, cfg, dict(env_kwargs or {}), int(seed)
        self.rows = list(rows) if rows is not None else None
        if self.rows is not None and not self.rows:
            raise ValueError("a task file sampler needs at least one row")
        self.position = 0
        self._perm: tuple[int, np.ndarray] | None = None

    @property
    def num_tasks(self) -> int | None:
        """Size of the task list (rows, or ``env.sampler.num_tasks`` of the index kind); None for the seed kind."""
        if self.rows is not None:
            return len(self.rows)
        return self.cfg.num_tasks if self.cfg.kind == "index" else None

    def make_task(self, p: int, index: int | None) -> Task:
        """Task ``p`` of the stream (its ``group_id``): list entry ``index``, or a fresh seed when None."""
        if index is None:
            seed = int(np.random.default_rng([self.seed, p]).integers(2**31))
            return Task(env_id=self.env_id, options=dict(self.cfg.options), group_id=p, seed=seed,
                        env_kwargs=dict(self.env_kwargs))
        if self.rows is not None:
            options = dict(self.rows[index])
        else:
            options = {**self.cfg.options, self.cfg.index_key: int(index)}
        return Task(env_id=self.env_id, options=options, group_id=p, env_kwargs=dict(self.env_kwargs),
                    index=int(index))

    def _index(self, p: int) -> int | None:
        n = self.num_tasks
        if n is None:
            return None
        epoch, offset = divmod(p, n)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(n))
        return int(self._perm[1][offset])

    def sample(self, n: int) -> list[Task]:
        """The next ``n`` tasks (distinct ``group_id``s)."""
        tasks = [self.make_task(self.position + i, self._index(self.position + i)) for i in range(n)]
        self.position += n
        return tasks

    def observe(self, step: int, outcomes: Sequence[GroupOutcome]) -> None:
        """Step ``step``'s finished groups (uniform sampling keeps nothing of them)."""

    def step_metrics(self) -> dict[str, float]:
        """Metrics of the last observed step ({} for uniform sampling)."""
        return {}

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """The checkpoint's ``sampler`` entry; ``position``: the data position to save (default: the current one;
        the loop passes it less the tasks drawn but not trained, which a resume draws again)."""
        return {"position": int(self.position if position is None else position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class PassRateSampler(TaskSampler):
    """The pass-rate curriculum over an indexed task list (see :class:`agent_rl.rollout.config.PassRateConfig` for
    the pools, the running rate, the weights and the cooldown).

    Draw p is a pure function of (seed, p, the per-task state): ``rng = default_rng([seed, p, 1])`` picks the pool,
    then the task; within one :meth:`sample` call a task is not drawn twice while its pool holds another. The state
    (each played task's rate and last step, the last observed step) is observed only between draws (the loop
    observes a step's groups before it draws the next step's tasks), so a resumed run draws the same tasks.

    Metrics (:meth:`step_metrics`, every step): ``curriculum/pool_frac/<pool>`` the fraction of all tasks in each
    pool after the step; ``curriculum/learnable_frac`` the fraction of the step's finished groups (DAPO-filtered
    ones included) with some but not all episodes won (the groups that teach); ``curriculum/drawn_frac/<pool>``
    the fraction of the step's draws taken from each pool.
    """

    def __init__(self, env_id: str, cfg: TaskSamplerConfig, curriculum: PassRateConfig, *,
                 env_kwargs: dict[str, Any] | None = None, seed: int = 0,
                 rows: Sequence[dict[str, Any]] | None = None) -> None:
        super().__init__(env_id, cfg, env_kwargs=env_kwargs, seed=seed, rows=rows)
        if self.num_tasks is None:
            raise ValueError("trainer.curriculum=pass_rate needs a task list: env.tasks=PATH or env.sampler.kind=index "
                             "(a seed-kind sampler draws a new task every time; none is seen twice)")
        self.curriculum = curriculum
        self.rates = np.full(self.num_tasks, np.nan)  # NaN: unseen
        self.last_step = np.full(self.num_tasks, -1, dtype=np.int64)
        self.step = 0  # the last observed step
        self._drawn = dict.fromkeys(POOLS, 0)
        self._metrics: dict[str, float] = {}

    def pools(self) -> np.ndarray:
        """Pool of every task now, as indices into :data:`POOLS` (num_tasks,)."""
        c = self.curriculum
        rate = np.nan_to_num(self.rates, nan=0.5)
        pool = np.where(rate >= c.easy_rate, 0, np.where(rate <= c.hard_rate, 2, 1))
        readmitted = (pool != 1) & (self.step - self.last_step >= c.cooldown_steps)
        return np.where(np.isnan(self.rates) | readmitted, 3, pool)

    def sample(self, n: int) -> list[Task]:
        pools = self.pools()
        members = [np.flatnonzero(pools == k) for k in range(len(POOLS))]
        weights = np.array([float(self.curriculum.weights.get(name, 0.0)) for name in POOLS])
        picked: set[int] = set()
        tasks = []
        for i in range(n):
            p = self.position + i
            rng = np.random.default_rng([self.seed, p, 1])
            fresh = [m[~np.isin(m, list(picked))] if picked else m for m in members]
            # tasks not drawn yet in this call from the weighted pools, else drawn ones again; when only pools of
            # weight 0 hold tasks, those evenly (a pool of weight 0 is never drawn while a weighted one has tasks)
            for choices, even in ((fresh, False), (members, False), (fresh, True), (members, True)):
                w = np.array([(1.0 if even else weights[k]) if len(m) else 0.0 for k, m in enumerate(choices)])
                if w.sum() > 0:
                    break
            k = int(rng.choice(len(POOLS), p=w / w.sum()))
            index = int(choices[k][rng.integers(len(choices[k]))])
            picked.add(index)
            self._drawn[POOLS[k]] += 1
            tasks.append(self.make_task(p, index))
        self.position += n
        return tasks

    def observe(self, step: int, outcomes: Sequence[GroupOutcome]) -> None:
        c = self.curriculum
        readmitted = self.pools() == 3
        mixed = 0
        for task, won in outcomes:
            if task.index is None or not won:
                continue
            rate = sum(map(bool, won)) / len(won)
            mixed += 0 < rate < 1
            old = self.rates[task.index]
            fresh = math.isnan(old) or bool(readmitted[task.index])
            self.rates[task.index] = rate if fresh else (1 - c.ema) * old + c.ema * rate
            self.last_step[task.index] = step
        self.step = int(step)
        counts = np.bincount(self.pools(), minlength=len(POOLS))
        drawn = sum(self._drawn.values())
        self._metrics = {
            **{f"curriculum/pool_frac/{name}": float(counts[k]) / len(self.rates) for k, name in enumerate(POOLS)},
            "curriculum/learnable_frac": mixed / len(outcomes) if outcomes else 0.0,
            **{f"curriculum/drawn_frac/{name}": self._drawn[name] / drawn if drawn else 0.0 for name in POOLS},
        }
        self._drawn = dict.fromkeys(POOLS, 0)

    def step_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        played = np.flatnonzero(~np.isnan(self.rates))
        return {**super().state_dict(position), "curriculum": {
            "step": self.step, "num_tasks": len(self.rates),
            "rates": {str(int(i)): float(self.rates[i]) for i in played},
            "last_step": {str(int(i)): int(self.last_step[i]) for i in played}}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        saved = state.get("curriculum")
        if saved is None:  # a checkpoint of a run without the curriculum: every task unseen
            return
        if int(saved["num_tasks"]) != len(self.rates):
            raise ValueError(f"the checkpoint's curriculum covers {saved['num_tasks']} tasks, this run's task list "
                             f"{len(self.rates)}")
        self.step = int(saved["step"])
        self.rates[:] = np.nan
        self.last_step[:] = -1
        for i, rate in saved["rates"].items():
            self.rates[int(i)] = float(rate)
        for i, last in saved["last_step"].items():
            self.last_step[int(i)] = int(last)


def make_task_sampler(cfg: Any, *, announce: Any = None, curriculum: bool = True) -> TaskSampler:
    """The run's sampler: rows of ``env.tasks`` (mapped by ``env.task_fields``, ``env.task_split``,
    ``env.task_filter``) or ``env.sampler``; :class:`PassRateSampler` for ``trainer.curriculum=pass_rate`` unless
    ``curriculum`` is False (behaviour cloning: the expert's episodes are drawn once, uniformly, before any pass rate
    exists). ``announce(text)`` receives the task file's description (row count, columns, first row).

    Raises:
        agent_rl.task_files.TaskFileError, FileNotFoundError: the task file (file, row and field named).
        ValueError: the curriculum without a task list.
    """
    rows = None
    if cfg.env.tasks:
        rows = load_tasks(cfg.env.tasks, cfg.env.task_fields or None, split=cfg.env.task_split or None,
                          filter=cfg.env.task_filter or None)
        if announce is not None:
            announce(rows.describe())
    kwargs = dict(env_kwargs=cfg.env_kwargs, seed=cfg.trainer.seed, rows=rows)
    if curriculum and cfg.trainer.curriculum == "pass_rate":
        return PassRateSampler(cfg.env.id, cfg.env.sampler, cfg.trainer.pass_rate, **kwargs)
    return TaskSampler(cfg.env.id, cfg.env.sampler, **kwargs)
