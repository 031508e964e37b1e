"""``envs.families``: each built-in env family describes itself once (panels, default split, split sizes, task type
key, expert kwarg) as plain data; a user's env registers its own or gets the default description."""

from __future__ import annotations

import gymnasium
import pytest

import envs  # noqa: F401 (registers the built-in ids)
from envs import families
from envs.families import BUILTIN, EnvFamily, describe, family_of, register_family


def test_every_builtin_description_names_a_registered_id_and_its_default_panel_has_tasks(require_alfworld):
    sizes = {}
    for env_id in BUILTIN:
        fam = family_of(env_id)
        assert isinstance(fam, EnvFamily) and fam.env_id == env_id and env_id in gymnasium.registry
        if fam.has_panels:
            sizes[fam.name] = fam.split_size(fam.env_split(fam.default_split), None)
    # the papers' panel sizes: ALFWorld valid_unseen 134 games, WebShop's 500 held-out goals, MATH500, HumanEval+ 164
    assert sizes == {"alfworld": 134, "webshop": 500, "math": 500, "code": 164}
    alf = family_of("agent_rl/ALFWorld-v0")
    assert alf.split_size("valid_seen", None) == 140
    types = alf.task_types("valid_unseen", None)
    assert len(types) == 134 and types[0] == "look_at_obj_in_light" and len(set(types)) == 6
    assert family_of("agent_rl/TextWorld-v0").has_panels is False  # games are generated on demand: no fixed split


def test_splits_keys_aliases_and_experts_are_the_envs_own():
    web, math_, code = (family_of(f"agent_rl/{n}-v0") for n in ("WebShop", "Math", "Code"))
    assert web.env_split("test") == "val" and web.env_split("train") == "train"
    assert (web.split_key, math_.split_key, code.split_key) == ("split", "dataset", "dataset")
    assert math_.canonical("math_train_deepscaler") == "math_train" and math_.canonical("nope") == "nope"
    assert code.canonical("mbpp") == "mbpp" and web.canonical(None) is None
    assert {n: family_of(i).expert_kwarg for i, n in
            [("agent_rl/ALFWorld-v0", "alfworld"), ("agent_rl/WebShop-v0", "webshop"),
             ("agent_rl/TextWorld-v0", "textworld"), ("agent_rl/Math-v0", "math"), ("agent_rl/Code-v0", "code")]} == \
        {"alfworld": "expert", "webshop": "expert", "textworld": "expert", "math": "", "code": ""}
    with pytest.raises(ValueError, match="unknown WebShop split 'nope'; valid: test \\(= val\\), val, train, all"):
        web.split_size("nope", None)
    with pytest.raises(KeyError, match="unknown math dataset 'nope'"):
        math_.split_size("nope", None)


def test_a_users_env_registers_its_description_once_or_gets_the_default(monkeypatch):
    monkeypatch.setattr(families, "_REGISTRY", dict(families._REGISTRY))  # this test's registrations stay here
    default = describe("me/Thing-v3")
    assert (default.name, default.has_panels, default.expert_kwarg, default.task_type_key) == \
        ("thing", False, "expert", "task_type")
    assert family_of("me/Thing-v3") is None
    mine = EnvFamily(name="thing", env_id="me/Thing-v3", default_split="test", split_size=lambda split, root: 7)
    register_family(mine)
    assert describe("me/Thing-v3") is mine and mine.has_panels
    with pytest.raises(ValueError, match="already described"):
        register_family(mine)
    with pytest.raises(ValueError, match="already described"):
        register_family(EnvFamily(name="alfworld", env_id="agent_rl/ALFWorld-v0"))
