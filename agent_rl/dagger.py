"""DAgger rounds of the warm start (``trainer.warm_start=dagger``, docs/training.md "Warm start").

Behaviour cloning trains on the expert's states only; the cloned policy drifts to states no demonstration visited
and has never seen the right action there. DAgger (Ross, Gordon and Bagnell 2011, "A Reduction of Imitation
Learning and Structured Prediction to No-Regret Online Learning", Algorithm 3.1) plays the policy, asks the expert
what it would have done in every state the policy reached, adds those labels to the data and clones again:

- **Round 0** is :mod:`agent_rl.sft`'s behaviour cloning: ``sft.num_episodes`` expert episodes, ``sft.epochs`` over
  their rows (the RL rows, ``rollout.mode``).
- **Round i >= 1** draws ``sft.dagger_episodes`` train-split tasks (after round 0's and the earlier rounds', from
  the run's sampler) and plays them with the mixture pi_i = beta_i pi* + (1 - beta_i) pi_hat_i, beta_i = p**i
  (``sft.dagger_beta`` = p, the paper's section 3 schedule), mixed per episode: the first
  :func:`expert_episode_count` of the round's tasks are played by the expert, the others by the current policy
  (the engine at ``sft.dagger_temperature``, 0 = greedy). Every turn of every episode is labelled with the
  expert's action for the state the turn acted on (``info["expert_action"]`` of the reset, then of the previous
  step; :func:`label_turns`); a label the expert gave up on (``EnvFamily.expert_gave_up``: ALFWorld's ``look``
  fallback) is dropped and counted (``dagger/labels_dropped``). The round then trains ``sft.dagger_steps``
  optimizer steps of ``sft.batch_size`` rows over the aggregate (round 0's rows and every round's labels so far).
- **A label's row** is per turn in either ``rollout.mode``: the prompt is the turn's own prompt as the policy saw it
  (per-turn mode: the env's messages; trajectory mode: the whole history, the policy's own earlier responses and
  the env's answers to them), the target the expert's action rendered as behaviour cloning renders it
  (``sft.response_template`` + EOS, :func:`agent_rl.sft.response_ids_for`). A trajectory row cannot hold the
  expert's action as the target of a turn whose context continues with the policy's action, hence one row a turn.

Each round is one call of the training loop (its steps continue the warm start's counter; its last step is
checkpointed and followed by the warm start's panel when ``trainer.eval_every`` > 0). A round's labelled rows are
saved (``DIR/checkpoints/warm_start/rows_round_<i>.pt``) before it trains, and every checkpoint's ``extra.json``
names its round (``dagger``), so a run killed in the middle of a round resumes it: labelling again from the previous
round's last checkpoint when its rows were not saved yet, training on from the latest checkpoint when they were.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from agent_rl.config.schema import Config, ConfigError
from agent_rl.envclient import EnvPoolBase, pool_caps
from agent_rl.learner.checkpoint import IncompleteCheckpoint, load_checkpoint
from agent_rl.lora import base_module
from agent_rl.rollout import GroupSpec, RolloutResult, build_rollout_batch
from agent_rl.rollout.policies import ExpertPolicy
from agent_rl.rollout.schedule import ExpertRows
from agent_rl.rollout.samplers import make_task_sampler
from agent_rl.runtime import build_engine, build_orchestrator, open_env_pool, pad_token_id
from agent_rl.sft import BehaviourCloningBackend, response_ids_for, step_rows
from agent_rl.types import Episode, RolloutBatch, Task, Turn
from envs.families import describe

#: the ``extra.json`` key naming a warm-start checkpoint's round: ``{"round", "first_step", "last_step"}``
EXTRA_KEY = "dagger"


# ------------------------------------------------------------------------------------------------ the schedule
def beta(p: float, round_index: int) -> float:
    """The expert's share beta_i = p**i of round ``round_index`` (Ross et al. 2011, section 3; round 0: 1, the
    expert's own episodes)."""
    return float(p) ** round_index


