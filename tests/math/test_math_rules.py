"""Issue 20: math answers that differ must not grade equal.

Every rule of either grading path that removes or rewrites text has a pair it must keep apart and a pair it must
still join, graded through the real interface (``score_response`` with the real math-verify in worker processes).
Each keep-apart pair is also checked on each path alone (the env ORs them, so one lenient path is enough for a false
1.0): the string match and math-verify, the latter in this process (its ``signal.alarm`` works in the main thread).
The list of rules is in docs/math_code_envs.md ("What is joined, what is kept apart").
"""

from __future__ import annotations

import pytest

from envs.math import score_response
from envs.math.env import MAX_FINAL_ANSWERS
from envs.math.grader import (
    AnswerParts,
    canonical_unit,
    extract_answer,
    final_answers,
    math_verify_equal,
    normalize_answer,
    split_answer,
    strings_match,
)


# (rule, reference, response): the response must score 0 ...
KEEP_APART = [
    # units: the four pairs of the issue (all scored 1.0: the normaliser and math-verify both dropped the unit)
    ("unit", "5\\text{ cm}", "\\boxed{5\\text{ km}}"),
    ("unit", "5\\text{ m}", "\\boxed{5 \\text{ cm}}"),
    ("unit", "30\\text{ minutes}", "\\boxed{30\\text{ hours}}"),
    ("unit", "10\\text{ dollars}", "\\boxed{10\\text{ cents}}"),
    ("unit", "5\\text{ cm}^2", "\\boxed{5\\text{ cm}}"),
    ("unit", "20^\\circ\\text{C}", "\\boxed{20^\\circ\\text{F}}"),
    ("unit", "5 \\text{ cm}", "\\boxed{5 km}"),  # a bare unit word is a unit too
    ("unit: no conversion", "5\\text{ m}", "\\boxed{500\\text{ cm}}"),
    ("money", "\\$18", "\\boxed{18\\text{ cents}}"),
    ("money", "\\$18", "\\boxed{\\$18 \\text{ per hour}}"),
    ("trailing words", "10", "\\boxed{10 \\text{ dozen}}"),  # "dozen" multiplies
    ("trailing words", "3", "\\boxed{3 \\text{ or more}}"),
    ("trailing words", "10\\text{ apples}", "\\boxed{10\\text{ oranges}}"),
    ("percent", "50\\%", "\\boxed{50^\\circ}"),
    ("percent", "0.5", "\\boxed{50\\%}"),
    ("degrees", "30^\\circ", "\\boxed{30\\%}"),
    ("degrees", "\\frac{\\pi}{6}", "\\boxed{30^\\circ}"),  # no conversion between degrees and radians
    # variables: "x=2" vs "y=2" scored 1.0 (the normaliser dropped any "x=")
    ("variable", "x=2", "\\boxed{y=2}"),
    ("variable", "x = 2", "\\boxed{y = 2}"),
    ("variable: chain", "3", "\\boxed{x = 2 = 3}"),
    ("variable: systems", "x=1, y=2", "\\boxed{y=1, x=2}"),
    ("equation", "3", "\\boxed{x+1=3}"),  # math-verify took the right side of any equation
    ("equation", "3", "\\boxed{5=3}"),
    ("marks inside", "(30^\\circ, 60^\\circ)", "\\boxed{(30\\%, 60\\%)}"),
    ("marks inside", "5'", "\\boxed{5''}"),  # feet and inches; the parser drops quotes
    ("marks inside", "f'(x)", "\\boxed{f(x)}"),
    ("marks inside", "1, 2", "\\boxed{1, 2, \\ldots}"),
    ("marks inside", "1, 2", "\\boxed{1, 2, ...}"),
    ("thousands", "1000", "\\boxed{1, 000}"),  # a list of two numbers
    ("thousands", "0.5", "\\boxed{0,5}"),  # a list, or a decimal comma: not joined with either
    ("thousands", "0.111", "\\boxed{0,111}"),
    ("spaces between digits", "0", "\\boxed{1\\,000 0}"),
    ("spaces between digits", "12", "\\boxed{1 2}"),
    ("spaces between digits", "3", "\\boxed{1 2}"),  # latex2sympy reads "1 2" as 1 + 2
    ("letters: case", "B", "\\boxed{b}"),  # latex2sympy lower-cases every symbol by default
    ("letters: case", "2x + 1", "\\boxed{2X + 1}"),
    ("letters: e", "\\text{(E)}", "\\boxed{e}"),
    ("sets vs intervals", "(1,2)", "\\boxed{\\{1,2\\}}"),
    ("sets vs intervals", "\\{1,2\\}", "\\boxed{(1,2)}"),
    ("intervals", "(1,2]", "\\boxed{[1,2]}"),
    ("tuples", "(1,2)", "\\boxed{(2,1)}"),
    ("lists vs tuples", "(1,2)", "\\boxed{2, 1}"),
    ("connectives", "x<1 \\text{ or } x>2", "\\boxed{x<1 \\text{ and } x>2}"),
    ("malformed fractions", "\\frac{1}{23}", "\\boxed{\\frac123}"),
    ("normal form", "5", "\\boxed{(-5)}"),
    ("normal form", "10", "\\boxed{1.0}"),
    ("scientific notation", "0.2", "\\boxed{2e - 1}"),  # with spaces: 2 times Euler's e, minus 1
    # hedging: several different final answers
    ("hedging", "3", "\\boxed{2} or \\boxed{3}"),
    ("hedging", "3", "The answer is \\boxed{2}. Wait, let me check that again carefully: it is \\boxed{3}."),
    ("hedging", "3", "\\boxed{3} \\boxed{2}"),
    ("hedging", "3", "\\boxed{2 \\text{ or } \\boxed{3}}"),
    ("hedging", "3", "\\boxed{2 \\text{ or } 3}"),
    ("hedging", "3", "#### 3\n#### 4"),
    # a long answer that merely contains the reference
    ("long answer", "3", "\\boxed{" + ", ".join(str(i) for i in range(1, 200)) + "}"),
    ("long answer", "3", "\\boxed{\\text{I think the answer is } 3 \\text{ but it could also be } 4}"),
    ("long answer", "3", "\\boxed{\\text{it is } 3}"),
    ("long answer", "7", "\\boxed{1 = 2 = 3 = 4 = 5 = 6 = 7}"),  # math-verify parsed the last equation
    ("long answer", "3", "\\boxed{" + " + ".join(["0"] * 100) + " + 3 + x}"),
    ("long answer", "3", "#### 3 or 4 or 5"),
    # math-verify's extraction fell back to any "answer: ..." or number inside a box it could not parse: all 1.0
    ("long answer", "3", "\\boxed{\\text{Final answer: } 3 \\text{, though it might be } 4 \\text{ or } 5 \\#\\#}"),
    ("long answer", "3", "\\boxed{I computed many values: 1, 2, 4, 5 and the answer is 3 @@ $}"),
    ("long answer", "3", "\\boxed{\\text{answer: } 3 \\text{ or } 4 \\text{ or } 5 \\text{ or } 6 \\&}"),
    ("long answer", "3", "\\boxed{x = 1, 2, 3, 4, 5, 6 & 3}"),
    ("long answer", "3", "\\boxed{3 \\text{ (if } n \\text{ is odd), } 4 \\text{ otherwise}}"),
]

