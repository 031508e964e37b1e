"""Answer extraction and equivalence checking for math problems.

Pure string functions (:func:`last_boxed`, :func:`final_answers`, :func:`extract_answer`, :func:`split_answer`,
:func:`normalize_answer`, :func:`strings_match`) plus :func:`math_verify_equal`, which parses both answers with
``math-verify`` 0.9.0 (its LaTeX normaliser and ``latex2sympy2_extended`` parser, then ``verify``); the env runs it in
a worker process with an outer deadline (:class:`envs.math.pool.VerifierPool`) and ORs it with the string match.

The rule every step here keeps: **a rewrite may join two spellings of one answer, never two different answers**. So
nothing that carries meaning is thrown away on one side and kept on the other. An answer is split first
(:func:`split_answer`) into its body, its unit (``\\text{ cm}``, ``\\%``, ``^\\circ``, ``\\$``) and its variable
(``x =``); both grading paths compare those parts by the same rules (:func:`parts_conflict`): different units or
variables never match; a unit or variable on one side only is allowed (a bare ``5`` answers ``5\\text{ cm}``).
Marks that the parser would drop inside a body (``%``, ``^\\circ``, primes, ``\\$``, ``\\ldots``) must be the same on
both sides. ``docs/math_code_envs.md`` lists every rule with a pair it keeps apart and a pair it joins.

Why a process: ``math-verify`` bounds its own work with ``signal.alarm``, which only works in a main thread, and some
inputs (``9^9^9^9``) block inside one C-level big-integer power that no signal interrupts. A worker process can be
killed; a thread cannot. The pool kills and replaces only the stuck worker, so one pathological answer never stalls
the other checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Commands whose argument is the boxed answer. ``\fbox`` is what some models and MATH solutions use.
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


_UNBRACED_ARGUMENT = re.compile(r"[^\s$]+")


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` of ``text`` -> index of its matching ``}``, in one pass (a stack; escaped ``\\{ \\}``
    do not count, an unmatched ``}`` is skipped). Unclosed ``{`` are absent. O(len(text)) time and memory."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    for match in re.finditer(r"(?<!\\)[{}]", text):
        if match.group(0) == "{":
            stack.append(match.start())
        elif stack:
            closing[stack.pop()] = match.start()
    return closing


def _box_argument(text: str, i: int, closing: dict[int, int] | None = None) -> tuple[int, int, int] | None:
    """The argument of the box command ending at ``text[i]``: ``(start, end, after)`` with the argument
    ``text[start:end]`` and ``after`` the index just past it, or None when unclosed.

    ``{...}`` with balanced braces (``closing`` from :func:`_closing_braces`; computed here when not given) or,
    without braces, the next token (``\\boxed 5`` -> ``5``). Linear in the argument when ``closing`` is given."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # "\boxed 5": the argument is the next token
        match = _UNBRACED_ARGUMENT.match(text, i)
        return (i, match.end(), match.end()) if match else None
    if closing is None:
        closing = _closing_braces(text[i:])
        j = closing.get(0)
        return None if j is None else (i + 1, i + j, i + j + 1)
    j = closing.get(i)
    return None if j is None else (i + 1, j, j + 1)


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    """``text[start:end]`` without its leading and trailing whitespace, as a span."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def last_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}`` (not ``\\frac{1``); ``\\boxed 5`` (no braces) gives ``5``.
    Returns None when there is no box or the last box is not closed.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    found = _box_argument(text, i)
    return text[slice(*_strip_span(text, found[0], found[1]))] if found else None


def _unwrap_box(text: str, start: int, end: int, closing: dict[int, int]) -> tuple[int, int]:
    """The span of a box's content ``text[start:end]`` with nested boxes unwrapped: ``\\boxed{\\boxed{7}}``'s
    content ``\\boxed{7}`` -> ``7`` (a box that is exactly one box is that box). Each level costs O(1) plus the
    whitespace around it, so unwrapping n levels is linear, not quadratic."""
    while True:
        start, end = _strip_span(text, start, end)
        match = _BOX_START.match(text, start, end)
        if not match:
            return start, end
        found = _box_argument(text, match.end(), closing)
        if found is None or found[2] > end or text[found[2]:end].strip():
            return start, end
        start, end = found[0], found[1]


# Boxes that a solution writes as one list ("\boxed{2}, \boxed{5}", "$\boxed{2}$ and $\boxed{5}$") form one answer
# "2, 5": only a comma, semicolon, "and" or "or" (with spaces and $) between them. math-verify groups more loosely
# (any 9 characters, or 70 with a separator somewhere), which would turn "\boxed{2}. On second thought, the
# answer is \boxed{3}" into one list.
# No two adjacent repeats over one class (``[\s$]*[,;]?[\s$]*`` was quadratic in a run of spaces between boxes).
_LIST_WORD = r"(?:and|or|\\text\{\s*(?:and|or)\s*\})"
_LIST_BETWEEN = re.compile(rf"[\s$]*(?:[,;][\s$]*(?:{_LIST_WORD}[\s$]*)?|{_LIST_WORD}[\s$]*)")


def _box_groups(text: str) -> list[str]:
    """Every final answer written in boxes, in order: the content of each box (nested boxes unwrapped), adjacent
    boxes of one list joined by ``", "``. An unclosed box ends the scan. Linear in ``len(text)``: the braces are
    matched once (:func:`_closing_braces`) and a box inside another box is not scanned again."""
    closing = _closing_braces(text)
    boxes: list[tuple[int, int, str]] = []  # (start, end, content)
    pos = 0
    while True:
        match = _BOX_START.search(text, pos)
        if not match:
            break
        found = _box_argument(text, match.end(), closing)
        if found is None:
            break
        boxes.append((match.start(), found[2], text[slice(*_unwrap_box(text, found[0], found[1], closing))]))
        pos = found[2]
    groups: list[list[str]] = []
    last_end = -1
    for start, end, content in boxes:
        if groups and _LIST_BETWEEN.fullmatch(text[last_end:start]):
            groups[-1].append(content)  # every box counts: "\boxed{7}, \boxed{7}" is a list of two
        else:
            groups.append([content])
        last_end = end
    return [", ".join(group) for group in groups]


def final_answers(text: str) -> list[str]:
    """The distinct final answers of a response, in order of appearance (the last one last).

    The boxed answers (:func:`_box_groups`: a list written as adjacent boxes is one answer); when there is no box,
    the first line after each GSM8K ``####``. Empty answers are dropped; answers with the same
    :func:`normalize_answer` count once. More than one answer means the response hedged: the env pays only if
    every one of them is correct.
    """
    answers = _box_groups(text)
    if not answers and "####" in text:
        for tail in text.split("####")[1:]:
            tail = tail.strip()
            answers.append(tail.splitlines()[0].strip() if tail else "")
    distinct: dict[str, str] = {}
    for answer in answers:
        if answer.strip():
            key = normalize_answer(answer)
            distinct.pop(key, None)  # keep the last occurrence's position: the final answer stays last
            distinct[key] = answer
    return list(distinct.values())


def extract_answer(text: str) -> str | None:
    """The model's final answer: the last boxed answer (adjacent boxes of one list joined, see
    :func:`final_answers`); else the text after GSM8K's last ``####``; else None."""
    answers = _box_groups(text)
    if answers:
        return answers[-1]
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    return None