def expert_episode_count(p: float, round_index: int, episodes: int) -> int:
    """Episodes of round ``round_index`` played by the expert: beta_i x ``episodes`` rounded half up (p=0.5, 8
    episodes: round 1 -> 4, round 2 -> 2, round 3 -> 1, round 4 -> 1 (0.5 rounds up), round 5 -> 0)."""
    return min(episodes, math.floor(beta(p, round_index) * episodes + 0.5))


def round_tasks(cfg: Config, round_index: int) -> list[Task]:
    """The tasks of round ``round_index`` (>= 1): the run's sampler (``env.tasks`` / ``env.sampler``, seeded by
    ``trainer.seed``, no curriculum) past round 0's ``sft.num_episodes`` and the earlier rounds'
    ``sft.dagger_episodes`` each (a pure function of the config: a resumed round draws the same tasks)."""
    s = cfg.sft
    sampler = make_task_sampler(cfg, announce=lambda text: None, curriculum=False)
    return sampler.sample(s.num_episodes + round_index * s.dagger_episodes)[-s.dagger_episodes:]


# ------------------------------------------------------------------------------------------------ labels
def task_key(seed: int | None, options: dict[str, Any] | None) -> str:
    """The key of a reset (a task's seed and options) in :class:`ResetLabels`."""
    return json.dumps([seed, options or {}], sort_keys=True, default=str)


