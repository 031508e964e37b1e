"""Training-task sampler: a resumable stream of :class:`~agent_rl.types.Task` (one per group)."""

from __future__ import annotations

from typing import Any

import numpy as np

from agent_rl.rollout.config import TaskSamplerConfig
from agent_rl.types import Task


class TaskSampler:
    """Draws tasks for groups; its whole state is ``position`` (saved in checkpoints as the data position).

    ``index`` kind: epoch e visits ``permutation_e(range(num_tasks))`` (``default_rng([seed, e])``); ``seed`` kind:
    task p gets the seed ``default_rng([seed, p]).integers(2**31)``. Both are pure functions of (seed, position),
    so a resumed run draws exactly the tasks the uninterrupted run would have drawn.
    """

    def __init__(self, env_id: str, cfg: TaskSamplerConfig, *, env_kwargs: dict[str, Any] | None = None,
                 seed: int = 0) -> None:
        self.env_id, self.cfg, self.env_kwargs, self.seed = env_id, cfg, dict(env_kwargs or {}), int(seed)
        self.position = 0
        self._perm: tuple[int, np.ndarray] | None = None

    def _task(self, p: int) -> Task:
        options = dict(self.cfg.options)
        seed: int | None = None
        if self.cfg.kind == "index":
            epoch, offset = divmod(p, self.cfg.num_tasks)
            if self._perm is None or self._perm[0] != epoch:
                self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.cfg.num_tasks))
            options[self.cfg.index_key] = int(self._perm[1][offset])
        else:
            seed = int(np.random.default_rng([self.seed, p]).integers(2**31))
        return Task(env_id=self.env_id, options=options, group_id=p, seed=seed, env_kwargs=dict(self.env_kwargs))

    def sample(self, n: int) -> list[Task]:
        """The next ``n`` tasks (distinct ``group_id``s)."""
        tasks = [self._task(self.position + i) for i in range(n)]
        self.position += n
        return tasks

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])
