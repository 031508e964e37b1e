"""The behaviour-cloning warm start of an RL run (``trainer.warm_start=bc``, issue 35; docs/training.md "Warm start").

A warm-started run is two phases in one run directory, each one call of the one training loop
(:func:`agent_rl.loop.run`):

1. **warm start** (:func:`run_warm_start`): :class:`agent_rl.sft.BehaviourCloningBackend` plays the env's expert
   on ``sft.num_episodes`` train-split tasks (the run's ``env.sampler``), clones it for ``sft.epochs`` over its rows
   (the RL rows: ``rollout.mode``; ``sft.lr``, no lr warm-up, AdamW). Rows of kind ``sft``, its own step counter
   1..K; checkpoints ``DIR/checkpoints/warm_start/step_k`` (``trainer.save_every`` and the last), the collected rows
   ``DIR/checkpoints/warm_start/rows.pt``; its panels (``trainer.eval_every`` > 0) at step 0 (the model before
   cloning) and step K (after), eval rows with ``"phase": "warm_start"``, files under ``DIR/eval/warm_start/``.
   When it ends, ``DIR/checkpoints/warm_start/done.json`` names the cloned checkpoint.
2. **RL**: the run's config with ``model.path`` = that checkpoint (the KL reference too, as for any
   ``model.path``); rows of kind ``train``, steps 1..N, checkpoints ``DIR/checkpoints/step_N``; no step-0 panel
   (the warm start's last panel played the same weights), eval rows ``"phase": "rl"``.

Resume (``trainer.resume=auto``): without ``done.json`` the warm start continues from its latest checkpoint (or
starts again, reusing ``rows.pt``), then RL starts; with it, RL continues from ``DIR/checkpoints/step_N`` as any run.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from agent_rl.config import Config
from agent_rl.learner.checkpoint import latest_checkpoint
from agent_rl.loop import run
from agent_rl.progress import Progress
from agent_rl.sft import BehaviourCloningBackend
from envs.families import describe

#: the warm start's folder under ``DIR/checkpoints``
WARM_START_DIR = "warm_start"
#: written in it when the warm start has ended: its checkpoint, step count and wall time
DONE_FILE = "done.json"
#: the eval cadence of the warm start: its step 0 and its last step only
_ENDS_ONLY = 10**9


def warm_start_dir(out: Path) -> Path:
    """``DIR/checkpoints/warm_start``."""
    return out / "checkpoints" / WARM_START_DIR


def warm_start_done(out: Path) -> dict[str, Any] | None:
    """The ended warm start's ``done.json`` (``checkpoint`` relative to ``out``), or None."""
    path = warm_start_dir(out) / DONE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def warm_start_config(cfg: Config) -> Config:
    """The warm start's config: the run's, with the panels at its ends only (when the run has panels) and the
    cloning optimiser without the RL preset's lr warm-up (TGRL warms up over 10 steps; a warm start has a few)."""
    ws = copy.deepcopy(cfg)
    if ws.trainer.eval_every > 0:
        ws.trainer.eval_every = _ENDS_ONLY
    ws.optim = dataclasses.replace(ws.optim, warmup=0)
    return ws


def plan_line(cfg: Config) -> str:
    """The run's plan, printed at start: warm start, RL steps, panel."""
    t, s = cfg.trainer, cfg.sft
    ws = (f"warm start: clone the env's expert on {s.num_episodes} train tasks, {s.epochs} epoch(s), batch "
          f"{s.batch_size}, lr {s.lr or cfg.optim.lr:g}, then " if t.warm_start == "bc" else "no warm start; ")
    g, turns = cfg.algo.group_size, cfg.rollout.max_turns
    tgrl = ""
    if cfg.algo.is_tgrl:
        a = cfg.algo
        temps = (f"T0 in {a.calibration.t_low} and T1 in {a.calibration.t_high} chosen by the calibration probe"
                 if a.calibration.on else f"T0={a.t_low} and T1={a.t_high}")
        warm = (f"its warm-up, every episode at T1 with plain GRPO, covers steps 1..{a.warmup_steps - 1}"
                if a.warmup_steps > 1 else "no warm-up")
        tgrl = f" (TGRL: {a.n_low} at T0 + {a.n_high} at T1, {temps}; {warm})"
    split = t.eval_panel or cfg.eval.split or describe(cfg.env.id, cfg.env.name).default_split
    panel = (f"panel: {t.eval_tasks} {split} tasks, greedy, <= {cfg.eval.max_turns or turns} turns, "
             + ("before and after the warm start and " if t.warm_start == "bc" else "before RL, ")
             + f"every {t.eval_every} RL steps and after the last" if t.eval_every > 0 else "no panel")
    return (f"plan: {ws}RL {cfg.algo.name} for {t.total_steps} step(s) x {t.tasks_per_step} task(s) x G={g} "
            f"episodes x <= {turns} turns ({cfg.rollout.mode} rows){tgrl}; lr {cfg.optim.lr:g}"
            + (f"; invalid-action penalty {cfg.rollout.invalid_penalty:g} a turn" if cfg.rollout.invalid_penalty else "")
            + f"; {panel}")


def run_warm_start(cfg: Config, out: Path, progress: Progress, config_file: Path | None = None) -> dict[str, Any]:
    """Run (or resume, ``trainer.resume=auto``) the warm start in ``out``; write and return ``done.json``
    (``checkpoint``: the cloned weights' folder, relative to ``out``; ``steps``; ``wall_s``)."""
    folder = warm_start_dir(out)
    ws = warm_start_config(cfg)
    t0 = time.perf_counter()
    backend = BehaviourCloningBackend(ws, out, progress, config_file, rows_file=folder / "rows.pt",
                                      measure_loss=False, zero_shot_cache=True)
    asyncio.run(run(ws, out, backend, progress, phase="warm_start", checkpoints=folder,
                    eval_dir=out / "eval" / WARM_START_DIR))
    ckpt = latest_checkpoint(folder)
    if ckpt is None:  # the loop saves its last step whatever trainer.save_every says
        raise RuntimeError(f"the warm start wrote no checkpoint under {folder}")
    done = {"checkpoint": str(ckpt.relative_to(out)), "steps": backend.total_steps,
            "wall_s": time.perf_counter() - t0, "rows": backend.batch.num_rows if backend.batch is not None else 0,
            **backend.collect_metrics}
    tmp = folder / (DONE_FILE + ".tmp")
    tmp.write_text(json.dumps(done, indent=1))
    tmp.replace(folder / DONE_FILE)
    print(f"warm start done: {done['steps']} cloning step(s) in {done['wall_s']:.0f} s; RL starts from "
          f"{done['checkpoint']}", file=sys.stderr)
    return done