# --- splitting an answer into body, unit and variable ------------------------------------------------------------
# Units: alias -> canonical name (one name per unit; no conversion between units: 500 cm is not 5 m here).
# Keys are case-sensitive ("m" metre, "M" nothing); words of 2+ letters also match lower-cased, and plurals
# ("hours", "inches") match their singular.
_UNIT_ALIASES: dict[str, tuple[tuple[str, int], ...]] = {}


def _units(canonical: str, *aliases: str, factors: tuple[tuple[str, int], ...] | None = None) -> None:
    for alias in (canonical, *aliases):
        _UNIT_ALIASES[alias] = factors or ((canonical, 1),)


for _name, *_aliases in (
    ("meter", "m", "metre"), ("centimeter", "cm", "centimetre"), ("millimeter", "mm", "millimetre"),
    ("kilometer", "km", "kilometre"), ("micrometer", "µm", "um", "micron"), ("nanometer", "nm", "nanometre"),
    ("inch", "in"), ("foot", "ft", "feet"), ("yard", "yd"), ("mile", "mi"), ("acre",), ("hectare", "ha"),
    ("liter", "L", "l", "litre"), ("milliliter", "mL", "ml", "millilitre"), ("gallon", "gal"), ("quart", "qt"),
    ("cup",), ("gram", "g", "gm"), ("kilogram", "kg"), ("milligram", "mg"), ("pound", "lb"), ("ounce", "oz"),
    ("ton", "tonne"), ("second", "s", "sec"), ("millisecond", "ms"), ("minute", "min"), ("hour", "h", "hr"),
    ("day",), ("week", "wk"), ("month",), ("year", "yr"), ("newton", "N"), ("joule", "J"), ("kilojoule", "kJ"),
    ("watt", "W"), ("kilowatt", "kW"), ("volt", "V"), ("ampere", "A", "amp"), ("coulomb", "C"), ("kelvin", "K"),
    ("pascal", "Pa"), ("kilopascal", "kPa"), ("hertz", "Hz"), ("electronvolt", "eV"), ("mole", "mol"),
    ("ohm", "Ω"), ("tesla", "T"), ("atmosphere", "atm"), ("calorie", "cal"), ("kilocalorie", "kcal"),
    ("celsius",), ("fahrenheit",), ("degree", "°", "deg"), ("radian", "rad"), ("percent", "%", "pct"),
    ("dollar", "$", "usd", "USD", "buck"), ("cent", "¢"), ("unit",),
):
    _units(_name, *_aliases)
_units("mph", factors=(("mile", 1), ("hour", -1)))
for _alias in ("kph", "kmh", "kmph"):
    _units(_alias, factors=(("kilometer", 1), ("hour", -1)))
_POWER_WORDS = {"square": 2, "sq": 2, "cubic": 3, "cu": 3}
_POWER_SUFFIX_WORDS = {"squared": 2, "cubed": 3}
# Words that change a quantity when they follow a number ("5 dozen" is 60, "3 tens" is 30, "2 times" a factor,
# "4 more" a difference). The one-sided rule below is an allow-list (known units, the question's nouns), so this
# list is never what lets a word through: it only keeps such words out of the nouns taken from a question
# (:func:`question_nouns`: "he has 3 tens and 4 ones" must not make "9 tens" equal 9).
_QUANTITY_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty sixty seventy "
    "eighty ninety tens teens hundred thousand million billion trillion quadrillion lakh crore myriad grand "
    "dozen score gross pair couple half halve halves third quarter fourth fifth sixth seventh eighth ninth tenth "
    "hundredth thousandth millionth fold time times twice thrice more less fewer greater smaller larger least most "
    "extra additional remaining left over under than plus minus total each per inverse reciprocal negative "
    "positive square cube squared cubed power percent percentage factorial or and not no about approx "
    "approximately roughly nearly almost around maybe possibly".split())
