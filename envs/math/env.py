"""``agent_rl/Math-v0``: one math problem per episode, reward 1 for an equivalent final answer.

Contract (``gymnasium.Env[str, str]``):

- ``reset(seed=None, options=None)``: ``options`` may hold ``dataset`` (one of :data:`envs.math.datasets.LOADERS`),
  ``split`` (gsm8k only) and ``index``; without ``index`` a problem is drawn with ``self.np_random``; without
  ``dataset`` one of the env's datasets is drawn. Or the task itself (a row of a user's task file:
  content, never a path): ``problem`` and ``answer`` (a string or a number), optional ``solution``, ``uid`` and
  ``task_type`` (:func:`task_from_options`; ``dataset`` is then ``"file"``). Returns ``(prompt, info)``: the prompt is the problem followed by
  the instruction (default: Qwen-Math's "Please reason step by step, and put your final answer within \\boxed{}.").
  ``info``: ``dataset``, ``split``, ``index``, ``uid`` (= ``task_id``), ``task_type``, ``problem``, ``prompt``, ``instruction``
  (and ``level`` for MATH500). The reference answer is NOT in the reset info.
- ``step(response)``: always ``terminated=True``. ``reward`` 1.0 if the final answer (the last ``\\boxed{}``, else
  GSM8K's ``####``) is equivalent to the reference by math-verify or by the normalised string match, and so is every
  other final answer the response gives (several different boxed answers are a hedge: 0.0), else 0.0.
  ``info``: ``extracted``, ``answers``, ``reference``, ``correct`` (= ``won``), ``reason``
  (``correct``/``wrong_answer``/``hedged``/``no_answer``), ``verifier`` (``math_verify``/``timeout``/``too_long``/
  ``error: ...``),
  ``string_match``, plus the reset info. Numbers compare by value (exact for exact rationals, else relative
  tolerance 1e-6: ``envs.math.grader.numbers_equal``); units, variables and marks are never dropped on one side
  only (``envs.math.grader.parts_conflict``, ``docs/math_code_envs.md``).
  Raises :class:`envs.errors.EnvInfraError` when the verifier itself cannot judge (``docs/env_errors.md``).
- Tools (``action_format="tools", tools=["python"]``, docs/tools.md): the episode is multi-turn. ``self.tools`` and
  reset's ``info["tools"]`` declare the ``python`` tool (``envs.tools.PYTHON_TOOL``); a step whose action is a call
  (``envs.tools.encode_call``) runs the program in the code sandbox and observes what it prints (reward 0, not
  terminated; info ``tool``, ``tool_ok``, ``invalid_action=False``); an invalid call is answered ``Invalid tool
  call: <reason>`` (``invalid_action=True``); a plain text reply is the final answer, graded as above
  (``terminated=True``). The turn budget is gymnasium's ``TimeLimit`` (``max_episode_steps``, the trainer's
  ``rollout.max_turns``): past it the episode is truncated with reward 0. Without tools the env is single-turn,
  whatever ``action_format``.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Sequence

import gymnasium

from envs.math.datasets import SPLITS, MathProblem, answer_str, canonical_name, load_math
from envs.math.grader import final_answers, question_nouns, strings_match
from envs.math.pool import VerifierPool, default_pool
from envs.spaces import TextSpace, check_action
from envs.tools import named_tools, task_tool_step

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TOOL_INSTRUCTION = ("You can run Python programs with the python tool. Please reason step by step, and put your "
                    "final answer within \\boxed{} in a reply that calls no tool.")
"""The instruction of an env with tools when ``instruction`` is left at :data:`DEFAULT_INSTRUCTION`."""


MAX_FINAL_ANSWERS = 8
"""A response with more distinct final answers than this is graded 0 without checking them (``reason="hedged"``)."""

MAX_ANSWER_CHARS = 1000
"""A final answer longer than this (or than 4 times the reference, if that is more) is graded wrong without being
parsed: the references are at most 210 characters (olympiadbench), and a long answer would only hold a verifier
worker until its deadline. With :data:`MAX_FINAL_ANSWERS`, this bounds what one response costs."""

RESPONSE_DEADLINE_CHECKS = 2
"""One response is graded within this many verifier deadlines (``pool.timeout_s`` each), extraction included: once
it has passed, the answers left unchecked make the response wrong (``verifier="timeout"``; never a false 1.0). The
final answer's check may start a verifier worker, whose import is not charged: the other answers get at least one
deadline after it."""


def score_response(reference: str, response: str, pool: VerifierPool, *,
                   question: str | None = None) -> dict[str, Any]:
    """Grade a full model response against a bare reference answer.

    Every distinct final answer of the response (:func:`envs.math.grader.final_answers`: each boxed answer, a list
    written as adjacent boxes counting as one; else each ``####`` line) must be equivalent to the reference: one
    correct box among wrong ones is a hedge and scores 0 (``reason="hedged"``). Each answer is correct when the
    string match (:func:`envs.math.grader.strings_match`) or math-verify in the pool says so; the last answer is
    checked first. A word after a number counts as the bare number only when it is a unit or a noun the question
    counts (``question``: :func:`envs.math.grader.question_nouns`; without it, units only). Extraction is linear in
    ``len(response)``; at most :data:`MAX_FINAL_ANSWERS` answers of at most :data:`MAX_ANSWER_CHARS` characters are
    checked, each under the pool's deadline, all within :data:`RESPONSE_DEADLINE_CHECKS` deadlines from the start.

    Returns a JSON-serialisable dict: ``reward`` (0.0/1.0), ``correct``, ``extracted`` (the last answer, str | None),
    ``answers`` (the distinct final answers, list of str), ``reference``, ``reason``
    (correct/wrong_answer/hedged/no_answer), ``verifier`` and ``string_match`` (of the last answer).

    Raises:
        EnvInfraError: the verifier itself cannot judge (from :meth:`VerifierPool.check`).
    """
    deadline = time.monotonic() + RESPONSE_DEADLINE_CHECKS * pool.timeout_s
    answers = final_answers(response)
    extracted = answers[-1] if answers else None
    out: dict[str, Any] = {"extracted": extracted, "answers": answers, "reference": reference,
                           "string_match": False, "verifier": "none"}
    if not answers:
        return {**out, "reward": 0.0, "correct": False, "reason": "no_answer"}
    if len(answers) > MAX_FINAL_ANSWERS:
        return {**out, "reward": 0.0, "correct": False, "reason": "hedged"}
    nouns = question_nouns(question)
    max_chars = max(MAX_ANSWER_CHARS, 4 * len(reference))
    n_correct = 0
    for i, answer in enumerate(reversed(answers)):  # the final answer first: a wrong one settles it
        if i == 1:  # the first check may have started a worker (its import is not charged): one deadline more
            deadline = max(deadline, time.monotonic() + pool.timeout_s)
        if len(answer) > max_chars:
            string_ok, verdict, how = False, False, "too_long"
        elif time.monotonic() > deadline:  # the response's budget is spent: what is left is not judged
            string_ok, verdict, how = False, False, "timeout"
        else:
            string_ok = strings_match(reference, answer, nouns)
            verdict, how = pool.check(reference, answer, nouns)
        if i == 0:
            out.update(string_match=string_ok, verifier=how)
        if not (bool(verdict) or string_ok):
            break
        n_correct += 1
    correct = n_correct == len(answers)
    # the final answer right but another one wrong: a hedge; the final answer wrong: a wrong answer
    reason = "correct" if correct else "hedged" if n_correct > 0 else "wrong_answer"
    return {**out, "reward": float(correct), "correct": correct, "reason": reason}


TASK_KEYS = ("problem", "answer", "solution", "uid", "task_type")
"""Reset options that give the task itself (``problem`` and ``answer`` required)."""

MAX_TASK_CHARS = 100_000
"""Longest problem, answer or solution a reset may give (characters): far above any benchmark's (the longest
olympiadbench problem has ~3,000), small enough that a hostile reset cannot make the verifier chew on megabytes."""


def task_from_options(options: dict[str, Any]) -> MathProblem:
    """The :class:`MathProblem` a reset's options give (``problem``, ``answer``, optional ``solution``, ``uid``,
    ``task_type``). The uid defaults to ``file/<sha1 of the problem, 12 hex>``; a numeric answer is written as the
    data sets' references are (27.0 -> "27").

    Raises:
        ValueError: a required key missing, a value of the wrong type, empty, or longer than :data:`MAX_TASK_CHARS`.
    """
    missing = [k for k in ("problem", "answer") if options.get(k) in (None, "")]
    if missing:
        raise ValueError(f"a math task needs {' and '.join(missing)} (got keys {sorted(options)})")
    for key in TASK_KEYS:
        value = options.get(key)
        if key == "answer" and isinstance(value, (int, float)) and not isinstance(value, bool):
            continue
        if value is not None and not isinstance(value, str):
            raise ValueError(f"math task field {key!r} must be a string, got {type(value).__name__}")
        if isinstance(value, str) and len(value) > MAX_TASK_CHARS:
            raise ValueError(f"math task field {key!r} has {len(value)} characters (at most {MAX_TASK_CHARS})")
    problem = options["problem"]
    uid = options.get("uid") or "file/" + hashlib.sha1(problem.encode("utf-8")).hexdigest()[:12]
    return MathProblem(uid, problem, answer_str(options["answer"]), options.get("solution") or "",
                       options.get("task_type") or "")


class MathEnv(gymnasium.Env[str, str]):
    """Single-turn math env over one or more benchmark files (see the module docstring for the contract).

    Args:
        datasets: dataset name or names (keys of ``LOADERS``: gsm8k, math500, math_train, aime, aime24, aime25,
            amc23, minerva, olympiadbench).
        split: default split (gsm8k: train/test; the others have one split).
        root: data root (``data.root`` config key); None uses ``envs.data.data_root``.
        instruction: appended to the problem after a blank line; "" for none.
        verify_timeout_s: outer deadline of one math-verify check (seconds).
        n_workers: verifier processes shared by every MathEnv of this process with the same settings.
        action_format: ``text`` or ``tools`` (see the module docstring).
        tools: tool names (``["python"]``) for ``action_format="tools"``; none keeps the env single-turn.
        tool_limits: sandbox limits of a ``python`` call (``envs.code.sandbox.SandboxLimits`` fields; default 10 s),
            each at most the machine's cap (``envs.code.sandbox.capped_limits``; above one, ``ValueError``).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        datasets: str | Sequence[str] = "math500",
        split: str = "test",
        root: str | None = None,
        instruction: str = DEFAULT_INSTRUCTION,
        verify_timeout_s: float = 5.0,
        n_workers: int = 2,
        action_format: str = "text",
        tools: Sequence[str] = (),
        tool_limits: Any = None,
    ) -> None:
        self.tools = named_tools(action_format, tools)  # ValueError for unknown names / tools without "tools"
        self.action_format = action_format
        if tool_limits is not None:  # a client may tighten the sandbox, never loosen it past the server's caps
            from envs.code.sandbox import capped_limits  # deferred: the sandbox's start-up code

            tool_limits = capped_limits(tool_limits, "tool_limits")
        self.tool_limits = tool_limits
        names = [datasets] if isinstance(datasets, str) else list(datasets)
        try:
            self.datasets = [canonical_name(name) for name in names]
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        self.split = split
        self.root = root
        self.instruction = TOOL_INSTRUCTION if self.tools and instruction == DEFAULT_INSTRUCTION else instruction
        self.pool = default_pool(n_workers=n_workers, timeout_s=verify_timeout_s)
        self.observation_space = TextSpace(1_000_000)
        self.action_space = TextSpace(1_000_000)
        self._problem: MathProblem | None = None
        self._info: dict[str, Any] = {}

    def _split_for(self, name: str, split: str | None) -> str:
        split = split or self.split
        splits = SPLITS.get(name)
        if splits is None:
            return "test"
        return split if split in splits else splits[-1]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        given = set(options) & set(TASK_KEYS)
        allowed = set(TASK_KEYS) if given else {"dataset", "split", "index"}
        unknown = sorted(set(options) - allowed)
        if unknown:  # a misspelt key ("datset") must not silently draw a random task
            raise ValueError(f"unknown reset options {unknown}; allowed: dataset, split, index, or the task itself: "
                             f"{', '.join(TASK_KEYS)} (not both)")
        if given:  # the task itself (a task file's row)
            self._problem = task_from_options(options)
            name, split, index = "file", "", -1
        else:
            name = options.get("dataset") or self.datasets[int(self.np_random.integers(len(self.datasets)))]
            name = canonical_name(name)
            split = self._split_for(name, options.get("split"))
            problems = load_math(name, split, self.root)
            index = options.get("index")
            index = int(self.np_random.integers(len(problems))) if index is None else int(index)
            if not 0 <= index < len(problems):
                raise IndexError(f"index {index} out of range for {name}/{split} ({len(problems)} problems)")
            self._problem = problems[index]
        prompt = self._problem.problem if not self.instruction else f"{self._problem.problem}\n\n{self.instruction}"
        self._info = {"dataset": name, "split": split, "index": index, "uid": self._problem.uid,
                      "task_id": self._problem.uid,
                      "task_type": self._problem.task_type or name, "problem": self._problem.problem,
                      "prompt": prompt, "instruction": self.instruction,
                      **{k: v for k, v in self._problem.meta.items() if isinstance(v, (str, int, float, bool))}}
        if self.action_format == "tools":
            return prompt, {**self._info, "tools": self.tools}
        return prompt, dict(self._info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        action = check_action(self, action)  # TypeError for a non-str (HTTP: 422), before the episode is used up
        if self._problem is None:
            raise RuntimeError("call reset() before step(); the episode ended at its final answer")
        turn = task_tool_step(action, self.tools, self.tool_limits)
        if turn is not None:  # a tool call (or an invalid one): the episode goes on
            observation, extra = turn
            return observation, 0.0, False, False, {**self._info, **extra, "won": False}
        result = score_response(self._problem.answer, action, self.pool, question=self._problem.problem)
        info = {**self._info, **result, "won": bool(result["correct"])}
        self._problem = None
        return "", float(result["reward"]), True, False, info