# ... and these must still score 1.
STILL_JOIN = [
    ("unit: one side", "5\\text{ cm}", "\\boxed{5}"),  # the documented rule: a bare number answers
    ("unit: one side", "10", "\\boxed{10\\text{ cm}}"),
    ("unit: one side", "18", "#### $18 \\text{ per hour}"),
    ("unit: spelling", "5\\text{ cm}", "\\boxed{5 \\text{cm}}"),
    ("unit: spelling", "5\\text{ m}", "\\boxed{5\\text{ meters}}"),
    ("unit: spelling", "5 \\text{ cm}", "\\boxed{5 cm}"),
    ("unit: spelling", "60 \\text{ km/h}", "\\boxed{60 \\text{ kilometers per hour}}"),
    ("unit: spelling", "5\\text{ cm}^2", "\\boxed{5 \\text{ square centimeters}}"),
    ("unit: spelling", "30\\text{ min}", "\\boxed{30 \\text{ minutes}}"),
    ("unit: spelling", "20^\\circ\\text{C}", "\\boxed{20 ^{\\circ} C}"),
    ("unit: spelling", "3\\times10^{8}", "\\boxed{3 \\times 10^{8} \\mathrm{~m/s}}"),
    ("money", "\\$18", "\\boxed{18}"),
    ("money", "\\$18", "\\boxed{18 \\text{ dollars}}"),
    ("money", "18.50", "#### $18.50"),
    # "10 apples" for 10 joins only when the question counts apples: tests/math/test_math_quantities.py
    ("trailing words", "10", "\\boxed{10 \\text{ units}}"),  # a unit noun
    ("percent", "50\\%", "\\boxed{50}"),
    ("percent", "50\\%", "\\boxed{50 \\text{ percent}}"),
    ("degrees", "30^\\circ", "\\boxed{30}"),
    ("degrees", "30^\\circ", "\\boxed{30 \\text{ degrees}}"),
    ("degrees", "30^{\\circ}", "\\boxed{30^\\circ}"),
    ("variable", "x=2", "\\boxed{2}"),
    ("variable", "2", "\\boxed{x = 2}"),
    ("variable", "x=2", "\\boxed{x = 2}"),
    ("variable: chain", "2", "\\boxed{x = \\frac{6}{3} = 2}"),
    ("variable: systems", "x=1, y=2", "\\boxed{y=2, x=1}"),
    ("equation", "3", "\\boxed{2+1=3}"),
    ("equation: assignment", "5", "\\boxed{a+b=5}"),
    ("marks inside", "(30^\\circ, 60^\\circ)", "\\boxed{(30^{\\circ}, 60^{\\circ})}"),
    ("marks inside", "5'", "\\boxed{5'}"),
    ("thousands", "1000", "\\boxed{1,000}"),
    ("thousands", "1000000", "\\boxed{1{,}000{,}000}"),
    ("thousands", "1000", "\\boxed{1\\,000}"),
    ("thousands", "1,234", "#### 1234"),
    ("letters", "\\text{(B)}", "\\boxed{B}"),
    ("letters", "\\text{(B)}", "\\boxed{(B)}"),
    ("letters: words", "\\text{Monday}", "\\boxed{\\text{monday}}"),
    ("letters: e", "e", "\\boxed{e}"),
    ("sets", "\\{1,2\\}", "\\boxed{\\{2,1\\}}"),
    ("lists", "1, 2", "\\boxed{\\{2, 1\\}}"),
    ("lists vs tuples", "(1,2)", "\\boxed{1, 2}"),
    ("intervals", "[1,2)", "\\boxed{[1,2)}"),
    ("intervals", "x > 2", "\\boxed{(2, \\infty)}"),
    ("connectives", "x<1 \\text{ or } x>2", "\\boxed{x>2 \\text{ or } x<1}"),
    ("malformed fractions", "\\frac{3}{2}", "\\boxed{\\frac123}"),  # TeX reads it as \frac{1}{2}3
    ("malformed fractions", "\\frac{1}{2}", "\\boxed{\\frac12}"),
    ("normal form", "0.5", "\\boxed{0.50}"),
    ("normal form", "51", "\\boxed{\\textbf{(051)}}"),
    ("scientific notation", "1\\times10^{-10}", "\\boxed{1e-10}"),
    ("hedging: one answer twice", "3", "so \\boxed{3}. Checking: indeed \\boxed{3}."),
    ("hedging: equal answers", "\\frac{1}{2}", "first \\boxed{\\frac{1}{2}}, as a decimal \\boxed{0.5}"),
    ("hedging: a list in boxes", "2, 5", "\\boxed{2}, \\boxed{5}"),
    ("hedging: nested boxes", "7", "\\boxed{\\boxed{7}}"),
    ("long answer", "3", "\\boxed{" + " + ".join(["0"] * 100) + " + 3}"),  # long, and equal
    ("gsm8k", "72", "24 + 48 = 72\n#### 72"),
]