_NOUN_AFTER_NUMBER = re.compile(
    r"(?<![A-Za-z0-9.])\d+(?:[.,]\d+)*(?:\s|\$|~|\\[,;: ]|\\(?:text|mbox|textrm|mathrm)\s*\{)*"
    r"([A-Za-z]{2,})(?![A-Za-z])"
    r"|(?<![A-Za-z])[Hh]ow\s+many\s+([A-Za-z]{2,})(?![A-Za-z])")  # the noun a question asks for: "how many ways"


def _word_forms(word: str) -> set[str]:
    """``word`` and its singular/plural spellings (``apples`` <-> ``apple``, ``boxes`` <-> ``box``)."""
    forms = {word, word + "s", word + "es"}
    if len(word) > 3 and word.endswith("es"):
        forms.add(word[:-2])
    if len(word) > 2 and word.endswith("s"):
        forms.add(word[:-1])
    return forms


def question_nouns(question: str | None) -> frozenset[str]:
    """The nouns a question counts: each word written right after a number (``3 apples``, ``$12$ marbles``,
    ``5\\text{ pens}``) or after "how many" (``how many ways``), lower-cased, except words that change a quantity
    (``3 tens``, ``2 times``, ``4 more``:
    :data:`_QUANTITY_WORDS`, in any of their :func:`_word_forms`). Linear in the question; empty for None."""
    if not question:
        return frozenset()
    nouns = set()
    for match in _NOUN_AFTER_NUMBER.finditer(question):
        word = (match.group(1) or match.group(2)).lower()
        if not _word_forms(word) & _QUANTITY_WORDS:
            nouns.add(word)
    return frozenset(nouns)


def _lookup_unit(word: str) -> tuple[tuple[str, int], ...] | None:
    """Canonical factors of one unit word, or None."""
    for candidate in (word, word.lower() if len(word) > 1 else word):
        if candidate in _UNIT_ALIASES:
            return _UNIT_ALIASES[candidate]
        if len(candidate) > 3 and candidate.endswith("es") and candidate[:-2] in _UNIT_ALIASES:
            return _UNIT_ALIASES[candidate[:-2]]
        if len(candidate) > 2 and candidate.endswith("s") and candidate[:-1] in _UNIT_ALIASES:
            return _UNIT_ALIASES[candidate[:-1]]
    return None


_UNIT_TOKEN = re.compile(r"[A-Za-zµΩ]+|[°%$¢²³/*]|\^\s*-?\d+")


def canonical_unit(phrase: str) -> str:
    """Canonical name of a unit phrase: ``"km/h"`` and ``"kilometers per hour"`` -> ``"kilometer/hour"``,
    ``"cm^2"`` and ``"square centimeters"`` -> ``"centimeter^2"``, ``"%"`` -> ``"percent"``, ``"°C"`` ->
    ``"celsius"``. A phrase with any word that is not a known unit gives ``"text:<the phrase, lower-cased>"``."""
    flat = re.sub(r"\\(?:text|textrm|textnormal|textup|textit|mathrm|mbox|rm|operatorname)\s*\{([^{}]*)\}",
                  r" \1 ", phrase)
    flat = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree", " ° ", flat)
    flat = (flat.replace("\\%", "%").replace("\\$", "$").replace("\\Omega", "Ω").replace("\\mu ", "µ")
            .replace("\\mu", "µ").replace("\\cdot", "*").replace("·", "*"))
    flat = re.sub(r"\\[,;:! ]|~", " ", flat)
    flat = re.sub(r"\^\s*\{\s*(-?\d+)\s*\}", r"^\1", flat).replace("{", " ").replace("}", " ")
    text_form = "text:" + " ".join(flat.lower().split())
    tokens = _UNIT_TOKEN.findall(flat)
    if "".join(tokens).replace(" ", "") != re.sub(r"\s+", "", flat):  # something that is not a unit token
        return text_form
    factors: dict[str, int] = {}
    sign, pending_power, last = 1, 1, None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("/",) or token.lower() == "per":
            sign = -1
        elif token == "*":
            pass
        elif token.lower() in _POWER_WORDS:
            pending_power = _POWER_WORDS[token.lower()]
        elif token.startswith("^") or token in "²³" or token.lower() in _POWER_SUFFIX_WORDS:
            if last is None:
                return text_form
            power = (int(token[1:]) if token.startswith("^") else 2 if token in ("²",) else 3 if token == "³"
                     else _POWER_SUFFIX_WORDS[token.lower()])
            for name, exponent in last:
                factors[name] += exponent * (power - 1)
        else:
            if token == "°" and i + 1 < len(tokens) and tokens[i + 1] in ("C", "F"):
                token, i = ("celsius" if tokens[i + 1] == "C" else "fahrenheit"), i + 1
            found = _lookup_unit(token)
            if found is None:
                return text_form
            last = tuple((name, exponent * sign * pending_power) for name, exponent in found)
            for name, exponent in last:
                factors[name] = factors.get(name, 0) + exponent
            sign, pending_power = 1, 1
        i += 1
    factors = {name: power for name, power in factors.items() if power}
    if not factors:
        return text_form
    numerator = [name if p == 1 else f"{name}^{p}" for name, p in sorted(factors.items()) if p > 0]
    denominator = [name if p == -1 else f"{name}^{-p}" for name, p in sorted(factors.items()) if p < 0]
    return "*".join(numerator) + "".join("/" + d for d in denominator)


_VARIABLE = re.compile(
    r"(?:[A-Za-z]|\\(?:alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|"
    r"rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega))"
    r"(?:_\{?[A-Za-z0-9]+\}?)?")
