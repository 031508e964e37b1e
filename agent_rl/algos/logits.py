"""Per-token quantities from logits: log-probs, entropy, and the TGRL Jensen-Shannon divergence (algorithms.md
§0 and §3 step 3).

All three take logits of shape (..., V) (typically (N, V) with N = flattened rows x tokens) and return (...). They
compute in float32 whatever the input dtype (bf16/fp16 logits are upcast chunk by chunk), and with ``chunk_size``
process ``chunk_size`` leading rows at a time so that the (chunk, V) temporaries bound the extra memory; the result
does not depend on the chunking. Temperatures divide the logits (algorithms.md §0: per row, not per batch): pass a
float, or a tensor broadcastable to ``logits.shape[:-1]`` (for logits (B, L, V) and a per-row temperature (B,), pass
``temperature[:, None]``).

Numerical safety: logits may be very large or contain ``-inf`` entries (masked vocabulary); each row needs at least one
finite logit. ``0 * log 0`` terms count as 0, never NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "truncate_logits",
    "logprobs_from_logits",
    "entropy_from_logits",
    "js_divergence_from_logits",
    "js_divergence_rows",
    "LN2",
]

LN2 = math.log(2.0)
_JS_EPS = 1e-8  # algorithms.md section 3, step 3: log(m + 1e-8)


def _flat(logits: Tensor, temperature: float | Tensor | None) -> tuple[Tensor, Tensor | None, tuple[int, ...]]:
    """(..., V) logits -> (N, V); temperature -> (N, 1) tensor or None (float temperatures are applied later)."""
    if logits.dim() < 1:
        raise ValueError("logits must have shape (..., V)")
    lead = tuple(logits.shape[:-1])
    z = logits.reshape(-1, logits.shape[-1])  # (..., V) -> (N, V)
    if isinstance(temperature, Tensor):
        temp = temperature.to(device=logits.device, dtype=torch.float32).expand(lead).reshape(-1, 1)  # (...) -> (N, 1)
        if bool((temp <= 0).any()):
            raise ValueError("temperature must be > 0")
        return z, temp, lead
    if temperature is not None and temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return z, None, lead


def _floor_value(*temps: float) -> float:
    """A finite lower bound for shifted logits such that dividing by any of ``temps`` stays finite: ``-inf`` (masked
    vocabulary) becomes a huge negative number, so that its probability is exactly 0 and ``0 * log p`` is 0."""
    return -1e30 * min(1.0, *temps)


def _normalise_(x: Tensor, p: Tensor) -> None:
    """In place: for scaled shifted logits x (max 0), ``p <- softmax(x)`` and ``x <- log_softmax(x)``."""
    torch.exp(x, out=p)
    s = p.sum(dim=-1, keepdim=True)  # >= 1: the max entry contributes exp(0)
    p.div_(s)
    x.sub_(s.log_())


def _chunks(n: int, chunk_size: int | None) -> list[tuple[int, int]]:
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size}")
    step = n if not chunk_size else chunk_size
    return [(i, min(i + step, n)) for i in range(0, n, max(step, 1))]


@torch.no_grad()
def truncation_mask(logits: Tensor, temperature: float | Tensor = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The tokens top-k / nucleus (top-p) sampling may draw, per row: True = kept (no grad; the mask is a constant).

    Order and ties follow the samplers of Hugging Face / vLLM: top-k on the raw logits (temperature-invariant; every
    token tied with the k-th is kept), then top-p on ``softmax(z / T)`` restricted to the top-k set: the smallest
    prefix, in descending probability, whose mass reaches ``top_p`` (the token that crosses it is kept).

    Args:
        logits: (N, V) float. temperature: float or (N,) tensor, > 0. top_k: 0 = off. top_p: 1.0 = off, in (0, 1].
    Returns:
        (N, V) bool; all True when both are off.
    Raises:
        ValueError: ``top_k < 0`` or ``top_p`` outside (0, 1].
    """
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_k must be >= 0 and top_p in (0, 1], got top_k={top_k}, top_p={top_p}")
    keep = torch.ones_like(logits, dtype=torch.bool)
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (N, 1)
        keep = logits >= kth
    if top_p < 1.0:
        t = temperature[:, None] if isinstance(temperature, Tensor) else temperature  # (N,) -> (N, 1)
        x = (logits.float() / t).masked_fill(~keep, float("-inf"))
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p_sorted = torch.softmax(sorted_x, dim=-1)
        drop_sorted = (p_sorted.cumsum(-1) - p_sorted) > top_p  # mass before this token already reaches top_p
        keep = keep & ~torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return keep


