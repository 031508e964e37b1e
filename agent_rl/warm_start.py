"""The warm start of an RL run (``trainer.warm_start=bc`` or ``dagger``; docs/training.md "Warm start").

A warm-started run is two phases in one run directory, each one call of the one training loop
(:func:`agent_rl.loop.run`):

1. **warm start** (:func:`run_warm_start`): :class:`agent_rl.sft.BehaviourCloningBackend` plays the env's expert
   on ``sft.num_episodes`` train-split tasks (the run's ``env.sampler``), clones it for ``sft.epochs`` over its rows
   (the RL rows: ``rollout.mode``; ``sft.lr``, no lr warm-up, AdamW). Rows of kind ``sft``, its own step counter
   1..K; checkpoints ``DIR/checkpoints/warm_start/step_k`` (``trainer.save_every`` and the last), the collected rows
   ``DIR/checkpoints/warm_start/rows.pt``; its panels (``trainer.eval_every`` > 0) at step 0 (the model before
   cloning) and step K (after), eval rows with ``"phase": "warm_start"``, files under ``DIR/eval/warm_start/``.
   ``trainer.warm_start=dagger``: round 0 is that cloning, then ``sft.dagger_rounds`` DAgger rounds
   (:mod:`agent_rl.dagger`: the policy plays, the expert labels each state, the aggregate is cloned again), each a
   call of the loop continuing the step counter, with a panel after it. Every ``sft`` row holds its ``round``.
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

from agent_rl.config.schema import Config
from agent_rl.learner.checkpoint import latest_checkpoint
from agent_rl.loop import run
from agent_rl.progress import Progress
from agent_rl.dagger import EXTRA_KEY, DAggerBackend
from agent_rl.runtime import resume_path
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
    warm = t.warm_start in ("bc", "dagger")
    ws = (f"warm start: clone the env's expert on {s.num_episodes} train tasks, {s.epochs} epoch(s), batch "
          f"{s.batch_size}, lr {s.lr or cfg.optim.lr:g}, then " if warm else "no warm start; ")
    if t.warm_start == "dagger":
        temp = "greedy" if s.dagger_temperature == 0 else f"T={s.dagger_temperature:g}"
        ws += (f"{s.dagger_rounds} DAgger round(s) of {s.dagger_episodes} episodes ({temp}; the expert plays a "
               f"share beta_i = {s.dagger_beta:g}^i) labelled by the expert, {s.dagger_steps} step(s) over the "
               "aggregate each, then ")
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
    ends = ("before the warm start, after each of its rounds and " if t.warm_start == "dagger" else
            "before and after the warm start and " if warm else "before RL, ")
    panel = (f"panel: {t.eval_tasks} {split} tasks, greedy, <= {cfg.eval.max_turns or turns} turns, "
             + ends + f"every {t.eval_every} RL steps and after the last" if t.eval_every > 0 else "no panel")
    return (f"plan: {ws}RL {cfg.algo.name} for {t.total_steps} step(s) x {t.tasks_per_step} task(s) x G={g} "
            f"episodes x <= {turns} turns ({cfg.rollout.mode} rows){tgrl}; lr {cfg.optim.lr:g}"
            + (f"; invalid-action penalty {cfg.rollout.invalid_penalty:g} a turn" if cfg.rollout.invalid_penalty else "")
            + f"; {panel}")


def first_round(folder: Path, ckpt: Path | None) -> int:
    """The round a warm start resumed from checkpoint ``ckpt`` (None: a fresh one, round 0) continues: the
    checkpoint's round (``extra.json`` ``dagger``), or the next one when the checkpoint is that round's last step."""
    if ckpt is None:
        return 0
    extra = json.loads((ckpt / "extra.json").read_text())
    info = extra.get(EXTRA_KEY)
    if info is None:  # a warm start checkpointed before rounds existed: round 0
        return 0
    return int(info["round"]) + (int(extra.get("step", 0)) >= int(info["last_step"]))


def run_warm_start(cfg: Config, out: Path, progress: Progress, config_file: Path | None = None) -> dict[str, Any]:
    """Run (or resume, ``trainer.resume=auto``) the warm start in ``out``: round 0 (behaviour cloning), then for
    ``trainer.warm_start=dagger`` ``sft.dagger_rounds`` DAgger rounds (:mod:`agent_rl.dagger`), each one call of
    the training loop; write and return ``done.json`` (``checkpoint``: the cloned weights' folder, relative to
    ``out``; ``steps``; ``wall_s``; ``rounds``: each round's first and last step and numbers)."""
    folder = warm_start_dir(out)
    ws = warm_start_config(cfg)
    t0 = time.perf_counter()
    backend = DAggerBackend(ws, out, progress, config_file, rows_file=folder / "rows.pt",
                            measure_loss=False, zero_shot_cache=True)
    # a warm start killed after its last checkpoint (before done.json) runs its last round's loop call again, which
    # has nothing left to train but sets the totals done.json reports
    start = min(first_round(folder, resume_path(ws, out, folder=folder)), backend.rounds - 1)
    for r in range(start, backend.rounds):
        backend.round = r
        progress.stage = f"warm start {r + 1}/{backend.rounds}"
        ws_r = copy.deepcopy(ws)
        if r > start:  # a later round continues from the previous round's last checkpoint
            ws_r.trainer.resume = "auto"
        asyncio.run(run(ws_r, out, backend, progress, phase="warm_start", checkpoints=folder,
                        eval_dir=out / "eval" / WARM_START_DIR))
    progress.stage = ""
    ckpt = latest_checkpoint(folder)
    if ckpt is None:  # the loop saves its last step whatever trainer.save_every says
        raise RuntimeError(f"the warm start wrote no checkpoint under {folder}")
    done = {"checkpoint": str(ckpt.relative_to(out)), "steps": backend.total_steps,
            "wall_s": time.perf_counter() - t0, "rows": backend.batch.num_rows if backend.batch is not None else 0,
            "rounds": backend.rounds, **backend.collect_metrics}
    tmp = folder / (DONE_FILE + ".tmp")
    tmp.write_text(json.dumps(done, indent=1))
    tmp.replace(folder / DONE_FILE)
    progress.note(f"warm start done: {done['rounds']} round(s), {done['steps']} cloning step(s) in "
                  f"{done['wall_s']:.0f} s; RL starts from {done['checkpoint']}")
    return done