_TEXT_TAIL = re.compile(
    r"\\(?:text|textrm|textnormal|textup|mathrm|mbox|rm|operatorname)\s*\{[^{}]*\}"
    r"(?:\s*\^\s*(?:\{\s*-?\d\s*\}|-?\d))?$")
_DEGREE_TAIL = re.compile(r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree)(?:\s*[CF](?![A-Za-z]))?$")
_PERCENT_TAIL = re.compile(r"\\?%$")
_WORD_TAIL = re.compile(r"(?<![A-Za-z\\])[A-Za-zµΩ]{2,}(?:/[A-Za-z]+)?(?:\^\s*(?:\{\s*-?\d\s*\}|-?\d))?$")
_CONNECTOR_TAIL = re.compile(r"(?:/|\\cdot)$")
_DANGLING = re.compile(r"(?:[+\-*/=^_,(\[{&<>]|\\(?:cdot|times|div|pm|mp|le|ge|leq|geq|lt|gt|ne|neq|in|to))$")
_PLAIN_NUMBER = re.compile(r"-?(?:\d+(?:[.,]\d+)*|\.\d+)(?:\\?%)?|-?\\frac\{\d+\}\{\d+\}")


@dataclass(frozen=True)
class AnswerParts:
    """One answer split for grading (:func:`split_answer`).

    Attributes:
        body: what is left to compare as mathematics (``"5"`` of ``x = 5\\text{ cm}``).
        unit: canonical unit (:func:`canonical_unit`: ``"centimeter"``, ``"percent"``, ``"degree"``, ``"dollar"``,
            ``"text:apples"`` for other trailing text), or None.
        variable: the variable of a leading ``x =`` (``"x"``, ``"\\theta"``, ``"a_1"``), or None.
    """

    body: str
    unit: str | None = None
    variable: str | None = None


def _top_level(text: str, char: str) -> list[int]:
    """Positions of ``char`` outside every bracket pair ``() [] {}`` (``\\{`` counts as a bracket)."""
    depth, out = 0, []
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == char and depth == 0:
            out.append(i)
    return out


def _strip_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right) and not s.endswith("\\$"):
            s = s[len(left) : -len(right)].strip()
    return s


_TAIL_WINDOW = 400  # characters searched for a unit at the end (a unit is short; a long answer stays linear)
_TRAILING_SPACE = re.compile(r"(?:\s|\\[,;:! ]|~)$")


def _rstrip_spaces(s: str, pos: int) -> int:
    """``pos`` moved left over spaces and spacing commands (``\\,`` ``\\;`` ``\\ `` ``~``) ending at it."""
    while pos > 0:
        match = _TRAILING_SPACE.search(s, max(0, pos - 2), pos)
        if match is None:
            return pos
        pos = match.start()
    return pos


def _unit_piece(s: str, pos: int) -> re.Match | None:
    """The unit piece ending at ``pos`` (a text group, a degree mark, a percent sign, a known bare unit word)."""
    for pattern in (_TEXT_TAIL, _DEGREE_TAIL, _PERCENT_TAIL, _WORD_TAIL):
        match = pattern.search(s, max(0, pos - _TAIL_WINDOW), pos)
        if match is None:
            continue
        if pattern is _WORD_TAIL:  # a bare word counts only when it is a known unit ("cm", "hours"), not "in"
            word = re.sub(r"\^.*$", "", match.group(0))
            if word == "in" or canonical_unit(word).startswith("text:"):
                continue
        return match
    return None


def _peel_unit(s: str) -> tuple[str, str]:
    """``(body, unit phrase)``: the trailing unit pieces (text groups, ``^\\circ``, ``%``, known bare unit words,
    joined by ``/`` or ``\\cdot``) cut off ``s``; ``(s, "")`` when there are none or no body would be left."""
    pos, pieces = len(s), []
    while len(pieces) < 8:  # a unit has a few pieces ("\\text{kg}\\cdot\\text{m}/\\text{s}^2"); more are not a unit
        end = _rstrip_spaces(s, pos)
        match = _unit_piece(s, end)
        if match is None and pieces:  # "\text{m}/\text{s}": a connector, then another piece
            connector = _CONNECTOR_TAIL.search(s, max(0, end - 8), end)
            if connector is not None and _unit_piece(s, _rstrip_spaces(s, connector.start())) is not None:
                pieces.insert(0, connector.group(0))
                pos = connector.start()
                continue
        if match is None:
            break
        pieces.insert(0, match.group(0))
        pos = match.start()
    body = s[: _rstrip_spaces(s, pos)].strip()
    if not pieces or not body or _DANGLING.search(body, max(0, len(body) - 16)):
        return s, ""
    return body, " ".join(pieces)


