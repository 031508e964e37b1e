"""Code env: extraction, codec, verdict summary, env contract, and canonical solutions on a deterministic sample.

The full canonical runs (164 HumanEval, 164 HumanEval+, 974 MBPP) are in ``scripts/check_code_canonical.py``; here
every 4th HumanEval task (41), every 40th MBPP task (25) and 3 HumanEval+ tasks keep the file near one minute.
"""

from __future__ import annotations

import json
import math

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.code import CodeEnv, RunResult, SandboxLimits, build_program, extract_code, load_code, run_tests, summarize
from envs.code._codec import decode, dumps


# --- pure helpers ---------------------------------------------------------------------------------------------
def test_extract_code_rules():
    two = "text\n```python\ndef g():\n    pass\n```\nmore\n```python\ndef f(x):\n    return 1\n```\n"
    assert extract_code(two, "f") == "def f(x):\n    return 1\n"  # the block that defines the entry point
    assert extract_code(two, "") == "def f(x):\n    return 1\n"  # else the longest block
    assert extract_code("def f(): pass", "f") == "def f(): pass"  # plain text
    assert extract_code("```python\ndef f():\n    return", "f") == "def f():\n    return"  # unterminated fence
    assert extract_code("```js\nlet a\n```", "f") == "```js\nlet a\n```"  # not Python: the whole response


def test_build_program_prepends_the_humaneval_prompt():
    task = load_code("humaneval")[0]
    full = build_program(task, "def has_close_elements(numbers, threshold):\n    return True\n")
    assert full.startswith(task.prompt) and full.endswith("return True\n")
    body = build_program(task, "    return True\n")
    assert body == task.prompt + "    return True\n"
    mbpp = load_code("mbpp")[0]
    assert build_program(mbpp, "x = 1") == "x = 1"


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -(2**70), 1.5, math.inf, "s", b"\x00b", 1 + 2j, [1, (2, 3)], {(1, 2): {3, 4}}, frozenset({1}),
     {"a": [None]}, int, str],
)
def test_codec_round_trip(value):
    back = decode(dumps(value))
    assert back == value and type(back) is type(value)


def test_codec_nan_and_subclasses():
    assert math.isnan(decode(dumps(float("nan"))))
    from collections import Counter, OrderedDict

    assert type(decode(dumps(Counter("aab")))) is dict and decode(dumps(Counter("aab"))) == {"a": 2, "b": 1}
    assert type(decode(dumps(OrderedDict(a=1)))) is dict


def test_summarize_reasons_and_fraction():
    tests = [{"name": "a", "passed": True, "status": "passed"}, {"name": "b", "passed": False, "status": "error"},
             {"name": "c", "passed": True, "status": "passed"}, {"name": "d", "passed": False, "status": "timeout"}]
    run = RunResult(tests=tests)
    out = summarize(run, "fraction")
    assert out["reward"] == 0.5 and out["reason"] == "runtime_error" and out["n_passed"] == 2
    assert out["tests"][0]["name"] == "b"  # failures first
    assert summarize(run, "all")["reward"] == 0.0
    assert summarize(RunResult(tests=tests[:1]), "all")["reward"] == 1.0
    assert summarize(RunResult(load_error=["SyntaxError", "x"]), "all")["reason"] == "syntax_error"
    assert summarize(RunResult(load_error=["MemoryError", ""]), "all")["reason"] == "memory"
    assert summarize(RunResult(timed_out=True, tests=tests), "fraction")["reward"] == 0.0


