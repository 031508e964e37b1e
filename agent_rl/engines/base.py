"""Engine protocol and registry: prompt ids in, sampled ids + their log-probs out (token-in/token-out)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from agent_rl.types import Generation


def row_seed(seed: int, *key: int) -> int:
    """A 63-bit sampling seed for the row identified by ``key`` under the base ``seed``:
    ``numpy.random.default_rng([seed, *key]).integers(2**63)`` (numpy's SeedSequence hashing: distinct keys give
    unrelated streams). ``seed`` and ``key`` are ints, taken modulo 2**64 (so a negative seed is fine)."""
    return int(np.random.default_rng([int(k) % 2**64 for k in (seed, *key)]).integers(2**63))


@runtime_checkable
class Engine(Protocol):
    """A generation engine.

    ``generate`` samples one response per prompt; row i uses ``temperatures[i]`` (per-row temperature, algorithms.md
    section 0). ``Generation.logprobs[j]`` is log softmax(z / T_i)[token_j] (natural log, fp32) of the sampled token
    under the full (not top-p/top-k truncated) tempered distribution, so the learner can recompute it exactly.
    ``Generation.token_ids`` are exactly the sampled ids (an EOS token, when sampled, is included); ``text`` is their
    decoding without special tokens (a matched stop string is kept in it). ``repetition_penalties`` (optional, per
    row, 1.0 = off) serves TGRL's ``algo.high_repetition_penalty``; with a penalty the log-probs are those of the
    penalised distribution sampled from. ``row_seeds`` (optional, per row): row i's sampling randomness comes from
    ``row_seeds[i]`` alone, so a row samples the same tokens whatever else is in the batch and in whatever order
    (the orchestrator passes :func:`row_seed` of (rollout seed, group id, slot, turn): episodes do not depend on the
    env timing that formed the batches); ``seed`` then plays no part. Greedy rows (T = 0) draw nothing.
    ``episode_ids`` (optional, per row, None = none): the episode each row belongs to, so an engine may keep its
    keys/values for the episode's next prompt (hf: ``engine.kv_reuse``; vllm_server routes the episode to one replica;
    vllm has its own prefix cache and ignores them); ``end_episode(id)`` says the episode is over. Neither changes the
    tokens sampled. The rollout passes them to an engine that declares ``EngineCaps.kv_reuse``.
    """

    tokenizer: Any

    def generate(self, prompts: list[list[int]], temperatures: list[float], *, max_new_tokens: int,
                 top_p: float = 1.0, top_k: int = 0, stop: list[str] | None = None, seed: int | None = None,
                 repetition_penalties: list[float] | None = None, row_seeds: list[int] | None = None,
                 episode_ids: list[str | None] | None = None) -> list[Generation]: ...

    def end_episode(self, episode_id: str) -> None:
        """The episode ``episode_id`` is over: drop what is kept for it (a no-op where nothing is)."""
        ...

    def sync_weights(self, model: Any, version: int | None = None) -> None:
        """Give the engine ``model``'s current weights. ``version``: the learner version they are (algorithms.md
        section 7); an engine that reports versions itself (``carries_versions``: ``vllm_server``) labels its
        generations with it, the others ignore it (a :class:`~agent_rl.engines.VersionedEngine` stamps theirs)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (vLLM: its engine processes and sync files); idempotent. Every owner of an
        engine (train loop, eval, Ray rollout workers) calls it when done."""
        ...


class ClosesOnExit:
    """Mixin of an engine that owns processes or servers (vllm, vllm_server): ``with engine:`` closes it, and so
    does garbage collection (best effort; the watchdogs cover a killed interpreter). ``close`` must be idempotent."""

    def close(self) -> None:  # pragma: no cover (every user defines it)
        raise NotImplementedError

    def __enter__(self) -> "ClosesOnExit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter teardown)
            pass


def check_episode_ids(episode_ids: list[str | None] | None, n: int) -> None:
    """The engines' shared check of ``generate``'s ``episode_ids``: None, or n entries (str or None), no id twice
    (an episode has one prompt in flight at a time).

    Raises:
        ValueError: the length differs from the prompts', an entry is not a str or None, or an id repeats.
    """
    if episode_ids is None:
        return
    if len(episode_ids) != n:
        raise ValueError(f"{n} prompts but {len(episode_ids)} episode ids")
    named = [e for e in episode_ids if e is not None]
    if any(not isinstance(e, str) for e in named):
        raise ValueError(f"episode ids must be str or None, got {sorted({type(e).__name__ for e in named})}")
    if len(set(named)) != len(named):
        raise ValueError("an episode id appears twice in one generate call (one prompt per episode at a time)")


def default_eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a response, the same for every engine: the model's ``generation_config.eos_token_id`` (an
    id or a list; ``agent_rl.models.load_policy`` puts every end-of-turn id there) plus the tokenizer's eos, sorted.

    Raises:
        ValueError: neither gives an id.
    """
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
    eos.add(getattr(tokenizer, "eos_token_id", None))
    ids = sorted(int(e) for e in eos if e is not None)
    if not ids:
        raise ValueError("no EOS id: neither the model's generation_config nor the tokenizer has one")
    return ids