def split_answer(answer: str) -> AnswerParts:
    """Split an answer into body, unit and variable (see :class:`AnswerParts`).

    ``$...$`` and ``\\(...\\)`` delimiters and a trailing sentence period are removed first. Then a leading ``\\$``
    (or a lone ``$`` before a number, GSM8K style) is the unit ``dollar``; a leading single variable with ``=``
    (``x = 3``, ``x = \\frac{6}{3} = 2``; not ``x = 1, y = 2``, which is a system) gives ``variable``; trailing
    text groups, ``^\\circ``, ``\\%`` and known bare unit words (``cm``, ``hours``) give ``unit``. Examples:
    ``"5\\text{ cm}"`` -> ``("5", "centimeter", None)``; ``"x = 50\\%"`` -> ``("50", "percent", "x")``;
    ``"\\$18.50"`` -> ``("18.50", "dollar", None)``; ``"\\text{(B)}"`` -> ``("\\text{(B)}", None, None)``.
    """
    s = _strip_delimiters(answer)
    s = re.sub(r"(?<=[^.\s])\s*\.$", "", s).strip()  # a sentence's period ("3." is 3), not "..."
    money = re.match(r"^(-?)\s*(?:\\\$|\$(?=\s*[\d.]))\s*", s)
    if money:
        s = money.group(1) + s[money.end():]
    variable = None
    equals = [i for i in _top_level(s, "=") if s[i - 1 : i] not in ("<", ">", "!", "\\")]
    if equals:
        head, rest = s[: equals[0]].strip(), s[equals[0] + 1 :].strip()
        # "x = 1, y = 2" and "x = 2 or x = 3" are several answers: the parser reads them whole
        connected = _top_level(rest, ",") or _top_level(rest, ";") or _CONNECTIVE.search(rest)
        if _VARIABLE.fullmatch(head) and rest and not connected:
            variable, s = head, rest
    body, phrase = _peel_unit(s)
    unit_phrase = " ".join(p for p in ("$" if money else "", phrase) if p)
    unit = canonical_unit(unit_phrase) if unit_phrase else None
    if unit is not None and unit.startswith("text:") and not phrase:
        unit = None
    return AnswerParts(body=body, unit=unit, variable=variable)


# --- the rules both paths apply to the parts ---------------------------------------------------------------------
_MARK = re.compile(r"\\%|%|\bpercent(?:age)?\b|\bpct\b|\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree|'+|\"+|\\\$|"
                   r"\\[lcv]?dots[bcimo]?|…|\.\.\.")
_INEQUALITY = re.compile(r"<|>|\\(?:le|ge|leq|geq|lt|gt|ne|neq|leqslant|geqslant)(?![A-Za-z])")
_CONNECTIVE = re.compile(r"(?<![A-Za-z])(and|or)(?![A-Za-z])|\\(lor|land|vee|wedge|cup|cap)(?![A-Za-z])")


def _marks(body: str) -> list[str]:
    """The marks in a body that the parser drops or rewrites (``%`` -> 1/100 or nothing, ``^\\circ``, primes and
    quotes, ``\\$``, ellipses), in order, each as its kind."""
    out = []
    for match in _MARK.finditer(body):
        mark = match.group(0)
        if mark in ("\\%", "%") or mark.startswith(("percent", "pct")):
            out.append("%")
        elif "circ" in mark or mark in ("°", "\\degree"):
            out.append("°")
        elif mark.startswith(("'", '"', "\\$")):
            out.append(mark)
        else:
            out.append("...")
    return out


def _outer_kind(body: str) -> str | None:
    """``"set"`` for ``\\{...\\}``, ``"interval"`` for a ``(a, b)`` / ``[a, b]`` pair-like bracket, else None."""
    s = re.sub(r"\\(?:left|right|big|Big|bigl|bigr)(?![A-Za-z])", "", body).replace(" ", "")
    if re.match(r"^(?:\\\{|\\lbrace)", s) and re.search(r"(?:\\\}|\\rbrace)$", s):
        return "set"
    if s[:1] in "([" and s[-1:] in ")]" and _top_level(s[1:-1], ","):
        return "interval"
    return None


def _connectives(body: str) -> list[str]:
    """How the top-level parts of a body are joined: ``and`` / ``or`` / ``,``, in order."""
    words = ["or" if (m.group(1) or m.group(2)) in ("or", "lor", "vee", "cup") else "and"
             for m in _CONNECTIVE.finditer(body)]
    return words + ["," for _ in _top_level(body, ",")]


def _unit_one_sided_ok(parts: AnswerParts, nouns: frozenset[str] = frozenset()) -> bool:
    """Whether ``parts.unit`` may be ignored when the other answer has no unit: a known unit (``5\\text{ cm}``,
    ``50\\%``), or words that are all nouns of the question (``nouns``, :func:`question_nouns`) after a plain
    number (``10\\text{ apples}`` when the question counts apples). An allow-list: any other word (``9\\text{
    tens}``, ``9\\text{ k}``, ``9\\text{ grand}``, ``9\\text{ inverse}``) may change the quantity."""
    if parts.unit is None or not parts.unit.startswith("text:"):
        return True
    words = parts.unit[len("text:"):].split()
    return (bool(words) and all(word.isalpha() and _word_forms(word) & nouns for word in words)
            and bool(_PLAIN_NUMBER.fullmatch(parts.body.replace(" ", ""))))


_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|textup|textsf|texttt|mathrm|mbox|mathbf)\s*"
                         r"\{([^{}]*)\}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTERS = re.compile(r"[A-Za-z]+")


def _text_words(body: str) -> tuple[list[str], bool] | None:
    """The words of a body's text groups (lower-cased, sorted) and whether the body is nothing but text groups;
    None when it has no text group. ``\\text{Eve lyn}`` -> ``(["eve", "lyn"], True)``."""
    groups = _TEXT_GROUP.findall(body)
    if not groups:
        return None
    words = sorted(word.lower() for group in groups for word in _LETTERS.findall(group))
    only_text = not _TEXT_GROUP.sub("", body).strip(" ${}()")
    return words, only_text


def _words_conflict(a: str, b: str) -> bool:
    """Words keep their identity: two bodies with text groups must have the same words (``\\text{Eve lyn}`` is
    not ``\\text{Evelyn}``); a body that is only text must have the words the other side writes in letters
    (``\\text{Evelyn}`` is not ``Eve lyn``, is ``Evelyn``). Case is ignored (``\\text{Monday}`` is ``monday``)."""
    wa, wb = _text_words(a), _text_words(b)
    if wa is not None and wb is not None:
        return wa[0] != wb[0]
    text, other = (wa, b) if wa is not None else (wb, a) if wb is not None else (None, "")
    if text is None or not text[1]:
        return False
    letters = sorted(word.lower() for word in _LETTERS.findall(_COMMAND.sub(" ", other)))
    return text[0] != letters


