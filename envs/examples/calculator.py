"""A small real tool env: solve an arithmetic word problem with a calculator tool (id ``agent_rl/Calculator-v0``).

It is also the template for a user's own env: it needs ``gymnasium`` and nothing of ours, and once registered
(``gymnasium.register(id=..., entry_point="module:Class")``) it works in-process (``gymnasium.make``), behind the
server (``python -m servers.serve --import module --env id``) and through the client, unchanged.

Actions (text):
    ``calc[<expr>]``    evaluate an arithmetic expression (numbers, ``+ - * / // % **``, parentheses; evaluated
                        on the ``ast``, never ``eval``) -> observation ``"Result: <value>"``;
    ``answer[<number>]`` submit the answer: the episode terminates, reward 1.0 if it equals the solution
                        by value (relative tolerance 1e-6: ``1e-9`` is not ``2e-9``), else 0.0. A number is
                        decimal, with commas only as thousands separators (``1,000``; ``1,2`` is not a number).
Anything else, or a bad expression, is answered with an error message and ``info["invalid_action"] = True``.

Tool interface (``action_format="tools"``, docs/tools.md): the same two actions as tools, declared in
:data:`CALCULATOR_TOOLS` (``env.tools`` and reset's ``info["tools"]``): ``calc(expression: str)`` and
``answer(answer: number)``; ``step`` takes a call encoded by ``envs.tools.encode_call``
(``{"name": "calc", "arguments": {"expression": "3 * 4"}}``). A reply that calls no tool, an unknown tool or wrong
arguments is an invalid action whose observation gives the reason (``Invalid tool call: ...``).

``reset(options=...)``: ``{"index": i}`` selects problem i (the same problem every time); ``{"problem": str,
"answer": float}`` poses your own; otherwise a problem is drawn with the env's ``np_random`` (seeded by ``seed``).
``info``: ``task_id``, ``task_type`` (template name), ``admissible_actions`` (tool calls on the problem's numbers and
the answers seen so far), ``won``, ``invalid_action``.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import re
import string
from typing import Any

import gymnasium
import numpy as np

from envs.spaces import TextSpace, check_action
from envs.tools import ToolCallError, check_action_format, function_tool, invalid_call_text, require_call

__all__ = ["CALCULATOR_TOOLS", "CalculatorEnv", "safe_eval", "format_number", "TEMPLATES"]

CALCULATOR_TOOLS = [
    function_tool("calc", "Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses) and get its "
                  "value.",
                  {"expression": {"type": "string", "description": "the expression, e.g. \"(3 + 4) * 2\""}}),
    function_tool("answer", "Submit the final answer to the problem; this ends the episode.",
                  {"answer": {"type": "number", "description": "the answer, a number"}}),
]
"""The tools of ``action_format="tools"``."""

# name -> (problem text with {a} {b} {c}, solution as a function of a, b, c)
TEMPLATES: dict[str, tuple[str, Any]] = {
    "shopping": ("Ann buys {a} boxes of pencils with {b} pencils in each box, then gives {c} pencils to a friend. "
                 "How many pencils does Ann have now?", lambda a, b, c: a * b - c),
    "sharing": ("A baker makes {a} trays of {b} cookies and shares them equally among {c} children. "
                "How many cookies does each child get?", lambda a, b, c: a * b / c),
    "travel": ("A train travels {a} km per hour for {b} hours, then {c} km more. How many km does it travel in "
               "total?", lambda a, b, c: a * b + c),
    "savings": ("Tom saves {a} dollars a week for {b} weeks and spends {c} dollars. How many dollars are left?",
                lambda a, b, c: a * b - c),
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ACTION = re.compile(r"^\s*(calc|answer)\[(.*)\]\s*$", re.DOTALL)
_MAX_ABS = 1e15
# An answer: a decimal number, optionally with thousands separators in groups of three ("1,000") and an exponent.
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][+-]?\d+)?|[+-]?\.\d+(?:[eE][+-]?\d+)?")


def safe_eval(expression: str) -> float:
    """Value of an arithmetic expression, computed on its syntax tree (no ``eval``).

    Allowed: int/float literals, ``+ - * / // % **`` and unary ``+ -``, parentheses. Example: ``"(3 + 4) * 2"``
    -> 14.

    Raises:
        ValueError: anything else (names, calls, attributes, strings), an expression over 200 characters, an
            exponent over 64 in absolute value, division by zero, or a result above 1e15 in absolute value.
    """
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expression!r}") from exc

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent larger than 64")
            try:
                result = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            if isinstance(result, complex) or not math.isfinite(result) or abs(result) > _MAX_ABS:
                raise ValueError("result out of range")
            return result
        raise ValueError(f"{type(node).__name__} is not allowed in a calculator expression")

    return value(tree)


def format_number(x: float) -> str:
    """``14.0`` -> ``"14"``, ``2.5`` -> ``"2.5"``, ``1/3`` -> ``"0.333333"`` (6 decimals at most)."""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.6f}".rstrip("0").rstrip(".")


class CalculatorEnv(gymnasium.Env[str, str]):
    """Arithmetic word problem + calculator tool. ``reward`` is 1.0 for a correct ``answer[...]``, else 0.0;
    ``terminated`` is True after any ``answer[...]``; the turn limit is gymnasium's ``TimeLimit`` (registered with
    ``max_episode_steps=10``)."""

    metadata = {"render_modes": []}
    _charset = string.printable

    def __init__(self, num_problems: int = 1000, action_format: str = "text") -> None:
        self.action_format = check_action_format(action_format)
        self.tools = CALCULATOR_TOOLS if action_format == "tools" else []
        self.observation_space = TextSpace(4096, charset=self._charset)
        # room for a tool call's JSON around a 200-character expression
        self.action_space = TextSpace(256 if action_format == "text" else 1024, charset=self._charset)
        self.num_problems = num_problems
        self._problem = ""
        self._solution = 0.0
        self._numbers: list[float] = []
        self._task_id = ""
        self._task_type = ""
        self._results: list[str] = []
        self._won = False

    def _pose(self, index: int) -> None:
        """Problem ``index`` (deterministic: its own generator seeded by the index)."""
        rng = np.random.default_rng(index)
        name = sorted(TEMPLATES)[index % len(TEMPLATES)]
        text, solve = TEMPLATES[name]
        a, b = (int(v) for v in rng.integers(2, 20, size=2))
        c = int(rng.integers(2, 10))
        if name == "sharing":  # keep the answer whole: make a*b a multiple of c
            a = c * int(rng.integers(1, 6))
        self._problem = text.format(a=a, b=b, c=c)
        self._solution = float(solve(a, b, c))
        self._numbers = [a, b, c]
        self._task_id = f"calculator/{index}"
        self._task_type = name

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Pose a problem (see the module docstring for ``options``) -> ``(problem text, info)``."""
        super().reset(seed=seed)
        options = options or {}
        if "problem" in options:
            self._problem = str(options["problem"])
            self._solution = float(options["answer"])
            self._numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", self._problem)]
            self._task_id = str(options.get("task_id", "custom"))
            self._task_type = "custom"
        else:
            index = options.get("index")
            self._pose(int(index) if index is not None else int(self.np_random.integers(self.num_problems)))
        self._results = []
        self._won = False
        if self.action_format == "tools":
            observation = f"{self._problem}\nUse the calc tool to compute and the answer tool to answer."
            return observation, {**self._info(invalid=False), "tools": self.tools}
        observation = f"{self._problem}\nUse calc[<expression>] to compute and answer[<number>] to answer."
        return observation, self._info(invalid=False)

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        numbers = [format_number(x) for x in self._numbers]
        calcs = [f"calc[{x} {op} {y}]" for x, y in itertools.permutations(numbers, 2) for op in ("+", "-", "*", "/")]
        answers = [f"answer[{r}]" for r in dict.fromkeys(self._results)]
        return {"task_id": self._task_id, "task_type": self._task_type, "admissible_actions": calcs + answers,
                "won": self._won, "invalid_action": invalid}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run one tool call or answer -> ``(observation, reward, terminated, truncated=False, info)``."""
        action = check_action(self, action)  # TypeError for a non-str (HTTP: 422)
        if self.action_format == "tools":
            try:
                call = require_call(action, self.tools)
            except ToolCallError as exc:
                return invalid_call_text(exc), 0.0, False, False, {**self._info(invalid=True), "tool_error": str(exc)}
            action = f"{call.name}[{call.arguments['answer' if call.name == 'answer' else 'expression']}]"
        match = _ACTION.match(action)
        if match is None:
            return ("Invalid action. Use calc[<expression>] or answer[<number>].", 0.0, False, False,
                    self._info(invalid=True))
        tool, argument = match.group(1), match.group(2)
        if tool == "calc":
            try:
                result = format_number(safe_eval(argument))
            except ValueError as exc:
                return f"Error: {exc}", 0.0, False, False, self._info(invalid=True)
            self._results.append(result)
            return f"Result: {result}", 0.0, False, False, self._info(invalid=False)
        number = argument.strip()
        if not _NUMBER.fullmatch(number):  # commas only as thousands separators: "1,2" is not 12
            return f"Error: {argument!r} is not a number", 0.0, False, False, self._info(invalid=True)
        given = float(number.replace(",", ""))
        # by value at every magnitude: an absolute tolerance would call 1e-9 and 2e-9 equal
        self._won = math.isclose(given, self._solution, rel_tol=1e-6, abs_tol=0.0)
        observation = "Correct!" if self._won else f"Wrong: the answer is {format_number(self._solution)}."
        return observation, float(self._won), True, False, self._info(invalid=False)
