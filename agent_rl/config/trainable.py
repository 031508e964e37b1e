"""Configs that cannot train are refused when they load (docs/training.md, "Refused configs"):
:func:`check_trainable` checks registry names, the env id and its kwargs, the device, the model's context, and the
combinations of keys that cannot work together (the backend's capabilities, :data:`agent_rl.config.schema.BACKENDS`;
asynchronous rollouts), and resolves ``trainer.warm_start`` (:func:`resolve_warm_start`). Called by
:func:`agent_rl.config.compose.load_config`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from pathlib import Path
from typing import Any

import gymnasium
import torch

import envs  # noqa: F401 (registers the built-in ids)
from agent_rl import algos
from agent_rl.config.schema import BACKENDS, Config, ConfigError
from agent_rl.engines import check_engine_config, engine_caps, engine_names
from agent_rl.models import model_context_length
from agent_rl.rollout import get_prompt
from agent_rl.rollout.tool_calls import get_tool_call_format
from envs.families import family_of
from envs.wrappers import WRAPPER_KWARGS

DEVICE_HELP = "auto, cpu, cuda, cuda:N"


def _registry_checks(cfg: Config) -> None:
    """Registry names (after ``trainer.imports``, which may register a user's entries): ``ValueError`` listing the
    valid names."""
    if not cfg.algo.uses_critic:
        algos.get_adv_estimator(cfg.algo.adv_estimator)
    algos.get_policy_loss(cfg.algo.policy_loss)
    levels = algos.CREDIT_RULES.meta(cfg.credit.name).get("levels", ("token", "turn"))
    if cfg.credit.level not in levels:
        raise ValueError(f"credit={cfg.credit.name} is not defined at credit.level={cfg.credit.level}; "
                         f"it supports {list(levels)}")
    rule_params = _keyword_params(algos.get_credit_rule(cfg.credit.name), skip=3)  # (inputs, S, level, ...)
    unknown = sorted(set(cfg.credit.kwargs) - set(rule_params)) if rule_params is not None else []
    if unknown:
        raise ValueError(f"credit.kwargs {', '.join(unknown)} not accepted by credit={cfg.credit.name}; valid keys: "
                         f"{', '.join(rule_params or []) or '(none)'}")
    algos.get_schedule(cfg.schedule.kind)
    if cfg.engine.name not in engine_names():
        close = difflib.get_close_matches(cfg.engine.name, engine_names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown engine {cfg.engine.name!r} (engine.name); valid names: {engine_names()}.{hint}")
    get_prompt(cfg.env.prompt)
    if cfg.env.action_format == "tools":
        get_tool_call_format(cfg.model.tool_call_format)


def _keyword_params(fn: Any, skip: int = 0) -> list[str] | None:
    """Keyword parameter names of ``fn`` after its first ``skip`` parameters; None if it takes ``**kwargs`` (or
    cannot be inspected), so any key is accepted."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params[skip:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _import_all(key: str, modules: list[str]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"{key}: cannot import {module!r} ({exc}); the module must be importable from the "
                              "working directory or PYTHONPATH") from None