_OUTER_OPEN = re.compile(r"^(?:\\\{|\\lbrace|\(|\[)")


def list_elements(body: str) -> list[str]:
    """The elements of a list, set, tuple or interval body: ``3, 5, 7, 7`` / ``\\{3, 5, 7, 7\\}`` /
    ``(3, 5, 7, 7)`` -> ``["3", "5", "7", "7"]`` (split at top-level commas and semicolons, after thousands
    separators are joined); one element for anything else. Linear in the body."""
    s = re.sub(r"\\(?:left|right|big|Big|bigl|bigr)(?![A-Za-z])", "", join_thousands(body)).strip()
    opening = _OUTER_OPEN.match(s)
    if opening:
        inner = s[opening.end():]
        for close in ("\\}", "\\rbrace", ")", "]"):
            if inner.endswith(close):
                inner = inner[: -len(close)]
                break
        else:
            inner = None
        # the outer pair encloses everything only when the inside is balanced ("(1, 2) \cup (3, 4)" is not)
        if inner is not None and _balanced(inner):
            s = inner
    cuts = sorted(_top_level(s, ",") + _top_level(s, ";"))
    pieces, last = [], 0
    for cut in cuts:
        pieces.append(s[last:cut].strip())
        last = cut + 1
    pieces.append(s[last:].strip())
    return pieces


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += c in "([{"
        depth -= c in ")]}"
        if depth < 0:
            return False
    return depth == 0


def parts_conflict(a: AnswerParts, b: AnswerParts, nouns: frozenset[str] = frozenset()) -> str | None:
    """Why two split answers cannot be equal whatever their bodies are, or None when their bodies decide.

    - variables: ``x = 2`` vs ``y = 2`` differ; a variable on one side only (``x = 2`` vs ``2``) is allowed;
    - units: different units differ (``5 cm`` vs ``5 km``, ``30^\\circ`` vs ``30\\%``); a unit on one side only is
      allowed when :func:`_unit_one_sided_ok` (``5\\text{ cm}`` vs ``5``; not ``5\\text{ dozen}`` vs ``5``; a
      word that is not a unit only when it is one of ``nouns``, the question's own: :func:`question_nouns`);
    - lists keep their multiplicity: without an inequality, two lists with different numbers of elements
      (:func:`list_elements`, two or more each) differ (``3, 5, 7, 7`` vs ``3, 5, 7``); one value against a list
      of equal values (``\\frac{639}{40}`` vs ``15\\frac{39}{40}, \\frac{639}{40}``, MATH500's own solution)
      is left to the values, as two equal boxes are;
    - words keep their identity (:func:`_words_conflict`: ``\\text{Eve lyn}`` vs ``\\text{Evelyn}``);
    - marks inside the bodies (:func:`_marks`) must be the same sequence (``(30^\\circ, 60^\\circ)`` vs
      ``(30\\%, 60\\%)``, ``5'`` vs ``5''``, ``1, 2, \\ldots`` vs ``1, 2``);
    - a set in braces is not an interval or tuple (``\\{1, 2\\}`` vs ``(1, 2)``);
    - with an inequality on either side, ``and`` / ``or`` / ``,`` joining the parts must agree when both sides
      have them (``x < 1 \\text{ or } x > 2`` vs ``x < 1 \\text{ and } x > 2``).
    """
    if a.variable and b.variable and a.variable != b.variable:
        return f"different variables {a.variable} and {b.variable}"
    if a.unit != b.unit:
        if a.unit is not None and b.unit is not None:
            return f"different units {a.unit} and {b.unit}"
        if not _unit_one_sided_ok(a, nouns) or not _unit_one_sided_ok(b, nouns):
            return f"trailing text {a.unit or b.unit} on one side only"
    if _marks(a.body) != _marks(b.body):
        return f"different marks {_marks(a.body)} and {_marks(b.body)}"
    kinds = {_outer_kind(a.body), _outer_kind(b.body)}
    if kinds == {"set", "interval"}:
        return "a set is not an interval or tuple"
    inequality = bool(_INEQUALITY.search(a.body) or _INEQUALITY.search(b.body))
    if not inequality:  # a single answer against a list of it written twice is left to the values (a hedge rule)
        na, nb = len(list_elements(a.body)), len(list_elements(b.body))
        if na != nb and min(na, nb) > 1:
            return f"lists of {na} and {nb} elements"
    if _words_conflict(a.body, b.body):
        return "different words"
    if inequality:
        ca, cb = _connectives(a.body), _connectives(b.body)
        if ca and cb and ca != cb:
            return f"different connectives {ca} and {cb}"
    return None


# --- the string path ---------------------------------------------------------------------------------------------
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|textnormal|mathrm|mbox|mathbf)\{([^{}]*)\}")
# thousands groups: "1,000", "1{,}000", "1\,000" (not "0,5" or "0,111": a list, or a decimal comma; not "1, 000")
_THOUSANDS = re.compile(r"(?<![\d.,])(-?[1-9]\d{0,2})((?:(?:,|\{,\}|\\,|\\ |~)\d{3})+)(?![\d,])")


def join_thousands(s: str) -> str:
    """``1,000`` / ``1{,}000`` / ``1\\,000`` -> ``1000`` (a group of exactly three digits after each separator,
    no space after a comma, the first group not starting with 0); ``1,2``, ``1, 000``, ``0,111`` stay."""
    return _THOUSANDS.sub(lambda m: m.group(1) + re.sub(r"\D", "", m.group(2)), s)


