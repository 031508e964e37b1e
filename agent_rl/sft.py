"""Behaviour cloning: ``python -m agent_rl.sft env=textworld env.kwargs.family=coin_collector sft.num_episodes=8 ...``

Warm-starts a policy on expert episodes, in the exact rows RL trains on, through the one training loop
(:func:`agent_rl.loop.run` over :class:`BehaviourCloningBackend`: its schedule, fixed expert rows
(:class:`agent_rl.rollout.schedule.ExpertRows`), and its update differ, the logging and checkpoint cadence are the
loop's, ``trainer.save_every`` and ``trainer.eval_every`` included):

1. **Collect** (once) ``sft.num_episodes`` expert episodes through the env client of the run (``env_server.mode``
   http or local, :func:`agent_rl.runtime.open_env_pool`), tasks from the run's ``TaskSampler`` (``env.tasks`` rows
   mapped by ``env.task_fields``, else ``env.sampler``; seeded by ``trainer.seed``; never the curriculum), played by the RL orchestrator with the env's expert as its policy
   (:class:`agent_rl.rollout.policies.ExpertPolicy`; the env made with its family's expert kwarg,
   ``envs.families``): each turn plays ``info["expert_action"]`` (ALFWorld: the fixed handcoded expert; TextWorld:
   the walkthrough, then TextWorld's planner; WebShop: the scripted oracle). Only won episodes are kept
   (``sft.keep_lost=true`` keeps all).
2. **Render**: every turn's prompt is the orchestrator's own (``EnvEpisode.next_prompt``: per-turn or
   full-trajectory, ``rollout.mode``), the response ``sft.response_template`` filled with the action (default
   ``<action>{action}</action>``, the format the RL parser reads) plus the end-of-turn token; rows are made by
   ``build_rollout_batch``, the one place RL rows are made. The rows are saved once (``DIR/sft_rows.pt``) so a
   resumed run trains on the same data.
3. **Train**: each step is one optimizer step over ``sft.batch_size`` rows (epoch e visits a permutation seeded by
   (``trainer.seed``, e)): loss = mean token cross-entropy over response (action) tokens only (``response_mask``),
   computed with the learner's trunk + ``lm_head`` on response positions only (``policy_trunk``,
   ``response_positions``, ``algos.logprobs_from_logits``: no (B, L, V) tensor), micro-batches with gradient
   accumulation (``sft.micro_batch_size``), AdamW (``optim.*``), global grad-norm clip.

Why not TRL's ``SFTTrainer``: it would re-tokenise text (our rows are token ids built by the RL prompt builder, and
the point is that the cloned policy sees exactly the RL prompts) and adds a dependency for a loop of 30 lines; the
forward is the learner's, so memory behaviour (response positions only) is the same as RL's.

Outputs (``trainer.output_dir``): ``config.yaml`` (named in one line, not printed), ``metrics.jsonl`` and ``tb/``
(``sft`` rows, one per optimizer step: ``sft/loss``, ``sft/token_acc``, ``actor/grad_norm``, ``actor/lr``,
``sft/epoch``, ``time/step_s``, ``batch/rows``; step 1 also the collection numbers), ``checkpoints/step_N``
(``agent_rl.learner.checkpoint`` layout: loadable as ``model.path=DIR/checkpoints/step_N``), ``sft_summary.json``
(collection success, loss before/after). ``trainer.resume=auto`` continues from the latest checkpoint (model,
optimizer, RNG, step).

``sft.*`` keys (:class:`agent_rl.config.schema.SFTConfig`) are validated with the rest of the config at load time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from agent_rl import algos
from agent_rl.cli import run_cli
from agent_rl.config.compose import load_config, to_yaml
from agent_rl.config.schema import Config, ConfigError, SFTConfig
from agent_rl.engines import set_torch_threads
from agent_rl.eval.training import TrainingEval
from agent_rl.learner.checkpoint import (IncompleteCheckpoint, latest_checkpoint, load_checkpoint,
                                         recover_checkpoints, save_checkpoint)
from agent_rl.learner.learner import lr_scheduler, policy_trunk, response_positions, restore_optimizer
from agent_rl.loop import FirstStepFailed, run
from agent_rl.lora import base_module, is_lora
from agent_rl.memory import release_free_heap
from agent_rl.progress import Progress, quiet_library_progress
from agent_rl.rollout import GroupSpec, RolloutResult, build_rollout_batch
from agent_rl.rollout.samplers import make_task_sampler
from agent_rl.rollout.policies import ExpertPolicy, ScriptedEngine
from agent_rl.rollout.prompts import format_ids
from agent_rl.rollout.schedule import ExpertRows
from agent_rl.runtime import (build_engine, build_orchestrator, check_output_dir, close_engine, config_groups_help,
                              load_run_policy, open_env_pool, pad_token_id, resolve_device, seed_everything,
                              set_data_root)
from agent_rl.types import Episode, RolloutBatch, Task
from envs.families import describe


# ------------------------------------------------------------------------------------------------ config
def load_sft_config(overrides: list[str]) -> tuple[Config, SFTConfig]:
    """The run's config (``sft.*`` keys included, validated with the rest: ``ConfigError`` on bad keys) and its
    ``sft`` part. The RL algorithm's preset must not set the behaviour cloner's optimiser (TGRL's RL recipe warms
    the lr up over 10 steps): ``algo=grpo`` unless ``algo=`` is given, so ``optim.*`` are config.yaml's and the
    model preset's."""
    if not any(o.split("=", 1)[0] == "algo" for o in overrides):
        overrides = ["algo=grpo", *overrides]
    cfg = load_config(overrides)
    if cfg.env.action_format != "text":  # the envs' experts answer in text commands, not in tool calls
        raise ConfigError("behaviour cloning needs env.action_format=text: the env experts give text commands, and "
                          "their tool-call form (docs/tools.md) is not written yet")
    if cfg.trainer.backend != "local":
        raise ConfigError(f"behaviour cloning runs on the local backend (trainer.backend=local), not "
                          f"trainer.backend={cfg.trainer.backend}")
    return cfg, cfg.sft


