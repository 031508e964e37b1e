"""Issue 10 (sections 1 and 2) for Code-v0: a sandbox that cannot start is never a reward (it raises
``EnvInfraError``), and zero real checks never pass (``no_tests``; helper definitions and ``assert True`` are not
tests). Every program here runs in the real sandbox."""

from __future__ import annotations

import pytest

import envs.code.env as code_env
import envs.code.sandbox as sandbox
from envs.code import CodeEnv, RunResult, summarize
from envs.code.datasets import CodeTask, load_code
from envs.errors import EnvInfraError


def check_task(test: str, entry_point: str = "f") -> CodeTask:
    return CodeTask(uid="t/0", dataset="humaneval", prompt="", entry_point=entry_point, canonical="", context="",
                    spec={"mode": "check", "test": test, "entry_point": entry_point})


NO_ASSERT = "def check(candidate):\n    candidate(1)\n"
NESTED = "def check(candidate):\n    def h(x, y):\n        assert candidate(x) == y\n    h(1, 1)\n"


def test_check_without_assertion_scores_zero_no_tests():
    # Issue input: check() holds no assertion; a program returning its input used to score 1.0 (passed, n_tests 1).
    for mode in ("all", "fraction"):
        out = CodeEnv(reward_mode=mode).evaluate(check_task(NO_ASSERT), "def f(x):\n    return x\n")
        assert (out["reward"], out["reason"], out["n_tests"]) == (0.0, "no_tests", 0)


def test_nested_helper_definition_is_not_a_test():
    # Issue input: the assert sits in a helper h(x, y) called as h(1, 1); "x + 1" used to score 0.5 in fraction mode.
    env = CodeEnv(reward_mode="fraction")
    wrong = env.evaluate(check_task(NESTED), "def f(x):\n    return x + 1\n")
    assert (wrong["reward"], wrong["n_tests"], wrong["n_passed"], wrong["reason"]) == (0.0, 1, 0, "wrong_answer")
    right = env.evaluate(check_task(NESTED), "def f(x):\n    return x\n")
    assert (right["reward"], right["n_tests"], right["n_passed"]) == (1.0, 1, 1)


def test_assert_true_is_not_a_test():
    # 48 HumanEval checks hold `assert True, "This prints if this assert fails ..."`: each was a free passing test in
    # fraction mode. One real assert (wrong here) + two vacuous ones -> 0/1, not 2/3.
    test = ("def check(candidate):\n    assert candidate(1) == 2\n    assert True, 'debug'\n"
            "    assert True\n")
    out = CodeEnv(reward_mode="fraction").evaluate(check_task(test), "def f(x):\n    return 0\n")
    assert (out["reward"], out["n_tests"]) == (0.0, 1)


def test_a_test_that_runs_no_assertion_is_not_counted():
    # A loop over nothing and an if not taken name the candidate and hold an assert, but check nothing: only the
    # third statement is a test (wrong here), so 0/1, not 2/3 in fraction mode; with a right program 1/1.
    test = ("def check(candidate):\n    for x in []:\n        assert candidate(x) == x\n"
            "    if False:\n        assert candidate(0) == 0\n    assert candidate(2) == 2\n")
    env = CodeEnv(reward_mode="fraction")
    wrong = env.evaluate(check_task(test), "def f(x):\n    return 0\n")
    assert (wrong["reward"], wrong["n_tests"]) == (0.0, 1)
    right = env.evaluate(check_task(test), "def f(x):\n    return x\n")
    assert (right["reward"], right["n_tests"], right["reason"]) == (1.0, 1, "passed")
    only_empty = env.evaluate(check_task("def check(candidate):\n    for x in []:\n        assert candidate(x)\n"),
                              "def f(x):\n    return x\n")
    assert (only_empty["reward"], only_empty["reason"]) == (0.0, "no_tests")