class ResetLabels(EnvPoolBase):
    """An env pool that records the expert's action for each reset state (``info["expert_action"]`` of the reset,
    by :func:`task_key`): the label of an episode's first turn, which no :class:`~agent_rl.types.Turn` holds (each
    turn's ``info`` is the env's answer to it, the state of the next turn). Every other call is the wrapped pool's
    (the snapshot ones only where its ``caps`` declare them)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.caps = pool_caps(pool)  # the wrapped pool's declared capabilities (snapshots)
        self.first: dict[str, str | None] = {}

    async def reset(self, env_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None,
                    env_kwargs: dict[str, Any] | None = None) -> Any:
        result = await self.pool.reset(env_id, seed=seed, options=options, env_kwargs=env_kwargs)
        self.first[task_key(seed, options)] = dict(result.info or {}).get("expert_action")
        return result

    async def step(self, session_id: str, action: str) -> Any:
        return await self.pool.step(session_id, action)

    async def close(self, session_id: str) -> None:
        await self.pool.close(session_id)

    async def snapshot(self, session_id: str) -> str:
        return await self.pool.snapshot(session_id)

    async def restore(self, snapshot_id: str) -> Any:
        return await self.pool.restore(snapshot_id)

    async def drop_snapshot(self, snapshot_id: str) -> None:
        await self.pool.drop_snapshot(snapshot_id)

    async def aclose(self) -> None:
        await self.pool.aclose()


def label_turns(episodes: Sequence[Episode], first_labels: dict[str, str | None],
                gave_up: str = "") -> tuple[list[tuple[list[int], str]], dict[str, float]]:
    """The expert's label of every turn of ``episodes``: ``([(prompt_ids, expert action)], counts)``.

    Turn k acted on the state the env reached after turn k-1, so its label is ``turns[k-1].info["expert_action"]``;
    turn 0's is the reset's (``first_labels[task_key(seed, options)]``, :class:`ResetLabels`). A label equal to
    ``gave_up`` (the expert had no action: ALFWorld's ``look`` fallback) is dropped. ``counts``:
    ``dagger/labels`` (kept), ``dagger/labels_dropped`` (gave up), ``dagger/labels_agree`` (kept labels equal to
    the action the episode played).

    Raises:
        RuntimeError: a state without ``info["expert_action"]`` (the env was not made with its expert kwarg).
    """
    pairs: list[tuple[list[int], str]] = []
    dropped = agree = 0
    for ep in episodes:
        label = first_labels.get(task_key(ep.task.seed, ep.task.options))
        for k, turn in enumerate(ep.turns):
            if k > 0:
                label = ep.turns[k - 1].info.get("expert_action")
            if label is None:
                raise RuntimeError(f"env {ep.task.env_id} gave no info['expert_action'] for turn {k} (made with "
                                   f"{ep.task.env_kwargs}): DAgger needs the expert's label of every state")
            if gave_up and label == gave_up:
                dropped += 1
                continue
            pairs.append((list(turn.prompt_ids), str(label)))
            agree += label == turn.action
    return pairs, {"dagger/labels": float(len(pairs)), "dagger/labels_dropped": float(dropped),
                   "dagger/labels_agree": float(agree)}


def label_rows(pairs: Sequence[tuple[list[int], str]], tokenizer: Any, cfg: Config) -> RolloutBatch:
    """One per-turn row per label: the turn's prompt, the expert action rendered as the target
    (:func:`agent_rl.sft.response_ids_for`), through ``build_rollout_batch`` (the one place rows are made)."""
    episodes = []
    for i, (prompt, action) in enumerate(pairs):
        ids = response_ids_for(tokenizer, action, cfg.sft)
        turn = Turn(prompt_ids=list(prompt), response_ids=ids, response_logprobs=[0.0] * len(ids), action=action)
        episodes.append(Episode(task=Task(env_id=cfg.env.id, group_id=i), temperature=1.0, is_high=False,
                                turns=[turn]))
    return build_rollout_batch(episodes, pad_token_id=pad_token_id(tokenizer), mode="turn")


def stack_rows(batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    """The rows of ``batches`` in one batch (right-padded to the longest, L = max L_j): row fields (B_j, ...) are
    concatenated, ``group_index``/``episode_index`` offset past the earlier batches' groups and episodes, the
    per-episode fields (E_j,) concatenated; ``extras`` dropped (cloning reads ids and masks only)."""
    length = max(b.input_ids.shape[1] for b in batches)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:  # (B_j, L_j) -> (B_j, L)
        return F.pad(t, (0, length - t.shape[1]), value=value)

    fields: dict[str, list[torch.Tensor]] = {}
    groups = episodes = 0
    for b in batches:
        parts = {"input_ids": pad(b.input_ids, pad_id), "attention_mask": pad(b.attention_mask, 0),
                 "response_mask": pad(b.response_mask, 0), "engine_logprobs": pad(b.engine_logprobs, 0),
                 "temperature": b.temperature, "group_index": b.group_index + groups,
                 "episode_index": b.episode_index + episodes, "is_high": b.is_high, "turn_index": b.turn_index,
                 "num_turns": b.num_turns, "rewards": b.rewards, "episode_rewards": b.episode_rewards,
                 "episode_group_index": b.episode_group_index + groups, "episode_is_high": b.episode_is_high}
        versions = b.policy_versions if b.policy_versions is not None else torch.zeros_like(b.input_ids)
        parts["policy_versions"] = pad(versions, -1)
        for name, value in parts.items():
            fields.setdefault(name, []).append(value)
        groups += int(b.episode_group_index.max()) + 1 if b.episode_group_index.numel() else 0
        episodes += int(b.episode_rewards.shape[0])
    return RolloutBatch(**{name: torch.cat(values) for name, values in fields.items()})


async def play_round(cfg: Config, pool: Any, engine: Any, tokenizer: Any, round_index: int,
                     progress: Any = None) -> tuple[list[tuple[list[int], str]], dict[str, float]]:
    """Play round ``round_index``'s tasks (:func:`round_tasks`; the first :func:`expert_episode_count` with the
    expert, the others with ``engine`` at ``sft.dagger_temperature``) and label every turn (:func:`label_turns`).
    Returns the labels and the round's numbers (``dagger/*``: episodes, expert episodes, beta, the policy's
    episodes won, labels kept and dropped, time)."""
    s = cfg.sft
    family = describe(cfg.env.id, cfg.env.name)
    kwarg = family.expert_kwarg if s.expert_kwarg is None else s.expert_kwarg
    tasks = [dataclasses.replace(t, env_kwargs={**t.env_kwargs, **({kwarg: True} if kwarg else {})})
             for t in round_tasks(cfg, round_index)]
    n_expert = expert_episode_count(s.dagger_beta, round_index, len(tasks))
    labelled = ResetLabels(pool)
    t0 = time.perf_counter()
    on_turn = (lambda gen: progress.turn(len(gen.token_ids))) if progress is not None else None
    on_episode = (lambda ep: progress.episode(ep.won)) if progress is not None else None
    rollout = dataclasses.replace(cfg.rollout, max_concurrent_episodes=max(1, s.concurrency))
    played: dict[bool, list[Episode]] = {True: [], False: []}  # by the expert?
    dropped_groups, failures = 0, []
    for by_expert, group in ((True, tasks[:n_expert]), (False, tasks[n_expert:])):
        if not group:
            continue
        policy = ExpertPolicy(render=lambda a: response_ids_for(tokenizer, a, s)) if by_expert else None
        orch = build_orchestrator(cfg, labelled, engine, rollout=rollout, policy=policy, on_turn=on_turn,
                                  on_episode=on_episode)
        temperature = 1.0 if by_expert else s.dagger_temperature
        try:
            result = await orch.run_groups([GroupSpec(t, [(temperature, False)]) for t in group], seed_key=round_index)
        finally:
            await orch.aclose()
        played[by_expert] += result.episodes
        dropped_groups += result.dropped_groups
        failures += result.failures
    if dropped_groups:  # after the orchestrator's retries: reported, not labelled
        print(f"warning: DAgger round {round_index}: {dropped_groups} episode(s) failed and are not labelled; first "
              f"reason: {failures[0]}", file=sys.stderr)
    pairs, counts = label_turns(played[True] + played[False], labelled.first, family.expert_gave_up)
    own = played[False]
    metrics = {"dagger/episodes": float(len(tasks)), "dagger/expert_episodes": float(n_expert),
               "dagger/beta": beta(s.dagger_beta, round_index), "dagger/episodes_failed": float(dropped_groups),
               "dagger/policy_success": sum(ep.won for ep in own) / max(len(own), 1),
               "dagger/turns": float(sum(len(ep.turns) for ep in played[True] + played[False])), **counts,
               "time/label_s": time.perf_counter() - t0}
    return pairs, metrics


# ------------------------------------------------------------------------------------------------ the backend
class DAggerBackend(BehaviourCloningBackend):
    """The warm start's rounds on the loop: round 0 is :class:`BehaviourCloningBackend` (the expert's rows,
    ``sft.epochs``); round i >= 1 (:attr:`round`, set before each loop call) restores the previous checkpoint,
    plays and labels its episodes (or reloads ``rows_round_<i>.pt``), and trains ``sft.dagger_steps`` steps over
    the aggregate. Each round's steps continue the warm start's counter: round i ends at step K0 + i x
    ``sft.dagger_steps`` (K0: round 0's steps). Every ``sft`` row holds ``round``; a round's first row its
    ``dagger/*`` numbers."""

    def __init__(self, cfg: Config, out: Path, progress: Any, config_file: Path | None = None, *,
                 rows_file: Path, **kwargs: Any) -> None:
        super().__init__(cfg, out, progress, config_file, rows_file=rows_file, **kwargs)
        self.round = 0
        self.rounds = 1 + (cfg.sft.dagger_rounds if cfg.trainer.warm_start == "dagger" else 0)
        self.round0_steps = 0
        self.round_metrics: dict[str, float] = {}
        self._round0: RolloutBatch | None = None

    def round_file(self, round_index: int) -> Path:
        return self.rows_file.with_name(f"rows_round_{round_index}.pt")

    def first_step(self, round_index: int) -> int:
        return 1 if round_index == 0 else self.round0_steps + (round_index - 1) * self.sft.dagger_steps + 1

    def last_step(self, round_index: int) -> int:
        return self.round0_steps + round_index * self.sft.dagger_steps

    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        if self._round0 is None:  # round 0's rows (collected once, rows.pt) fix K0, the steps of round 0
            extra = await super().start(ckpt if self.round == 0 else None)
            self._round0, self.round0_steps = self.batch, self.total_steps
            if self.round == 0:
                return extra
        if ckpt is None:
            raise ConfigError(f"DAgger round {self.round} starts from round {self.round - 1}'s checkpoint, and "
                              f"{self.rows_file.parent} holds none")
        try:
            extra = await asyncio.to_thread(load_checkpoint, ckpt, self.model, self.cloner,
                                            weights_only=self.cfg.trainer.resume_weights_only)
        except IncompleteCheckpoint as exc:
            raise ConfigError(str(exc)) from None
        batches = [self._round0]
        for r in range(1, self.round + 1):
            batches.append(await self._labels(r))
        self.batch = stack_rows(batches, pad_token_id(self.tokenizer))
        self.total_steps = self.last_step(self.round)
        return extra

    async def _labels(self, round_index: int) -> RolloutBatch:
        """Round ``round_index``'s labelled rows: ``rows_round_<i>.pt`` when saved, else played now (the current
        weights: the previous round's last checkpoint) and saved."""
        path = self.round_file(round_index)
        if path.is_file():
            saved = await asyncio.to_thread(torch.load, path, weights_only=False)
            if round_index == self.round:
                self.round_metrics = saved["metrics"]
                print(f"reusing the {saved['batch'].num_rows} labelled rows of {path}", file=sys.stderr)
            return saved["batch"]
        if round_index != self.round:
            raise RuntimeError(f"{path} (DAgger round {round_index}'s labels) is missing; round {self.round} needs it")
        self.progress.phase(f"warm start {round_index + 1}/{self.rounds}: label", total=self.sft.dagger_episodes)
        await self._open_player()
        self.engine.sync_weights(base_module(self.model))
        self._synced = True
        pairs, self.round_metrics = await play_round(self.cfg, self.pool, self.engine, self.tokenizer, round_index,
                                                     self.progress)
        self.progress.end()
        if not pairs:
            raise RuntimeError(f"DAgger round {round_index}: no label to train on "
                               f"({json.dumps(self.round_metrics)})")
        batch = label_rows(pairs, self.tokenizer, self.cfg)
        tmp = path.with_suffix(".tmp")
        await asyncio.to_thread(torch.save, {"batch": batch, "metrics": self.round_metrics}, tmp)
        tmp.replace(path)
        m = self.round_metrics
        print(f"DAgger round {round_index}: {int(m['dagger/episodes'])} episode(s) ({int(m['dagger/expert_episodes'])}"
              f" by the expert, beta {m['dagger/beta']:.3g}), policy won {m['dagger/policy_success']:.0%}; "
              f"{int(m['dagger/labels'])} label(s), {int(m['dagger/labels_dropped'])} dropped (the expert gave up), "
              f"{int(m['dagger/labels_agree'])} equal to the played action", file=sys.stderr)
        return batch

    async def _open_player(self) -> None:
        if self.pool is None:
            self._pool_cm = open_env_pool(self.cfg, self.out)
            self.pool = await self._pool_cm.__aenter__()
        if self.engine is None:
            self.engine = build_engine(self.cfg, base_module(self.model), self.tokenizer)

    async def open(self) -> ExpertRows:
        if self.cfg.trainer.eval_every > 0:
            await self._open_player()
        return ExpertRows(self.rows)

    def rows(self, step: int) -> RolloutResult:
        assert self.batch is not None
        if self.round == 0:
            result = super().rows(step)
        else:  # the aggregate, a permutation per round (seeded by (trainer.seed, round)) in slices of batch_size
            first = self.first_step(self.round)
            rows = step_rows(self.batch.num_rows, self.sft.batch_size, self.cfg.trainer.seed * 1000 + self.round,
                             step - first + 1)
            metrics = {"sft/rows_aggregate": float(self.batch.num_rows)}
            if step == first:
                metrics.update(self.round_metrics)
            result = RolloutResult(episodes=[], metrics=metrics, batch=self.batch.select_rows(rows))
        result.metrics["round"] = self.round
        return result

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        r = self.round
        await super().save(path, {**extra, EXTRA_KEY: {"round": r, "first_step": self.first_step(r),
                                                       "last_step": self.last_step(r)}})

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            self.pool = self.engine = self._pool_cm = None