def truncate_logits(logits: Tensor, temperature: float | Tensor = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """``logits`` with every token that top-k / top-p sampling cannot draw set to ``-inf`` (see
    :func:`truncation_mask`), so ``log_softmax(truncate_logits(z) / T)`` is the log-prob of the distribution the
    sampler actually drew from. Differentiable in the kept entries. Returns ``logits`` itself when both are off.

    Args:
        logits: (N, V). temperature: float or (N,). top_k, top_p: as :func:`truncation_mask`.
    Returns:
        (N, V), dtype of ``logits``.
    """
    if top_k <= 0 and top_p >= 1.0:
        return logits
    return logits.masked_fill(~truncation_mask(logits.detach(), temperature, top_k, top_p), float("-inf"))


def logprobs_from_logits(
    logits: Tensor, token_ids: Tensor, temperature: float | Tensor = 1.0, chunk_size: int | None = None
) -> Tensor:
    """Log-prob of ``token_ids`` under ``softmax(logits / T)``; differentiable (used with grad by the learner).

    Computed as ``x_y - logsumexp(x)`` with ``x = (z - max z) / T`` (shift-invariant; keeps very large logits finite).

    Args:
        logits: (..., V) float (any float dtype; computed in float32).
        token_ids: (...) long, the tokens whose log-prob is wanted (already shifted to align with ``logits``).
        temperature: float or tensor broadcastable to (...), > 0.
        chunk_size: rows of the flattened (N, V) processed at a time (None = all at once).
    Returns:
        (...) float32 log-probs (natural log, nats).
    Raises:
        ValueError: a temperature <= 0, ``token_ids`` not matching ``logits.shape[:-1]``, ``chunk_size <= 0``.
    """
    z, temp, lead = _flat(logits, temperature)
    ids = token_ids.reshape(-1, 1).long()  # (...) -> (N, 1)
    if ids.shape[0] != z.shape[0]:
        raise ValueError(f"token_ids shape {tuple(token_ids.shape)} does not match logits {tuple(logits.shape)}")
    out = []
    for a, b in _chunks(z.shape[0], chunk_size):
        t = temp[a:b] if temp is not None else float(temperature)  # type: ignore[arg-type]
        x = z[a:b].float()  # (n, V)
        x = (x - x.amax(dim=-1, keepdim=True).detach().clamp_min(torch.finfo(torch.float32).min)) / t  # max-shifted
        out.append(x.gather(-1, ids[a:b]).squeeze(-1) - torch.logsumexp(x, dim=-1))
    res = torch.cat(out) if out else z.new_zeros(0, dtype=torch.float32)
    return res.reshape(lead)


def entropy_from_logits(logits: Tensor, temperature: float | Tensor = 1.0, chunk_size: int | None = None) -> Tensor:
    """Entropy ``H = -sum_v p log p`` of ``p = softmax(logits / T)`` (natural log), per token; differentiable.

    Args:
        logits: (..., V) float. temperature: float or tensor broadcastable to (...), > 0.
        chunk_size: rows of the flattened (N, V) processed at a time (None = all at once).
    Returns:
        (...) float32 entropies in nats, in [0, log V]. Under ``torch.no_grad()`` (the learner's old-policy pass) it
        works in place with at most 2 (chunk, V) float32 buffers.
    Raises:
        ValueError: a temperature <= 0 or ``chunk_size <= 0``.
    """
    z, temp, lead = _flat(logits, temperature)
    grad = torch.is_grad_enabled() and logits.requires_grad
    n_rows, vocab = z.shape
    chunks = _chunks(n_rows, chunk_size)  # validates chunk_size before anything is allocated
    step = min(chunk_size or n_rows, n_rows)
    if not grad:  # 2 float32 (step, V) work buffers reused for every chunk (bounded memory, see the JS function)
        x_buf, p_buf = (torch.empty(step, vocab, dtype=torch.float32, device=z.device) for _ in range(2))
    out = []
    for a, b in chunks:
        t = temp[a:b] if temp is not None else float(temperature)  # type: ignore[arg-type]
        floor = _floor_value(float(t.min()) if isinstance(t, Tensor) else t)
        if grad:  # out of place: autograd needs the intermediate values
            x = z[a:b].float()
            x = (x - x.amax(dim=-1, keepdim=True).detach()).clamp_min(floor)
            lp = torch.log_softmax(x / t, dim=-1)
            out.append((-(lp.exp() * lp).sum(-1)).clamp_min(0.0))
        else:
            x, p = x_buf[: b - a], p_buf[: b - a]  # (n, V) views
            x.copy_(z[a:b])
            x.sub_(x.amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float32).min)).clamp_min_(floor)
            x.mul_(1.0 / t)
            _normalise_(x, p)  # x <- log p
            out.append((-(p.mul_(x)).sum(-1)).clamp_min(0.0))
    res = torch.cat(out) if out else z.new_zeros(0, dtype=torch.float32)
    return res.reshape(lead)


