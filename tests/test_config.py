"""Issue 10 sections 4 and 7: configs that cannot train are refused at load time (``load_config``), with one clear
line naming what, where and the valid choices; what is adjusted instead is said in one line."""

from __future__ import annotations

import re

import pytest
import torch

from agent_rl.config.compose import config_dict, load_config

from agent_rl.config.schema import ConfigError

from agent_rl.resume import RESUME_APPLIED, compare_for_resume

from agent_rl.config.trainable import fit_prompt_budget
from agent_rl.engines.vllm import vllm_build
from agent_rl.models import TINY_MAX_POSITIONS

CHEAP = ["env=choose_item", "model=tiny", "env_server.mode=local"]


# ------------------------------------------------------------------------------------------- section 4
def test_dapo_group_size_one_is_refused():
    # a reported input: every group of one reward is all-equal, so DAPO filtered every group and trained nothing
    with pytest.raises(ConfigError, match=r"dapo_dynamic_sampling needs algo.group_size >= 2 \(got 1\)"):
        load_config([*CHEAP, "algo=dapo", "algo.group_size=1"])
    assert load_config([*CHEAP, "algo=dapo", "algo.group_size=2"]).algo.group_size == 2


@pytest.mark.parametrize("algo", ["grpo", "drgrpo", "rloo", "gspo"])
def test_group_estimator_with_one_episode_per_group_is_refused(algo):
    # a group of one has no baseline: every advantage is 0 (tests/algos: single-row groups get exactly 0)
    with pytest.raises(ConfigError, match="gives every advantage 0"):
        load_config([*CHEAP, f"algo={algo}", "algo.group_size=1"])


def test_batch_estimator_needs_two_episodes_per_step():
    ok = load_config([*CHEAP, "algo=grpo", "algo.adv_estimator=reinforce_pp", "algo.group_size=1",
                      "trainer.tasks_per_step=2"])
    assert ok.algo.group_size == 1  # reinforce_pp's baseline is the batch: 2 episodes are enough
    with pytest.raises(ConfigError, match="reinforce_pp whitens over the step's episodes"):
        load_config([*CHEAP, "algo=grpo", "algo.adv_estimator=reinforce_pp", "algo.group_size=1",
                     "trainer.tasks_per_step=1"])


def test_tgrl_without_high_rows_is_refused():
    with pytest.raises(ConfigError, match=r"\(tgrl\) n_high >= 1"):
        load_config([*CHEAP, "algo.n_low=1", "algo.n_high=0", "algo.group_size=1"])


def test_zero_temperature_is_refused():
    with pytest.raises(ConfigError, match="temperatures must be > 0"):
        load_config([*CHEAP, "algo=grpo", "algo.temperature=0"])


@pytest.mark.parametrize("extra,match", [
    # refused at load time, not after the first rollout in the learner
    (["algo=grpo", "algo.adv_estimator=gigpo"], r"rollout.fork needs a group estimator .* \(got gigpo"),
    (["algo=grpo", "algo.adv_estimator=reinforce_pp"], r"\(got reinforce_pp"),
    (["algo=ppo"], r"\(got gae"),
    (["rollout.fork.siblings=0"], r"siblings=0 forks nothing"),
    (["rollout.fork.restore=copy"], r"rollout.fork.restore='copy' is not valid; valid values: replay, state"),
    (["rollout.max_turns=3", "rollout.fork.points=3"], r"points=3 fork turns need .* rollout.max_turns=3"),
    (["env=math", "env.action_format=tools", "rollout.max_turns=4"], r"do not replay exactly"),  # the orchestrator skipped forks silently
    (["env=external", "env.external.program=tests.gateway.programs:react_text",
      "env.external.tasks=agent_rl/Calculator-v0"], r"env=external does not fork groups"),
])
def test_forked_group_config_edges_are_refused(extra, match):
    with pytest.raises(ConfigError, match=match):
        load_config([*CHEAP, "rollout.fork.points=1", *extra])
    ok = load_config([*CHEAP, "algo=grpo", "rollout.max_turns=3", "rollout.fork.points=2"])
    assert ok.rollout.fork.enabled and load_config([*CHEAP, "algo=tgrl", "rollout.fork.points=1"]).rollout.fork.enabled
    # the state route copies the env's state: an env declared not to replay exactly is not refused for it
    by_state = load_config([*CHEAP, "rollout.fork.points=1", "rollout.fork.restore=state", "env=math",
                            "env.action_format=tools", "rollout.max_turns=4"])
    assert by_state.rollout.fork.restore == "state"