def _ids(rows: list[tuple[str, str, str]]) -> list[str]:
    return [f"{rule}: {reference} | {response[:40]}" for rule, reference, response in rows]


@pytest.mark.parametrize("rule, reference, response", KEEP_APART, ids=_ids(KEEP_APART))
def test_keep_apart(pool, rule, reference, response):
    out = score_response(reference, response, pool)
    assert out["reward"] == 0.0, out
    answers = final_answers(response)
    if len(answers) == 1:  # each path alone must also refuse the answer (a hedge has a right answer among others)
        assert not strings_match(reference, answers[0]), rule
        assert not math_verify_equal(reference, answers[0], timeout_s=5), rule


@pytest.mark.parametrize("rule, reference, response", STILL_JOIN, ids=_ids(STILL_JOIN))
def test_still_join(pool, rule, reference, response):
    out = score_response(reference, response, pool)
    assert out["reward"] == 1.0, out
    assert out["reason"] == "correct"


def test_every_rule_has_both_pairs():
    apart = {rule.split(":")[0] for rule, *_ in KEEP_APART}
    join = {rule.split(":")[0] for rule, *_ in STILL_JOIN}
    assert apart - join <= {"spaces between digits", "sets vs intervals", "tuples"}, apart - join
    assert len(KEEP_APART) >= 50 and len(STILL_JOIN) >= 45


