"""Behaviour cloning: ``python -m agent_rl.sft env=textworld env.kwargs.family=coin_collector sft.num_episodes=8 ...``

Warm-starts a policy on expert episodes, in the exact rows RL trains on:

1. **Collect** ``sft.num_episodes`` expert episodes through the env client of the run (``env_server.mode`` http or
   local, the same :func:`agent_rl.train.open_env_pool`), tasks from the run's ``TaskSampler`` (``env.sampler``,
   seeded by ``trainer.seed``), the env made with ``expert=True``; each turn plays ``info["expert_action"]``
   (ALFWorld: the fixed handcoded expert; TextWorld: the walkthrough, then TextWorld's planner; WebShop: the
   scripted oracle). Only won episodes
   are kept (``sft.keep_lost=true`` keeps all).
2. **Render** every turn with the env's prompt format and the orchestrator's own prompt builder
   (``RolloutOrchestrator.next_prompt``: per-turn or full-trajectory, ``rollout.mode``), the response being
   ``sft.response_template`` filled with the action (default ``<action>{action}</action>``, the format the RL
   parser reads) plus the end-of-turn token; rows are made by ``build_rollout_batch``, the one place RL rows are
   made. The rows are saved once (``DIR/sft_rows.pt``) so a resumed run trains on the same data.
3. **Train**: loss = mean token cross-entropy over response (action) tokens only (``response_mask``), computed with
   the learner's trunk + ``lm_head`` on response positions only (``policy_trunk``, ``response_positions``,
   ``algos.logprobs_from_logits``: no (B, L, V) tensor), micro-batches with gradient accumulation over
   ``sft.batch_size`` rows, AdamW (``optim.*``), global grad-norm clip.

Why not TRL's ``SFTTrainer``: it would re-tokenise text (our rows are token ids built by the RL prompt builder, and
the point is that the cloned policy sees exactly the RL prompts) and adds a dependency for a loop of 30 lines; the
forward is the learner's, so memory behaviour (response positions only) is the same as RL's.

Outputs (``trainer.output_dir``): ``config.yaml``, ``metrics.jsonl`` and ``tb/`` (per optimizer step:
``sft/loss``, ``sft/token_acc``, ``actor/grad_norm``, ``actor/lr``, ``sft/epoch``, ``time/step_s``),
``checkpoints/step_N`` (``agent_rl.learner.checkpoint`` layout: loadable as ``model.path=DIR/checkpoints/step_N``),
``sft_summary.json`` (collection success, loss before/after). ``trainer.resume=auto`` continues from the latest
checkpoint (model, optimizer, RNG, step).

``sft.*`` keys (:class:`SFTConfig`) are parsed here; every other key is the training config (``agent_rl/config.py``).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agent_rl.config import Config, ConfigError, load_config, to_yaml


@dataclass
class SFTConfig:
    """Behaviour-cloning settings (``sft.*``)."""

    num_episodes: int = 64
    """Expert episodes to collect (tasks drawn from ``env.sampler``)."""
    epochs: int = 1
    """Passes over the collected rows."""
    batch_size: int = 16
    """Rows per optimizer step."""
    micro_batch_size: int = 8
    """Rows per forward/backward (gradient accumulation up to ``batch_size``)."""
    keep_lost: bool = False
    """Also train on expert episodes that did not win."""
    response_template: str = "<action>{action}</action>"
    """The target response of a turn; ``{action}`` is the expert action."""
    append_eos: bool = True
    """End the target response with the tokenizer's EOS (the chat template's end-of-turn)."""
    concurrency: int = 8
    """Expert episodes played at once while collecting."""
    expert_kwarg: str = "expert"
    """Env constructor kwarg that turns ``info["expert_action"]`` on ("" = the env always gives it)."""

    def __post_init__(self) -> None:
        if self.num_episodes < 1 or self.epochs < 1 or self.batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("sft.num_episodes, epochs, batch_size, micro_batch_size must be >= 1")
        if "{action}" not in self.response_template:
            raise ValueError("sft.response_template must contain {action}")


# ------------------------------------------------------------------------------------------------ config
def load_sft_config(overrides: list[str]) -> tuple[Config, SFTConfig]:
    """Split ``sft.*`` overrides from the training overrides; return both configs (``ConfigError`` on bad keys)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    sft_ov = [o.lstrip("+") for o in overrides if o.lstrip("+").startswith("sft.")]
    rest = [o for o in overrides if not o.lstrip("+").startswith("sft.")]
    if not any(o.split("=", 1)[0] == "algo" for o in rest):
        # the RL algorithm's preset must not set the SFT optimiser (TGRL's RL recipe warms the lr up over 10 steps):
        # SFT's optim.* are config.yaml's and the model preset's, unless given
        rest = ["algo=grpo", *rest]
    cfg = load_config(rest)
    if cfg.env.action_format != "text":  # the envs' experts answer in text commands, not in tool calls
        raise ConfigError("behaviour cloning needs env.action_format=text: the env experts give text commands, and "
                          "their tool-call form (docs/tools.md) is not written yet")
    try:
        node = OmegaConf.merge(OmegaConf.structured(SFTConfig),
                               OmegaConf.from_dotlist([o[len("sft."):] for o in sft_ov]))
        sft = OmegaConf.to_object(node)
    except (OmegaConfBaseException, ValueError) as exc:
        valid = ", ".join(f"sft.{k}" for k in SFTConfig.__dataclass_fields__)
        raise ConfigError(f"bad sft override ({exc}); valid keys: {valid}") from None
    assert isinstance(sft, SFTConfig)
    return cfg, sft


