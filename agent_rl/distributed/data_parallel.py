"""Data-parallel learner ranks: torch.distributed process group + torch DDP, batch sharding by whole groups.

Loss normalisation (why N ranks give the single learner's update)
-----------------------------------------------------------------
A single learner's mini-batch loss is ``sum_tokens(l) / D`` with ``D = algos.agg_denominator`` of the whole
mini-batch (``token_mean``: its trained tokens; ``seq_mean_token_mean``: its rows with a trained token;
``seq_mean_token_sum_norm``: its rows, with the batch-wide ``L_max``). Rank r holds the groups ``S_r`` of that
mini-batch, so the single learner's gradient is ``g = sum_r G_r / D`` with ``G_r = grad sum_{S_r}(l)``.

DDP **averages** gradients over the N ranks. Each rank therefore divides its loss by ``D / N``, where
``D = all_reduce_sum(D_r)`` is the global denominator (one all-reduce of a scalar per mini-batch): the DDP average
``(1/N) sum_r G_r / (D/N) = sum_r G_r / D = g``. ``L_max`` (Dr.GRPO) is all-reduced with MAX once per update.
The gradient clip then runs on the averaged gradient (identical on every rank), AdamW steps identically, and the
ranks stay bit-for-bit in step (DDP broadcasts rank 0's parameters when it is built).

Gradient accumulation: the learner's micro-batch backward passes run on the plain module, so DDP's reducer is not
armed and gradients accumulate locally (DDP's ``no_sync`` semantics); :meth:`DataParallel.sync_gradients` then runs
one DDP forward/backward of ``0 * sum(p)`` over every trainable parameter, which makes the DDP reducer all-reduce
(bucketed, averaged) the accumulated ``.grad`` of every parameter: torch's own DDP does the communication.

Exact for every estimator whose statistics live inside a group (GRPO, RLOO, Dr.GRPO, TGRL's per-trajectory JS
weights, GiGPO): groups never straddle ranks. Batch-wide statistics are per rank (an approximation, as in other
DP trainers): PPO's GAE whitening and the ``forking`` credit rule's entropy quantile. With
``algo.num_mini_batches = k > 1`` each rank deals its own groups into ``k`` chunks (the global mini-batch i is the
union of the ranks' chunks i): a partition of whole groups drawn differently from the single learner's shuffle.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from agent_rl.types import RolloutBatch


class _AllParams(nn.Module):
    """The trainable modules of a learner, with a forward ``0 * sum(p)`` that touches every trainable parameter."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)

    def forward(self) -> Tensor:  # noqa: D102
        params = [p for p in self.parameters() if p.requires_grad]
        return sum((p * 0).sum() for p in params) if params else torch.zeros(())


class RankCollectives:
    """The scalar collectives the learner's loss normalisation needs from one of ``world_size`` ranks (the default
    process group must be initialised): shared by :class:`DataParallel` (DDP) and
    :class:`agent_rl.distributed.fsdp.FullyShardedDataParallel`.

    ``lockstep``: whether the learner must run the same number of forward / backward passes on every rank (FSDP's
    all-gathers are collective; DDP's micro-batches run on the plain module and need not).
    """

    lockstep = False

    def __init__(self, device: torch.device) -> None:
        if not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} needs torch.distributed.init_process_group first")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.device = device

    def global_denominator(self, den: Tensor) -> Tensor:
        """``all_reduce_sum(den) / world_size`` (0-dim float tensor): a rank's loss divided by it, averaged over the
        ranks by the gradient reduction, is the global mini-batch loss (module docstring)."""
        t = den.detach().float().reshape(()).clone().to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.world_size

    def global_max(self, value: int) -> int:
        """Max of an int over the ranks (the batch-wide ``L_max`` of Dr.GRPO)."""
        t = torch.tensor(float(value), device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def global_min(self, value: int) -> int:
        """Min of an int over the ranks (the number of mini-batches every rank can form: all ranks must run the
        same number of optimiser steps, or the gradient all-reduces would pair up wrongly and hang)."""
        return -self.global_max(-value)


class DataParallel(RankCollectives):
    """The hooks a :class:`agent_rl.learner.Learner` calls when it is one of ``world_size`` ranks
    (``learner.data_parallel = DataParallel(learner)``). The default process group must be initialised.

    Args:
        learner: the rank's learner; its policy (and value head) are wrapped in one torch DDP module, which
            broadcasts rank 0's parameters to every rank at construction.
    """

    def __init__(self, learner: Any) -> None:
        super().__init__(torch.device(learner.device))
        modules = [learner.model] + ([learner.value_head] if getattr(learner, "value_head", None) is not None else [])
        device = self.device
        ddp = nn.parallel.DistributedDataParallel
        # buffers (rotary tables) are equal on every rank and never trained: no per-forward buffer broadcast
        no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(ddp).parameters
                          else {"broadcast_buffers": False})
        self.ddp = ddp(_AllParams(modules), device_ids=[device.index or 0] if device.type == "cuda" else None,
                       **no_buffer_sync)

    def sync_gradients(self) -> None:
        """Average the accumulated ``.grad`` of every trainable parameter over the ranks through DDP's reducer."""
        self.ddp().backward()


