"""Generation for the rollout: the :class:`GenerationBatcher` that batches concurrent episodes' prompts into engine
calls, and the :class:`Generator` that opens one batcher per run (a ``run_groups`` call or a stream) and holds what
every turn needs from the engine side (sampling settings, the policy version, the ``on_turn`` hook).

Determinism: which prompts share an engine call depends on env timing, so sampling randomness is keyed by the row,
not by the call: the turn ``k`` of the episode in slot ``s`` of group ``g`` samples with
``row_seed(rollout_seed, g, s, k)`` (``agent_rl.engines.row_seed``; ``rollout_seed`` is drawn from the generator's
seed and the run's ``seed_key``, :meth:`Generator.open`). With the same seed, the same groups give the same episodes
whatever the env latencies, batch sizes, worker count or arrival order.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

import numpy as np

from agent_rl.engines.base import caps_of, row_seed
from agent_rl.types import Generation


class GenerationBatcher:
    """Collects prompts from concurrent episodes and generates them in batches in a worker thread.

    Batching rule: once a prompt waits, the batch is sent when every live episode (``active``, kept by the
    orchestrator) is waiting for generation, or when no new prompt arrived for ``wait_s`` seconds (so episodes that
    are a step behind join, but a slow env reset never holds the others up for long).

    ``busy_s`` accumulates the time the engine spent generating; the orchestrator reports the rest of the rollout's
    wall time as the time generation waited on envs (``time/env_wait_frac`` = 1 - busy / wall: env resets and steps
    on the critical path, plus the short batching waits).
    """

    def __init__(self, engine: Any, *, max_new_tokens: int, top_p: float = 1.0, top_k: int = 0,
                 stop: list[str] | None = None, batch_size: int = 0, seed: int | None = None,
                 wait_s: float = 0.02) -> None:
        self.engine = engine
        self.kwargs = dict(max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, stop=stop)
        self.batch_size, self.seed = batch_size, seed
        self._pending: list[tuple[list[int], float, asyncio.Future, float, tuple[int, ...] | None,
                                  tuple[int | None, tuple[str, ...]]]] = []
        self._wakeup = asyncio.Event()
        self._arrived = asyncio.Event()
        self.wait_s = wait_s
        self.active = 0
        self._closed = False
        self._calls = 0
        self.busy_s = 0.0
        self.batch_sizes: list[int] = []
        self.first_start: float | None = None
        self.generated_tokens = 0
        self.prefill_tokens = self.kv_reuse_tokens = 0  # prompt tokens computed / taken from the engine's caches
        self._episode_ids: dict[asyncio.Future, str] = {}  # pending row -> its episode (engine.kv_reuse)

    async def generate(self, prompt_ids: list[int], temperature: float,
                       repetition_penalty: float = 1.0, key: tuple[int, ...] | None = None,
                       episode_id: str | None = None, max_new_tokens: int | None = None,
                       stop: Sequence[str] = ()) -> Generation:
        """Queue one prompt; resolves to its Generation. ``repetition_penalty`` (1.0 = off) is per row: TGRL's
        ``algo.high_repetition_penalty`` on high-temperature episodes (algorithms.md section 3, optional).
        ``key`` (ints, e.g. (group id, slot, turn)) names the row: with a batcher ``seed`` the row
        samples with ``row_seed(seed, *key)`` whatever batch it lands in (module docstring); a batch with a row
        without key falls back to one seed per engine call (``seed`` + call index). ``episode_id`` names the row's
        episode for engines that keep its keys/values between turns (those with ``end_episode``: hf's
        ``engine.kv_reuse``). ``max_new_tokens`` (at most the batcher's) and ``stop`` (added to the batcher's stop
        strings) are the row's own generation cap and stop strings (the gateway's clients): rows are batched only
        with rows of the same ones, so the engine stops each where it was asked to."""
        fut = asyncio.get_running_loop().create_future()
        if episode_id is not None:
            self._episode_ids[fut] = episode_id
        cap = None if max_new_tokens is None or max_new_tokens >= self.kwargs["max_new_tokens"] else int(max_new_tokens)
        self._pending.append((prompt_ids, temperature, fut, float(repetition_penalty),
                              None if key is None else tuple(int(k) for k in key), (cap, tuple(stop))))
        self._wakeup.set()
        self._arrived.set()
        return await fut

    def episode_started(self) -> None:
        self.active += 1

    def episode_finished(self) -> None:
        self.active -= 1
        self._arrived.set()

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()

    async def run(self) -> None:
        """Serve requests until :meth:`close`; an engine exception is passed to every waiting episode."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending:
                if self._closed:
                    return
                continue
            while len(self._pending) < self.active and not self._closed:  # let episodes a step behind join
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), self.wait_s)
                except asyncio.TimeoutError:
                    break
            for row in [r for r in self._pending if r[2].done()]:  # its episode was cancelled: not generated
                self._pending.remove(row)
                self._episode_ids.pop(row[2], None)
            if not self._pending:
                self._wakeup.set()
                continue
            opts = self._pending[0][5]  # one engine call per (cap, stop strings): the rows asking the same
            same = [r for r in self._pending if r[5] == opts]
            batch = same if self.batch_size <= 0 else same[:self.batch_size]
            self._pending = [r for r in self._pending if not any(r is b for b in batch)]
            call_kwargs = dict(self.kwargs)
            if opts[0] is not None:
                call_kwargs["max_new_tokens"] = opts[0]
            if opts[1]:
                base_stop = list(self.kwargs["stop"] or [])
                call_kwargs["stop"] = base_stop + [s for s in opts[1] if s not in base_stop]
            seed = None if self.seed is None else self.seed + self._calls
            self._calls += 1
            t0 = time.perf_counter()
            self.batch_sizes.append(len(batch))
            if self.first_start is None:
                self.first_start = t0
            extra: dict[str, Any] = {}
            if any(b[3] != 1.0 for b in batch):  # only engines asked for a penalty need to support it
                extra["repetition_penalties"] = [b[3] for b in batch]
            if self.seed is not None and all(b[4] is not None for b in batch):  # per-row randomness
                extra["row_seeds"] = [row_seed(self.seed, *b[4]) for b in batch]
            episode_ids = [self._episode_ids.pop(b[2], None) for b in batch]
            if caps_of(self.engine).kv_reuse and any(e is not None for e in episode_ids):
                extra["episode_ids"] = episode_ids
            try:
                gens = await asyncio.to_thread(self.engine.generate, [b[0] for b in batch], [b[1] for b in batch],
                                               seed=seed, **call_kwargs, **extra)
            except Exception as exc:  # noqa: BLE001 (re-raised in every waiting episode)
                for _, _, fut, _, _, _ in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                gens = None
            self.busy_s += time.perf_counter() - t0
            if gens is not None:
                for (prompt, _, fut, _, _, _), gen in zip(batch, gens):
                    self.generated_tokens += len(gen.token_ids)
                    cached = min(int(gen.cached_tokens or 0), len(prompt))
                    self.kv_reuse_tokens += cached
                    self.prefill_tokens += len(prompt) - cached
                    if not fut.done():
                        fut.set_result(gen)
            if self._pending or self._closed:
                self._wakeup.set()