def test_helper_chains_and_module_level_helpers_count():
    # A module-level helper asserting through another helper: each call is one test; definitions are not.
    test = ("def near(a, b):\n    assert abs(a - b) < 1e-6\n\ndef close(c, x, y):\n    near(c(x), y)\n\n"
            "def check(candidate):\n    close(candidate, 1, 2.0)\n    close(candidate, 2, 5.0)\n")
    out = CodeEnv(reward_mode="fraction").evaluate(check_task(test), "def f(x):\n    return x + 1.0\n")
    assert (out["n_tests"], out["n_passed"], out["reward"]) == (2, 1, 0.5)


def test_humaneval_tasks_with_assert_true_count_only_real_tests():
    # The first HumanEval task whose check holds `assert True`: its canonical solution still scores 1.0, and
    # n_tests counts only the asserts that involve the candidate.
    import ast

    task = next(t for t in load_code("humaneval") if "assert True" in t.spec["test"])
    check = next(n for n in ast.parse(task.spec["test"]).body if isinstance(n, ast.FunctionDef) and n.name == "check")
    real = sum(1 for s in check.body if isinstance(s, ast.Assert) and not isinstance(s.test, ast.Constant))
    env = CodeEnv(reward_mode="fraction")
    out = env.evaluate(task, task.canonical)
    assert out["reward"] == 1.0 and out["n_tests"] == real, (task.uid, out["n_tests"], real)


def test_summarize_zero_tests_is_zero():
    assert summarize(RunResult(tests=[]), "fraction")["reason"] == "no_tests"
    assert summarize(RunResult(tests=[]), "all")["reward"] == 0.0


# --- section 1: the sandbox could not judge ---------------------------------------------------------------------
def test_sandbox_interpreter_missing_raises_infra_error(monkeypatch):
    # Issue input: the sandbox interpreter path does not exist, so the checker exits 127 (or Popen fails without
    # isolation). Used to be reward 0.0 with reason sandbox_error.
    monkeypatch.setattr(sandbox, "sandbox_python", lambda: "/nonexistent/python3")
    env = CodeEnv(datasets="mbpp")
    env.reset(options={"dataset": "mbpp", "index": 0})
    with pytest.raises(EnvInfraError, match="/nonexistent/python3") as info:
        env.step("```python\ndef min_cost(*a):\n    return 0\n```")
    assert info.value.component == "sandbox"


def test_worker_that_never_starts_is_infra_not_crashed(monkeypatch):
    # Only the worker's interpreter fails (exit 127 before it says "started"): the checker must not score the
    # program "crashed" (0.0), since no program code ran.
    monkeypatch.setattr(sandbox, "WORKER_SOURCE", "import os\nos._exit(127)\n")
    with pytest.raises(EnvInfraError, match="did not start"):
        CodeEnv().evaluate(check_task("def check(candidate):\n    assert candidate(1) == 1\n"),
                           "def f(x):\n    return x\n")


def test_program_that_exits_is_still_judged_crashed():
    # The handshake must not turn a program's own os._exit(127) into an infrastructure error.
    out = CodeEnv().evaluate(check_task("def check(candidate):\n    assert candidate(1) == 1\n"),
                             "import os\nos._exit(127)\n")
    assert (out["reward"], out["reason"]) == (0.0, "crashed")


def test_checker_without_verdict_raises():
    with pytest.raises(EnvInfraError, match="checker exit 1"):
        summarize(RunResult(checker_error="checker exit 1: boom"))


def test_expected_outputs_not_recordable_is_infra(monkeypatch):
    def fail(task, build=True):
        raise RuntimeError("canonical solution of HumanEval/0 failed while recording outputs")

    monkeypatch.setattr(code_env, "humanevalplus_expected", fail)
    task = load_code("humanevalplus")[0]
    with pytest.raises(EnvInfraError, match="recording outputs"):
        CodeEnv(datasets="humanevalplus").evaluate(task, task.canonical)