def _env_checks(cfg: Config) -> None:
    """``env.id`` registered (built-ins and ``env_server.imports``) and ``env.kwargs`` accepted by its constructor.
    Skipped for env servers given by URL (their registry is theirs). The turn budget has one key, rollout.max_turns."""
    if "max_episode_steps" in cfg.env.kwargs:
        raise ConfigError("env.kwargs.max_episode_steps is not a key here: the turn budget is rollout.max_turns "
                          "(passed to the env as gymnasium's max_episode_steps)")
    if cfg.env_server.mode == "http" and cfg.env_server.urls:
        return
    if cfg.env.external.enabled and cfg.env.external.from_file:  # env=external on a task file: no env is made
        if not Path(cfg.env.external.tasks).exists():
            raise ConfigError(f"env.external.tasks={cfg.env.external.tasks} does not exist (a task file or folder, "
                              "or a registered env id)")
        return
    _import_all("env_server.imports", cfg.env_server.imports)
    spec = gymnasium.registry.get(cfg.env.id)
    if spec is None:
        ids = sorted(k for k in gymnasium.registry if "/" in k)
        close = difflib.get_close_matches(cfg.env.id, list(gymnasium.registry), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"env.id={cfg.env.id!r} is not a registered gymnasium id; registered: {', '.join(ids)} "
                          f"(a user's env: env_server.imports=[module] calling gymnasium.register).{hint}")
    entry = spec.entry_point
    try:
        ctor = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception:  # noqa: BLE001 (an entry point that cannot be loaded here fails, with its reason, when built)
        return
    accepted = _keyword_params(ctor)
    if accepted is None:
        return
    unknown = sorted(set(cfg.env_kwargs) - set(accepted) - {"max_episode_steps", *WRAPPER_KWARGS})  # make_env's
    for key, what in (("action_format", "env.action_format=tools"), ("tools", f"env.tools={list(cfg.env.tools)}")):
        if key in unknown and key not in cfg.env.kwargs:
            raise ConfigError(f"{what}: {cfg.env.id} ({entry}) takes no {key!r} argument, so it offers no tool "
                              "interface; a tool env takes action_format='tools' and declares its tools "
                              "(docs/tools.md)")
    if unknown:
        raise ConfigError(f"env.kwargs {', '.join(unknown)} not accepted by {cfg.env.id} ({entry}); valid keys: "
                          f"{', '.join(sorted(accepted)) or '(none)'}")


def _device_checks(cfg: Config) -> None:
    name = cfg.trainer.device
    if name == "auto":
        return
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"trainer.device={name!r} is not a device; valid: {DEVICE_HELP}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name!r} but torch finds no CUDA device; use trainer.device=cpu (or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"trainer.device={name!r}: only {torch.cuda.device_count()} CUDA device(s)")


def fit_prompt_budget(cfg: Config, context: int | None, source: str) -> str | None:
    """Keep every row inside the model's context: ``rollout.max_prompt_tokens + engine.max_new_tokens <= context``
    (a row is at most one prompt plus one response, also in trajectory mode, whose prompt holds the history).
    A larger prompt budget is capped to ``context - max_new_tokens`` in place (returns the one-line note to print);
    ``engine.max_new_tokens >= context`` is refused (ConfigError). ``context`` None (unknown) checks nothing."""
    if not context:
        return None
    budget, new = cfg.rollout.max_prompt_tokens, cfg.engine.max_new_tokens
    if new >= context:
        raise ConfigError(f"engine.max_new_tokens={new} does not fit the model's context of {context} positions "
                          f"({source}); lower it below {context}")
    if budget + new <= context:
        return None
    cfg.rollout.max_prompt_tokens = context - new
    return (f"rollout.max_prompt_tokens capped {budget} -> {context - new}: the model's context is {context} "
            f"positions ({source}) and engine.max_new_tokens={new}")


