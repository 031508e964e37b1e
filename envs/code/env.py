"""``agent_rl/Code-v0``: one programming task per episode, reward from unit tests run in the sandbox.

Contract (``gymnasium.Env[str, str]``):

- ``reset(seed=None, options=None)``: ``options`` may hold ``dataset`` (humaneval, humanevalplus, mbpp,
  mbpp_sanitized) and ``index``; otherwise drawn with ``self.np_random``. Or the task itself (a row of a user's task
  file: content, never a path; :func:`task_from_options`): ``prompt`` and either ``tests`` (assert
  statements: a list, or one string of lines; optional ``setup`` run first) or ``entry_point`` + ``test`` (a
  HumanEval ``check(candidate)`` function), optional ``context`` (prepended to the program), ``language``
  (``python``, the sandbox's one), ``uid``, ``task_type``; ``dataset`` is then ``"file"``. Returns ``(prompt, info)``; the prompt is
  the task (HumanEval: signature + docstring; MBPP: description + its tests) followed by the instruction.
  ``info``: ``dataset``, ``index``, ``uid`` (= ``task_id``), ``task_type``, ``entry_point``, ``problem``, ``prompt``,
  ``instruction``, ``n_tests`` (HumanEval+: -1 until the first step).
- ``step(response)``: always ``terminated=True``. The program is the last fenced code block that defines the entry
  point (else the longest fenced block, else the whole response); for HumanEval(+) the prompt (imports, helpers) is
  prepended. ``reward`` = 1.0 if every test passes else 0.0 (``reward_mode="fraction"``: passed / total).
  ``info``: ``reason`` (passed, wrong_answer, runtime_error, timeout, memory, crashed, syntax_error, load_error,
  no_code, no_tests), ``passed`` (= ``won``), ``n_passed``, ``n_tests``, ``status_counts``, ``tests`` (first ``max_test_details`` per-test
  dicts), ``load_error``, ``stdout``/``stderr`` excerpts and sizes, ``isolation``, ``wall_s``, plus the reset info.
  Raises :class:`envs.errors.EnvInfraError` when the sandbox could not judge (``docs/env_errors.md``).
- Tools (``action_format="tools", tools=["python"]``, docs/tools.md): multi-turn as math's (``envs.math.env``): a
  ``python`` call runs in the sandbox and its output is the observation; an invalid call is answered ``Invalid tool
  call: <reason>``; a plain text reply is the solution, graded as above. Without tools the env is single-turn.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any, Sequence

import gymnasium

from envs.code.datasets import LOADERS, CodeTask, _mbpp_entry, humanevalplus_expected, load_code
from envs.code.sandbox import (
    PLUS_WALL_S,
    RunResult,
    SandboxLimits,
    capped_limits,
    raise_if_infra,
    run_tests,
    sandbox_caps,
)
from envs.errors import EnvInfraError
from envs.spaces import TextSpace, check_action
from envs.tools import named_tools, task_tool_step

DEFAULT_INSTRUCTION = "Write the complete Python solution in a single ```python code block."
TOOL_INSTRUCTION = ("You can run Python programs with the python tool to test your code. When done, write the "
                    "complete Python solution in a single ```python code block in a reply that calls no tool.")
_FENCE_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")


def fenced_blocks(response: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each closed Markdown code fence, in order: a line opening with three backticks (the
    language is the word right after them), the body up to the next three backticks. What
    ``re.findall(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", response, re.DOTALL)`` finds, in O(len(response))
    (that pattern is quadratic on a response of unclosed fences without a newline: 64 KB took 6 s)."""
    blocks, pos = [], 0
    while True:
        start = response.find("```", pos)
        if start < 0:
            break
        newline = response.find("\n", start + 3)
        end = response.find("```", newline + 1) if newline >= 0 else -1
        if end < 0:  # no newline or no closing fence after it: no later fence can close either
            break
        language = _FENCE_LANG.match(response, start + 3, newline).group(1)
        blocks.append((language, response[newline + 1 : end]))
        pos = end + 3
    return blocks
_SYNTAX = {"SyntaxError", "IndentationError", "TabError"}


