"""The small fixed panel evaluated during training (``trainer.eval_every``, ``trainer.eval_panel``,
``trainer.eval_tasks``): before step 1 (logged as step 0), every ``eval_every`` steps and after the last step, with
the policy being trained, greedy by default (``eval.temperature``), on the run's env pool and engine."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from agent_rl.config.schema import ConfigError
from agent_rl.eval.runner import build_panels, env_family, evaluate, scalar_metrics
from agent_rl.task_files import TaskFileError
from envs.data import cache_dir


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
        if cfg.eval.tasks:  # a task file as the panel: held out unless it is the training file
            if cfg.eval.tasks == cfg.env.tasks and cfg.eval.task_split == cfg.env.task_split:
                raise ConfigError(f"eval.tasks={cfg.eval.tasks!r} is the training file env.tasks (same split); "
                                  "choose held-out tasks (another file or eval.task_split)")
            try:
                self.panels = build_panels(self.cfg, num_tasks=cfg.trainer.eval_tasks)
            except (TaskFileError, FileNotFoundError) as exc:
                raise ConfigError(f"eval.tasks={cfg.eval.tasks!r}: {exc}") from None
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

    async def results(self, step: int, pool: Any, engine: Any, *, progress: Any = None,
                      cache: bool = False) -> list[dict[str, Any]]:
        """Evaluate the panel with ``engine`` on the env ``pool``; writes ``<folder>/step_<step>/<panel>.json|.png``;
        returns one result dict per panel (the JSON content). ``progress``: the display to report turns and episodes
        to (default this evaluator's). The Ray backend runs this on rollout worker 0.

        ``cache``: the policy is the unmodified ``model.*`` (no ``model.path``, no update yet: the warm start's
        step-0 panel), whose greedy games are a function of :meth:`panel_key`: read them from
        ``$AGENT_RL_CACHE/panels/<key hash>.json`` when played before, else play and store them there (as
        ``benchmarks/bench_learning.py --eval-cache`` does); delete the folder to play them again."""
        path = None
        if cache:
            key = self.panel_key()
            path = cache_dir() / "panels" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
            if path.is_file():
                stored = json.loads(path.read_text())
                if stored.get("key") == key:
                    folder = self.folder / f"step_{step}"
                    folder.mkdir(parents=True, exist_ok=True)
                    for result in stored["results"]:
                        (folder / f"{result['panel']}.json").write_text(json.dumps(result, indent=1))
                    self.progress.note(f"panel at step {step} from the cache {path} (played before in "
                                       f"{sum(r['wall_s'] for r in stored['results']):.0f} s; delete it to replay)")
                    return stored["results"]
        results = await evaluate(self.cfg, pool, engine, panels=self.panels, folder=self.folder / f"step_{step}",
                                 progress=self.progress if progress is None else progress)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": self.panel_key(), "results": results}))
            tmp.replace(path)
        return results

    def panel_key(self) -> str:
        """The identity of a greedy panel of the unmodified ``model.*``: the model (name, dtype, LoRA rank), the
        torch and transformers versions, the engine's sampling settings, ``eval.*``, the rollout format, the prompt
        and every panel task (env id, options, kwargs)."""
        import transformers

        c = self.cfg
        return json.dumps({
            "model": [c.model.name, c.model.dtype, c.model.lora.rank, torch.__version__, transformers.__version__],
            "engine": [c.engine.name, c.engine.max_new_tokens, c.engine.top_p, c.engine.top_k, c.engine.seed],
            "eval": dataclasses.asdict(c.eval), "prompt": c.env.prompt,
            "rollout": [c.rollout.mode, c.rollout.history_length, c.rollout.max_prompt_tokens, c.env.action_format],
            "tasks": [[p.name, [[t.env_id, t.options, t.env_kwargs, t.seed] for t in p.tasks]] for p in self.panels],
        }, sort_keys=True, default=str)

    def metrics(self, step: int, results: list[dict[str, Any]]) -> dict[str, float]:
        """The ``eval/<panel>/...`` scalars of :meth:`results`' output, with one console line per panel."""
        metrics: dict[str, float] = {}
        for result in results:
            metrics.update(scalar_metrics(result))
            self.progress.note(f"eval {result['panel']} at step {step}: success {100 * result['success']:.1f}% "
                               f"({result['num_tasks']} tasks, {result['wall_s']:.0f} s)")
        return metrics