def check_trainable(cfg: Config) -> list[str]:
    """Refuse at load time what cannot train, and say what was adjusted (docs/training.md "Refused
    configs"). Imports ``trainer.imports`` (a user's registry entries) and, for in-process or auto-started envs,
    ``env_server.imports``.

    Checks: registry names (estimator, policy loss, credit rule and level, schedule, engine, prompt format); the env
    id and its constructor kwargs; ``trainer.device``; the model's context (prompt budget capped, see
    :func:`fit_prompt_budget`); batch-level estimators need >= 2 episodes per step; DAPO
    overlong ``L_c <= L_max``.
    Single-group checks (``algo=dapo`` with G < 2, group estimators with G = 1, temperatures 0) are in the
    dataclasses' ``__post_init__``.

    Returns:
        one-line notes (adjustments and warnings) that :func:`load_config` prints.
    Raises:
        ConfigError: what, where, and the valid choices.
    """
    notes: list[str] = []
    _import_all("trainer.imports", cfg.trainer.imports)
    notes += resolve_warm_start(cfg)  # trainer.warm_start auto -> dagger | bc | none, bc without an expert refused
    try:
        _registry_checks(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _env_checks(cfg)
    _device_checks(cfg)
    if cfg.model.path and not Path(cfg.model.path).is_dir():
        raise ConfigError(f"model.path={cfg.model.path!r} is not a folder (a saved model or checkpoint)")
    if cfg.model.name.startswith(("/", "./", "../", "~")) and not Path(cfg.model.name).expanduser().is_dir():
        raise ConfigError(f"model.name={cfg.model.name!r} looks like a local path but is not a folder; valid: "
                          "smollm2, tiny, a hub id (org/name) or an existing folder")
    context = model_context_length(cfg.model)
    source = f"model={cfg.model.name}"
    try:  # the engine's own load-time check (vllm: installed, recent, head size; vllm_server: its servers)
        notes += check_engine_config(cfg, context)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if engine_caps(cfg.engine.name).model_len_limit and cfg.engine.max_model_len and (
            not context or cfg.engine.max_model_len < context):
        context, source = cfg.engine.max_model_len, "engine.max_model_len"
    note = fit_prompt_budget(cfg, context, source)
    if note:
        notes.append(note)
    algo = cfg.algo
    if algo.adv_estimator == "reinforce_pp" and cfg.trainer.tasks_per_step * algo.group_size < 2:
        raise ConfigError("algo.adv_estimator=reinforce_pp whitens over the step's episodes: trainer.tasks_per_step x "
                          f"algo.group_size = {cfg.trainer.tasks_per_step * algo.group_size} gives advantage 0; "
                          "use >= 2 episodes per step")
    if cfg.env.tools and cfg.rollout.max_turns < 2:
        raise ConfigError(f"env.tools={list(cfg.env.tools)} makes an episode multi-turn (tool calls, then the final "
                          f"answer) but rollout.max_turns={cfg.rollout.max_turns}; set rollout.max_turns >= 2 "
                          "(env=math_python uses 4)")
    if algo.dapo_overlong and algo.dapo_overlong_cache_len > algo.dapo_overlong_max_len:
        raise ConfigError(f"algo.dapo_overlong_cache_len={algo.dapo_overlong_cache_len} must be <= "
                          f"algo.dapo_overlong_max_len={algo.dapo_overlong_max_len}")
    _backend_checks(cfg)
    notes += _async_checks(cfg)
    mini = algo.num_mini_batches
    if mini > cfg.trainer.tasks_per_step:
        notes.append(f"algo.num_mini_batches={mini} > trainer.tasks_per_step={cfg.trainer.tasks_per_step}: "
                     "mini-batches hold whole groups, so a step makes at most tasks_per_step optimiser steps")
    if algo.high_repetition_penalty != 1.0:
        notes.append(f"warning: algo.high_repetition_penalty={algo.high_repetition_penalty} samples T1 rows from "
                     "the penalised distribution while the learner's log-probs are unpenalised (off-policy by that "
                     "much; the reference code does the same); algo.behaviour_correction=tis weights each token by "
                     "min(exp(old_logp - logp_beh), cap) and so corrects it (auto: tis only when "
                     "trainer.max_staleness >= 1)")
    return notes


def resolve_warm_start(cfg: Config) -> list[str]:
    """``trainer.warm_start`` resolved in place: auto -> for the embedded default model (``model.name=smollm2``, no
    ``model.path``) with text actions, dagger on an env whose expert labels any state (``EnvFamily.state_expert``:
    ALFWorld's handcoded expert), bc on an env whose family describes an expert (TextWorld's walkthroughs, WebShop's
    oracle); none otherwise. Returns the note to print.

    Raises:
        ConfigError: ``bc`` or ``dagger`` on an env without an expert (a family that describes none, e.g. math and
            code; an env that describes no family, unless ``sft.expert_kwarg`` names its expert kwarg) or with
            tool-call actions; ``dagger`` on an env whose expert cannot label the states a policy reaches.
    """
    t = cfg.trainer
    family = family_of(cfg.env.id)
    # the env has an expert: its family names the expert kwarg, or (an env without a family) sft.expert_kwarg is set
    expert = bool(family.expert_kwarg) if family is not None else cfg.sft.expert_kwarg is not None
    state_expert = expert and family is not None and family.state_expert
    if t.warm_start == "auto":
        embedded = cfg.model.name == "smollm2" and not cfg.model.path and cfg.env.action_format == "text"
        t.warm_start = ("dagger" if state_expert else "bc") if embedded and expert else "none"
        if t.warm_start == "dagger":
            return [f"trainer.warm_start=auto -> dagger: model={cfg.model.name} is the embedded default and "
                    f"{cfg.env.id}'s expert labels any state; it is cloned, then {cfg.sft.dagger_rounds} DAgger "
                    "round(s) (sft.*), then RL (trainer.warm_start=bc: cloning only; none: RL only)"]
        if t.warm_start == "bc":
            return [f"trainer.warm_start=auto -> bc: model={cfg.model.name} is the embedded default and {cfg.env.id} "
                    "has an expert; it is cloned first (sft.*), then RL (trainer.warm_start=none: RL only)"]
        return []
    if t.warm_start in ("bc", "dagger"):
        what = "clones the env's expert" if t.warm_start == "bc" else "asks the env's expert to label states"
        if not expert:
            why = (f"its family ({family.name}, envs.families) describes no expert" if family is not None else
                   "it describes no env family (envs.families.register_family) and sft.expert_kwarg is not set")
            raise ConfigError(f"trainer.warm_start={t.warm_start} {what}, but {cfg.env.id} has none: {why}; "
                              "use trainer.warm_start=none (or auto)")
        if cfg.env.action_format != "text":
            raise ConfigError(f"trainer.warm_start={t.warm_start} needs env.action_format=text: the env experts give "
                              "text commands, and their tool-call form (docs/tools.md) is not written yet")
        if t.warm_start == "dagger" and not state_expert:
            raise ConfigError(f"trainer.warm_start=dagger asks the expert what it would play in the states the policy "
                              f"reached, but {cfg.env.id} has no state expert (envs.families: state_expert is "
                              "false; its expert follows its own episode, e.g. TextWorld's walkthrough); use "
                              "trainer.warm_start=bc")
    return []


def _async_checks(cfg: Config) -> list[str]:
    """Asynchronous rollouts (``trainer.max_staleness`` >= 1) that cannot work are refused; keys that only act with
    them are noted when set without them."""
    k, r = cfg.trainer.max_staleness, cfg.rollout
    if k == 0:
        return ["note: rollout.partial=true has no effect with trainer.max_staleness=0 (synchronous rollouts: no "
                "weight sync happens during an episode)"] if r.partial else []
    if cfg.engine.sleep_mode:
        raise ConfigError(f"engine.sleep_mode=true frees the engine's GPU memory during every update, but "
                          f"trainer.max_staleness={k} keeps it generating then; set engine.sleep_mode=false or "
                          "trainer.max_staleness=0")
    return []


def _backend_checks(cfg: Config) -> None:
    """What ``trainer.backend`` cannot do (:data:`BACKENDS`) is refused here, with the backend that can."""
    t, caps = cfg.trainer, BACKENDS[cfg.trainer.backend]
    asks = [(t.num_learners > 1, "data_parallel", f"trainer.num_learners={t.num_learners}"),
            (cfg.rollout.num_workers > 1, "rollout_workers", f"rollout.num_workers={cfg.rollout.num_workers}"),
            (cfg.env_server.replicas > 1, "rollout_workers", f"env_server.replicas={cfg.env_server.replicas}"),
            (t.learner_strategy == "fsdp", "sharded_learner", "trainer.learner_strategy=fsdp")]
    for asked, capability, what in asks:
        if asked and not getattr(caps, capability):
            able = [name for name, c in BACKENDS.items() if getattr(c, capability)]
            raise ConfigError(f"{what} needs a backend with {capability.replace('_', ' ')} (trainer.backend="
                              f"{'|'.join(able)}); trainer.backend={t.backend} has none")
    if t.num_learners > t.tasks_per_step:
        raise ConfigError(f"trainer.tasks_per_step={t.tasks_per_step} < trainer.num_learners={t.num_learners}: every "
                          "learner rank needs at least one whole group")
    if t.learner_strategy == "fsdp" and cfg.algo.uses_critic:
        raise ConfigError(f"trainer.learner_strategy=fsdp does not shard the value head of algo={cfg.algo.name}; "
                          "use trainer.learner_strategy=ddp")
    if t.fsdp_offload and t.learner_gpus <= 0:
        raise ConfigError("trainer.fsdp_offload=true moves the FSDP shards from GPU to CPU memory: it needs "
                          "trainer.learner_gpus > 0 (a CPU learner's shards are in CPU memory already)")
