"""The hf engine's kept keys/values (``engine.kv_reuse``, :mod:`agent_rl.engines.hf`'s module docstring): the store
of each live episode's cache between its turns, and the batch-cache layout of rows with different reused lengths.

Shapes: a kept layer is ``(keys, values)`` of (kv_heads, L, head_dim) for L kept tokens; a batch cache is a
transformers ``DynamicCache`` of (b, kv_heads, C, head_dim) per layer, right-aligned (row i's columns end at C), whose
layers grow into spare columns instead of concatenating at every token (:func:`growing_cache`).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

#: ended episode ids a store remembers (ids are never reused; 64 Ki short strings: a few MiB at most).
MAX_ENDED = 1 << 16

Layers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class EpisodeCache:
    """The kept keys/values of one episode: ``token_ids`` (L ids, the prompt and response fed so far) and per layer
    ``(keys, values)`` of shape (kv_heads, L, head_dim); ``stamp`` the weights they were computed with."""

    token_ids: list[int]
    layers: Layers
    stamp: tuple[int, ...]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class EpisodeKVStore:
    """Kept caches by episode id, least recently used first, at most ``max_tokens`` tokens over all episodes
    (beyond it whole episodes are evicted, oldest first). Thread-safe (the rollout ends episodes from its event
    loop while the engine generates in a worker thread). An ended id is remembered (the newest :data:`MAX_ENDED`):
    a generation of it still in flight, or handed to the engine just before its episode was cancelled, keeps
    nothing for it.

    Args:
        enabled: ``engine.kv_reuse`` (off: nothing is ever kept).
        max_tokens: ``engine.kv_reuse_max_tokens`` (>= 1).
    """

    def __init__(self, enabled: bool, max_tokens: int) -> None:
        self.enabled, self.max_tokens = bool(enabled), int(max_tokens)
        self.entries: OrderedDict[str, EpisodeCache] = OrderedDict()  # LRU order: oldest first
        self.tokens = 0  # tokens kept now (<= max_tokens)
        self.in_flight: set[str] = set()  # episodes of a generate call running now
        self.ended: OrderedDict[str, None] = OrderedDict()
        self.evicted = 0  # episodes evicted since construction
        self.lock = threading.Lock()

    def end(self, episode_id: str) -> None:
        """Drop ``episode_id``'s cache (unknown ids are fine) and remember that it ended."""
        with self.lock:
            entry = self.entries.pop(episode_id, None)
            if entry is not None:
                self.tokens -= len(entry.token_ids)
            self.ended[episode_id] = None
            while len(self.ended) > MAX_ENDED:
                self.ended.popitem(last=False)

    def fork(self, source_id: str, episode_id: str) -> None:
        """Start ``episode_id``'s cache as ``source_id``'s, sharing its tensors (kept caches are never written in
        place); nothing for an unknown or ended source, an id already kept or ended, or with the store off."""
        with self.lock:
            entry = self.entries.get(source_id)
            if entry is None or not self.enabled or episode_id in self.ended or episode_id in self.entries:
                return
            self.entries[episode_id] = EpisodeCache(list(entry.token_ids), list(entry.layers), entry.stamp)
            self.tokens += len(entry.token_ids)
            self._evict()

    def clear(self) -> None:
        """Drop every kept cache."""
        with self.lock:
            self.entries.clear()
            self.tokens = 0

    def episodes(self) -> list[str]:
        """Episode ids with a kept cache, least recently used first."""
        with self.lock:
            return list(self.entries)

    def begin(self, episode_ids: list[str | None]) -> dict[str, EpisodeCache]:
        """A generate call starts for ``episode_ids``: mark them in flight and take their kept entries out of the
        store (all at once, so the rows kept by one forward batch of the call never evict the entries the next one
        is about to use; each is kept again, extended, when its row is done)."""
        with self.lock:
            self.in_flight |= {e for e in episode_ids if e is not None}
            taken = {e: self.entries.pop(e) for e in episode_ids if e is not None and e in self.entries}
            self.tokens -= sum(len(x.token_ids) for x in taken.values())
        return taken

    def done(self, episode_ids: list[str | None]) -> None:
        """The generate call of :meth:`begin` is over."""
        with self.lock:
            self.in_flight -= {e for e in episode_ids if e is not None}

    def wants(self, episode_id: str | None, n_tokens: int) -> bool:
        """Whether a row of ``episode_id`` with ``n_tokens`` fed tokens would be kept (before copying its cache)."""
        return episode_id is not None and self.enabled and n_tokens <= self.max_tokens

    def keep(self, episode_id: str, token_ids: list[int], layers: Layers, stamp: tuple[int, ...]) -> None:
        """Keep ``layers`` (per layer (kv_heads, L, head_dim), L = ``len(token_ids)``) for ``episode_id``, unless it
        ended meanwhile; evicts the oldest episodes beyond ``max_tokens``."""
        with self.lock:
            if episode_id in self.ended:
                return
            self.entries[episode_id] = EpisodeCache(list(token_ids), layers, stamp)
            self.tokens += len(token_ids)
            self._evict()

    def _evict(self) -> None:
        """Evict whole episodes, least recently used first, until at most ``max_tokens`` are kept (lock held)."""
        while self.tokens > self.max_tokens:
            _, old = self.entries.popitem(last=False)
            self.tokens -= len(old.token_ids)
            self.evicted += 1