def test_tiny_defaults_fit_the_context(capsys):
    # a reported input: model=tiny with the defaults (ALFWorld: prompt budget 4096 + engine.max_new_tokens 256)
    # exceeds the tiny model's 4096 positions. Right: the prompt budget is capped to 4096 - 256 = 3840, said in one line
    cfg = load_config(["model=tiny"])
    assert TINY_MAX_POSITIONS == 4096
    assert (cfg.rollout.max_prompt_tokens, cfg.engine.max_new_tokens) == (3840, 256)
    err = capsys.readouterr().err
    assert "config: rollout.max_prompt_tokens capped 4096 -> 3840: the model's context is 4096 positions" in err
    # a budget that fits is untouched and nothing is printed; SmolLM2 has 8192 positions
    assert load_config(["model=tiny", "rollout.max_prompt_tokens=1000"]).rollout.max_prompt_tokens == 1000
    assert load_config([]).rollout.max_prompt_tokens == 4096
    assert "capped" not in capsys.readouterr().err
    # a response budget that alone fills the context is refused
    with pytest.raises(ConfigError, match="engine.max_new_tokens=4096 does not fit the model's context of 4096"):
        load_config(["model=tiny", "engine.max_new_tokens=4096"])


def test_fit_prompt_budget_after_loading():
    # the trainer checks again with the loaded model's max_position_embeddings (hub models not cached offline)
    cfg = load_config(CHEAP, check=False)
    cfg.rollout.max_prompt_tokens, cfg.engine.max_new_tokens = 4096, 32
    assert fit_prompt_budget(cfg, None, "x") is None and cfg.rollout.max_prompt_tokens == 4096
    assert fit_prompt_budget(cfg, 2048, "loaded") == ("rollout.max_prompt_tokens capped 4096 -> 2016: the model's "
                                                       "context is 2048 positions (loaded) and engine.max_new_tokens=32")
    assert cfg.rollout.max_prompt_tokens == 2016
    assert fit_prompt_budget(cfg, 2048, "loaded") is None  # idempotent


def test_repetition_penalty_off_policy_is_said(capsys):
    load_config([*CHEAP, "algo.high_repetition_penalty=1.05"])
    assert "warning: algo.high_repetition_penalty=1.05 samples T1 rows from the penalised distribution" in \
        capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available() or vllm_build() is not None,
                    reason="checks the refusal on a machine without CUDA and without vLLM")
def test_vllm_without_cuda_is_refused():
    with pytest.raises(ConfigError, match="engine=vllm needs a CUDA device") as info:
        load_config([*CHEAP, "engine=vllm"])
    assert "scripts/setup_vllm.sh" in str(info.value)  # says how to get vLLM's CPU build


@pytest.mark.vllm
def test_vllm_config_that_can_run_is_accepted_and_its_context_caps_the_prompt_budget(capsys):
    cfg = load_config([*CHEAP, "engine=vllm", "model.tiny_hidden_size=128", "engine.max_model_len=512",
                       "engine.max_new_tokens=32"])
    assert cfg.engine.name == "vllm" and cfg.rollout.max_prompt_tokens == 480  # 512 - 32
    assert "engine.max_model_len" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.parametrize("overrides,reason", [
    # head size 64 / 4 = 16: below vLLM-CPU attention's sizes (and not one of them); the fix is named
    (["model.tiny_hidden_size=64"], r"head size is 16 \(model.tiny_hidden_size=64 / 4 heads\).*"
                                    r"model.tiny_hidden_size=128"),
    (["model.tiny_hidden_size=192"], r"head size is 48"),
    (["model.tiny_hidden_size=128", f"engine.max_model_len={TINY_MAX_POSITIONS + 1}"],
     rf"engine.max_model_len={TINY_MAX_POSITIONS + 1} is longer than the model's context of {TINY_MAX_POSITIONS}"),
])
def test_vllm_config_that_cannot_run_is_refused_at_load(overrides, reason):
    with pytest.raises(ConfigError, match=reason):
        load_config([*CHEAP, "engine=vllm", *overrides])