def extract_code(response: str, entry_point: str = "") -> str:
    """Program text of a model response (see the module docstring for the rule). Pure function."""
    blocks = [body for lang, body in fenced_blocks(response) if lang.lower() in ("", "python", "py", "python3")]
    if not blocks:
        # an unterminated fence (the model ran out of tokens): take everything after it
        start = re.search(r"```[ \t]*(?:python3?|py)?[ \t]*\n", response)
        return response[start.end():] if start else response
    if entry_point:
        defining = [b for b in blocks if re.search(rf"def\s+{re.escape(entry_point)}\s*\(", b)]
        if defining:
            return defining[-1]
    return max(blocks, key=len)


TASK_KEYS = ("prompt", "tests", "setup", "entry_point", "test", "context", "language", "uid", "task_type")
"""Reset options that give the task itself (``prompt`` and ``tests`` or ``entry_point`` + ``test`` required)."""

LANGUAGES = ("python",)
"""Languages the sandbox runs (a task's ``language``)."""

MAX_TASK_CHARS = 200_000
"""Longest text field of a task given at reset (characters; all asserts together): MBPP's and HumanEval+'s are
below 10,000 (tests as statements; HumanEval+'s large inputs live in its own file)."""

MAX_TASK_TESTS = 1000
"""Most assert statements a task given at reset may have."""


def task_from_options(options: dict[str, Any]) -> CodeTask:
    """The :class:`CodeTask` a reset's options give (see the module docstring). ``tests`` as one string is split
    into its non-empty lines; the entry point of an asserts task defaults to the function its first assert calls;
    the uid to ``file/<sha1 of prompt and tests, 12 hex>``.

    Raises:
        ValueError: a required key missing, both kinds of test or neither, a value of the wrong type or size, a
            language the sandbox does not run.
    """
    prompt = options.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"a code task needs a non-empty string prompt (got keys {sorted(options)})")
    for key in TASK_KEYS:
        value = options.get(key)
        if key == "tests" and isinstance(value, list):
            if len(value) > MAX_TASK_TESTS or not all(isinstance(v, str) for v in value):
                raise ValueError(f"code task field 'tests' must be at most {MAX_TASK_TESTS} strings")
            value = "\n".join(value)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"code task field {key!r} must be a string, got {type(value).__name__}")
        if value is not None and len(value) > MAX_TASK_CHARS:
            raise ValueError(f"code task field {key!r} has {len(value)} characters (at most {MAX_TASK_CHARS})")
    language = (options.get("language") or "python").lower()
    if language not in LANGUAGES:
        raise ValueError(f"code task language {language!r} is not run by the sandbox; valid: {', '.join(LANGUAGES)}")
    tests, check = options.get("tests"), options.get("test")
    entry_point = options.get("entry_point") or ""
    context = options.get("context") or ""
    if (tests is None) == (check is None):
        raise ValueError("a code task needs either tests (assert statements) or entry_point + test (a check "
                         "function), not both")
    if check is not None:
        if not entry_point:
            raise ValueError("a code task with a check function (test) needs its entry_point")
        spec = {"mode": "check", "context": context, "test": check, "entry_point": entry_point}
        body = check
    else:
        asserts = [t for t in (tests if isinstance(tests, list) else tests.splitlines()) if t.strip()]
        if not asserts:
            raise ValueError("a code task's tests hold no statement")
        if len(asserts) > MAX_TASK_TESTS:
            raise ValueError(f"a code task has {len(asserts)} tests (at most {MAX_TASK_TESTS})")
        entry_point = entry_point or _mbpp_entry(asserts)
        spec = {"mode": "asserts", "setup": options.get("setup") or "", "asserts": asserts}
        body = "\n".join(asserts)
    uid = options.get("uid") or "file/" + hashlib.sha1(f"{prompt}\0{body}".encode("utf-8")).hexdigest()[:12]
    return CodeTask(uid, "file", prompt, entry_point, "", context, spec, options.get("task_type") or "")


def build_program(task: CodeTask, code: str) -> str:
    """Program run in the worker: HumanEval(+) gets its prompt (imports, helpers) in front; a bare completion of
    the function body is appended to the prompt as in the original benchmark."""
    if not task.context:
        return code
    if task.entry_point and re.search(rf"def\s+{re.escape(task.entry_point)}\s*\(", code):
        return task.context + "\n\n" + code
    return task.context + code