def reuse(entry: EpisodeCache | None, prompt: list[int], stamp: tuple[int, ...]) -> tuple[int, Layers | None]:
    """(reused length m, per-layer (keys, values) of the first m tokens) of one row: the common prefix of the kept
    ids and ``prompt``, at most ``len(prompt) - 1`` (a row feeds at least one token); none for other weights."""
    if entry is None or entry.stamp != stamp:
        return 0, None
    m = min(common_prefix(entry.token_ids, prompt), len(prompt) - 1)  # at least one token to feed
    if m <= 0:
        return 0, None
    return m, [(k[:, :m], v[:, :m]) for k, v in entry.layers]


#: spare columns a growing cache layer allocates beyond what it holds, at least (and at least half its length)
GROW_BLOCK = 64


@functools.lru_cache(maxsize=None)
def _growing_classes() -> tuple[type, type]:
    """``(GrowingLayer, GrowingCache)``, made on first use (transformers is imported then, not with this module).

    ``GrowingLayer`` is transformers' ``DynamicLayer`` whose ``update`` writes the new keys and values into spare
    columns of a buffer instead of concatenating the whole cache each decode step (``torch.cat`` copies every
    layer's cache at every token: O(L) a token. Measured on SmolLM2, 1 thread: 7% less CPU time for 8 rows of
    600-token prompts x 128 new tokens, nothing measurable at 160 tokens; docs/performance.md). When the buffer is
    full, or when its tensors were replaced from outside (``batch_select_indices`` keeps a subset of rows), the next update moves them into a new buffer with
    ``max(GROW_BLOCK, length / 2)`` spare columns: amortised, one copy per that many tokens. ``keys`` / ``values``
    are always the views of the filled columns, (b, kv_heads, L, head_dim), so every reader sees what a
    ``DynamicLayer`` would hold, bit for bit. ``GrowingCache(past)`` is a ``DynamicCache`` of such layers, filled
    with ``past`` (per layer ``(keys, values)``) or empty.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import Cache, DynamicLayer

    class GrowingLayer(DynamicLayer):
        _kbuf: torch.Tensor | None = None
        _vbuf: torch.Tensor | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            have = self.keys.shape[-2] if self.keys.numel() else 0
            need = have + key_states.shape[-2]
            kbuf, vbuf = self._kbuf, self._vbuf
            if kbuf is None or need > kbuf.shape[-2] or kbuf.shape[0] != key_states.shape[0] \
                    or self.keys.data_ptr() != kbuf.data_ptr() or self.values.data_ptr() != vbuf.data_ptr():
                cap = need + max(GROW_BLOCK, need // 2)
                kbuf = key_states.new_empty((*key_states.shape[:2], cap, key_states.shape[-1]))
                vbuf = value_states.new_empty((*value_states.shape[:2], cap, value_states.shape[-1]))
                if have:
                    kbuf[:, :, :have] = self.keys
                    vbuf[:, :, :have] = self.values
                self._kbuf, self._vbuf = kbuf, vbuf
            kbuf[:, :, have:need] = key_states
            vbuf[:, :, have:need] = value_states
            self.keys, self.values = kbuf[:, :, :need], vbuf[:, :, :need]
            return self.keys, self.values

        def reset(self) -> None:
            self._kbuf = self._vbuf = None
            super().reset()

    class GrowingCache(DynamicCache):
        def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
            layers = []
            for keys, values in past or []:
                layer = GrowingLayer()
                layer.update(keys, values)
                layers.append(layer)
            if layers:
                Cache.__init__(self, layers=layers)
            else:
                Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    return GrowingLayer, GrowingCache


def growing_cache(past: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    """A batch cache (``DynamicCache``) whose layers grow into spare columns (:func:`_growing_classes`): empty, or
    holding ``past`` (per layer (keys, values) of (b, kv_heads, C, head_dim))."""
    return _growing_classes()[1](past)


def join_caches(cache_a: Any, mask_a: torch.Tensor, cache_b: Any, mask_b: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The rows of two batch caches in one (a's rows first), right-aligned: the shorter one gets masked zero
    columns in front (exact: :mod:`agent_rl.engines.hf`'s module docstring), so every row's next token is again in
    the last column.

    Args:
        cache_a, cache_b: ``DynamicCache`` of (b_a, kv_heads, C_a, head_dim) / (b_b, ..., C_b, ...) per layer.
        mask_a, mask_b: (b_a, C_a) / (b_b, C_b) attention masks over those columns.
    Returns:
        ``(cache of b_a + b_b rows and max(C_a, C_b) columns, its (b_a + b_b, C) mask)``.
    """
    width = max(mask_a.shape[1], mask_b.shape[1])

    def pad(x: torch.Tensor, dim: int) -> torch.Tensor:  # zero columns in front of ``dim`` up to ``width``
        missing = width - x.shape[dim]
        if missing == 0:
            return x
        shape = list(x.shape)
        shape[dim] = missing
        return torch.cat([x.new_zeros(shape), x], dim=dim)

    past = [(torch.cat([pad(la.keys, 2), pad(lb.keys, 2)]), torch.cat([pad(la.values, 2), pad(lb.values, 2)]))
            for la, lb in zip(cache_a.layers, cache_b.layers)]
    return growing_cache(past), torch.cat([pad(mask_a, 1), pad(mask_b, 1)])