# ------------------------------------------------------------------------------------------------ collection
class _TokenizerOnly:
    """What ``RolloutOrchestrator`` needs of an engine to build prompts (no generation here)."""

    def __init__(self, tokenizer: Any, eos_ids: list[int]) -> None:
        self.tokenizer, self.eos_token_ids = tokenizer, eos_ids


def response_ids_for(tokenizer: Any, action: str, sft: SFTConfig) -> list[int]:
    """Token ids of the target response for ``action`` (template + optional EOS). The action is the env's text:
    encoded as data (a special token's string in it stays plain characters, ``agent_rl.rollout.prompts.format_ids``);
    the template's own text may hold control tokens."""
    from agent_rl.rollout.prompts import format_ids

    ids = format_ids(tokenizer, sft.response_template, action=action)
    if sft.append_eos and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids


async def collect_expert_episodes(cfg: Config, sft: SFTConfig, tokenizer: Any, pool: Any,
                                  tasks: list[Any]) -> tuple[list[Any], dict[str, float]]:
    """Play ``tasks`` with the env's expert through ``pool``; return (kept episodes, collection metrics).

    Every turn's prompt is built by the RL orchestrator's prompt builder from the same :class:`TurnContext` the
    orchestrator would build; ``Turn.response_ids`` is the rendered expert response (log-probs 0).

    Raises:
        RuntimeError: the env gives no ``info["expert_action"]`` (it has no expert, or ``sft.expert_kwarg`` is
            wrong), or every episode failed.
    """
    from agent_rl.rollout import RolloutOrchestrator, get_prompt
    from agent_rl.rollout.prompts import TurnContext
    from agent_rl.types import Episode, Turn

    prompt = get_prompt(cfg.env.prompt)
    eos = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    builder = RolloutOrchestrator(pool, _TokenizerOnly(tokenizer, eos), prompt, cfg.rollout,
                                  max_new_tokens=cfg.engine.max_new_tokens)
    rcfg = cfg.rollout
    sem = asyncio.Semaphore(max(1, sft.concurrency))

    async def play(task: Any) -> Episode:
        kwargs = dict(task.env_kwargs)
        if sft.expert_kwarg:
            kwargs[sft.expert_kwarg] = True
        async with sem:
            reset = await pool.reset(task.env_id, seed=task.seed, options=task.options, env_kwargs=kwargs)
            try:
                obs, info = reset.observation, dict(reset.info or {})
                ep = Episode(task=task, temperature=1.0, is_high=False, task_type=info.get("task_type"))
                task_text = prompt.task_text(obs, info)
                history: list[tuple[str, str]] = []
                prompt_ids: list[int] = []
                for k in range(rcfg.max_turns):
                    if "expert_action" not in info:
                        raise RuntimeError(f"env {task.env_id} gave no info['expert_action'] (made with {kwargs}); "
                                           "behaviour cloning needs an env expert")
                    admissible = info.get("admissible_actions") or info.get("admissible_commands")
                    ctx = TurnContext(task=task_text, observation=obs,
                                      admissible=list(admissible) if admissible else None,
                                      history=history[-rcfg.history_length:] if rcfg.history_length else [],
                                      step=k, info=info)
                    prompt_ids = builder.next_prompt(ctx, k, prompt_ids, ep.turns[-1] if ep.turns else None)
                    if len(prompt_ids) > rcfg.max_prompt_tokens:
                        break
                    action = str(info["expert_action"])
                    response = response_ids_for(tokenizer, action, sft)
                    step = await pool.step(reset.session_id, action)
                    ep.turns.append(Turn(prompt_ids=list(prompt_ids), response_ids=response,
                                         response_logprobs=[0.0] * len(response), action=action,
                                         observation=step.observation, reward=float(step.reward),
                                         terminated=bool(step.terminated), truncated=bool(step.truncated)))
                    history.append((obs, action))
                    obs, info = step.observation, dict(step.info or {})
                    if step.terminated or step.truncated:
                        break
                ep.reward = sum(t.reward for t in ep.turns)
                ep.won = bool(info.get("won", ep.reward > 0))
                return ep
            finally:
                try:
                    await pool.close(reset.session_id)
                except Exception:  # noqa: BLE001 (best effort; the server's TTL reaps leftovers)
                    pass

    episodes = await asyncio.gather(*(play(t) for t in tasks))
    won = [ep for ep in episodes if ep.won]
    kept = [ep for ep in episodes if ep.turns and (ep.won or sft.keep_lost)]
    metrics = {
        "collect/episodes": float(len(episodes)),
        "collect/success_rate": len(won) / max(len(episodes), 1),
        "collect/turns_mean": sum(len(ep.turns) for ep in episodes) / max(len(episodes), 1),
        "collect/kept_episodes": float(len(kept)),
    }
    if not kept:
        raise RuntimeError(f"no expert episode to train on ({len(episodes)} played, {len(won)} won)")
    return kept, metrics


