"""The few types everything on the trainer side passes around (data flow: docs/training.md).

Dimension glossary, the one used in every docstring of the package (``agent_rl.algos`` included):
    B  rows (one per turn in per-turn mode, one per episode in full-trajectory mode)
    L  padded row length (prompt + response tokens)
    T  response-token axis of a (B, T) tensor; in the learner T == L (prompt and padding carry response_mask 0)
    E  episodes, G group size (episodes of one task), K turns of an episode
    V  vocabulary size, N flattened (masked) tokens, d hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Task:
    """One task instance: env id + options that select it (split/index/goal id), and the group it belongs to."""

    env_id: str
    options: dict[str, Any] = field(default_factory=dict)
    group_id: int = 0
    seed: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    index: int | None = None
    """The task's position in the run's task list (``env.tasks`` rows, ``env.sampler.kind=index``); None for
    seed-drawn tasks. The curriculum's key (``agent_rl.rollout.samplers.PassRateSampler``)."""


@dataclass
class Generation:
    """What an engine returns for one prompt: the sampled ids exactly as sampled, their log-probs at the sampling
    temperature (natural log), and why generation stopped (``"stop"`` on EOS/stop string, ``"length"``).
    ``cached_tokens``: how many of the prompt's tokens the engine took from a cache instead of computing them (hf:
    the episode's earlier turns, ``engine.kv_reuse``; vLLM: its prefix cache); 0 when unknown."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    cached_tokens: int = 0
    policy_version: int | None = None
    """The version of the weights that sampled it (algorithms.md section 7, "Versions"), stamped by an engine that
    knows it (:class:`agent_rl.engines.VersionedEngine`); None: the orchestrator's current version."""