def special_stop_ids(tokenizer: Any, stop: list[str] | None) -> list[int]:
    """Ids of the stop strings that ``tokenizer`` holds as one special token (Hermes-2-Pro's ``</tool_call>``): an
    engine that matches stop strings on text decoded without special tokens (vLLM with ``skip_special_tokens``)
    never sees them, so it must stop on these ids too. Sorted; empty when there are none."""
    try:
        added = tokenizer.get_added_vocab()
        special = set(tokenizer.all_special_ids)
    except Exception:  # noqa: BLE001 (a tokenizer without added vocabulary: no special stop tokens)
        return []
    return sorted({added[s] for s in stop or [] if s in added and added[s] in special})


@dataclass(frozen=True)
class EngineCaps:
    """What an engine can do beyond ``generate``/``sync_weights``/``close``, declared once at registration
    (:func:`register_engine`) and read by everything that would otherwise probe the engine object.

    Attributes:
        kv_reuse: takes ``generate(episode_ids=...)`` and ``end_episode(id)``: the rollout names the episode of each
            row so the engine may keep its prefix warm between its turns (hf keeps the episode's keys/values,
            ``engine.kv_reuse``; vllm_server routes the episode's turns to one replica, whose prefix cache holds
            them; vllm accepts the ids and lets its own prefix cache find the turns); ``end_episode`` frees what is
            kept. An engine without it never sees episode ids.
        fork_cache: ``fork_episode(source_id, episode_id)``: a forked sibling starts from its base's cached prefix.
        token_js: ``token_js(turns, t_low, t_high, ...)`` scores per-token Jensen-Shannon divergences from full
            logits (``rollout.fork.select=js``).
        carries_versions: its generations carry the weights' version themselves (``Generation.policy_version``):
            no :class:`~agent_rl.engines.VersionedEngine` around it (algorithms.md section 7).
        sleep: ``sleep()``/``wake_up()`` free its accelerator memory between rollouts (vLLM's sleep mode).
        own_process: generates in processes of its own (a vLLM engine or server): the learner's weights reach it by
            a weight-sync route, never by sharing the policy module (an asynchronous run needs no copy of the
            policy for it).
        step_metrics: ``step_metrics()`` returns its own metrics for the step (``vllm_server``: the servers'
            ``/metrics``).
        prefix_cache_stats: ``prefix_cache_stats()`` returns its prefix-cache hit counters.
        model_len_limit: honours ``engine.max_model_len`` (the longest prompt + response it accepts): the prompt
            budget is capped to fit it when the config loads.
    """

    kv_reuse: bool = False
    fork_cache: bool = False
    token_js: bool = False
    carries_versions: bool = False
    sleep: bool = False
    own_process: bool = False
    step_metrics: bool = False
    prefix_cache_stats: bool = False
    model_len_limit: bool = False


class EngineBase:
    """Base class of the engines: their declared :class:`EngineCaps` (class attribute ``caps``) and no-op defaults
    of every optional method, so a caller reads ``engine.caps`` and calls, never probes with ``getattr``. A method
    whose capability is not declared keeps the default: a no-op for the ones with nothing to do (``end_episode``,
    ``sleep``, ``wake_up``, ``close``), an empty answer for the metrics, ``NotImplementedError`` for the ones that
    must produce something (``fork_episode``, ``token_js``)."""

    caps: EngineCaps = EngineCaps()
    tokenizer: Any
    eos_token_ids: list[int] | None = None

    def end_episode(self, episode_id: str) -> None:
        """The episode ``episode_id`` is over: drop what is kept for it (a no-op where nothing is)."""

    def fork_episode(self, source_id: str, episode_id: str) -> None:
        """Start ``episode_id``'s cache from ``source_id``'s (declared by ``caps.fork_cache``)."""
        raise NotImplementedError(f"{type(self).__name__} has no fork cache (EngineCaps.fork_cache)")

    def token_js(self, *args: Any, **kwargs: Any) -> Any:
        """Per-token Jensen-Shannon divergences (declared by ``caps.token_js``)."""
        raise NotImplementedError(f"{type(self).__name__} scores no token JS (EngineCaps.token_js)")

    def sleep(self) -> None:
        """Free accelerator memory until :meth:`wake_up` (declared by ``caps.sleep``; else a no-op)."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (a no-op where sleep is)."""

    def step_metrics(self) -> dict[str, float]:
        """The engine's own metrics for the step (declared by ``caps.step_metrics``; else none)."""
        return {}

    def prefix_cache_stats(self) -> dict[str, float]:
        """Prefix-cache counters (declared by ``caps.prefix_cache_stats``; else none)."""
        return {}

    def close(self) -> None:
        """Release what the engine holds; idempotent (a no-op where it holds nothing)."""