# ------------------------------------------------------------------------------------------------ collection
def response_ids_for(tokenizer: Any, action: str, sft: SFTConfig) -> list[int]:
    """Token ids of the target response for ``action`` (template + optional EOS). The action is the env's text:
    encoded as data (a special token's string in it stays plain characters, ``agent_rl.rollout.prompts.format_ids``);
    the template's own text may hold control tokens."""
    ids = format_ids(tokenizer, sft.response_template, action=action)
    if sft.append_eos and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids


async def collect_expert_episodes(cfg: Config, tokenizer: Any, pool: Any, tasks: list[Task],
                                  progress: Any = None) -> tuple[list[Episode], dict[str, float]]:
    """Play ``tasks`` with the env's expert through ``pool`` on the RL orchestrator; return (kept episodes,
    collection metrics). Each task is a group of one episode at temperature 1; a turn's response is the rendered
    expert action (:func:`response_ids_for`, log-probs 0); an episode an env failure ended (after the
    orchestrator's retries) is counted as played and not kept. ``progress``: the display told each turn and episode.

    Raises:
        RuntimeError: the env gives no ``info["expert_action"]`` (it has no expert, or its expert kwarg is wrong:
            ``sft.expert_kwarg``), or no episode is left to train on.
    """
    sft = cfg.sft
    kwarg = describe(cfg.env.id, cfg.env.name).expert_kwarg if sft.expert_kwarg is None else sft.expert_kwarg
    rollout = dataclasses.replace(cfg.rollout, max_concurrent_episodes=max(1, sft.concurrency))
    orch = build_orchestrator(cfg, pool, ScriptedEngine(tokenizer), rollout=rollout,
                              policy=ExpertPolicy(render=lambda action: response_ids_for(tokenizer, action, sft)),
                              on_turn=(lambda gen: progress.turn(0)) if progress is not None else None,
                              on_episode=(lambda ep: progress.episode(ep.won)) if progress is not None else None)
    groups = [GroupSpec(Task(env_id=t.env_id, options=t.options, group_id=t.group_id, seed=t.seed,
                             env_kwargs={**t.env_kwargs, **({kwarg: True} if kwarg else {})}), [(1.0, False)])
              for t in tasks]
    try:
        result = await orch.run_groups(groups, seed_key=0)
    finally:
        await orch.aclose()
    episodes = result.episodes
    played = len(episodes) + result.dropped_groups
    won = [ep for ep in episodes if ep.won]
    kept = [ep for ep in episodes if ep.turns and (ep.won or sft.keep_lost)]
    metrics = {
        "collect/episodes": float(played),
        "collect/success_rate": len(won) / max(played, 1),
        "collect/turns_mean": sum(len(ep.turns) for ep in episodes) / max(played, 1),
        "collect/kept_episodes": float(len(kept)),
    }
    if result.dropped_groups:
        print(f"warning: {result.dropped_groups} expert episode(s) dropped (not trained on); first reason: "
              f"{result.failures[0]}", file=sys.stderr)
    if not kept:
        raise RuntimeError(f"no expert episode to train on ({played} played, {len(won)} won)")
    return kept, metrics


