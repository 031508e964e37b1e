"""Engines whose weights carry a version (algorithms.md section 7, asynchronous rollouts)."""

from __future__ import annotations

import threading
from typing import Any, Callable


class VersionedEngine:
    """An engine whose weights carry a version (algorithms.md section 7): every ``generate`` call stamps its
    generations with the version the call started under (``Generation.policy_version``), and :meth:`sync` swaps
    the weights between two calls (a lock), so no call ever samples with half-loaded weights. Other attributes are
    the wrapped engine's.

    Args:
        engine: the engine (hf with its own copy of the policy, or vllm: its own process).
        version: the version of the weights it holds now.
    """

    def __init__(self, engine: Any, version: int = 0) -> None:
        self.engine, self.version = engine, int(version)
        self._lock = threading.Lock()

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            version = self.version
            gens = self.engine.generate(*args, **kwargs)
        for gen in gens:
            gen.policy_version = version
        return gens

    @property
    def token_js(self) -> Callable[..., Any]:
        """The wrapped engine's ``token_js`` (``rollout.fork.select=js``), run between two syncs like ``generate``.
        AttributeError when the wrapped engine has none (only hf scores token JS), so ``hasattr`` tells the truth."""
        score = self.engine.token_js

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return score(*args, **kwargs)
        return locked

    def sync(self, load: Callable[[], None], version: int) -> None:
        """Run ``load()`` (the weight copy into the engine) between two engine calls and set the version (blocking:
        call it in a worker thread from an event loop)."""
        with self._lock:
            load()
            self.version = int(version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
