"""How a step's rows are cut: mini-batches of whole groups (one optimiser step each) and micro-batches of rows under a
row count or a token budget (gradient accumulation; the memory bound of one forward)."""

from __future__ import annotations

import torch
from torch import Tensor


def group_mini_batches(group_index: Tensor, num_mini_batches: int, generator: torch.Generator) -> list[Tensor]:
    """Split a batch's rows into mini-batches of whole groups (algorithms.md, TGRL "Reference training recipe": the
    batch's groups split into ``algo.num_mini_batches`` mini-batches; every row of an episode, and so of a group,
    lands in one mini-batch).

    The groups are shuffled with ``generator`` and dealt into ``min(num_mini_batches, number of groups)`` chunks of
    nearly equal group counts (the first ``n_groups % k`` chunks get one group more).

    Args:
        group_index: (B,) long, rows of a group share it. num_mini_batches: >= 1. generator: CPU generator.
    Returns:
        list of (b_i,) long row indices on ``group_index``'s device, each ascending; together a partition of 0..B-1.
    Raises:
        ValueError: ``num_mini_batches < 1``.
    """
    if num_mini_batches < 1:
        raise ValueError(f"num_mini_batches must be >= 1, got {num_mini_batches}")
    uniq, inv = torch.unique(group_index.cpu(), return_inverse=True)  # (G,), (B,) dense group id per row
    n_groups = int(uniq.numel())
    if n_groups == 0:
        return []
    perm = torch.randperm(n_groups, generator=generator)  # (G,) shuffled groups
    k = min(num_mini_batches, n_groups)
    chunk_of_group = torch.empty(n_groups, dtype=torch.long)
    for i, groups in enumerate(perm.tensor_split(k)):
        chunk_of_group[groups] = i
    chunk = chunk_of_group[inv]  # (B,) mini-batch of each row
    return [(chunk == i).nonzero(as_tuple=True)[0].to(group_index.device) for i in range(k)]


def token_budget_micro_batches(rows: Tensor, lengths: Tensor, max_tokens: int) -> list[Tensor]:
    """Micro-batches of ``rows`` under a token budget (``algo.micro_batch_tokens``; verl's dynamic batch size,
    ``use_dynamic_bsz`` / ``rearrange_micro_batches``, for padded rows).

    The rows are sorted by length, longest first (stable), and cut greedily into consecutive runs: a run grows while
    ``(rows in it) x (its longest row)`` stays <= ``max_tokens`` (the padded size of its forward); a row longer than
    the budget is a micro-batch of its own. Sorted runs waste the least padding, and every micro-batch is as full
    as the budget allows.

    Args:
        rows: (n,) long row indices. lengths: (n,) each row's padded length in tokens. max_tokens: >= 1.
    Returns:
        list of (b_i,) long tensors (rows' values), together a permutation of ``rows``, longest first.
    Raises:
        ValueError: ``max_tokens < 1`` or ``rows`` and ``lengths`` of different shapes.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if rows.shape != lengths.shape or rows.dim() != 1:
        raise ValueError(f"rows {tuple(rows.shape)} and lengths {tuple(lengths.shape)} must be the same (n,) shape")
    order = torch.argsort(lengths, descending=True, stable=True)
    rows, sizes = rows[order], lengths[order].tolist()
    out, start = [], 0
    for i in range(1, len(sizes) + 1):  # cut before row i when adding it would exceed the budget
        if i == len(sizes) or (i - start + 1) * max(int(sizes[start]), 1) > max_tokens:
            out.append(rows[start:i])
            start = i
    return out


def micro_batches(rows: Tensor, attention_mask: Tensor, micro_batch_size: int, micro_batch_tokens: int
                  ) -> list[Tensor]:
    """Split ``rows`` (n,) into micro-batches of rows of similar length, longest first: ``micro_batch_size``
    rows each (``algo.micro_batch_size``), or with ``micro_batch_tokens > 0`` (``algo.micro_batch_tokens``) packed
    under that token budget (:func:`token_budget_micro_batches` on each row's padded length, last attended column
    + 1, which is what the forward of a micro-batch computes). Either way every micro-batch's loss is divided by its
    mini-batch's denominator, so the accumulated gradient does not depend on the split.

    Args:
        rows: (n,) long row indices. attention_mask: (B, L) 0/1 of the whole batch.
    Returns:
        list of (b_i,) long tensors, together a permutation of ``rows``.
    """
    if micro_batch_tokens > 0:
        am = attention_mask[rows]
        cols = torch.arange(1, am.shape[1] + 1, device=am.device)
        ends = (am.bool() * cols).amax(-1)  # (n,) last attended column + 1 (0 for an empty row)
        return token_budget_micro_batches(rows, ends, micro_batch_tokens)
    lengths = attention_mask[rows].sum(-1)
    rows = rows[torch.argsort(lengths, descending=True, stable=True)]
    return list(rows.split(micro_batch_size))
