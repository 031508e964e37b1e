"""Entry point: ``python -m agent_rl.train env=alfworld algo=tgrl [key=value ...]`` (Hydra overrides).

Parse the config, check the output folder and the resume, pick the backend (``trainer.backend``: local, ray), run
the one training loop (:func:`agent_rl.loop.run`: collect -> batch -> update -> store episodes -> sync -> eval ->
log -> checkpoint), write the report. Outputs in ``trainer.output_dir``: ``config.yaml`` (``config.resume-N.yaml``
for each resume), ``metrics.jsonl``, ``tb/``, ``checkpoints/step_N``, ``episodes/``, ``curves.png``, ``summary.md``.
``trainer.resume=auto`` continues from the latest checkpoint.

Small CPU budget used by the acceptance check and the tests::

    python -m agent_rl.train env=alfworld algo=tgrl model=tiny trainer.total_steps=2 trainer.output_dir=DIR \\
        trainer.tasks_per_step=1 rollout.max_turns=3 engine.max_new_tokens=16
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

from agent_rl.cli import run_cli
from agent_rl.config.compose import config_dict, load_config, to_yaml

from agent_rl.config.schema import Config, ConfigError

from agent_rl.resume import compare_for_resume
from agent_rl.trackers import Trackers
from agent_rl.learner.checkpoint import latest_checkpoint, recover_checkpoints
from agent_rl.local import LocalBackend
from agent_rl.loop import FirstStepFailed, NonFiniteUpdates, run
from agent_rl.progress import Progress, quiet_library_progress
from agent_rl.report import finish_run
from agent_rl.runtime import (check_output_dir, check_resume_state, config_groups_help, resume_path, saved_run_config,
                              set_data_root)
from agent_rl.warm_start import plan_line, run_warm_start, warm_start_dir, warm_start_done


def make_backend(cfg: Config, out: Path, progress: Progress, config_file: Path | None = None) -> Any:
    """The backend ``trainer.backend`` names (``agent_rl.config.schema.BACKENDS``), its policy loaded."""
    if cfg.trainer.backend == "ray":  # learners, rollout workers, env servers as Ray actors (docs/scaling.md)
        from agent_rl.distributed.backend import RayBackend  # deferred: imports ray (optional, heavy)

        return RayBackend(cfg, out, progress, config_file)
    return LocalBackend(cfg, out, progress, config_file)


def main(overrides: list[str] | None = None, *, notice: str = "") -> dict[str, Any]:
    """CLI/test entry point: compose the config from ``overrides`` (default ``sys.argv[1:]``), save it as
    ``DIR/config.yaml`` (named in one line), train. Returns the last step's metrics record. ``notice``: a line
    printed once the config is valid (the CLI's CPU-preset line)."""
    overrides = sys.argv[1:] if overrides is None else overrides
    if any(arg in ("-h", "--help") for arg in overrides):
        print(usage())
        return {}
    cfg = load_config(overrides)
    if notice:
        print(notice, file=sys.stderr)
    out = Path(cfg.trainer.output_dir or Path("runs") / cfg.run_name).resolve()
    check_output_dir(cfg, out)
    cfg.trainer.output_dir = str(out)
    config_file = out / "config.yaml"
    if cfg.trainer.resume:  # a save interrupted by a crash: undo a half-done replace, drop its temporary folder
        for folder in (out / "checkpoints", warm_start_dir(out)):
            for line in recover_checkpoints(folder):
                print(f"checkpoints: {line}", file=sys.stderr)
    print(plan_line(cfg), file=sys.stderr)
    # one display for the whole command: one clock, each phase named (warm start i/n, RL step s/N)
    progress = Progress(enabled=cfg.trainer.progress)
    warm = cfg.trainer.warm_start in ("bc", "dagger")
    if warm:  # clone the env's expert first (agent_rl.warm_start; DAgger rounds: agent_rl.dagger), then RL
        cfg = warm_start_first(cfg, out, progress)
    ckpt = resume_path(cfg, out)
    if ckpt is not None:  # resume: compare with the config the checkpoint was trained under (docs/training.md)
        state_notes = check_resume_state(cfg, ckpt)  # ConfigError: a state file is missing
        extra = json.loads((ckpt / "extra.json").read_text())
        start = int(extra.get("step", 0)) + 1
        saved, source = extra.get("config"), f"{ckpt}/extra.json"
        if saved is None:  # a checkpoint written before configs were saved in it: the run's newest config file
            saved, source = saved_run_config(ckpt.parent.parent, start)
        for line in [*compare_for_resume(saved, cfg, source=source), *state_notes]:
            print(line, file=sys.stderr)
        if start <= cfg.trainer.total_steps:  # each config the run ran under is kept
            config_file = out / f"config.resume-{start}.yaml"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"trainer.output_dir={out} cannot be created: {exc.strerror or exc}") from None
    set_data_root(cfg)
    config_file.write_text(to_yaml(cfg), encoding="utf-8")
    if not (warm and config_file == out / "config.yaml"):  # the warm start named it already
        progress.note(f"config: {config_file} (the resolved config)")
    # W&B / MLflow (trainer.loggers): opened here, in the driver only (Ray actors never log to them)
    trackers = Trackers.open(cfg.trainer.loggers, out, config_dict(cfg), cfg.trainer.tracking,
                             resume=ckpt is not None, tags=[cfg.env.name, cfg.algo.name, cfg.model.name])
    try:
        # after a warm start the RL phase has no step-0 panel: the warm start's last panel played the same weights
        record = asyncio.run(run(cfg, out, make_backend(cfg, out, progress, config_file), progress,
                                 eval_at_start=not warm, trackers=trackers))
        print(finish_run(out), file=sys.stderr)  # DIR/curves.png, DIR/summary.md
        trackers.finish([config_file, out / "curves.png", out / "summary.md"])
    finally:
        trackers.close()
    return record