def summarize(result: RunResult, reward_mode: str = "all", max_test_details: int = 20) -> dict[str, Any]:
    """Reward and JSON-serialisable info of one sandboxed run.

    Returns ``reward`` plus the step-info fields listed in the module docstring. A run without a single test
    scores 0.0 with ``reason="no_tests"`` (zero checks never pass).

    Raises:
        EnvInfraError: the sandbox could not judge the program (it did not start, or wrote no verdict).
    """
    raise_if_infra(result)
    tests = result.tests
    n_tests, n_passed = len(tests), sum(1 for t in tests if t["passed"])
    counts = Counter(t["status"] for t in tests)
    if result.load_error is not None:
        name, message = result.load_error[0], result.load_error[1]
        if name in _SYNTAX:
            reason = "syntax_error"
        elif name == "MemoryError":
            reason = "memory"
        elif name == "TimeoutError" or (name == "WorkerGone" and message == "timeout"):
            reason = "timeout"
        elif name == "WorkerGone":  # the program killed its own interpreter (os._exit, SIGXFSZ, ...)
            reason = "crashed"
        else:
            reason = "load_error"
    elif result.timed_out:
        reason = "timeout"
    elif not n_tests:
        reason = "no_tests"
    elif n_passed == n_tests:
        reason = "passed"
    else:
        first = next((t for t in tests if not t["passed"]), {"status": "error"})
        reason = {"error": "runtime_error"}.get(first["status"], first["status"])
    if result.limit_hit is not None:  # the run (program or the task's test code) went past a per-run cap: no pass
        reason = {"memory": "memory", "cpu": "timeout"}.get(result.limit_hit, "crashed")
    all_passed = reason == "passed"
    if reward_mode == "all":
        reward = float(all_passed)
    else:
        reward = n_passed / n_tests if n_tests and result.load_error is None and not result.timed_out else 0.0
    failed_first = sorted(tests, key=lambda t: t["passed"])[:max_test_details]
    return {
        "reward": reward, "reason": reason, "passed": all_passed, "n_passed": n_passed, "n_tests": n_tests,
        "status_counts": dict(counts), "tests": failed_first, "load_error": result.load_error,
        "stdout": result.stdout, "stderr": result.stderr, "stdout_bytes": result.stdout_bytes,
        "stderr_bytes": result.stderr_bytes, "isolation": result.isolation, "wall_s": round(result.wall_s, 3),
        "run_limits": result.run_limits, "limit_hit": result.limit_hit, "peak_memory_mb": result.peak_memory_mb,
    }


