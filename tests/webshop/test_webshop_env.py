"""The env's contract: bad input (each a clear answer, no crash), reset options, info, the llm observation mode."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from envs.webshop import WebShopEnv, parse_action
from envs.wrappers import EpisodeOverError


@pytest.fixture()
def env(make_env):
    return make_env(observation_mode="text")


def _assert_unchanged_invalid(before_obs, result, error_part):
    obs, reward, terminated, truncated, info = result
    assert obs == before_obs
    assert reward == 0.0
    assert terminated is False and truncated is False
    assert info["invalid_action"] is True
    assert error_part in info["error"]
    json.dumps(info)


def test_parse_action_matches_reference_regex():
    assert parse_action("search[red shoes]") == ("search", "red shoes")
    assert parse_action("click[buy now]") == ("click", "buy now")
    assert parse_action("search[]") == ("search[]", None)  # (.+) needs one char
    assert parse_action("search[a [b] c]") == ("search[a ", "b] c")  # greedy name: a reference quirk, kept
    assert parse_action("no brackets") == ("no brackets", None)


def test_unknown_and_malformed_actions_leave_page_unchanged(env):
    obs, _ = env.reset(options={"goal_idx": 0})
    _assert_unchanged_invalid(obs, env.step("buy it"), "could not parse")
    _assert_unchanged_invalid(obs, env.step("jump[high]"), "unknown action 'jump'")
    _assert_unchanged_invalid(obs, env.step("Search[pillows]"), "unknown action 'Search'")  # names are case-sensitive
    _assert_unchanged_invalid(obs, env.step("search[]"), "empty argument")
    _assert_unchanged_invalid(obs, env.step(""), "could not parse")


def test_clicking_what_is_not_on_the_page(env):
    obs, info = env.reset(options={"goal_idx": 0})
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    _assert_unchanged_invalid(obs, env.step("click[search]"), "nothing on this page is clickable")
    obs, *_ = env.step("search[decorative pillows]")
    _assert_unchanged_invalid(obs, env.step("click[buy now]"), "'buy now' is not clickable on this page")


def test_ten_kilobyte_query_is_rejected_clearly(env):
    obs, _ = env.reset(options={"goal_idx": 0})
    _assert_unchanged_invalid(obs, env.step("search[" + "pillow " * 1500 + "]"), "action too long (10508 chars")
    # a long but acceptable query still searches
    obs, reward, terminated, _, info = env.step("search[" + "pillow " * 200 + "]")
    assert info["page"] == "results" and not info["invalid_action"]


def test_non_string_action(env):
    # The same contract as over HTTP (422 there): refused before the env acts, the page and turn untouched.
    obs, _ = env.reset(options={"goal_idx": 0})
    for bad, name in [(None, "NoneType"), (7, "int")]:
        with pytest.raises(TypeError, match=f"takes a str action .* got {name}"):
            env.step(bad)
    assert env.step("search[pillow]")[4]["page"] == "results"


def test_blank_search_gives_empty_results(env):
    env.reset(options={"goal_idx": 0})
    obs, reward, terminated, _, info = env.step("search[ ]")  # accepted by the reference: no terms, no hits
    assert "Page 1 (Total results: 0)" in obs
    assert info["available_actions"]["clickables"] == ["back to search", "next >"]


def test_attribute_prefix_is_disabled(env):
    obs, _ = env.reset(options={"goal_idx": 0})
    _assert_unchanged_invalid(obs, env.step("search[<a> machine washable]"), "<a> (attribute) search prefix")


def test_category_and_query_prefixes(env):
    env.reset(options={"goal_idx": 0})
    _, _, _, _, info = env.step("search[<q> decorative pillows]")
    assert info["page"] == "results"
    catalog = env.unwrapped.catalog
    n = sum(p.query == "decorative pillows" for p in catalog.products)
    assert f"(Total results: {n})" in env.unwrapped._observation()
    _, _, _, _, info = env.step("search[<c>]")  # the reference raises IndexError here
    assert "(Total results: 0)" in env.unwrapped._observation()


def test_actions_after_buy_now(env):
    env.reset(options={"goal_idx": 0})
    for action in ("search[decorative pillows]", "click[b0743jkhbv]", 'click[28" x 28"]'):
        env.step(action)
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert reward == 1.0 and terminated and info["won"] and info["score"] == 1.0
    assert info["purchased"] == {"asin": "B0743JKHBV", "options": {"size": '28" x 28"'}, "price": 14.95}
    assert info["available_actions"]["clickables"] == []
    for action in ("click[buy now]", "search[pillows]", "click[back to search]"):
        with pytest.raises(EpisodeOverError, match="terminated at step 4"):  # gymnasium.make's guard (issue 20)
            env.step(action)
        obs2, reward2, terminated2, _, info2 = env.unwrapped.step(action)  # the class itself: the done page
        assert obs2 == obs and reward2 == 0.0 and terminated2 is True
        assert info2["invalid_action"] and "episode is over" in info2["error"]


def test_reset_options_and_splits(make_env):
    env = make_env()
    with pytest.raises(ValueError, match="goal_idx must be an int"):
        env.reset(options={"goal_idx": 6910})
    with pytest.raises(ValueError, match="goal_idx must be an int"):
        env.reset(options={"goal_idx": "3"})
    with pytest.raises(ValueError, match="split must be one of"):
        env.reset(options={"split": "test"})
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"goal": 3})
    with pytest.raises(ValueError, match="index must be an int in \\[0, 500\\) for split 'val'"):
        env.reset(options={"split": "val", "index": 500})
    assert env.reset(options={"split": "train", "index": 0})[1]["goal_idx"] == 500
    assert env.reset(options={"split": "val", "index": 7})[1]["goal_idx"] == 7
    for _ in range(20):
        assert env.reset(options={"split": "val"})[1]["goal_idx"] < 500
        assert env.reset()[1]["goal_idx"] >= 500  # default split: train
    a = [env.reset(seed=s, options={"split": "val"})[1]["goal_idx"] for s in (1, 2, 3)]
    b = [env.reset(seed=s, options={"split": "val"})[1]["goal_idx"] for s in (1, 2, 3)]
    assert a == b
    with pytest.raises(ValueError, match="observation_mode must be one of"):
        WebShopEnv(observation_mode="html")


def test_step_before_reset_raises(webshop_dir):
    with pytest.raises(RuntimeError, match="reset"):
        WebShopEnv().step("search[x]")


def test_time_limit_is_fifteen_steps(env):
    env.reset(options={"goal_idx": 0})
    for i in range(15):
        _, _, terminated, truncated, _ = env.step("click[nothing]")
        assert not terminated and truncated == (i == 14)


def test_admissible_actions(env):
    _, info = env.reset(options={"goal_idx": 0})
    assert info["admissible_actions"] == ["search[<query>]"]
    _, _, _, _, info = env.step("search[decorative pillows]")
    assert info["admissible_actions"][:2] == ["click[back to search]", "click[next >]"]
    assert len(info["admissible_actions"]) == 12
    _, _, _, _, info = env.step("click[b0743jkhbv]")
    assert info["admissible_actions"][:6] == [
        "click[back to search]", "click[< prev]", "click[description]", "click[features]", "click[reviews]",
        "click[buy now]",
    ]
    assert 'click[28" x 28"]' in info["admissible_actions"]
    assert info["product"] == "B0743JKHBV" and info["page"] == "item"


def test_llm_observation(make_env):
    env = make_env(observation_mode="llm")
    obs, info = env.reset(options={"goal_idx": 0})
    instruction = info["instruction"]
    assert obs.startswith(f"Instruction: {instruction}\n\nPage: search page.")
    assert obs.endswith("Admissible actions:\nsearch[<query>]")
    obs, *_ = env.step("search[decorative pillows]")
    assert 'Page: search results for "decorative pillows", page 1 (50 results, 10 per page).' in obs
    assert "[b0743jkhbv] Ambesonne Abstract Throw Pillow Cushion Cover" in obs
    assert "click[next >]" in obs.split("Admissible actions:")[1]
    obs, *_ = env.step("click[b0743jkhbv]")
    assert "Title: Ambesonne" in obs and "Price: $14.95" in obs
    assert "Selected: nothing yet" in obs
    obs, *_ = env.step('click[28" x 28"]')
    assert 'Option size: 16" x 16", 18 x 18-inch' in obs and '[28" x 28"]' in obs
    assert 'Selected: size: 28" x 28"' in obs
    obs, *_ = env.step("click[features]")
    assert obs.count("\n- ") >= 1 and "Page: Features of product b0743jkhbv." in obs
    env.step("click[< prev]")
    obs, reward, terminated, _, info = env.step("click[buy now]")
    assert terminated and reward == 1.0
    assert 'You bought B0743JKHBV (size: 28" x 28"). Score: 1.0.' in obs
    assert obs.endswith("(none: the episode is over)")


def test_sessions_share_catalog_and_index(make_env):
    a, b = make_env(), make_env(observation_mode="text_rich")
    assert a.unwrapped.catalog is b.unwrapped.catalog
    assert a.unwrapped.index is b.unwrapped.index
    a.reset(options={"goal_idx": 1})
    b.reset(options={"goal_idx": 2})
    a.step("search[shorts]")
    assert b.unwrapped.state.kind == "search"  # sessions hold their own page state


def test_registered_with_gymnasium():
    spec = gym.spec("agent_rl/WebShop-v0")
    assert spec.entry_point == "envs.webshop:WebShopEnv" and spec.max_episode_steps == 15


def test_human_goals(make_env):
    from envs.webshop import run_oracle

    env = make_env(human_goals=True)
    goals = env.unwrapped.catalog.goals
    assert len(goals) == 13  # the MTurk instructions of this catalog with attributes (docs/webshop.md 1.3)
    assert all(isinstance(g["goal_options"], list) and g["weight"] == 1 for g in goals)
    assert env.reset(options={"split": "train"})[1]["goal_idx"] < 13  # splits cover all 13 human goals
    assert [run_oracle(env, i)["score"] for i in range(13)] == [1.0] * 13


@pytest.mark.parametrize("mode", ["text", "text_rich", "llm"])
def test_random_play_never_crashes(make_env, mode):
    import random

    rng = random.Random(0)
    env = make_env(observation_mode=mode)
    junk = ["click[]", "search[<r>]", "search[<c> fashion]", "search[<q> console tables]", "click[< prev]",
            "click[next >]", "search[" + "x" * 3000 + "]", "click[description]", "search[ ]", "click[attributes]"]
    episodes = 0
    for episode in range(60):
        obs, info = env.reset(seed=episode, options={"split": "all"})
        for _ in range(15):
            choices = info["admissible_actions"] or ["click[buy now]"]
            action = rng.choice(choices + junk)
            if action == "search[<query>]":
                action = f"search[{' '.join(rng.sample(info['instruction'].split(), 3))}]"
            obs, reward, terminated, truncated, info = env.step(action)
            assert isinstance(obs, str) and 0.0 <= reward <= 1.0
            json.dumps(info)
            if terminated or truncated:
                break
        episodes += 1
    assert episodes == 60


def test_internal_failures_are_could_not_judge(env, monkeypatch):
    # Issue 10: a failure inside the search engine or the reward is EnvInfraError (500 env_infra_error over HTTP,
    # the orchestrator drops the group), never an invalid action with reward 0.
    import envs.webshop.env as webshop_env
    from envs.errors import EnvInfraError

    env.reset(options={"goal_idx": 0})
    for action in ("search[decorative pillows]", "click[b0743jkhbv]", 'click[28" x 28"]'):
        env.step(action)

    def broken(*args, **kwargs):
        raise KeyError("price table")

    monkeypatch.setattr(webshop_env, "get_reward", broken)
    with pytest.raises(EnvInfraError, match="WebShop failed on 'click\\[buy now\\]': KeyError") as info:
        env.step("click[buy now]")
    assert info.value.component == "webshop"
    env.reset(options={"goal_idx": 0})
    monkeypatch.setattr(env.unwrapped, "_top_products", broken)
    with pytest.raises(EnvInfraError, match="search\\[pillows\\]"):
        env.step("search[pillows]")
