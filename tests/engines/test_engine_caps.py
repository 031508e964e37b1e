"""Engines declare what they can do (``EngineCaps``) when they register; callers read the declaration
(``engine_caps(name)``, ``caps_of(engine)``) and call the protocol methods, whose defaults are no-ops
(``EngineBase``). Also the registered per-engine config check, and what reads the declarations at config load
(``rollout.fork.select=js`` needs ``token_js``; ``model_len_limit`` caps the prompt budget)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_rl.config.schema import Config
from agent_rl.engines import (EngineBase, EngineCaps, HFEngine, VersionedEngine, caps_of, check_engine_config,
                              engine_caps, engine_names, register_engine)
from agent_rl.engines import base as engine_registry
from agent_rl.engines.config import EngineConfig
from agent_rl.engines.vllm import VLLMEngine
from agent_rl.engines.vllm_server import VLLMServerEngine
from agent_rl.rollout.config import ForkConfig, RolloutConfig


@pytest.fixture
def registered():
    """Register test engines by name (``register_engine``) and remove them from the registry afterwards."""
    names: list[str] = []

    def add(name: str, caps: EngineCaps, check: Any = None) -> None:
        register_engine(name, caps, check=check)(lambda model, tok, **kw: None)
        names.append(name)

    yield add
    for name in names:
        for table in (engine_registry._ENGINES, engine_registry._CAPS, engine_registry._CHECKS):
            table.pop(name, None)


def test_each_registered_engine_declares_its_caps():
    """The three built-in declarations, field by field (every other field False)."""
    assert engine_names() == ["hf", "vllm", "vllm_server"]
    assert engine_caps("hf") == HFEngine.caps == EngineCaps(kv_reuse=True, fork_cache=True, token_js=True)
    assert engine_caps("vllm") == VLLMEngine.caps == EngineCaps(
        kv_reuse=True, sleep=True, own_process=True, prefix_cache_stats=True, model_len_limit=True)
    assert engine_caps("vllm_server") == VLLMServerEngine.caps == EngineCaps(
        kv_reuse=True, carries_versions=True, own_process=True, step_metrics=True, prefix_cache_stats=True,
        model_len_limit=True)
    # the rollout passes episode ids to each of them (vllm_server routes an episode to one replica by its id)
    assert all(engine_caps(n).kv_reuse for n in engine_names())
    assert [n for n in engine_names() if engine_caps(n).token_js] == ["hf"]
    assert [n for n in engine_names() if engine_caps(n).own_process] == ["vllm", "vllm_server"]


def test_unknown_engine_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown engine 'hff' \(engine.name\); valid names: \['hf', 'vllm', "
                                         r"'vllm_server'\]. Did you mean 'hf'\?"):
        engine_caps("hff")
    with pytest.raises(ValueError, match="unknown engine 'nope'"):
        check_engine_config(Config(engine=EngineConfig(name="nope")), None)


def test_register_engine_rejects_a_duplicate_and_defaults_to_the_factorys_caps():
    class Declared(EngineBase):
        caps = EngineCaps(sleep=True)

    register_engine("test_declared")(Declared)  # no caps given: the class's
    try:
        assert engine_caps("test_declared") == EngineCaps(sleep=True)
        with pytest.raises(ValueError, match="already registered"):
            register_engine("test_declared", EngineCaps())(Declared)
    finally:
        engine_registry._ENGINES.pop("test_declared")
        engine_registry._CAPS.pop("test_declared")


def test_engine_base_defaults_are_no_ops_or_refusals():
    class Plain(EngineBase):
        pass

    eng = Plain()
    assert eng.caps == EngineCaps() and caps_of(eng) == EngineCaps()
    assert eng.end_episode("ep1") is None and eng.sleep() is None and eng.wake_up() is None and eng.close() is None
    assert eng.step_metrics() == {} and eng.prefix_cache_stats() == {}
    with pytest.raises(NotImplementedError, match="Plain has no fork cache"):
        eng.fork_episode("ep1", "ep2")
    with pytest.raises(NotImplementedError, match="Plain scores no token JS"):
        eng.token_js([], 0.3, 1.2)
    assert caps_of(object()) == EngineCaps()  # a duck-typed engine (a test's scripted one) declares nothing


class Recording(EngineBase):
    """An engine that records the optional calls it receives."""

    def __init__(self, caps: EngineCaps) -> None:
        self.caps, self.tokenizer, self.eos_token_ids, self.calls = caps, "tok", [7], []

    def end_episode(self, episode_id: str) -> None:
        self.calls.append(("end_episode", episode_id))

    def fork_episode(self, source_id: str, episode_id: str) -> None:
        self.calls.append(("fork_episode", source_id, episode_id))

    def sleep(self) -> None:
        self.calls.append(("sleep",))

    def wake_up(self) -> None:
        self.calls.append(("wake_up",))

    def step_metrics(self) -> dict[str, float]:
        self.calls.append(("step_metrics",))
        return {"engine/x": 1.0}

    def prefix_cache_stats(self) -> dict[str, float]:
        return {"hit_rate": 0.5}

    def close(self) -> None:
        self.calls.append(("close",))


def test_versioned_engine_forwards_the_declared_caps_and_calls():
    inner = Recording(EngineCaps(kv_reuse=True, fork_cache=True, step_metrics=True))
    eng = VersionedEngine(inner, version=3)
    assert eng.caps == EngineCaps(kv_reuse=True, fork_cache=True, step_metrics=True, carries_versions=True)
    assert caps_of(eng) == eng.caps and eng.tokenizer == "tok" and eng.eos_token_ids == [7]
    eng.end_episode("ep1")
    eng.fork_episode("ep1", "ep2")
    eng.sleep()  # not declared: not forwarded
    eng.wake_up()
    assert eng.step_metrics() == {"engine/x": 1.0}
    assert eng.prefix_cache_stats() == {}  # not declared
    eng.close()
    assert inner.calls == [("end_episode", "ep1"), ("fork_episode", "ep1", "ep2"), ("step_metrics",), ("close",)]

    sleeper = Recording(EngineCaps(sleep=True, prefix_cache_stats=True))
    wrapped = VersionedEngine(sleeper)
    wrapped.end_episode("ep1")  # kv_reuse not declared: not forwarded
    wrapped.sleep()
    wrapped.wake_up()
    assert wrapped.prefix_cache_stats() == {"hit_rate": 0.5} and wrapped.step_metrics() == {}
    assert sleeper.calls == [("sleep",), ("wake_up",)]

    class Scripted:  # duck-typed: declares nothing, has no close
        tokenizer = None

    plain = VersionedEngine(Scripted())
    assert plain.caps == EngineCaps(carries_versions=True) and plain.eos_token_ids is None
    plain.close()  # nothing to close


def test_check_engine_config_runs_the_registered_check(registered):
    seen: list[tuple[str, int | None]] = []

    def check(cfg: Any, context: int | None) -> list[str]:
        seen.append((cfg.engine.name, context))
        if cfg.engine.max_new_tokens > 64:
            raise ValueError("test_checked: engine.max_new_tokens > 64")
        return ["test_checked: fine"]

    registered("test_checked", EngineCaps(), check)
    registered("test_unchecked", EngineCaps())
    assert check_engine_config(Config(engine=EngineConfig(name="test_checked", max_new_tokens=8)), 2048) == \
        ["test_checked: fine"]
    with pytest.raises(ValueError, match="max_new_tokens > 64"):
        check_engine_config(Config(engine=EngineConfig(name="test_checked", max_new_tokens=128)), None)
    assert seen == [("test_checked", 2048), ("test_checked", None)]
    assert check_engine_config(Config(engine=EngineConfig(name="test_unchecked")), 2048) == []
    assert check_engine_config(Config(engine=EngineConfig(name="hf")), 2048) == []  # hf registers none


def _js_fork(engine: str) -> Config:
    return Config(engine=EngineConfig(name=engine),
                  rollout=RolloutConfig(mode="trajectory", max_turns=4, fork=ForkConfig(points=1, select="js")))


def test_js_fork_is_refused_for_an_engine_without_token_js(registered):
    registered("test_no_js", EngineCaps(kv_reuse=True, fork_cache=True))
    registered("test_js", EngineCaps(token_js=True))
    for name in ("test_no_js", "vllm", "vllm_server"):
        with pytest.raises(ValueError, match=rf"select=js .* \(engine={name} returns no full logits: "
                                             r"EngineCaps.token_js\): use engine=hf"):
            _js_fork(name)
    assert _js_fork("test_js").rollout.fork.select == "js"
    assert _js_fork("hf").engine.name == "hf"


def test_model_len_limit_caps_the_prompt_budget_at_load(registered):
    """An engine that declares ``model_len_limit`` has its ``engine.max_model_len`` cap the prompt budget (the tiny
    model's own context, 2048, is larger): 300 - 64 = 236 prompt tokens; one that does not keeps the budget."""
    from agent_rl.config.compose import load_config

    registered("test_limited", EngineCaps(model_len_limit=True), lambda cfg, context: ["test_limited: checked"])
    registered("test_unlimited", EngineCaps())
    cheap = ["env=choose_item", "model=tiny", "env_server.mode=local", "engine.max_new_tokens=64",
             "engine.max_model_len=300", "rollout.max_prompt_tokens=1000"]
    assert load_config([*cheap, "engine.name=test_limited"]).rollout.max_prompt_tokens == 236
    assert load_config([*cheap, "engine.name=test_unlimited"]).rollout.max_prompt_tokens == 1000