def caps_of(engine: Any) -> EngineCaps:
    """The capabilities of an engine object: its declared ``caps`` (an :class:`EngineBase`), else none beyond
    ``generate`` (a plain object with the :class:`Engine` protocol's ``generate``, as a test's scripted engine)."""
    return engine.caps if isinstance(engine, EngineBase) else EngineCaps()


EngineFactory = Callable[..., Engine]
ConfigCheck = Callable[[Any, "int | None"], list[str]]
"""A per-engine load-time config check ``(cfg, context) -> notes``: ``cfg`` the run's config, ``context`` the model's
context length when known; raises ``ValueError`` (the reason and what to do) for a config the engine cannot run."""
_ENGINES: dict[str, EngineFactory] = {}
_CAPS: dict[str, EngineCaps] = {}
_CHECKS: dict[str, ConfigCheck] = {}


def register_engine(name: str, caps: EngineCaps | None = None,
                    check: ConfigCheck | None = None) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator registering an engine factory ``(model, tokenizer, **kwargs) -> Engine`` under ``name`` with its
    declared capabilities (default: the factory's ``caps`` when it is an :class:`EngineBase` class; else none) and its
    load-time config check (``check``: :data:`ConfigCheck`, run by :func:`check_engine_config`; None = nothing to
    check). Duplicates are rejected."""

    def deco(factory: EngineFactory) -> EngineFactory:
        if name in _ENGINES:
            raise ValueError(f"engine {name!r} is already registered")
        _ENGINES[name] = factory
        declared = factory.caps if isinstance(factory, type) and issubclass(factory, EngineBase) else EngineCaps()
        _CAPS[name] = caps if caps is not None else declared
        if check is not None:
            _CHECKS[name] = check
        return factory

    return deco


def engine_caps(name: str) -> EngineCaps:
    """The declared capabilities of the registered engine ``name`` (``engine.name``).

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    if name not in _CAPS:
        _unknown(name)
    return _CAPS[name]


def check_engine_config(cfg: Any, context: int | None) -> list[str]:
    """Run the config check ``cfg.engine.name`` registered (:func:`register_engine`'s ``check``; nothing is started).

    Returns:
        the check's notes ([] for an engine without a check).
    Raises:
        ValueError: unknown engine name, or what the engine's check refuses.
    """
    name = cfg.engine.name
    if name not in _ENGINES:
        _unknown(name)
    check = _CHECKS.get(name)
    return list(check(cfg, context)) if check is not None else []


def _unknown(name: str) -> None:
    close = difflib.get_close_matches(name, list(_ENGINES), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown engine {name!r} (engine.name); valid names: {sorted(_ENGINES)}.{hint}")


def get_engine(name: str, model: Any, tokenizer: Any, **kwargs: Any) -> Engine:
    """Build the engine ``name`` (``engine.name``) around ``model``/``tokenizer``.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    if name not in _ENGINES:
        _unknown(name)
    return _ENGINES[name](model, tokenizer, **kwargs)


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def merge_engine_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """One step's engine metrics of several engines (the Ray backend's rollout workers, each with its own engine's
    ``step_metrics``): ``engine/weight_version`` the oldest, ``engine/requests_in_flight_max`` summed (their servers
    are apart), ``engine/prefix_cache_hit_rate`` the mean, everything else (sync times, probe gaps) the largest.
    Empty: {}."""
    keys = sorted({k for m in parts for k in m})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(m[key]) for m in parts if key in m]
        if key == "engine/weight_version":
            out[key] = min(values)
        elif key == "engine/requests_in_flight_max":
            out[key] = sum(values)
        elif key == "engine/prefix_cache_hit_rate":
            out[key] = sum(values) / len(values)
        else:
            out[key] = max(values)
    return out


def set_torch_threads(num_threads: int) -> None:
    """Give this process ``num_threads`` torch intra-op threads (0 = leave as is).

    Measured: with two busy threads torch's OpenMP can stall badly in tiny ops: when the engine and the
    learner share the machine with env servers or other workers, give each process one (or few) threads.
    """
    import torch

    if num_threads > 0:
        torch.set_num_threads(num_threads)