@dataclass
class Turn:
    """One agent turn: the prompt ids the engine saw, the response ids it sampled (never re-tokenised), their
    engine log-probs, the parsed action and the env's reply."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    action: str
    observation: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    invalid: bool = False
    response_truncated: bool = False
    policy_version: int = 0
    """The policy version v that sampled the response tokens: the number of completed RL steps whose weights the
    engine held when the turn's generation started (algorithms.md section 7; a synchronous run's step s: s - 1)."""
    segment: int = 0
    """The segment of its episode the turn belongs to: 0, but for a gateway episode (``agent_rl.gateway``) whose
    program rewrote its history, where each request that did not extend the conversation starts the next one (a
    field of its own, never read from ``info``, which the env writes)."""


@dataclass(frozen=True)
class ForkOrigin:
    """Where a forked sibling (``rollout.fork``) starts: its base is the episode of slot ``base_slot`` of
    its group; turns ``0..turn-1`` replayed the base's actions (copies of the base's turns: never trained on the
    sibling), turns ``turn..`` were sampled."""

    base_slot: int
    turn: int


@dataclass
class Episode:
    """A finished (or failed) episode of one task at one temperature (``fork``: set on a forked sibling)."""

    task: Task
    temperature: float
    is_high: bool
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    won: bool = False
    task_type: str | None = None
    failure: str | None = None  # reason if the episode failed (env error after retries); never trained on
    fork: ForkOrigin | None = None


@dataclass
class RolloutBatch:
    """Padded tensors built from episodes by ``agent_rl.rollout.build_rollout_batch`` (one place).

    Attributes (all on CPU until the learner moves them):
        input_ids: (B, L) long, prompt + response ids, right-padded with the pad id.
        attention_mask: (B, L) long 0/1.
        response_mask: (B, L) float 0/1, 1 on response (action) tokens that are trained; prompt, padding and (in
            full-trajectory mode) observation tokens are 0.
        engine_logprobs: (B, L) float, the engine's log-probs of each response token at the row's temperature,
            aligned with ``input_ids`` (0 where response_mask is 0).
        temperature: (B,) float, the temperature the row was sampled at.
        group_index: (B,) long, rows of the same group (same task) share it.
        episode_index: (B,) long, rows of the same episode share it.
        is_high: (B,) bool, sampled at the high temperature (TGRL).
        turn_index: (B,) long, 0-based turn of the row in its episode (full-trajectory mode: the row's segment, 0
            but for a gateway episode that rewrote its history, ``agent_rl.rollout.batch.segments``).
        num_turns: (B,) long, number of turns K of the row's episode (full-trajectory mode: its rows, 1 but for
            such a gateway episode; turn-level credit sees no turns inside a row).
        rewards: (B,) float, the episode reward broadcast to every row of the episode.
        episode_rewards: (E,) float, one per episode (E episodes), and ``episode_group_index`` (E,),
            ``episode_is_high`` (E,) bool, for group statistics computed per episode rather than per row.
        policy_versions: (B, L) long, the policy version that sampled each response token (``Turn.policy_version``),
            -1 where ``response_mask`` is 0; None only in batches made by hand (treat as version 0 everywhere).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    engine_logprobs: torch.Tensor
    temperature: torch.Tensor
    group_index: torch.Tensor
    episode_index: torch.Tensor
    is_high: torch.Tensor
    turn_index: torch.Tensor
    num_turns: torch.Tensor
    rewards: torch.Tensor
    episode_rewards: torch.Tensor
    episode_group_index: torch.Tensor
    episode_is_high: torch.Tensor
    policy_versions: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: str | torch.device) -> "RolloutBatch":
        """A copy on ``device`` with the learner's dtypes (``is_high``/``episode_is_high`` bool, ``temperature``
        float32); tensor ``extras`` move too, other extras are kept as they are."""
        moved: dict[str, Any] = {f: getattr(self, f).to(device) for f in _TENSOR_FIELDS}
        moved["policy_versions"] = None if self.policy_versions is None else self.policy_versions.to(device)
        moved["is_high"] = moved["is_high"].bool()
        moved["episode_is_high"] = moved["episode_is_high"].bool()
        moved["temperature"] = moved["temperature"].float()
        extras = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in (self.extras or {}).items()}
        return RolloutBatch(**moved, extras=extras)

    def select_rows(self, rows: torch.Tensor) -> "RolloutBatch":
        """Rows ``rows`` ((b,) long, in that order) of this batch. The per-episode tensors (``episode_*``, (E,)) and
        ``episode_*`` extras stay whole, so ``episode_index`` keeps pointing into them; row-sized tensor extras are
        sliced with the rows."""
        n = self.num_rows
        out = {f: getattr(self, f) if f.startswith("episode_") and f != "episode_index" else getattr(self, f)[rows]
               for f in _TENSOR_FIELDS}
        out["policy_versions"] = None if self.policy_versions is None else self.policy_versions[rows]
        extras = {k: v[rows] if isinstance(v, torch.Tensor) and not k.startswith("episode_") and v.dim() >= 1
                  and v.shape[0] == n else v for k, v in (self.extras or {}).items()}
        return RolloutBatch(**out, extras=extras)

    @property
    def won(self) -> torch.Tensor | None:
        """(B,) bool, the row's episode was won (``extras["episode_won"]`` (E,) broadcast, or ``extras["won"]``
        (B,)); None when the batch does not say (success is then ``reward > 0``)."""
        ex = self.extras or {}
        if ex.get("episode_won") is not None:
            return torch.as_tensor(ex["episode_won"], device=self.episode_index.device).bool()[self.episode_index]
        if ex.get("won") is not None:
            return torch.as_tensor(ex["won"], device=self.episode_index.device).bool()
        return None

    @property
    def obs_key(self) -> torch.Tensor | None:
        """(B,) long key of the observation each turn row acted on (``extras["obs_key"]``, per-turn mode), or None."""
        key = (self.extras or {}).get("obs_key")
        return None if key is None else torch.as_tensor(key, device=self.episode_index.device).long()


_TENSOR_FIELDS = ("input_ids", "attention_mask", "response_mask", "engine_logprobs", "temperature", "group_index",
                  "episode_index", "is_high", "turn_index", "num_turns", "rewards", "episode_rewards",
                  "episode_group_index", "episode_is_high")


def fork_base_indices(episodes: list[Any]) -> dict[int, int]:
    """Index of each forked sibling's base episode in ``episodes`` (the ``fork.base_slot``-th episode without
    ``fork`` of the sibling's group); siblings whose base is missing are left out."""
    bases: dict[int, list[int]] = {}
    for e, ep in enumerate(episodes):
        if getattr(ep, "fork", None) is None:
            bases.setdefault(int(ep.task.group_id), []).append(e)
    out: dict[int, int] = {}
    for e, ep in enumerate(episodes):
        fork = getattr(ep, "fork", None)
        slots = bases.get(int(ep.task.group_id), []) if fork is not None else []
        if fork is not None and 0 <= fork.base_slot < len(slots):
            out[e] = slots[fork.base_slot]
    return out