@pytest.mark.vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU build: no sleep mode")
def test_vllm_sleep_mode_and_in_process_engine_on_cpu_are_refused():
    with pytest.raises(ConfigError, match="engine.sleep_mode=true: vLLM's CPU build has no sleep mode"):
        load_config([*CHEAP, "engine=vllm", "model.tiny_hidden_size=128", "engine.sleep_mode=true"])
    with pytest.raises(ConfigError, match="engine.multiprocessing=false: vLLM's CPU build in the trainer's process"):
        load_config([*CHEAP, "engine=vllm", "model.tiny_hidden_size=128", "engine.multiprocessing=false"])


# ------------------------------------------------------------------------------------------- section 7
BAD = [
    ("algo.adv_estimator=grpoo", "unknown advantage estimator 'grpoo' (algo.adv_estimator); valid names: ['drgrpo', "
                                 "'gigpo', 'grpo', 'reinforce_pp', 'rloo']. Did you mean 'grpo'?"),
    ("algo.policy_loss=ppo", "unknown policy loss 'ppo' (algo.policy_loss); valid names: ['gspo', 'ppo_clip']"),
    ("credit.name=jss", "unknown credit rule 'jss' (credit); valid names: ['empg', 'entropy_adv', 'forking', 'js', "
                        "'tp', 'uniform']. Did you mean 'js'?"),
    ("schedule.kind=linea", "unknown schedule 'linea' (schedule); valid names: ['constant', 'linear', 'none', "
                            "'power', 'sigmoid']. Did you mean 'linear'?"),
    ("engine.name=vlm", "unknown engine 'vlm' (engine.name); valid names: ['hf', 'vllm', 'vllm_server']. "
                        "Did you mean 'vllm'?"),
    ("env.prompt=mathh", "unknown prompt format 'mathh'; valid: ['alfworld', 'alfworld_goal', 'code', 'generic', "
                         "'math', 'react', 'react_webshop', 'textworld', 'webshop']"),
    ("credit=forking credit.level=turn", "credit=forking is not defined at credit.level=turn; it supports ['token']"),
    ("credit=uniform credit.kwargs.alpha=1", "credit.kwargs alpha not accepted by credit=uniform; valid keys: (none)"),
    ("credit=entropy_adv credit.kwargs.alpah=1", "credit.kwargs alpah not accepted by credit=entropy_adv; valid "
                                                 "keys: alpha, kappa"),
    ("env.id=agent_rl/ChoseItem-v0", "env.id='agent_rl/ChoseItem-v0' is not a registered gymnasium id; registered: "
                                     "agent_rl/ALFWorld-v0, "),
    ("env.kwargs.bogus=1", "env.kwargs bogus not accepted by agent_rl/ChooseItem-v0 "
                           "(envs.examples.choose_item:ChooseItemEnv); valid keys: action_format, items, targets"),
    ("trainer.device=gpu", "trainer.device='gpu' is not a device; valid: auto, cpu, cuda, cuda:N"),
    ("trainer.imports=[no_such_module_xyz]", "trainer.imports: cannot import 'no_such_module_xyz'"),
    ("env_server.imports=[no_such_module_xyz]", "env_server.imports: cannot import 'no_such_module_xyz'"),
    ("model.name=/no/such/model", "model.name='/no/such/model' looks like a local path but is not a folder; valid: "
                                  "smollm2, tiny, a hub id (org/name) or an existing folder"),
    ("model.path=/no/such/model", "model.path='/no/such/model' is not a folder"),
    ("env_server.local_kind=threads", "env_server.local_kind='threads' is not valid; valid values: thread, process"),
    ("rollout.max_prompt_tokens=0", "rollout.max_prompt_tokens >= 1"),
    ("algo=grp", "unknown option algo=grp: available options in 'algo': dapo, drgrpo, grpo, gspo, ppo, rloo, tampo, "
                 "tgrl, tgrl_small. Did you mean algo=grpo?"),
    ("trainer.total_steps=many", "could not be converted to Integer (trainer.total_steps)"),
]