# ------------------------------------------------------------------------------------------------ the loss
class BehaviourCloner:
    """Token cross-entropy on response tokens of a ``RolloutBatch``, with AdamW (the optimizer state is what a
    checkpoint saves as ``learner.pt``).

    Args:
        model: causal LM (moved to ``device``).
        optim: ``OptimConfig`` (lr, betas, eps, weight_decay, warmup, max_grad_norm); a LoRA (peft) ``model``
            trains its adapter only, at ``optim.for_lora()``'s learning rate (``optim.lora_lr``), as the learner.
        micro_batch_size: rows per forward.
    """

    def __init__(self, model: torch.nn.Module, optim: Any, *, micro_batch_size: int, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        if is_lora(model):  # the adapter's own learning rate (OptimConfig.lora_lr)
            optim = optim.for_lora()
        self.optim_cfg = optim
        self.micro_batch_size = micro_batch_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                                           weight_decay=optim.weight_decay)
        # cloning counts its warm-up in optimiser steps whatever optim.warmup_unit says (there are no RL steps)
        self.scheduler = lr_scheduler(self.optimizer, optim.warmup, unit="optimizer_step")

    @property
    def lr(self) -> float:
        """The learning rate of the next optimiser step."""
        return float(self.scheduler.get_last_lr()[0])

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """AdamW moments and step count from ``sd``; hyper-parameters and LR schedule from this run's ``optim``
        (``restore_optimizer``, as the RL learner)."""
        self.scheduler = restore_optimizer(self.optimizer, sd, self.optim_cfg, unit="optimizer_step")

    def _token_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) log-probs of the N response tokens of these rows at T = 1, and (N,) whether each is the argmax."""
        ids, am = input_ids.to(self.device), attention_mask.to(self.device)
        last = int(am.any(0).nonzero().max()) + 1
        ids, am, rm = ids[:, :last], am[:, :last], response_mask.to(self.device)[:, :last]
        trunk, lm_head = policy_trunk(self.model)
        position_ids = (am.cumsum(-1) - 1).clamp(min=0)
        hidden = trunk(input_ids=ids, attention_mask=am, position_ids=position_ids, use_cache=False).last_hidden_state
        rows, cols = response_positions(rm)
        logits = lm_head(hidden[rows, cols - 1])  # (N, V)
        tokens = ids[rows, cols]
        logp = algos.logprobs_from_logits(logits, tokens, 1.0)
        return logp, (logits.argmax(-1) == tokens)

    def _micro(self, rows: torch.Tensor) -> list[torch.Tensor]:
        return list(rows.split(self.micro_batch_size))

    @torch.no_grad()
    def evaluate(self, batch: RolloutBatch) -> dict[str, float]:
        """Mean response-token cross-entropy (nats) and argmax accuracy over every row of ``batch``."""
        was = self.model.training
        self.model.eval()
        nll, acc, n = 0.0, 0.0, 0
        try:
            for rows in self._micro(torch.arange(batch.num_rows)):
                logp, hit = self._token_logprobs(batch.input_ids[rows], batch.attention_mask[rows],
                                                 batch.response_mask[rows])
                nll -= float(logp.sum())
                acc += float(hit.sum())
                n += int(logp.numel())
        finally:
            self.model.train(was)
        return {"loss": nll / max(n, 1), "token_acc": acc / max(n, 1), "tokens": float(n)}

    def train_step(self, batch: RolloutBatch, rows: torch.Tensor) -> dict[str, float]:
        """One optimizer step on ``rows`` of ``batch`` (loss = summed token NLL / tokens of all ``rows``). The freed
        heap is given back to the OS before the activations and after them, as ``Learner.update`` does (DAgger and
        ``agent_rl.sft`` alternate these steps with generation: docs/training.md, "Memory on a CPU")."""
        release_free_heap()
        self.model.train()
        n_tokens = int(batch.response_mask[rows][:, 1:].gt(0).sum())
        if n_tokens == 0:
            return {"sft/loss": 0.0, "sft/token_acc": 0.0, "actor/grad_norm": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        total, hits = 0.0, 0.0
        for micro in self._micro(rows):
            logp, hit = self._token_logprobs(batch.input_ids[micro], batch.attention_mask[micro],
                                             batch.response_mask[micro])
            loss = -logp.sum() / n_tokens
            loss.backward()
            total += float(loss.detach())
            hits += float(hit.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.optim_cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        release_free_heap()  # the step's activations, before the next generation or step
        return {"sft/loss": total, "sft/token_acc": hits / n_tokens, "actor/grad_norm": float(grad_norm),
                "actor/lr": float(self.scheduler.get_last_lr()[0])}


def step_rows(num_rows: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """Rows of 1-based optimizer ``step``: epoch e visits a permutation seeded by (seed, e) in slices of
    ``batch_size`` (the last slice of an epoch may be shorter). A pure function of its arguments (resume-safe)."""
    per_epoch = math.ceil(num_rows / batch_size)
    epoch, offset = divmod(step - 1, per_epoch)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(num_rows, generator=gen)
    return perm[offset * batch_size:(offset + 1) * batch_size]


# ------------------------------------------------------------------------------------------------ the backend
class BehaviourCloningBackend:
    """Behaviour cloning on the loop (:class:`agent_rl.loop.Backend`): :meth:`start` collects the expert rows once
    (or reloads ``DIR/sft_rows.pt``); :meth:`open` returns them as the run's schedule (:class:`ExpertRows`: step s
    trains ``rows(s)``, :func:`step_rows`), each update is one :class:`BehaviourCloner` step. The env pool and an
    engine are opened only for the in-training eval panel (``trainer.eval_every``)."""

    kind = "sft"

    def __init__(self, cfg: Config, out: Path, progress: Any, config_file: Path | None = None, *,
                 rows_file: Path | None = None, optim: Any = None, measure_loss: bool = True,
                 zero_shot_cache: bool = False) -> None:
        self.cfg, self.sft, self.out, self.progress = cfg, cfg.sft, out, progress
        self.rows_file = rows_file or out / "sft_rows.pt"  # the collected rows (a warm start's: in its checkpoints)
        self.measure_loss = measure_loss  # the loss over all rows before training (a warm start skips it: its cost)
        self.zero_shot_cache = zero_shot_cache  # the step-0 panel of model.* from the panel cache (TrainingEval)
        seed_everything(cfg.trainer.seed)
        set_torch_threads(cfg.engine.num_threads)
        self.model, self.tokenizer = load_run_policy(cfg, progress, config_file, train=True)
        optim = optim or cfg.optim
        if self.sft.lr > 0:  # sft.lr: the cloning rate (model=smollm2 sets it; 0 = optim.lr)
            optim = dataclasses.replace(optim, lr=self.sft.lr)
        self.cloner = BehaviourCloner(self.model, optim, micro_batch_size=self.sft.micro_batch_size,
                                      device=resolve_device(cfg.trainer.device))
        self.batch: RolloutBatch | None = None
        self.collect_metrics: dict[str, float] = {}
        self.before: dict[str, float] | None = None
        self.total_steps = 0
        self.per_epoch = 1
        self.pool: Any = None
        self.engine: Any = None
        self._pool_cm: Any = None
        self._synced = True

    @property
    def lr(self) -> float:
        return self.cloner.lr

    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        cfg, sft = self.cfg, self.sft
        rows_file = self.rows_file
        if rows_file.is_file():
            saved = await asyncio.to_thread(torch.load, rows_file, weights_only=False)
            self.batch, self.collect_metrics = saved["batch"], saved["metrics"]
            print(f"reusing the {self.batch.num_rows} rows of {rows_file}", file=sys.stderr)
        else:
            # the run's tasks (env.tasks rows, else env.sampler), drawn as RL's uniform sampler would draw them
            sampler = make_task_sampler(cfg, announce=lambda text: print(text, file=sys.stderr), curriculum=False)
            tasks = sampler.sample(sft.num_episodes)
            t0 = time.perf_counter()
            self.progress.phase(f"{self.progress.stage or 'cloning'}: expert episodes", total=len(tasks))
            async with open_env_pool(cfg, self.out) as pool:
                episodes, self.collect_metrics = await collect_expert_episodes(cfg, self.tokenizer, pool, tasks,
                                                                               self.progress)
            self.progress.end()
            self.collect_metrics["time/collect_s"] = time.perf_counter() - t0
            self.batch = build_rollout_batch(episodes, pad_token_id=pad_token_id(self.tokenizer),
                                             mode=cfg.rollout.mode)
            rows_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = rows_file.with_suffix(".tmp")
            await asyncio.to_thread(torch.save, {"batch": self.batch, "metrics": self.collect_metrics}, tmp)
            tmp.replace(rows_file)
        print(f"expert episodes: {json.dumps(self.collect_metrics)}; rows: {self.batch.num_rows}", file=sys.stderr)
        self.per_epoch = math.ceil(self.batch.num_rows / sft.batch_size)
        self.total_steps = self.per_epoch * sft.epochs
        extra = None
        if ckpt is not None:
            try:  # a missing learner.pt / rng.pt is refused unless trainer.resume_weights_only=true
                extra = await asyncio.to_thread(load_checkpoint, ckpt, self.model, self.cloner,
                                                weights_only=cfg.trainer.resume_weights_only)
            except IncompleteCheckpoint as exc:
                raise ConfigError(str(exc)) from None
            if cfg.trainer.resume_weights_only:
                print("resume: trainer.resume_weights_only=true: the optimizer (AdamW moments) and the LR warm-up "
                      f"(optim.warmup={cfg.optim.warmup}) restart; weights and step from {ckpt}", file=sys.stderr)
            self.before = extra.get("loss_before")
        if self.before is None and self.measure_loss:
            self.before = await asyncio.to_thread(self.cloner.evaluate, self.batch)
        return extra

    async def open(self) -> ExpertRows:
        """The step's rows (:class:`ExpertRows`); the env pool and an engine only for the in-training panel."""
        if self.cfg.trainer.eval_every > 0:  # the in-training panel plays episodes: an env pool and an engine
            self._pool_cm = open_env_pool(self.cfg, self.out)
            self.pool = await self._pool_cm.__aenter__()
            self.engine = build_engine(self.cfg, base_module(self.model), self.tokenizer)
        return ExpertRows(self.rows)

    def rows(self, step: int) -> RolloutResult:
        """The rows of optimizer step ``step`` (``RolloutResult.batch``; no episodes are played)."""
        assert self.batch is not None
        rows = step_rows(self.batch.num_rows, self.sft.batch_size, self.cfg.trainer.seed, step)
        metrics = {"sft/epoch": float((step - 1) // self.per_epoch + 1)}
        if step == 1:
            metrics.update(self.collect_metrics)
        return RolloutResult(episodes=[], metrics=metrics, batch=self.batch.select_rows(rows))

    async def update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        metrics = dict(await asyncio.to_thread(self.cloner.train_step, batch, torch.arange(batch.num_rows)))
        metrics["time/step_s"] = time.perf_counter() - t0
        self._synced = False
        return metrics

    async def token_stats(self) -> dict[str, Any] | None:
        return None

    async def engine_metrics(self) -> dict[str, float]:
        """None: behaviour cloning syncs its engine only for the panel."""
        return {}

    async def evaluate(self, step: int, evaluator: TrainingEval) -> list[dict[str, Any]]:
        """The panel with the current weights (the engine is synced here, before it plays: eval only)."""
        if not self._synced:
            self.engine.sync_weights(base_module(self.model))
            self._synced = True
        # the step-0 panel of the unmodified model.* (the warm start's zero-shot panel) is a cached result
        cache = self.zero_shot_cache and step == 0 and not self.cfg.model.path
        return await evaluator.results(step, self.pool, self.engine, cache=cache)

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        await asyncio.to_thread(save_checkpoint, path, self.model, self.tokenizer, self.cloner,
                                {**extra, "loss_before": self.before, "kind": "sft"})

    async def close(self) -> None:
        try:
            if self._pool_cm is not None:
                await self._pool_cm.__aexit__(None, None, None)
        finally:
            if self.engine is not None:
                close_engine(self.engine)

    def summary(self, checkpoints: Path | None = None) -> dict[str, Any]:
        """``sft_summary.json``: rows, steps, loss and token accuracy before and after, the collection numbers, the
        last checkpoint (under ``checkpoints``, default ``DIR/checkpoints``)."""
        assert self.batch is not None and self.before is not None
        after = self.cloner.evaluate(self.batch)
        return {"rows": self.batch.num_rows, "steps": self.total_steps, "loss_before": self.before["loss"],
                "loss_after": after["loss"], "token_acc_before": self.before["token_acc"],
                "token_acc_after": after["token_acc"], "response_tokens": after["tokens"], **self.collect_metrics,
                "checkpoint": str(latest_checkpoint(checkpoints or self.out) or ""), "sft": asdict(self.sft)}


# ------------------------------------------------------------------------------------------------ the run
def main(overrides: list[str] | None = None) -> dict[str, Any]:
    """CLI/test entry point (as ``agent_rl.train.main``): compose, save ``DIR/config.yaml``, collect, train; returns
    the summary (``DIR/sft_summary.json``)."""
    overrides = sys.argv[1:] if overrides is None else overrides
    if any(arg in ("-h", "--help") for arg in overrides):
        print(__doc__)
        print(config_groups_help())
        print("sft.* keys: " + ", ".join(f"sft.{k}={v!r}" for k, v in asdict(SFTConfig()).items()))
        return {}
    cfg, _ = load_sft_config(overrides)
    name = f"{cfg.env.name}-sft-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(cfg.trainer.output_dir or Path("runs") / name).resolve()
    check_output_dir(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    cfg.trainer.output_dir = str(out)
    set_data_root(cfg)
    if cfg.trainer.resume:  # a save interrupted by a crash: undo a half-done replace, drop its temporary folder
        for line in recover_checkpoints(out / "checkpoints"):
            print(f"checkpoints: {line}", file=sys.stderr)
    (out / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    progress = Progress(enabled=cfg.trainer.progress)
    progress.stage = "cloning"  # its phases read "cloning: expert episodes", "cloning: update 3/8", never "RL step"
    progress.note(f"config: {out / 'config.yaml'} (the resolved config)")
    backend = BehaviourCloningBackend(cfg, out, progress, out / "config.yaml")
    asyncio.run(run(cfg, out, backend, progress))
    summary = backend.summary()
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"action-token cross-entropy {summary['loss_before']:.4f} -> {summary['loss_after']:.4f} nats; token "
          f"accuracy {summary['token_acc_before']:.3f} -> {summary['token_acc_after']:.3f}; checkpoint "
          f"{summary['checkpoint']}", file=sys.stderr)
    return summary


def cli() -> None:
    """``python -m agent_rl.sft``: :func:`main`, errors as every command line prints them (:mod:`agent_rl.cli`)."""
    def run() -> None:
        quiet_library_progress()  # a log (not a terminal) gets no carriage-return lines from library bars
        main()

    run_cli(run, run_errors=(FirstStepFailed,))


if __name__ == "__main__":
    cli()