class Generator:
    """The engine as a group player's episodes see it: the sampling settings of every turn, the open
    :class:`GenerationBatcher` (one per ``run_groups`` call or stream, :meth:`open`), the policy version each turn
    records and the ``on_turn`` hook.

    Args:
        engine: ``agent_rl.engines`` Engine (``tokenizer``, ``generate``).
        max_new_tokens, top_p, top_k: sampling settings of every turn (the temperature is per episode).
        stop: stop strings of every turn (None: none).
        seed: base seed of generation calls (None: engine default).
        batch_size, wait_s: the batcher's settings (``rollout.gen_batch_size``, ``rollout.gen_wait_s``).
        high_repetition_penalty: repetition penalty of high-temperature episodes (TGRL, 1.0 = off).
        on_turn: called with every turn's :class:`Generation` (progress displays, the evaluation's records).
    """

    def __init__(self, engine: Any, *, max_new_tokens: int, top_p: float = 1.0, top_k: int = 0,
                 stop: list[str] | None = None, seed: int | None = None, batch_size: int = 0, wait_s: float = 0.02,
                 high_repetition_penalty: float = 1.0,
                 on_turn: Callable[[Generation], None] | None = None) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.gen_kwargs = dict(max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, stop=stop or None,
                               batch_size=batch_size, seed=seed, wait_s=wait_s)
        self.high_repetition_penalty = float(high_repetition_penalty)
        self.on_turn = on_turn
        self.batcher: GenerationBatcher | None = None
        """The open batcher (None between runs)."""
        self.last_batcher: GenerationBatcher | None = None
        """The batcher of the last closed run (its generation statistics: benchmarks)."""
        self.policy_version = 0
        """The version of the engine's weights (algorithms.md section 7): set by the backend at each weight sync; a
        turn records it when its generation is requested, unless the engine stamps its own
        (``Generation.policy_version``, :class:`agent_rl.engines.VersionedEngine`)."""

    def open(self, seed_key: int) -> GenerationBatcher:
        """Open the run's batcher; its rollout seed is ``default_rng([seed, seed_key]).integers(2**31)`` (no seed: the
        engine's default)."""
        kwargs = dict(self.gen_kwargs)
        if kwargs["seed"] is not None:
            kwargs["seed"] = int(np.random.default_rng([int(kwargs["seed"]), int(seed_key)]).integers(2**31))
        self.batcher = GenerationBatcher(self.engine, **kwargs)
        return self.batcher

    def close(self) -> None:
        """Forget the open batcher (kept as :attr:`last_batcher`)."""
        if self.batcher is not None:
            self.last_batcher, self.batcher = self.batcher, None

    def penalty(self, is_high: bool) -> float:
        """The repetition penalty of an episode: ``high_repetition_penalty`` at T1, else 1.0 (off)."""
        return self.high_repetition_penalty if is_high else 1.0

    def finish_turn(self, gen: Generation, version: int) -> Generation:
        """Stamp ``version`` (the policy version when the turn was requested) on a generation the engine did not
        stamp, and call ``on_turn``."""
        if gen.policy_version is None:
            gen.policy_version = version
        if self.on_turn is not None:
            self.on_turn(gen)
        return gen
