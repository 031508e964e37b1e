"""Test doubles for the rollout: a byte tokenizer, a scripted deterministic engine, a minimal in-process env pool
and a pool wrapper that injects env failures."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium

import envs  # noqa: F401  (registers the built-in ids)
from agent_rl.types import Generation


class ByteTokenizer:
    """ids = UTF-8 bytes + 3; 0 pad, 1 eos; no chat template (the prompts use the plain layout)."""

    pad_token_id, eos_token_id, eos_token, chat_template = 0, 1, "", None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + 3 for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


class ScriptedEngine:
    """``policy(prompt_text, temperature) -> response text``; logprob of token j = -(j + 1) * temperature / 100 so
    tests can check which temperature produced a row. Records every call (prompts, temperatures)."""

    def __init__(self, policy: Callable[[str, float], str], *, delay_s: float = 0.0) -> None:
        self.tokenizer = ByteTokenizer()
        self.policy, self.delay_s = policy, delay_s
        self.calls: list[tuple[list[list[int]], list[float]]] = []

    def generate(self, prompts, temperatures, *, max_new_tokens, top_p=1.0, top_k=0, stop=None, seed=None,
                 row_seeds=None):
        import time

        if self.delay_s:
            time.sleep(self.delay_s)
        self.calls.append((prompts, list(temperatures)))
        out = []
        for p, t in zip(prompts, temperatures):
            ids = self.tokenizer.encode(self.policy(self.tokenizer.decode(p), t))
            finish = "stop"
            if len(ids) > max_new_tokens:
                ids, finish = ids[:max_new_tokens], "length"
            out.append(Generation(token_ids=ids, logprobs=[-(j + 1) * t / 100 for j in range(len(ids))],
                                  text=self.tokenizer.decode(ids), finish_reason=finish))
        return out

    def sync_weights(self, model: Any) -> None:
        pass


@dataclass
class _Reset:
    session_id: str
    observation: str
    info: dict


@dataclass
class _Step:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict


class SimplePool:
    """Minimal in-process env pool with the env client interface (envs run in the event loop; fine for tests)."""

    def __init__(self) -> None:
        self.envs: dict[str, gymnasium.Env] = {}
        self._ids = itertools.count()
        self.resets = 0

    async def reset(self, env_id, *, seed=None, options=None, env_kwargs=None):
        await asyncio.sleep(0)
        env = gymnasium.make(env_id, **(env_kwargs or {}))
        obs, info = env.reset(seed=seed, options=options)
        sid = f"s{next(self._ids)}"
        self.envs[sid] = env
        self.resets += 1
        return _Reset(sid, obs, info)

    async def step(self, session_id, action):
        await asyncio.sleep(0)
        return _Step(*self.envs[session_id].step(action))

    async def close(self, session_id):
        env = self.envs.pop(session_id, None)
        if env is not None:
            env.close()

    async def aclose(self):
        for sid in list(self.envs):
            await self.close(sid)


class FlakyPool:
    """Wraps a pool; ``fail(call_index) -> bool`` decides which reset calls raise (0-based over all resets)."""

    def __init__(self, inner: Any, fail_reset: Callable[[int, dict], bool]) -> None:
        self.inner, self.fail_reset = inner, fail_reset
        self.reset_calls = 0

    async def reset(self, env_id, *, seed=None, options=None, env_kwargs=None):
        n = self.reset_calls
        self.reset_calls += 1
        if self.fail_reset(n, options or {}):
            raise ConnectionError(f"injected failure on reset {n}")
        return await self.inner.reset(env_id, seed=seed, options=options, env_kwargs=env_kwargs)

    async def step(self, session_id, action):
        return await self.inner.step(session_id, action)

    async def close(self, session_id):
        await self.inner.close(session_id)

    async def aclose(self):
        await self.inner.aclose()


def local_pool() -> Any:
    """B's LocalEnvPool when importable, else :class:`SimplePool`."""
    try:
        from agent_rl.envclient import LocalEnvPool
    except ImportError:
        return SimplePool()
    return LocalEnvPool()