def js_divergence_rows(z: Tensor, t_low: float, t_high: float) -> Tensor:
    """The JS of :func:`js_divergence_from_logits` for one chunk, written functionally (no in-place ops, no
    buffers) so that ``torch.compile`` can fuse it into a few passes over V (what ``compile=True`` uses).

    Args:
        z: (n, V) logits. t_low, t_high: > 0.
    Returns:
        (n,) float32 in [0, ln 2].
    """
    x = z.float()
    x = x - x.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    x = x.clamp_min(_floor_value(t_low, t_high))
    lp0 = torch.log_softmax(x / t_low, dim=-1)
    lp1 = torch.log_softmax(x / t_high, dim=-1)
    p0, p1 = lp0.exp(), lp1.exp()
    log_m = torch.log(0.5 * (p0 + p1) + _JS_EPS)
    return (0.5 * ((p0 * (lp0 - log_m)).sum(-1) + (p1 * (lp1 - log_m)).sum(-1))).clamp(0.0, LN2)


_COMPILED: dict[str, object] = {}


def _compiled_js_rows():  # lazily: torch.compile costs ~30 s on CPU, and only when asked for
    if "js" not in _COMPILED:
        _COMPILED["js"] = torch.compile(js_divergence_rows, dynamic=None)
    return _COMPILED["js"]


@torch.no_grad()
def js_divergence_from_logits(
    logits: Tensor, t_low: float, t_high: float, chunk_size: int | None = None, compile: bool = False
) -> Tensor:
    """Per-token Jensen-Shannon divergence between ``p0 = softmax(z / t_low)`` and ``p1 = softmax(z / t_high)``.

    Spec section 3.3, exactly: ``m = (p0 + p1) / 2``,
    ``J = 0.5 sum_v p0 (log p0 - log(m + 1e-8)) + 0.5 sum_v p1 (log p1 - log(m + 1e-8))``, clamped to [0, ln 2].
    No grad (it is a detached weight computed on the old-policy logits).

    Args:
        logits: (..., V) float, usually (N, V).
        t_low, t_high: the two temperatures T0, T1 (> 0). ``t_low == t_high`` gives 0 up to float rounding.
        chunk_size: rows processed at a time; peak extra memory is 5 (chunk_size, V) float32
            buffers. Small chunks (16-64 rows) are also the fastest on CPU (the buffers stay in cache).
            None = all rows at once. The result does not depend on it (to float rounding).
        compile: run each chunk through ``torch.compile(js_divergence_rows)`` (compiled once per process, on first
            use; worth it on GPU where the fused kernel reads V a few times instead of ~20; the result differs from
            the eager path by float rounding only, about 2e-6).
    Returns:
        (...) float32 JS in nats, in [0, ln 2].
    Raises:
        ValueError: ``t_low`` or ``t_high`` <= 0, or ``chunk_size <= 0``.
    """
    z, _, lead = _flat(logits, None)
    if t_low <= 0 or t_high <= 0:
        raise ValueError(f"temperatures must be > 0, got t_low={t_low}, t_high={t_high}")
    if compile:
        fn = _compiled_js_rows()
        parts = [fn(z[a:b], float(t_low), float(t_high)) for a, b in _chunks(z.shape[0], chunk_size)]
        res = torch.cat(parts) if parts else z.new_zeros(0, dtype=torch.float32)
        return res.reshape(lead)  # type: ignore[union-attr]
    floor = _floor_value(t_low, t_high)
    n_rows, vocab = z.shape
    chunks = _chunks(n_rows, chunk_size)  # validates chunk_size before anything is allocated
    step = min(chunk_size or n_rows, n_rows)
    # 5 float32 (step, V) work buffers, allocated once and reused for every chunk: the peak memory is bounded by the
    # chunk whatever the allocator does (glibc does not always return freed 10-100 MB blocks to the OS)
    x_buf, lp0_buf, p0_buf, p1_buf, lm_buf = (
        torch.empty(step, vocab, dtype=torch.float32, device=z.device) for _ in range(5)
    )
    out = []
    for a, b in chunks:
        n = b - a
        x, lp0, p0, p1, log_m = x_buf[:n], lp0_buf[:n], p0_buf[:n], p1_buf[:n], lm_buf[:n]  # (n, V) views
        x.copy_(z[a:b])  # float32
        x.sub_(x.amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float32).min)).clamp_min_(floor)
        torch.mul(x, 1.0 / t_low, out=lp0)
        _normalise_(lp0, p0)  # lp0 <- log p0, p0 <- p0
        x.mul_(1.0 / t_high)
        _normalise_(x, p1)  # x <- log p1
        torch.lerp(p0, p1, 0.5, out=log_m).add_(_JS_EPS).log_()  # log(m + 1e-8)
        # each term p (log p - log(m + eps)) summed directly: no cancellation between large sums
        kl0 = lp0.sub_(log_m).mul_(p0).sum(-1)  # (n,)
        kl1 = x.sub_(log_m).mul_(p1).sum(-1)
        out.append((0.5 * (kl0 + kl1)).clamp_(0.0, LN2))
    res = torch.cat(out) if out else z.new_zeros(0, dtype=torch.float32)
    return res.reshape(lead)
