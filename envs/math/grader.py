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


def math_verify_equal(reference: str, answer: str, timeout_s: int = 5) -> bool:
    """math-verify verdict for two bare answers (no ``\\boxed``). Runs in the calling process: use it only in a
    worker process (see :class:`envs.math.pool.VerifierPool`).

    Both sides are cleaned with :func:`normalize_answer`-style percent/degree removal, then wrapped in ``\\boxed{}``
    and parsed. One correction on top of math-verify: when both sides are exact rationals (``1/2004!``,
    ``1/2006!``) they must be exactly equal; math-verify would call them equal after rounding to 6 decimals.
    """
    from math_verify import parse, verify

    def clean(s: str) -> str:
        s = s.replace("\\%", "").replace("%", "")
        return re.sub(r"\^\s*\{?\\circ\}?", "", s)

    gold = parse("\\boxed{" + clean(reference) + "}", parsing_timeout=timeout_s)
    pred = parse("\\boxed{" + clean(answer) + "}", parsing_timeout=timeout_s)
    if not gold or not pred:
        return False
    exact_gold, exact_pred = _exact_rational(gold[0]), _exact_rational(pred[0])
    if exact_gold is not None and exact_pred is not None:
        return bool(exact_gold == exact_pred)
    return bool(verify(gold, pred, timeout_seconds=timeout_s))
