"""Engines whose weights carry a version (algorithms.md section 7, asynchronous rollouts)."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

from agent_rl.engines.base import EngineBase, caps_of


class VersionedEngine(EngineBase):
    """An engine whose weights carry a version (algorithms.md section 7): every ``generate`` call stamps its
    generations with the version the call started under (``Generation.policy_version``), and :meth:`sync` swaps
    the weights between two calls (a lock), so no call ever samples with half-loaded weights. Its capabilities are
    the wrapped engine's plus ``carries_versions``; its optional methods run the wrapped engine's (the ones that
    read or change the weights' state under the lock). Nothing else of the wrapped engine is forwarded: what a caller
    needs of it is a declared capability or an :class:`EngineBase` method (``engine`` is the wrapped one).

    Args:
        engine: the engine (hf with its own copy of the policy, or vllm: its own process).
        version: the version of the weights it holds now.
    """

    def __init__(self, engine: Any, version: int = 0) -> None:
        self.engine, self.version = engine, int(version)
        self.caps = replace(caps_of(engine), carries_versions=True)
        self.tokenizer = engine.tokenizer
        self.eos_token_ids = engine.eos_token_ids if isinstance(engine, EngineBase) else None
        self._lock = threading.Lock()

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            version = self.version
            gens = self.engine.generate(*args, **kwargs)
        for gen in gens:
            gen.policy_version = version
        return gens

    def token_js(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped engine's ``token_js`` (``rollout.fork.select=js``), run between two syncs like ``generate``."""
        with self._lock:
            return self.engine.token_js(*args, **kwargs)

    def sync(self, load: Callable[[], None], version: int) -> None:
        """Run ``load()`` (the weight copy into the engine) between two engine calls and set the version (blocking:
        call it in a worker thread from an event loop)."""
        with self._lock:
            load()
            self.version = int(version)

    def sync_weights(self, model: Any, version: int | None = None) -> None:
        """The wrapped engine's ``sync_weights`` as is (no lock, no version: :meth:`sync` does both)."""
        self.engine.sync_weights(model, version)

    def end_episode(self, episode_id: str) -> None:
        if self.caps.kv_reuse:
            self.engine.end_episode(episode_id)

    def fork_episode(self, source_id: str, episode_id: str) -> None:
        self.engine.fork_episode(source_id, episode_id)

    def sleep(self) -> None:
        if self.caps.sleep:
            self.engine.sleep()

    def wake_up(self) -> None:
        if self.caps.sleep:
            self.engine.wake_up()

    def step_metrics(self) -> dict[str, float]:
        return self.engine.step_metrics() if self.caps.step_metrics else {}

    def prefix_cache_stats(self) -> dict[str, float]:
        return self.engine.prefix_cache_stats() if self.caps.prefix_cache_stats else {}

    def close(self) -> None:
        if isinstance(self.engine, EngineBase):
            self.engine.close()