@pytest.mark.parametrize(("override", "message"), BAD, ids=[b[0] for b in BAD])
def test_config_errors_are_one_line_with_the_valid_choices(override, message):
    with pytest.raises(ConfigError) as err:
        load_config([*CHEAP, *override.split()])
    # other test modules register test-only entries ("_test_...") in the same process: leave them out of the list
    text = re.sub(r"'_test_\w+', ", "", str(err.value))
    assert message in text
    assert "\n" not in text


def test_good_choices_pass_the_same_checks():
    load_config([*CHEAP, "credit=entropy_adv", "credit.kwargs.alpha=0.5", "algo=grpo"])
    load_config([*CHEAP, "env.kwargs.items=[a,b]", "trainer.device=cpu"])
    for env in ("alfworld", "webshop", "math", "code", "gym"):  # every preset's env id and kwargs check out
        load_config([f"env={env}"])


# ------------------------------------------------------------------------------------------- section 5 (unit)
MUST_MATCH = ["algo.name", "algo.adv_estimator", "algo.clip_high", "algo.group_size", "credit.name", "credit.kwargs",
              "schedule.kind", "model.name", "model.dtype", "env.id", "env.kwargs", "env.sampler.options",
              "engine.max_new_tokens", "engine.top_p",
              "optim.lr", "rollout.mode", "rollout.max_turns", "trainer.seed", "trainer.tasks_per_step"]
MAY_CHANGE = ["trainer.total_steps", "trainer.save_every", "trainer.keep_checkpoints", "trainer.progress",
              "trainer.loggers", "trainer.output_dir", "trainer.device", "engine.batch_size", "env_server.urls",
              "env_server.mode", "data.root", "algo.micro_batch_size", "model.gradient_checkpointing"]


def _changed(saved: dict, key: str) -> dict:
    """A copy of ``saved`` with ``key``'s value replaced by a different one of the same kind."""
    import copy

    out = copy.deepcopy(saved)
    node = out
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    value = node[last]
    node[last] = (not value if isinstance(value, bool) else value + 1 if isinstance(value, (int, float))
                  else {"changed": 1} if isinstance(value, dict) else ["changed"] if isinstance(value, list)
                  else f"{value}-changed")
    return out


@pytest.mark.parametrize("key", MUST_MATCH)
def test_resume_refuses_a_key_that_must_match(key):
    cfg = load_config(CHEAP, check=False)
    saved = _changed(config_dict(cfg), key)
    with pytest.raises(ConfigError, match=rf"resuming changes 1 key\(s\) that must match .*{key}: .*"
                                          "trainer.resume_allow_changes=true"):
        compare_for_resume(saved, cfg)
    cfg.trainer.resume_allow_changes = True
    if key not in RESUME_APPLIED:  # nothing applies the change: refused even when asked for (issue 20)
        with pytest.raises(ConfigError, match=rf"even with trainer.resume_allow_changes=true: {key}: "):
            compare_for_resume(saved, cfg)
        return
    lines = compare_for_resume(saved, cfg)
    assert any(line.startswith(f"resume: {key}: ") and line.endswith(f"(applied: {RESUME_APPLIED[key]})")
               for line in lines)
    assert "not the run it continues" in lines[-1]


@pytest.mark.parametrize("key", MAY_CHANGE)
def test_resume_accepts_a_key_that_may_change(key):
    cfg = load_config(CHEAP, check=False)
    lines = compare_for_resume(_changed(config_dict(cfg), key), cfg)
    assert len(lines) == 1 and lines[0].startswith(f"resume: {key}: ") and lines[0].endswith("(may change)")


def test_resume_reports_keys_added_or_removed_by_a_code_upgrade():
    cfg = load_config(CHEAP, check=False)
    saved = config_dict(cfg)
    saved["algo"]["old_key"] = 0  # a key the new code no longer has
    del saved["trainer"]["tasks_per_step"]  # a key the old code did not have
    assert compare_for_resume(saved, cfg) == [
        "resume: algo.old_key: 0 -> '(absent)' (removed key)",
        "resume: trainer.tasks_per_step: '(absent)' -> 8 (new key)",
    ]
    assert compare_for_resume(config_dict(cfg), cfg) == []  # the same config: silent
    assert "no saved config found" in compare_for_resume(None, cfg)[0]