def _normalize_body(body: str) -> str:
    s = body.strip().replace("$", "")
    s = re.sub(r"\\(?:left|right|big|Big|bigl|bigr)(?![A-Za-z])", "", s)
    s = join_thousands(s)
    s = re.sub(r"\\[!,;:]|\\ |~", " ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = s.strip()
    s = re.sub(r"(?<=\d)\s+(?=\d)", "\x00", s)  # "1 2" is not "12": keep one space there
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    s = s.replace(",", ", ")  # list commas (thousands are joined already): "1, 000" must not become "1,000"
    # "(051)" (AIME's "\textbf{(051)}") -> "051"; "(B)" -> "B"; "(-5)" -> "-5" (never "5")
    s = re.sub(r"^\((-?\d+|[A-Za-z])\)$", r"\1", s)
    if re.fullmatch(r"-?\d+\.\d*", s):  # 0.50 -> 0.5, 3.0 -> 3
        s = s.rstrip("0").rstrip(".")
    if re.fullmatch(r"-?0\d+", s):  # AIME's 051 is 51 (not "0+\d+": quadratic on a long run of zeros)
        s = re.sub(r"^(-?)0+(?=\d)", r"\1", s)
    return s


def normalize_answer(answer: str) -> str:
    """Canonical string of one answer (the string path, and the key that tells two final answers apart).

    The body (:func:`split_answer`) without ``$``, spaces (one kept between two digits: ``1 2`` is not ``12``),
    ``\\left``/``\\right``, ``\\!``/``\\,``, with ``\\text{}`` unwrapped, thousands separators joined
    (:func:`join_thousands`), ``\\dfrac``/``\\tfrac`` -> ``\\frac``, ``0.50`` -> ``0.5``, ``(051)`` -> ``51``;
    then the variable in front (``x=``) and the canonical unit behind (``\\%``, ``^\\circ``,
    ``\\text{centimeter}``). Nothing with meaning is dropped: ``10\\text{ cm}`` -> ``10\\text{centimeter}``,
    ``50\\%`` -> ``50\\%``, ``x = 3.`` -> ``x=3``. Idempotent.
    """
    parts = split_answer(answer)
    out = _normalize_body(parts.body)
    if parts.variable:
        out = f"{parts.variable}={out}"
    if parts.unit == "percent":
        out += "\\%"
    elif parts.unit == "degree":
        out += "^\\circ"
    elif parts.unit is not None:
        out += "\\text{" + parts.unit.removeprefix("text:") + "}"
    return out


def strings_match(reference: str, answer: str, nouns: frozenset[str] = frozenset()) -> bool:
    """String verdict: the parts do not conflict (:func:`parts_conflict`, with the question's ``nouns``) and the
    normalised bodies are equal and non-empty."""
    ref, ans = split_answer(reference), split_answer(answer)
    if parts_conflict(ref, ans, frozenset(nouns)):
        return False
    a, b = _normalize_body(ref.body), _normalize_body(ans.body)
    return bool(a) and a == b


# --- the math-verify path ----------------------------------------------------------------------------------------
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


def clean_for_parse(body: str) -> str:
    """What :func:`math_verify_equal` hands to math-verify's normaliser: scientific notation (``1e-10``) written as
    LaTeX (``1\\times10^{-10}``), thousands separators joined (:func:`join_thousands`) and every other comma
    before a digit spaced (latex2sympy reads ``0,111`` as 0.111 and ``1,000`` as 1000), and ``\\frac123`` read as
    TeX does (``\\frac{1}{2}3``; math-verify's own repair makes it ``\\frac{1}{23}``)."""
    s = _SCIENTIFIC.sub(lambda m: f"{m.group(1)}\\times10^{{{m.group(2)}}}", body)
    s = re.sub(r",(?=\d)", ", ", join_thousands(s))  # what is left are list commas ("0,111" is no decimal)
    return re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)


# Digits separated only by space ("1 2", "1\,5"): latex2sympy reads them as a sum or a product (1\,000 -> 0).
_SPACED_DIGITS = re.compile(r"\d(?:\s|\\[,;:! ]|~)+(?=\d)")


def _parse_latex(body: str, timeout_s: int) -> Any:
    """``body`` as a sympy object through math-verify's own pieces, configured so that no text is dropped.

    ``math_verify.parse`` is not used: its extraction falls back to any number found anywhere in the text and to the
    last equation of a chain (so a long answer that merely contains the reference would match), its LaTeX
    normalisation strips units, and its parser lower-cases every symbol (``B`` would equal ``b``). Here:
    ``normalize_latex`` with ``units=False, boxed="none"`` and ``latex2sympy`` with ``lowercase_symbols=False``
    on the whole body, under math-verify's own ``signal.alarm`` timeout.

    Raises:
        TimeoutError: parsing ran past ``timeout_s`` (math-verify's ``TimeoutException`` is a BaseException).
        Exception: anything the parser raises on a body it does not understand.
    """
    # deferred: math-verify and sympy are heavy and only the verifier workers need them
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig, latex2sympy
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex
    from math_verify.errors import TimeoutException
    from math_verify.grader import should_treat_as_complex
    from math_verify.utils import timeout

    config = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="none",
                                 equations=False)
    normalized = normalize_latex(clean_for_parse(body), config)
    try:
        return timeout(timeout_seconds=timeout_s)(latex2sympy)(
            normalized, is_real=not should_treat_as_complex(normalized), convert_degrees=False,
            normalization_config=None, conversion_config=ConversionConfig(lowercase_symbols=False))
    except TimeoutException as exc:
        raise TimeoutError(f"parsing {body[:80]!r} ran past {timeout_s} s") from exc