def row_layers(cache: Any, row: int, mask_row: torch.Tensor, n_tokens: int) -> Layers:
    """Row ``row`` of the batch ``cache`` as kept layers: its real columns (``mask_row`` == 1), per layer
    (kv_heads, L, head_dim).

    Raises:
        RuntimeError: the row has other than ``n_tokens`` real columns.
    """
    cols = mask_row.nonzero().squeeze(-1)
    layers = [(layer.keys[row].index_select(1, cols), layer.values[row].index_select(1, cols))
              for layer in cache.layers]
    if layers and layers[0][0].shape[1] != n_tokens:
        raise RuntimeError(f"kv reuse: {layers[0][0].shape[1]} cached columns for {n_tokens} tokens")
    return layers


def right_aligned(taken: list[tuple[int, Layers | None]], big_c: int) -> Any:
    """The batch cache of the reused prefixes ``taken`` ((m_i, layers_i) per row, :func:`reuse`): per layer
    (b, kv_heads, C, head_dim) with row i's m_i columns at ``[C - m_i, C)`` and zeros before; an empty
    ``DynamicCache`` when ``big_c`` (C, the longest m_i) is 0."""
    if big_c == 0:
        return growing_cache()
    b = len(taken)
    ref = next(layers for _, layers in taken if layers is not None)
    past = []
    for li, (k0, v0) in enumerate(ref):
        k = k0.new_zeros((b, k0.shape[0], big_c, k0.shape[2]))  # (b, kv_heads, C, head_dim)
        v = v0.new_zeros((b, v0.shape[0], big_c, v0.shape[2]))
        for r, (m, layers) in enumerate(taken):
            if layers is not None:
                k[r, :, big_c - m:] = layers[li][0]
                v[r, :, big_c - m:] = layers[li][1]
        past.append((k, v))
    return growing_cache(past)