# --- env contract -----------------------------------------------------------------------------------------------
def test_env_contract_and_reasons():
    env = gymnasium.make("agent_rl/Code-v0", datasets="humaneval")
    obs, info = env.reset(seed=0, options={"index": 2})
    task = load_code("humaneval")[2]
    assert obs.startswith(task.prompt) and info["entry_point"] == "truncate_number" and info["prompt"] == obs
    good = "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
    _, reward, terminated, _, info = env.step(good)
    assert (reward, terminated, info["reason"]) == (1.0, True, "passed")
    assert info["n_tests"] == 3 and info["isolation"] in ("full", "userns", "none")
    json.dumps(info)
    env.reset(options={"index": 2})
    _, reward, _, _, info = env.step("```python\ndef truncate_number(number):\n    return number\n```")
    assert (reward, info["reason"]) == (0.0, "wrong_answer")
    env.reset(options={"index": 2})
    _, reward, _, _, info = env.step("```python\ndef truncate_number(number)\n    return 0\n```")
    assert (reward, info["reason"]) == (0.0, "syntax_error")
    env.reset(options={"index": 2})
    _, reward, _, _, info = env.step("")
    assert (reward, info["reason"]) == (0.0, "no_code")
    with pytest.raises(ValueError, match=r"unknown reset options \['idx'\]; allowed: dataset, index"):
        env.reset(options={"idx": 2})  # a typo must not silently draw a random task


def test_fraction_reward_mode():
    env = CodeEnv(datasets="mbpp", reward_mode="fraction")
    env.reset(options={"index": 1})  # similar_elements: 3 asserts
    wrong_on_one = ("def similar_elements(a, b):\n    r = tuple(sorted(set(a) & set(b)))\n"
                    "    return r if r != (13, 14) else ()\n")
    _, reward, _, _, info = env.step(wrong_on_one)
    assert info["n_tests"] == 3 and info["n_passed"] == 2 and reward == pytest.approx(2 / 3)


def test_mbpp_program_names_shadow_builtins():
    # mbpp/126 defines its own `sum(a, b)`; the assert must call the program's, not the builtin
    spec = {"mode": "asserts", "setup": "", "asserts": ["assert sum(10, 15) == 6"]}
    # common divisors of 10 and 15 below 10: 1 and 5 -> 2, + 4 = 6
    prog = "def sum(a, b):\n    return len([i for i in range(1, min(a, b)) if a % i == 0 and b % i == 0]) + 4\n"
    assert summarize(run_tests(prog, spec))["reward"] == 1.0


# --- canonical solutions (deterministic samples; the full runs are in the script) --------------------------------
@pytest.mark.parametrize("index", range(0, 164, 4))
def test_humaneval_canonical_sample(index):
    env = CodeEnv(datasets="humaneval")
    env.reset(options={"index": index})
    _, reward, _, _, info = env.step(f"```python\n{load_code('humaneval')[index].canonical}\n```")
    assert reward == 1.0, info


@pytest.mark.parametrize("index", range(0, 974, 40))
def test_mbpp_canonical_sample(index):
    env = CodeEnv(datasets="mbpp", limits=SandboxLimits(call_timeout_s=8.0))
    env.reset(options={"index": index})
    _, reward, _, _, info = env.step(load_code("mbpp")[index].canonical)
    assert reward == 1.0, info


@pytest.mark.parametrize("index", [0, 2, 53])
def test_humanevalplus_canonical_and_a_wrong_solution(index):
    env = CodeEnv(datasets="humanevalplus")
    task = load_code("humanevalplus")[index]
    env.reset(options={"index": index})
    _, reward, _, _, info = env.step(task.canonical)
    assert reward == 1.0 and info["n_tests"] == len(task.spec["inputs"]) > 100, info
    # a solution that is right on the first 10 inputs only must fail the rest: exactly 10 tests pass
    env.reset(options={"index": index})
    bad = task.canonical + f"\n_real, _calls = {task.entry_point}, []\n" \
        f"def {task.entry_point}(*args):\n    _calls.append(1)\n" \
        "    return _real(*args) if len(_calls) <= 10 else None\n"
    _, reward, _, _, info = env.step(bad)
    assert reward == 0.0 and info["n_passed"] == 10 and info["reason"] == "wrong_answer", info