# --- the pure pieces, against hand-written values ----------------------------------------------------------------
@pytest.mark.parametrize("answer, parts", [
    ("5\\text{ cm}", AnswerParts("5", "centimeter")),
    ("x = 50\\%", AnswerParts("50", "percent", "x")),
    ("\\$18.50", AnswerParts("18.50", "dollar")),
    ("$18$", AnswerParts("18")),  # paired dollars are math delimiters
    ("-\\$5", AnswerParts("-5", "dollar")),
    ("3\\times10^{8} \\mathrm{~m/s}", AnswerParts("3\\times10^{8}", "meter/second")),
    ("20^\\circ C", AnswerParts("20", "celsius")),
    ("10 \\text{ apples}", AnswerParts("10", "text:apples")),
    ("x = \\frac{6}{3} = 2", AnswerParts("\\frac{6}{3} = 2", None, "x")),
    ("x=1, y=2", AnswerParts("x=1, y=2")),  # a system: not one variable
    ("x = 2 \\text{ or } x = 3", AnswerParts("x = 2 \\text{ or } x = 3")),
    ("\\text{(B)}", AnswerParts("\\text{(B)}")),  # text with nothing before it is the answer, not a unit
    ("2ab", AnswerParts("2ab")),  # letters after a number are a product unless a known unit word
    ("12 in", AnswerParts("12 in")),  # bare "in" is not inches
    ("3 \\times \\text{m}", AnswerParts("3 \\times \\text{m}")),  # no body would be left of the operator
    ("3.", AnswerParts("3")),
])
def test_split_answer(answer, parts):
    assert split_answer(answer) == parts


@pytest.mark.parametrize("phrase, canonical", [
    ("cm", "centimeter"), ("centimetres", "centimeter"), ("km/h", "kilometer/hour"), ("mph", "mile/hour"),
    ("kilometers per hour", "kilometer/hour"), ("cm^2", "centimeter^2"), ("\\text{cm}^{3}", "centimeter^3"),
    ("square feet", "foot^2"), ("kg m/s^2", "kilogram*meter/second^2"), ("^\\circ", "degree"), ("\\%", "percent"),
    ("°F", "fahrenheit"), ("hours", "hour"), ("inches", "inch"), ("m", "meter"), ("M", "text:m"),
    ("apples", "text:apples"), ("cm of rope", "text:cm of rope"),
])
def test_canonical_unit(phrase, canonical):
    assert canonical_unit(phrase) == canonical


def test_final_answers_and_extraction():
    assert final_answers("\\boxed{2} or \\boxed{3}") == ["2, 3"]  # one list (math-verify's grouping)
    text = "First \\boxed{2}. After checking every case again, the answer is \\boxed{3}."
    assert final_answers(text) == ["2", "3"] and extract_answer(text) == "3"
    assert final_answers("\\boxed{3} and later, after a long check of everything, \\boxed{3}") == ["3"]
    assert final_answers("\\boxed{\\boxed{7}}") == ["7"]
    assert final_answers("#### 3\nmore\n#### 4") == ["3", "4"]
    assert final_answers("\\boxed{3} #### 4") == ["3"]  # boxes win over ####
    assert final_answers("\\boxed{}") == [] and final_answers("no answer") == []


def test_hedge_reasons_and_limit(pool):
    spread = "\\boxed{2}. Then again, thinking about it for much longer, it might be \\boxed{3}."
    out = score_response("3", spread, pool)
    assert (out["reward"], out["reason"], out["answers"], out["extracted"]) == (0.0, "hedged", ["2", "3"], "3")
    assert score_response("4", spread, pool)["reason"] == "wrong_answer"  # the final answer itself is wrong
    many = " Then, after a long and careful second look at it, ".join(
        f"\\boxed{{{i}}}" for i in range(MAX_FINAL_ANSWERS + 1))
    out = score_response("1", many, pool)
    assert (out["reward"], out["reason"], out["verifier"]) == (0.0, "hedged", "none")  # not even checked


def test_normal_form_keeps_what_carries_meaning():
    assert len({normalize_answer(a) for a in ("5\\text{ cm}", "5\\text{ km}", "5", "5\\%", "5^\\circ")}) == 5
    assert normalize_answer("5 \\text{centimeters}") == normalize_answer("5\\text{ cm}")
    for answer in ("x = 5 \\text{ cm}", "\\$18.50", "(1, 000)", "60 \\text{ km/h}", "1, 2, \\ldots"):
        assert normalize_answer(normalize_answer(answer)) == normalize_answer(answer)