def _value_of_numeric_equation(expr: Any) -> Any:
    """The value of ``2 + 1 = 3`` or ``\\frac{6}{3} = 2`` (an equation or chain whose parts are all plain numbers
    and equal by :func:`numbers_equal`), its last part; None for anything else (``x + 1 = 3``, ``5 = 3``)."""
    import sympy
    from latex2sympy2_extended.logic import And

    relations = list(expr._unsorted_args) if isinstance(expr, And) else [expr]
    if not all(isinstance(r, sympy.Eq) for r in relations):
        return None
    parts = [p for r in relations for p in (r.lhs, r.rhs)]
    if any(_numeric_value(p) is None for p in parts):
        return None
    if not all(numbers_equal(x, y) for x, y in zip(parts, parts[1:])):
        return None
    return parts[-1]


def math_verify_equal(reference: str, answer: str, timeout_s: int = 5, nouns: frozenset[str] = frozenset()) -> bool:
    """math-verify verdict for two bare answers (no ``\\boxed``). Runs in the calling process: use it only in a
    worker process (see :class:`envs.math.pool.VerifierPool`).

    Both answers are split (:func:`split_answer`) and must not conflict (:func:`parts_conflict`, with the
    question's ``nouns``); the bodies are
    parsed by :func:`_parse_latex` (bodies with digits separated only by spaces are not parsed: False, the string
    path decides). Numbers compare by value (:func:`numbers_equal`): exactly when both sides are exact rationals
    (``1/2004!`` is not ``1/2006!``), else with the relative tolerance :data:`REL_TOL`. Everything else goes to
    ``math_verify.verify`` (sets unordered, tuples and intervals ordered, matrices, relations, symbolic
    equality), except two of its joins that are refused here: an equation against a plain value counts only when
    it is an assignment (``a + b = 5``, its right side) or an equality of numbers (``2 + 1 = 3``), never
    ``x + 1 = 3`` for ``3``; the symbol ``E`` is not Euler's ``e``; and a list the parser read as a set with
    fewer elements than were written (``3, 5, 5``: duplicates) is compared as a multiset (:func:`_multisets_equal`).

    Raises:
        TimeoutError: parsing ran past ``timeout_s``.
    """
    import sympy
    from math_verify.grader import is_assignment_relation, is_equation, is_relation

    ref, ans = split_answer(reference), split_answer(answer)
    if parts_conflict(ref, ans, frozenset(nouns)) or not ref.body or not ans.body:
        return False
    if _SPACED_DIGITS.search(join_thousands(ref.body)) or _SPACED_DIGITS.search(join_thousands(ans.body)):
        return False
    try:
        gold, pred = _parse_latex(ref.body, timeout_s), _parse_latex(ans.body, timeout_s)
    except TimeoutError:
        raise
    except Exception:  # the parser does not understand a body: no verdict from math-verify
        return False
    if is_equation(gold) != is_equation(pred):
        equation, other = (gold, pred) if is_equation(gold) else (pred, gold)
        if not is_relation(other) and not isinstance(other, sympy.Set) and not is_assignment_relation(equation):
            value = _value_of_numeric_equation(equation)
            if value is None:
                return False
            gold, pred = (value, pred) if equation is gold else (gold, value)
    if (gold == sympy.E and isinstance(pred, sympy.Symbol) and pred.name == "E") or (
            pred == sympy.E and isinstance(gold, sympy.Symbol) and gold.name == "E"):
        return False  # latex2sympy reads "e" as Euler's number; a symbol E (a point, choice (E)) is not it
    if isinstance(gold, sympy.FiniteSet) or isinstance(pred, sympy.FiniteSet):
        elements = list_elements(ref.body), list_elements(ans.body)
        if min(map(len, elements)) > 1 and any(isinstance(v, sympy.FiniteSet) and len(v.args) != len(e)
                                               for v, e in zip((gold, pred), elements)):
            return _multisets_equal(*elements, timeout_s)  # the parser dropped duplicates: count them here
    return _values_equal(gold, pred, timeout_s)


MAX_MULTISET_ELEMENTS = 64
"""A list with duplicates and more elements than this is not compared element by element (False)."""


def _values_equal(gold: Any, pred: Any, timeout_s: int) -> bool:
    """Two parsed values: by value when both are plain numbers (:func:`numbers_equal`), else ``math_verify.verify``."""
    from math_verify import verify

    by_value = numbers_equal(gold, pred)
    if by_value is not None:
        return by_value
    return bool(verify(gold, pred, timeout_seconds=timeout_s))


def _multisets_equal(gold: list[str], pred: list[str], timeout_s: int) -> bool:
    """Whether two lists of element bodies are equal as multisets (each gold element matched to its own
    predicted one; equality of values is an equivalence, so a greedy matching is exact). At most
    :data:`MAX_MULTISET_ELEMENTS` elements, each parsed once."""
    if len(gold) != len(pred) or len(gold) > MAX_MULTISET_ELEMENTS:
        return False
    try:
        gold_values = [_parse_latex(g, timeout_s) for g in gold]
        pred_values = [_parse_latex(p, timeout_s) for p in pred]
    except TimeoutError:
        raise
    except Exception:  # an element the parser does not understand: no verdict
        return False
    unmatched = list(range(len(pred_values)))
    for value in gold_values:
        match = next((j for j in unmatched if _values_equal(value, pred_values[j], timeout_s)), None)
        if match is None:
            return False
        unmatched.remove(match)
    return True