# ------------------------------------------------------------------------------------------------ the loss
class BehaviourCloner:
    """Token cross-entropy on response tokens of a ``RolloutBatch``, with AdamW (the optimizer state is what a
    checkpoint saves as ``learner.pt``).

    Args:
        model: causal LM (moved to ``device``).
        optim: ``OptimConfig`` (lr, betas, eps, weight_decay, warmup, max_grad_norm).
        micro_batch_size: rows per forward.
    """

    def __init__(self, model: torch.nn.Module, optim: Any, *, micro_batch_size: int, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.optim_cfg = optim
        self.micro_batch_size = micro_batch_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                                           weight_decay=optim.weight_decay)
        from agent_rl.learner.learner import lr_scheduler

        self.scheduler = lr_scheduler(self.optimizer, optim.warmup)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """AdamW moments and step count from ``sd``; hyper-parameters and LR schedule from this run's ``optim``
        (``restore_optimizer``, as the RL learner)."""
        from agent_rl.learner.learner import restore_optimizer

        self.scheduler = restore_optimizer(self.optimizer, sd, self.optim_cfg)

    def _token_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) log-probs of the N response tokens of these rows at T = 1, and (N,) whether each is the argmax."""
        from agent_rl import algos
        from agent_rl.learner.learner import policy_trunk, response_positions

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
    def evaluate(self, batch: Any) -> dict[str, float]:
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

    def train_step(self, batch: Any, rows: torch.Tensor) -> dict[str, float]:
        """One optimizer step on ``rows`` of ``batch`` (loss = summed token NLL / tokens of all ``rows``)."""
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


# ------------------------------------------------------------------------------------------------ the run
async def _collect(cfg: Config, sft: SFTConfig, tokenizer: Any, out: Path) -> tuple[Any, dict[str, float]]:
    from agent_rl.rollout import TaskSampler, build_rollout_batch
    from agent_rl.train import open_env_pool

    sampler = TaskSampler(cfg.env.id, cfg.env.sampler, env_kwargs=cfg.env_kwargs, seed=cfg.trainer.seed)
    tasks = sampler.sample(sft.num_episodes)
    t0 = time.perf_counter()
    async with open_env_pool(cfg, out) as pool:
        episodes, metrics = await collect_expert_episodes(cfg, sft, tokenizer, pool, tasks)
    metrics["time/collect_s"] = time.perf_counter() - t0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return build_rollout_batch(episodes, pad_token_id=pad, mode=cfg.rollout.mode), metrics


def sft_loop(cfg: Config, sft: SFTConfig, out: Path) -> dict[str, Any]:
    """Collect (or reload) the rows, then train ``sft.epochs`` epochs; returns the summary dict."""
    from agent_rl.engines import set_torch_threads
    from agent_rl.learner.checkpoint import IncompleteCheckpoint, latest_checkpoint, load_checkpoint, save_checkpoint
    from agent_rl.logging import MetricsLogger
    from agent_rl.models import load_policy
    from agent_rl.train import prune_checkpoints, resolve_device, resume_path, seed_everything

    seed_everything(cfg.trainer.seed)
    set_torch_threads(cfg.engine.num_threads)
    model, tokenizer = load_policy(cfg.model)
    rows_file = out / "sft_rows.pt"
    if rows_file.is_file():
        saved = torch.load(rows_file, weights_only=False)
        batch, collect_metrics = saved["batch"], saved["metrics"]
        print(f"reusing the {batch.num_rows} rows of {rows_file}", file=sys.stderr)
    else:
        batch, collect_metrics = asyncio.run(_collect(cfg, sft, tokenizer, out))
        tmp = rows_file.with_suffix(".tmp")
        torch.save({"batch": batch, "metrics": collect_metrics}, tmp)
        tmp.replace(rows_file)
    print(f"expert episodes: {json.dumps(collect_metrics)}; rows: {batch.num_rows}", file=sys.stderr)

    cloner = BehaviourCloner(model, cfg.optim, micro_batch_size=sft.micro_batch_size,
                             device=resolve_device(cfg.trainer.device))
    per_epoch = math.ceil(batch.num_rows / sft.batch_size)
    total = per_epoch * sft.epochs
    start = 1
    ckpt = resume_path(cfg, out, latest_checkpoint)
    summary_file = out / "sft_summary.json"
    before = None
    if ckpt is not None:
        try:  # a missing learner.pt / rng.pt is refused unless trainer.resume_weights_only=true
            extra = load_checkpoint(ckpt, model, cloner, weights_only=cfg.trainer.resume_weights_only)
        except IncompleteCheckpoint as exc:
            raise ConfigError(str(exc)) from None
        if cfg.trainer.resume_weights_only:
            print("resume: trainer.resume_weights_only=true: the optimizer (AdamW moments) and the LR warm-up "
                  f"(optim.warmup={cfg.optim.warmup}) restart; weights and step from {ckpt}", file=sys.stderr)
        start = int(extra["step"]) + 1
        before = extra.get("loss_before")
        print(f"resumed from {ckpt} at step {start}", file=sys.stderr)
    if before is None:
        before = cloner.evaluate(batch)
    logger = MetricsLogger(out, total_steps=total, start_step=start, tensorboard=cfg.trainer.tensorboard,
                           progress=cfg.trainer.progress)
    try:
        for step in range(start, total + 1):
            t0 = time.perf_counter()
            metrics: dict[str, Any] = dict(cloner.train_step(batch, step_rows(batch.num_rows, sft.batch_size,
                                                                               cfg.trainer.seed, step)))
            metrics["sft/epoch"] = (step - 1) // per_epoch + 1
            metrics["time/step_s"] = time.perf_counter() - t0
            if step == 1:
                metrics.update(collect_metrics)
            logger.log(step, metrics, kind="sft")
            if step % cfg.trainer.save_every == 0 or step == total:
                save_checkpoint(out / "checkpoints" / f"step_{step}", model, tokenizer, cloner,
                                {"step": step, "loss_before": before, "kind": "sft"})
                prune_checkpoints(out / "checkpoints", cfg.trainer.keep_checkpoints)
    finally:
        logger.close()
    after = cloner.evaluate(batch)
    summary = {"rows": batch.num_rows, "steps": total, "loss_before": before["loss"], "loss_after": after["loss"],
               "token_acc_before": before["token_acc"], "token_acc_after": after["token_acc"],
               "response_tokens": after["tokens"], **collect_metrics,
               "checkpoint": str(latest_checkpoint(out) or ""), "sft": asdict(sft)}
    summary_file.write_text(json.dumps(summary, indent=1))
    print(f"action-token cross-entropy {before['loss']:.4f} -> {after['loss']:.4f} nats; token accuracy "
          f"{before['token_acc']:.3f} -> {after['token_acc']:.3f}; checkpoint {summary['checkpoint']}",
          file=sys.stderr)
    return summary


def main(overrides: list[str] | None = None) -> dict[str, Any]:
    """CLI/test entry point (like ``agent_rl.train.main``): compose, save ``DIR/config.yaml``, collect, train."""
    overrides = sys.argv[1:] if overrides is None else overrides
    if any(arg in ("-h", "--help") for arg in overrides):
        from agent_rl.train import usage

        print(__doc__)
        print("Config groups" + usage().split("Config groups", 1)[-1])
        print("sft.* keys: " + ", ".join(f"sft.{k}={v!r}" for k, v in asdict(SFTConfig()).items()))
        return {}
    cfg, sft = load_sft_config(overrides)
    from omegaconf import OmegaConf

    name = f"{cfg.env.name}-sft-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(cfg.trainer.output_dir or Path("runs") / name).resolve()
    if not cfg.trainer.resume and (any((out / "checkpoints").glob("step_*")) or
                                   (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size):
        raise ConfigError(f"trainer.output_dir={out} already holds a run (metrics.jsonl / checkpoints); add "
                          "trainer.resume=auto to continue it, or choose a new trainer.output_dir")
    out.mkdir(parents=True, exist_ok=True)
    cfg.trainer.output_dir = str(out)
    if cfg.data.root:
        import os

        os.environ["AGENT_RL_DATA"] = cfg.data.root
    text = to_yaml(cfg) + OmegaConf.to_yaml({"sft": asdict(sft)})
    print(text, file=sys.stderr)
    (out / "config.yaml").write_text(text, encoding="utf-8")
    return sft_loop(cfg, sft, out)


def cli() -> None:
    try:
        main()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
