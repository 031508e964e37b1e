"""Answer extraction and equivalence checking for math problems.

Pure string functions (:func:`last_boxed`, :func:`extract_answer`, :func:`normalize_answer`, :func:`strings_match`)
plus :func:`verify_answer`, which runs ``math-verify`` (0.9.0) on the extracted answer in a worker process with an
outer deadline and falls back to the normalised string match.

Why a process: ``math-verify`` bounds its own work with ``signal.alarm``, which only works in a main thread, and some
inputs (``9^9^9^9``) block inside one C-level big-integer power that no signal interrupts. A worker process can be
killed; a thread cannot. The pool (:class:`envs.math.pool.VerifierPool`) kills and replaces only the stuck worker, so
one pathological answer never stalls the other checks.
"""

from __future__ import annotations

import re
from typing import Any

# Commands whose argument is the boxed answer. ``\fbox`` is what some models and MATH solutions use.
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}`` (not ``\\frac{1``); ``\\boxed 5`` (no braces) gives ``5``.
    Returns None when there is no box or the last box is not closed.
    """
    start = -1
    for cmd in _BOX_COMMANDS:
        start = max(start, text.rfind(cmd))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # "\boxed 5": the argument is the next token
        match = re.match(r"[^\s$]+", text[i:])
        return match.group(0) if match else None
    depth = 0
    for j in range(i, len(text)):
        char = text[j]
        if char == "\\":  # skip escaped braces "\{" "\}"
            continue
        if char == "{" and text[j - 1] != "\\":
            depth += 1
        elif char == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The model's final answer: the last ``\\boxed{}``; else the text after GSM8K's last ``####``; else None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    return None


_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\{([^{}]*)\}")
_UNIT_WORDS = (
    r"(?:degrees?|cm|m|km|mm|kg|g|units?|inches|inch|feet|foot|ft|meters?|miles?|hours?|minutes?|seconds?|"
    r"dollars?|cents?|mph|km/h|sq|square)"
)


def normalize_answer(answer: str) -> str:
    """Canonical string for the fallback match (also used to clean answers before math-verify).

    Removes ``$``, spaces, ``\\left``/``\\right``, ``\\!``/``\\,``, ``^\\circ``, ``\\%``, text-wrapped units, a
    leading ``x=``, thousands separators (``1,000`` -> ``1000``), a trailing period; ``\\dfrac``/``\\tfrac`` ->
    ``\\frac``; ``0.50`` -> ``0.5``. Idempotent.
    """
    s = answer.strip()
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right|big|Big|bigl|bigr)\b", "", s)
    s = re.sub(r"\\[!,;:]|\\ |~", " ", s)
    s = s.replace("{,}", ",").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s).replace("°", "")
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\\text\{\s*" + _UNIT_WORDS + r"(?:\^?\d)?\s*\}", "", s)
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = s.strip().rstrip(".").strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*(?=\S)", "", s)  # "x = 3" -> "3" (single variable only)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^\((-?\d+)\)$", r"\1", s)  # "(051)" (AIME solutions box "\textbf{(051)}") -> "051"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # thousands separators, not tuples like "1,2"
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.\d*", s):  # 0.50 -> 0.5, 3.0 -> 3
        s = s.rstrip("0").rstrip(".")
    return s


def strings_match(reference: str, answer: str) -> bool:
    """Fallback verdict: the normalised strings are equal (and non-empty)."""
    ref, ans = normalize_answer(reference), normalize_answer(answer)
    return bool(ref) and ref == ans


def _exact_rational(value: Any) -> Any:
    """``value`` as a sympy ``Rational`` when it is an exact rational number (``1/2004!`` included), else None."""
    try:
        import sympy

        if isinstance(value, sympy.Basic) and value.is_number and value.is_rational:
            value = value.doit()
            return value if isinstance(value, sympy.Rational) else None
    except Exception:  # sympy raises many types on odd input: no exact value then
        return None
    return None


REL_TOL = 1e-6
"""Relative tolerance of two numbers when at least one is inexact (a decimal, or irrational like ``2\\sqrt{3}``):
``|a - b| <= REL_TOL * max(|a|, |b|)``. Scale-free, so ``1.6e-19`` is not ``3.2e-19`` (math-verify's own rule,
rounding to 6 decimals, calls every pair below 5e-7 equal), while ``0.0833333333333333`` is ``1/12``."""

# "1e-10", "2.5E+3": scientific notation, which the LaTeX parser would read as Euler's e ("1e-10" -> E - 10).
_SCIENTIFIC = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")


def _numeric_value(value: Any) -> Any:
    """``value`` as a 30-digit sympy Float (complex allowed) when it is a plain number (no symbols, not a set,
    interval, equation or matrix), else None."""
    try:
        import sympy

        if isinstance(value, sympy.Expr) and value.is_number:
            number = sympy.N(value, 30)
            return number if number.is_number and number.is_finite else None
    except Exception:  # sympy raises many types on odd input: not a plain number then
        return None
    return None


def numbers_equal(gold: Any, pred: Any, rel_tol: float = REL_TOL) -> bool | None:
    """Value comparison of two parsed answers: exact when both are exact rationals, else relative (``rel_tol``)
    when both are plain numbers; None when either is not a plain number (math-verify decides then)."""
    exact_gold, exact_pred = _exact_rational(gold), _exact_rational(pred)
    if exact_gold is not None and exact_pred is not None:
        return bool(exact_gold == exact_pred)
    a, b = _numeric_value(gold), _numeric_value(pred)
    if a is None or b is None:
        return None
    import sympy

    return bool(sympy.Abs(a - b) <= rel_tol * sympy.Max(sympy.Abs(a), sympy.Abs(b)))


def clean_for_parse(answer: str) -> str:
    """What :func:`math_verify_equal` parses: percent signs and degree marks removed, scientific notation
    (``1e-10``) written as LaTeX (``1\\times10^{-10}``)."""
    s = answer.replace("\\%", "").replace("%", "")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    return _SCIENTIFIC.sub(lambda m: f"{m.group(1)}\\times10^{{{m.group(2)}}}", s)


def math_verify_equal(reference: str, answer: str, timeout_s: int = 5) -> bool:
    """math-verify verdict for two bare answers (no ``\\boxed``). Runs in the calling process: use it only in a
    worker process (see :class:`envs.math.pool.VerifierPool`).

    Both sides go through :func:`clean_for_parse`, are wrapped in ``\\boxed{}`` and parsed. Numbers compare by
    value (:func:`numbers_equal`): exactly when both sides are exact rationals (``1/2004!`` is not ``1/2006!``),
    else with the relative tolerance :data:`REL_TOL`; math-verify's own rounding to 6 decimals, which calls
    ``1.6\\times10^{-19}`` and ``3.2\\times10^{-19}`` equal, is only used for what is not a plain number (sets,
    intervals, equations, matrices, expressions with symbols).
    """
    from math_verify import parse, verify

    gold = parse("\\boxed{" + clean_for_parse(reference) + "}", parsing_timeout=timeout_s)
    pred = parse("\\boxed{" + clean_for_parse(answer) + "}", parsing_timeout=timeout_s)
    if not gold or not pred:
        return False
    by_value = numbers_equal(gold[0], pred[0])
    if by_value is not None:
        return by_value
    return bool(verify(gold, pred, timeout_seconds=timeout_s))