def warm_start_first(cfg: Config, out: Path, progress: Progress) -> Config:
    """The warm start of a ``trainer.warm_start=bc`` or ``dagger`` run (:func:`agent_rl.warm_start.run_warm_start`;
    skipped when ``DIR/checkpoints/warm_start/done.json`` says it ended: a resumed RL phase), and the RL phase's
    config: ``cfg`` with ``model.path`` = the cloned checkpoint; ``trainer.resume`` naming a warm-start checkpoint
    resumes the warm start from it, then RL starts fresh (``auto``). ``progress``: the command's one display.

    Raises:
        ConfigError: RL checkpoints without an ended warm start (``done.json`` deleted: the RL phase's start weights
            are unknown).
    """
    folder = warm_start_dir(out)
    done = warm_start_done(out)
    resume = cfg.trainer.resume
    in_warm_start = resume not in ("", "auto") and folder.resolve() in Path(resume).resolve().parents
    if done is None:
        if not in_warm_start and latest_checkpoint(out / "checkpoints") is not None:
            raise ConfigError(f"{out}/checkpoints holds RL checkpoints but {folder}/done.json (the ended warm start) "
                              "is missing; restore it or use trainer.warm_start=none with model.path=<its checkpoint>")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"trainer.output_dir={out} cannot be created: {exc.strerror or exc}") from None
        set_data_root(cfg)
        (out / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
        progress.note(f"config: {out / 'config.yaml'} (the resolved config)")
        done = run_warm_start(cfg, out, progress, out / "config.yaml")
    cfg = copy.deepcopy(cfg)
    cfg.model.path = str(out / done["checkpoint"])
    if in_warm_start:
        cfg.trainer.resume = "auto"
    return cfg


def usage() -> str:
    """``--help`` text: the module docstring, the config groups and their options."""
    return "\n".join([__doc__ or "", config_groups_help()])


def with_device_preset(overrides: list[str]) -> tuple[list[str], str]:
    """The command line's overrides, plus the CPU budget preset when no ``trainer=`` is given and no GPU is visible
    (``trainer=cpu_alfworld`` for env=alfworld, the default env: ALFWorld's own sizing; ``trainer=cpu``
    for every other env); and the one line that says so ("" when nothing was added)."""
    if any(ov.split("=", 1)[0].lstrip("+~") == "trainer" for ov in overrides) or torch.cuda.is_available() or \
            any(arg in ("-h", "--help") for arg in overrides):
        return overrides, ""
    env = next((ov.split("=", 1)[1] for ov in overrides if ov.split("=", 1)[0].lstrip("+~") == "env"), "alfworld")
    if env == "alfworld":
        return [*overrides, "trainer=cpu_alfworld"], (
            "no GPU found: using ALFWorld's CPU budget preset trainer=cpu_alfworld (configs/trainer/cpu_alfworld.yaml:"
            " pick_and_place_simple games, a warm start on the expert for SmolLM2 (cloning, then DAgger rounds), "
            "then 4 RL steps x 3 tasks x 4 episodes x 8 turns in trajectory mode, TGRL warm-up 1 step, an 8-game "
            "valid_unseen panel before and after each warm-start round and after RL); add trainer=default for the "
            "full budget")
    return [*overrides, "trainer=cpu"], (
        "no GPU found: using the CPU budget preset trainer=cpu (configs/trainer/cpu.yaml: 4 steps x 4 episodes x "
        "3 turns, a 4-game eval panel before and after); add trainer=default for the full budget")


def cli() -> None:
    """``python -m agent_rl.train``: :func:`main`, a config error printed as one line ``config error: what, where,
    the valid choices`` (exit code 2, no traceback; :func:`agent_rl.cli.run_cli`). Every check that can run before
    training raises ConfigError (:func:`agent_rl.config.compose.load_config`, the output dir, the resume path and
    config)."""

    def run() -> None:
        quiet_library_progress()  # a log (not a terminal) gets no carriage-return lines from library bars
        overrides, notice = with_device_preset(sys.argv[1:])
        main(overrides, notice=notice)

    run_cli(run, run_errors=(FirstStepFailed, NonFiniteUpdates))


if __name__ == "__main__":
    cli()