class CodeEnv(gymnasium.Env[str, str]):
    """Single-turn code env (see the module docstring for the contract).

    Args:
        datasets: name or names among humaneval, humanevalplus, mbpp, mbpp_sanitized.
        root: data root (``data.root``); None uses ``envs.data.data_root``.
        reward_mode: ``all`` (1 iff every test passes) or ``fraction`` (passed / total).
        instruction: appended to the prompt after a blank line; "" for none.
        limits: sandbox limits (a :class:`SandboxLimits` or a dict of its fields), each at most the machine's cap
            (:func:`envs.code.sandbox.sandbox_caps`: the defaults unless the server's ``--sandbox-limits`` says
            more); above one, ``ValueError`` naming it.
        plus_wall_s: wall-clock budget of a HumanEval+ run (hundreds of inputs), seconds (capped the same way).
        max_test_details: per-test dicts kept in ``info["tests"]`` (failures first).
        action_format: ``text`` or ``tools`` (see the module docstring).
        tools: tool names (``["python"]``) for ``action_format="tools"``; none keeps the env single-turn.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        datasets: str | Sequence[str] = "humaneval",
        root: str | None = None,
        reward_mode: str = "all",
        instruction: str = DEFAULT_INSTRUCTION,
        limits: SandboxLimits | dict[str, Any] | None = None,
        plus_wall_s: float = PLUS_WALL_S,
        max_test_details: int = 20,
        action_format: str = "text",
        tools: Sequence[str] = (),
    ) -> None:
        self.tools = named_tools(action_format, tools)  # ValueError for unknown names / tools without "tools"
        self.action_format = action_format
        if self.tools and instruction == DEFAULT_INSTRUCTION:
            instruction = TOOL_INSTRUCTION
        names = [datasets] if isinstance(datasets, str) else list(datasets)
        for name in names:
            if name not in LOADERS:
                raise ValueError(f"unknown code dataset {name!r}; valid: {sorted(LOADERS)}")
        if reward_mode not in ("all", "fraction"):
            raise ValueError(f"reward_mode must be 'all' or 'fraction', got {reward_mode!r}")
        self.datasets = names
        self.root = root
        self.reward_mode = reward_mode
        self.instruction = instruction
        self.limits = capped_limits(limits)  # ValueError above the server's caps: a client cannot loosen them
        cap = sandbox_caps()["plus_wall_s"]
        if isinstance(plus_wall_s, bool) or not isinstance(plus_wall_s, (int, float)) or not 0 < plus_wall_s <= cap:
            raise ValueError(f"plus_wall_s={plus_wall_s!r} must be a positive number at most the server's cap {cap}")
        self.plus_wall_s = plus_wall_s
        self.max_test_details = max_test_details
        self.observation_space = TextSpace(1_000_000)
        self.action_space = TextSpace(1_000_000)
        self._task: CodeTask | None = None
        self._info: dict[str, Any] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        given = set(options) & set(TASK_KEYS)
        unknown = sorted(set(options) - (set(TASK_KEYS) if given else {"dataset", "index"}))
        if unknown:  # a misspelt key ("datset") must not silently draw a random task
            raise ValueError(f"unknown reset options {unknown}; allowed: dataset, index, or the task itself: "
                             f"{', '.join(TASK_KEYS)} (not both)")
        if given:  # the task itself (a task file's row)
            self._task = task_from_options(options)
            name, index = "file", -1
        else:
            name = options.get("dataset") or self.datasets[int(self.np_random.integers(len(self.datasets)))]
            tasks = load_code(name, self.root)
            index = options.get("index")
            index = int(self.np_random.integers(len(tasks))) if index is None else int(index)
            if not 0 <= index < len(tasks):
                raise IndexError(f"index {index} out of range for {name} ({len(tasks)} tasks)")
            self._task = tasks[index]
        task = self._task
        prompt = task.prompt if not self.instruction else f"{task.prompt}\n\n{self.instruction}"
        spec = task.spec
        n_tests = len(spec.get("asserts", spec.get("inputs", []))) if spec["mode"] != "check" else -1
        self._info = {"dataset": name, "index": index, "uid": task.uid, "task_id": task.uid,
                      "task_type": task.task_type or name,
                      "entry_point": task.entry_point, "problem": task.prompt, "prompt": prompt,
                      "instruction": self.instruction, "n_tests_declared": n_tests}
        if self.action_format == "tools":
            return prompt, {**self._info, "tools": self.tools}
        return prompt, dict(self._info)

    def evaluate(self, task: CodeTask, code: str) -> dict[str, Any]:
        """Run ``code`` (already extracted) against ``task``'s tests; returns :func:`summarize`'s dict."""
        spec, limits = task.spec, self.limits
        if spec["mode"] == "io":
            try:
                expected = humanevalplus_expected(task)
            except RuntimeError as exc:  # the ground truth could not be recorded: nothing to judge against
                raise EnvInfraError(str(exc), component="sandbox") from exc
            spec = {**spec, "expected": expected}
            limits = SandboxLimits(**{**self.limits.__dict__, "wall_s": max(self.limits.wall_s, self.plus_wall_s),
                                      "cpu_s": max(self.limits.cpu_s, int(self.plus_wall_s))})
        result = run_tests(build_program(task, code), spec, limits)
        return summarize(result, self.reward_mode, self.max_test_details)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        action = check_action(self, action)  # TypeError for a non-str (HTTP: 422), before the episode is used up
        if self._task is None:
            raise RuntimeError("call reset() before step(); the episode ended at its solution")
        turn = task_tool_step(action, self.tools, {**self.limits.__dict__, "wall_s": min(self.limits.wall_s, 10.0)})
        if turn is not None:  # a tool call (or an invalid one): the episode goes on
            observation, extra = turn
            return observation, 0.0, False, False, {**self._info, **extra, "won": False}
        task, self._task = self._task, None
        code = extract_code(action, task.entry_point)
        if not code.strip():
            info = {**self._info, "reward": 0.0, "reason": "no_code", "passed": False, "won": False, "n_passed": 0,
                    "n_tests": 0}
            return "", 0.0, True, False, info
        out = self.evaluate(task, code)
        return "", float(out["reward"]), True, False, {**self._info, **out, "won": bool(out["passed"])}
