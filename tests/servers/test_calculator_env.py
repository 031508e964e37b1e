"""The example tool env ``agent_rl/Calculator-v0`` in-process (``gymnasium.make``): safe evaluation, rewards,
the turn limit. The same env behind the server and through the clients: test_server_api.py, test_envclient.py."""

from __future__ import annotations

import gymnasium
import pytest

import envs  # noqa: F401
from envs.examples.calculator import TEMPLATES, format_number, safe_eval


@pytest.mark.parametrize("expression,value", [
    ("(3 + 4) * 2", 14), ("2 ** 10", 1024), ("7 // 2", 3), ("7 % 4", 3), ("-3 + +5", 2), ("1 / 4", 0.25),
    ("17 * 13 - 6", 215),
])
def test_safe_eval_values(expression, value):
    assert safe_eval(expression) == value


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "a + 1", "len('x')", "2 ** 100", "1 / 0", "'a' * 3", "1 if 1 else 2",
    "(1).real", "9" * 300, "10 ** 16",
])
def test_safe_eval_rejects(expression):
    with pytest.raises(ValueError):
        safe_eval(expression)


def test_format_number():
    assert [format_number(x) for x in (14.0, 2.5, 1 / 3, -3.0)] == ["14", "2.5", "0.333333", "-3"]


def test_episode_in_process_and_turn_limit():
    env = gymnasium.make("agent_rl/Calculator-v0")
    obs, info = env.reset(options={"index": 0})
    assert obs.startswith("Tom saves 17 dollars a week for 13 weeks and spends 6 dollars.")
    assert (info["task_type"], info["won"], info["invalid_action"]) == ("savings", False, False)
    assert env.step("calc[17 * 13]")[0] == "Result: 221"
    obs, reward, terminated, truncated, info = env.step("calc[import os]")
    assert obs.startswith("Error:") and info["invalid_action"] and reward == 0.0
    assert env.step("say hi")[4]["invalid_action"]
    obs, reward, terminated, truncated, info = env.step("answer[214]")
    assert (obs, reward, terminated, info["won"]) == ("Wrong: the answer is 215.", 0.0, True, False)
    env.reset(options={"index": 0})
    for _ in range(9):
        assert env.step("calc[1]")[3] is False
    assert env.step("calc[1]")[3] is True  # registered with max_episode_steps=10 (gymnasium's TimeLimit)
    env.reset(options={"problem": "What is 6 times 7?", "answer": 42})
    assert env.step("answer[42.0]")[1] == 1.0


def test_every_problem_has_a_whole_answer_and_seeds_repeat():
    env = gymnasium.make("agent_rl/Calculator-v0").unwrapped
    for index in range(40):
        env.reset(options={"index": index})
        assert float(env._solution).is_integer()
        assert env._task_type == sorted(TEMPLATES)[index % len(TEMPLATES)]
    first = env.reset(seed=123)[0]
    assert env.reset(seed=123)[0] == first


@pytest.mark.parametrize("solution, given, won", [
    (1e-9, "2e-9", False),  # an absolute 1e-6 tolerance called these equal (issue 10: numbers compare by value)
    (1e-9, "1e-9", True),
    (1e-9, "1.0000001e-9", True),  # within 1e-6 relative
    (3.2e-19, "1.6e-19", False),
    (215.0, "215", True),
    (215.0, "215.001", False),
    (0.0, "0.0000001", False),
    (6.02e23, "6.02e23", True),
])
def test_answers_compare_by_value(solution, given, won):
    env = gymnasium.make("agent_rl/Calculator-v0")
    env.reset(options={"problem": "custom", "answer": solution})
    _, reward, terminated, _, info = env.step(f"answer[{given}]")
    assert (reward, terminated, info["won"]) == (float(won), True, won)


@pytest.mark.parametrize("solution, given, reward, terminated", [
    (12.0, "1,2", 0.0, False),  # a comma that is not a thousands separator: not a number (it was read as 12)
    (12.0, "1,23", 0.0, False),
    (1000.0, "1,000", 1.0, True),  # thousands separators still join
    (1234567.0, "1,234,567", 1.0, True),
    (12.0, "12.", 1.0, True),
    (10.0, "1_0", 0.0, False),  # Python's digit grouping is not a number here
])
def test_answer_commas_are_only_thousands_separators(solution, given, reward, terminated):
    env = gymnasium.make("agent_rl/Calculator-v0")
    env.reset(options={"problem": "custom", "answer": solution})
    _, got, done, _, info = env.step(f"answer[{given}]")
    assert (got, done, info["invalid_action"]) == (reward, terminated, not terminated)
