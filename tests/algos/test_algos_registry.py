"""Registries (STYLE habit 3): decorator registration, duplicates rejected, errors list valid names, user extensions
work through the public entry points without editing anything else."""

import pytest
import torch

import agent_rl.algos as algos
from agent_rl.algos import (
    ADV_ESTIMATORS,
    CREDIT_RULES,
    POLICY_LOSSES,
    SCHEDULES,
    AdvEstimator,
    CreditInputs,
    CreditRuleName,
    PolicyLossName,
    Registry,
    ScheduleKind,
    apply_credit,
    compute_advantages,
    get_schedule,
    policy_loss,
    register_adv_estimator,
    register_credit_rule,
    register_policy_loss,
    register_schedule,
    schedule_value,
)


def test_builtins_match_enums():
    assert set(ADV_ESTIMATORS.names()) >= {e.value for e in AdvEstimator}
    assert set(POLICY_LOSSES.names()) >= {e.value for e in PolicyLossName}
    assert set(CREDIT_RULES.names()) >= {e.value for e in CreditRuleName}
    assert set(SCHEDULES.names()) >= {e.value for e in ScheduleKind}
    assert CREDIT_RULES.meta("forking")["levels"] == ("token",)
    assert CREDIT_RULES.meta("empg")["levels"] == ("turn",)
    assert get_schedule(ScheduleKind.LINEAR)(0.5, 1.0) == 0.5


def test_duplicates_rejected_and_unknown_lists_names():
    reg: Registry = Registry("thing", "x.thing")

    @reg.register("a")
    def a():
        return 1

    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(ValueError, match=r"valid names: \['a'\]"):
        reg.get("b")
    with pytest.raises(ValueError, match="already registered"):
        register_adv_estimator("grpo")(lambda r, g: r)
    with pytest.raises(ValueError, match="already registered"):
        register_credit_rule("tp")(lambda *a: a)
    with pytest.raises(ValueError, match="levels"):
        register_credit_rule("_bad_levels", levels=("episode",))
    with pytest.raises(ValueError, match="sigmoid"):
        schedule_value("sigmoidd", 1, 10)


def test_user_extensions_work_through_the_public_entry_points():
    @register_adv_estimator("_test_sign")
    def _sign(rewards, group_index, **kwargs):  # (B,) -> (B,)
        return torch.sign(rewards - 0.5)

    assert compute_advantages("_test_sign", torch.tensor([1.0, 0.0]), torch.tensor([0, 0])).tolist() == [1.0, -1.0]

    @register_policy_loss("_test_reinforce")
    def _reinforce(logprobs, old_logprobs, advantages, response_mask, *, clip_low, clip_high, dual_clip):
        return -advantages * logprobs, {}

    loss, met = policy_loss("_test_reinforce", torch.full((1, 2), -1.0), torch.zeros(1, 2), torch.tensor([2.0]),
                            torch.ones(1, 2))
    assert loss.item() == pytest.approx(2.0) and "actor/pg_loss" in met

    @register_credit_rule("_test_half", levels=("turn",))
    def _half(inputs, S, level):
        return inputs.token_advantages * 0.5, inputs.response_mask

    inp = CreditInputs(torch.ones(1), torch.ones(1, 2), torch.zeros(1, dtype=torch.long),
                       torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    assert apply_credit("_test_half", inp, 0.0, "turn")[0].tolist() == [[0.5, 0.5]]
    with pytest.raises(ValueError, match="not defined at level"):
        apply_credit("_test_half", inp, 0.0, "token")

    @register_schedule("_test_step")
    def _step(tau, m):
        return m if tau < 0.5 else 0.0

    assert schedule_value("_test_step", 10, 100) == 0.99 and schedule_value("_test_step", 60, 100) == 0.0


def test_public_api_exists():
    for name in ("compute_advantages", "compute_gae", "js_divergence_from_logits", "tgrl_token_weights",
                 "tgrl_advantages", "tgrl_delta_r", "schedule_value", "tp_mask", "turn_tp_mask", "forking_mask",
                 "entropy_adv", "empg_advantages", "policy_loss", "entropy_from_logits", "logprobs_from_logits",
                 "dapo_overlong_penalty", "dapo_keep_groups", "kl_penalty", "apply_credit", "CreditInputs",
                 "register_adv_estimator", "register_policy_loss", "register_credit_rule", "register_schedule",
                 "get_adv_estimator", "get_policy_loss", "get_credit_rule", "get_schedule"):
        assert hasattr(algos, name), name
    assert set(algos.__all__) <= set(dir(algos))


def test_algos_imports_only_torch_and_stdlib():
    import ast
    import pathlib
    import sys

    allowed = set(sys.stdlib_module_names) | {"torch"}
    pkg = pathlib.Path(algos.__file__).parent
    for f in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod.split(".")[0] in allowed, f"{f.name} imports {mod}"
