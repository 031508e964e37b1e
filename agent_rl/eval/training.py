"""The small fixed panel evaluated during training (``trainer.eval_every``, ``trainer.eval_panel``,
``trainer.eval_tasks``): before step 1 (logged as step 0), every ``eval_every`` steps and after the last step, with
the policy being trained, greedy by default (``eval.temperature``), on the run's env pool and engine."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from agent_rl.config import ConfigError
from agent_rl.eval.runner import build_panels, env_family, evaluate, scalar_metrics


class TrainingEval:
    """``enabled`` is False when ``trainer.eval_every`` is 0 or the env has no panel (a note says so).

    Raises:
        ConfigError: the panel's split or dataset is the one the run trains on (eval tasks must be held out).
    """

    def __init__(self, cfg: Any, out: Path, progress: Any, *, folder: Path | None = None) -> None:
        self.every = int(cfg.trainer.eval_every)
        self.out, self.progress = out, progress
        # DIR/eval/step_N (a warm start's: DIR/eval/warm_start/step_N)
        self.folder = folder if folder is not None else out / "eval" if out is not None else None
        self.panels: list[Any] = []
        self.cfg = copy.deepcopy(cfg)
        self.cfg.eval.policy = "model"
        if self.every <= 0:
            return
        try:
            family = env_family(cfg)
        except ValueError as exc:
            progress.note(f"trainer.eval_every={self.every}: skipped ({exc})")
            self.every = 0
            return
        self.panels = build_panels(self.cfg, split=cfg.trainer.eval_panel, num_tasks=cfg.trainer.eval_tasks)
        trained = family.canonical(cfg.env.sampler.options.get(family.split_key))
        for panel in self.panels:
            held = family.canonical(panel.tasks[0].options.get(family.split_key) if panel.tasks else None)
            if trained is not None and held == trained:
                raise ConfigError(f"trainer.eval_panel={panel.split!r} is the training split/dataset {trained!r}; "
                                 "choose held-out tasks (ALFWorld valid_seen/valid_unseen, WebShop test, another "
                                 "math/code dataset)")

    @property
    def enabled(self) -> bool:
        return self.every > 0 and bool(self.panels)

    def due(self, step: int, total: int) -> bool:
        """Step 0 (before training), every ``eval_every`` steps, and the last step."""
        return self.enabled and (step == 0 or step % self.every == 0 or step == total)

    async def run(self, step: int, pool: Any, engine: Any) -> dict[str, float]:
        """Evaluate the panel now (:meth:`results`) and return its ``eval/<panel>/...`` scalars (:meth:`metrics`)."""
        return self.metrics(step, await self.results(step, pool, engine))

    async def results(self, step: int, pool: Any, engine: Any, *, progress: Any = None) -> list[dict[str, Any]]:
        """Evaluate the panel with ``engine`` on the env ``pool``; writes ``<folder>/step_<step>/<panel>.json|.png``;
        returns one result dict per panel (the JSON content). ``progress``: the display to report turns and episodes
        to (default this evaluator's). The Ray backend runs this on rollout worker 0."""
        return await evaluate(self.cfg, pool, engine, panels=self.panels, folder=self.folder / f"step_{step}",
                              progress=self.progress if progress is None else progress)

    def metrics(self, step: int, results: list[dict[str, Any]]) -> dict[str, float]:
        """The ``eval/<panel>/...`` scalars of :meth:`results`' output, with one console line per panel."""
        metrics: dict[str, float] = {}
        for result in results:
            metrics.update(scalar_metrics(result))
            self.progress.note(f"eval {result['panel']} at step {step}: success {100 * result['success']:.1f}% "
                               f"({result['num_tasks']} tasks, {result['wall_s']:.0f} s)")
        return metrics