# ------------------------------------------------------------------------------------------------ batches
def take_shard(batch: RolloutBatch, rows: Tensor, episodes: Tensor) -> RolloutBatch:
    """Rows ``rows`` (ascending, (b,) long) of ``batch`` whose episodes are exactly ``episodes`` (ascending, (e,)
    long), episodes renumbered 0..e-1 in that order: one entry of :func:`shard_indices` as a batch."""
    remap = torch.full((batch.episode_rewards.shape[0],), -1, dtype=torch.long)
    remap[episodes] = torch.arange(episodes.numel())
    n_rows, n_eps = batch.num_rows, batch.episode_rewards.shape[0]
    out: dict[str, Any] = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if f.name == "extras":
            continue
        if v is None:  # an optional per-token tensor that is not set (policy_versions of a hand-made batch)
            out[f.name] = None
        elif f.name.startswith("episode_") and f.name != "episode_index":
            out[f.name] = v[episodes]
        elif f.name == "episode_index":
            out[f.name] = remap[v[rows]]
        else:
            out[f.name] = v[rows]
    extras: dict[str, Any] = {}
    for k, v in (batch.extras or {}).items():
        t = v if isinstance(v, Tensor) else None
        if t is not None and t.dim() >= 1 and k.startswith("episode_") and t.shape[0] == n_eps:
            extras[k] = t[episodes]
        elif t is not None and t.dim() >= 1 and t.shape[0] == n_rows:
            extras[k] = t[rows]
        else:
            extras[k] = v
    return RolloutBatch(**out, extras=extras)


def shard_indices(batch: RolloutBatch, num_shards: int) -> list[tuple[Tensor, Tensor]]:
    """``(rows, episodes)`` of each shard (ascending index tensors into ``batch``): whole groups dealt round-robin in
    first-appearance order, so shard sizes differ by at most one group.

    Raises:
        ValueError: ``num_shards < 1`` or fewer groups than shards (a rank would have nothing to train on).
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    groups = list(dict.fromkeys(batch.group_index.tolist()))
    if len(groups) < num_shards:
        raise ValueError(f"{len(groups)} group(s) cannot be split over {num_shards} learners (whole groups only); "
                         "raise trainer.tasks_per_step or lower trainer.num_learners")
    out = []
    for r in range(num_shards):
        mine = torch.tensor(groups[r::num_shards], dtype=torch.long)
        out.append((torch.isin(batch.group_index, mine).nonzero(as_tuple=True)[0],
                    torch.isin(batch.episode_group_index, mine).nonzero(as_tuple=True)[0]))
    return out


def shard_batch(batch: RolloutBatch, num_shards: int) -> list[RolloutBatch]:
    """Split ``batch`` into ``num_shards`` batches of whole groups (:func:`shard_indices`).

    Per-row tensors and row-sized tensor extras are sliced by row, per-episode tensors (``episode_*``, extras
    ``episode_*`` of length E) by episode, with ``episode_index`` renumbered per shard.

    Raises:
        ValueError: ``num_shards < 1`` or fewer groups than shards (a rank would have nothing to train on).
    """
    return [take_shard(batch, rows, episodes) for rows, episodes in shard_indices(batch, num_shards)]


def unshard_rows(parts: Sequence[Tensor], rows: Sequence[Tensor], num_rows: int) -> Tensor:
    """The inverse of the row split: per-shard ``(b_r, ...)`` tensors (shard r's rows ``rows[r]`` of
    :func:`shard_indices`) -> one ``(num_rows, ...)`` tensor in the batch's row order (the ranks' per-token
    statistics back on the whole batch, for the episode store)."""
    out = parts[0].new_zeros((num_rows, *parts[0].shape[1:]))
    for part, idx in zip(parts, rows):
        out[idx] = part
    return out


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, backend: str = "auto",
                       timeout_s: float = 600.0) -> str:
    """``torch.distributed.init_process_group`` over TCP (``backend=auto``: nccl when CUDA is available, else gloo);
    returns the backend used."""
    import datetime

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    return backend