def test_resume_total_steps_under_a_schedule_is_noted():
    cfg = load_config([*CHEAP, "schedule=linear"], check=False)
    lines = compare_for_resume(_changed(config_dict(cfg), "trainer.total_steps"), cfg)
    assert lines[-1] == "resume: note: schedule=linear depends on trainer.total_steps; the remaining steps follow " \
                        "the new N"


# ------------------------------------------------------------------------------------- one default per concept
def test_one_default_per_concept():
    """The root ``configs/config.yaml`` and the group options it selects by default restate the schema's dataclass
    defaults, never another value; presets (``algo=tgrl``'s JS credit, its 4 mini-batches) are presets. The learner's
    own default credit rule is the config's."""
    from dataclasses import asdict

    import yaml

    from agent_rl.config.schema import CONFIG_DIR, Config
    from agent_rl.learner import AlgoConfig, Learner, OptimConfig
    from agent_rl.models import load_policy

    defaults = asdict(Config())
    root = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())
    chosen = {k: v for item in root["defaults"] if isinstance(item, dict) for k, v in item.items()}
    assert chosen["credit"] == "uniform" and chosen["schedule"] == "none"
    files = {"root": {k: v for k, v in root.items() if k != "defaults"}}
    for group in ("credit", "schedule", "engine", "trainer", "model"):
        files[group] = yaml.safe_load((CONFIG_DIR / group / f"{chosen[group]}.yaml").read_text())
    differ = []
    for name, tree in files.items():
        for section, values in tree.items():
            for key, value in (values or {}).items():
                default = defaults[section][key]
                if value != (list(default) if isinstance(default, tuple) else default):
                    differ.append(f"{name}: {section}.{key}={value!r} (schema default {default!r})")
    assert differ == []
    assert load_config([*CHEAP, "algo=grpo"]).credit.name == "uniform"
    assert load_config([*CHEAP, "algo=tgrl"]).credit.name == "js"  # the preset's choice
    model, tok = load_policy(load_config(CHEAP).model)
    assert Learner(model, tok, AlgoConfig(name="tgrl"), OptimConfig()).credit == Config().credit  # no hidden rule


# ------------------------------------------------------------------------------------- backend capabilities
@pytest.mark.parametrize("override,needs", [
    ("trainer.num_learners=2", "trainer.num_learners=2 needs a backend with data parallel (trainer.backend=ray)"),
    ("rollout.num_workers=2", "rollout.num_workers=2 needs a backend with rollout workers (trainer.backend=ray)"),
    ("env_server.replicas=2", "env_server.replicas=2 needs a backend with rollout workers (trainer.backend=ray)"),
])
def test_what_the_local_backend_cannot_do_is_refused_at_load(override, needs):
    with pytest.raises(ConfigError, match=re.escape(needs + "; trainer.backend=local has none")):
        load_config([*CHEAP, "algo=grpo", override])
    assert load_config([*CHEAP, "algo=grpo", override, "trainer.backend=ray", "trainer.tasks_per_step=2"])


def test_every_learner_rank_needs_a_group_at_load():
    with pytest.raises(ConfigError, match="trainer.tasks_per_step=1 < trainer.num_learners=2: every learner rank"):
        load_config([*CHEAP, "algo=grpo", "trainer.backend=ray", "trainer.num_learners=2", "trainer.tasks_per_step=1"])


def test_sft_keys_are_validated_with_the_rest_of_the_config():
    with pytest.raises(ConfigError, match=r"sft has no key 'epoch'.*Did you mean 'sft.epochs'"):
        load_config([*CHEAP, "sft.epoch=2"])
    with pytest.raises(ConfigError, match="sft.response_template must contain {action}"):
        load_config([*CHEAP, "sft.response_template=plain"])
    assert load_config([*CHEAP, "sft.epochs=3"]).sft.epochs == 3
