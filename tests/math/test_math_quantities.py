"""Issue 33: a word after a number joins the bare number only when it is known not to change the quantity; lists
keep their multiplicity and words their identity; extraction is linear in the response.

The word rule is an allow-list (``envs.math.grader`` units, plus the nouns the question itself counts), so the
keep-apart list below is a sample of words no list of qualifiers enumerated (every one of them scored 1.0 for the
reference ``9`` before), and the still-join list the units that must keep working.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

import pytest

from envs.math import score_response
from envs.math.grader import (
    final_answers,
    math_verify_equal,
    question_nouns,
    strings_match,
)


@contextmanager
def guard(seconds: int):
    """A generous hang guard (never a speed assertion): fails the test instead of stalling the suite."""
    def fail(*_):
        raise TimeoutError(f"ran past the {seconds} s guard")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# Words that scale, invert or otherwise change a number: "9 <word>" is not 9.
CHANGING_WORDS = [
    "tens", "tenths", "k", "grand", "inverse", "dozen", "score", "gross", "hundred", "hundreds", "thousand",
    "million", "billion", "trillion", "lakh", "crore", "myriad", "half", "halves", "thirds", "quarters", "fifths",
    "hundredths", "thousandths", "squared", "cubed", "factorial", "times", "fold", "more", "less", "fewer",
    "pairs", "couples", "reciprocal", "negative", "bn", "mn", "M", "thou", "doz", "ish", "approx", "ago",
]

# Units that keep the quantity: "9 <unit>" answers "9".
UNITS = [
    "cm", "meters", "km", "inches", "feet", "miles", "kg", "grams", "pounds", "ounces", "liters", "mL",
    "gallons", "seconds", "minutes", "hours", "days", "weeks", "years", "dollars", "cents", "degrees", "percent",
    "square feet", "km/h", "mph", "newtons", "joules", "watts", "volts",
]


def test_lists_are_long_enough():
    assert len(set(CHANGING_WORDS)) >= 30 and len(set(UNITS)) >= 20


@pytest.mark.parametrize("word", CHANGING_WORDS)
def test_changing_word_keeps_apart(pool, word):
    response = f"\\boxed{{9\\text{{ {word}}}}}"
    assert score_response("9", response, pool)["reward"] == 0.0, word
    assert not strings_match("9", f"9\\text{{ {word}}}")
    assert not math_verify_equal("9", f"9\\text{{ {word}}}", timeout_s=5)


@pytest.mark.parametrize("unit", UNITS)
def test_unit_still_joins(pool, unit):
    assert score_response("9", f"\\boxed{{9\\text{{ {unit}}}}}", pool)["reward"] == 1.0, unit


ISSUE_KEEP_APART = [
    ("9", "\\boxed{9\\text{ tens}}"),
    ("9", "\\boxed{9\\text{ tenths}}"),
    ("9", "\\boxed{9\\text{ k}}"),
    ("9", "\\boxed{9\\text{ grand}}"),
    ("9", "\\boxed{9\\text{ inverse}}"),
    ("\\frac{14}{3}", "\\boxed{\\frac{14}{3}\\text{ tenths}}"),
    ("3, 5, 7", "\\boxed{3, 5, 7, 7}"),  # a multiset keeps its multiplicity
    ("3, 3, 5", "\\boxed{3, 5, 5}"),
    ("\\{3, 5, 7\\}", "\\boxed{\\{3, 5, 7, 7\\}}"),
    ("3, 5, 7, 7", "\\boxed{3, 5, 7}"),
    ("3, 5, 7", "\\boxed{3}, \\boxed{5}, \\boxed{7}, \\boxed{7}"),  # the same, written as adjacent boxes
    ("3, 7, 7", "\\boxed{3}, \\boxed{7}, \\boxed{7}, \\boxed{7}"),
    ("\\text{Evelyn}", "\\boxed{\\text{Eve lyn}}"),  # a word keeps its identity
    ("\\text{Evelyn}", "\\boxed{Eve lyn}"),
    ("\\text{Eve lyn}", "\\boxed{\\text{Evelyn}}"),
    ("10", "\\boxed{10 \\text{ apples}}"),  # a noun the question does not count (no question given)
]

ISSUE_STILL_JOIN = [
    ("3, 5, 7", "\\boxed{7, 5, 3}"),
    ("3, 5, 7, 7", "\\boxed{7, 3, 7, 5}"),
    ("\\frac{639}{40}", "\\boxed{15\\frac{39}{40}, \\frac{639}{40}}"),  # math500/451's solution: one value twice
    ("\\{3, 5, 7\\}", "\\boxed{\\{7, 5, 3\\}}"),
    ("3, 7, 7", "\\boxed{3}, \\boxed{7}, \\boxed{7}"),  # adjacent boxes keep their counts
    ("7", "\\boxed{7} and \\boxed{7}"),  # one value written twice is still that value
    ("\\text{Evelyn}", "\\boxed{\\text{evelyn}}"),
    ("\\text{Eve lyn}", "\\boxed{\\text{Eve  lyn}}"),
    ("9", "\\boxed{9\\text{ km}}"),
]


@pytest.mark.parametrize(("reference", "response"), ISSUE_KEEP_APART)
def test_issue_inputs_keep_apart(pool, reference, response):
    assert score_response(reference, response, pool)["reward"] == 0.0
    answer = final_answers(response)[-1]
    assert not strings_match(reference, answer)
    assert not math_verify_equal(reference, answer, timeout_s=5)


@pytest.mark.parametrize(("reference", "response"), ISSUE_STILL_JOIN)
def test_issue_neighbours_still_join(pool, reference, response):
    assert score_response(reference, response, pool)["reward"] == 1.0


QUESTION = ("Tom has 3 apples and 12 marbles; he buys 4 more apples, then gets 2 times as many marbles. "
            "He also has 3 tens and 4 ones.")


def test_question_nouns_are_the_counted_nouns():
    # "more", "times", "tens" follow a number too, but they change a quantity: never taken from a question
    assert question_nouns(QUESTION) == {"apples", "marbles"}  # "ones" is a form of "one"


@pytest.mark.parametrize(("response", "reward"), [
    ("\\boxed{10 \\text{ apples}}", 1.0),
    ("\\boxed{10 \\text{ apple}}", 1.0),
    ("\\boxed{10 \\text{ marbles}}", 1.0),
    ("\\boxed{10 \\text{ oranges}}", 0.0),  # not a noun of this question
    ("\\boxed{10 \\text{ tens}}", 0.0),  # the question writes "3 tens", still not a unit
    ("\\boxed{10 \\text{ more}}", 0.0),
    ("\\boxed{10 \\text{ times}}", 0.0),
])
def test_question_nouns_join(pool, response, reward):
    assert score_response("10", response, pool, question=QUESTION)["reward"] == reward


WAYS = "In how many ways can 4 books be put on a shelf? How many tens are in 240? How many more pens than pencils?"


def test_how_many_names_the_counted_noun(pool):
    """The noun a question asks for ("how many ways") is a counted noun too: ``24\\text{ ways}`` answers it (it
    scored 0: only words written after a number were taken); quantity words stay out ("how many tens")."""
    assert question_nouns(WAYS) == {"ways", "books"}
    assert score_response("24", "\\boxed{24 \\text{ ways}}", pool, question=WAYS)["reward"] == 1.0
    assert score_response("24", "\\boxed{24 \\text{ tens}}", pool, question=WAYS)["reward"] == 0.0
    assert score_response("24", "\\boxed{24 \\text{ more}}", pool, question=WAYS)["reward"] == 0.0


def test_math_env_passes_its_question(pool):
    from envs.math.env import MathEnv

    env = MathEnv(datasets="gsm8k", split="test")
    _, info = env.reset(options={"index": 0})
    reference = env._problem.answer
    nouns = question_nouns(info["problem"])
    assert nouns, info["problem"]
    noun = sorted(nouns)[0]
    _, reward, *_ = env.step(f"\\boxed{{{reference} \\text{{ {noun}}}}}")
    assert reward == 1.0
    env.reset(options={"index": 0})
    _, reward, *_ = env.step(f"\\boxed{{{reference} \\text{{ grand}}}}")
    assert reward == 0.0


# --- bounded in the input ----------------------------------------------------------------------------------------
def test_deeply_nested_boxes_are_linear(pool):
    depth = 8000
    nested = "\\boxed{" * depth + "9" + "}" * depth
    with guard(60):
        assert final_answers(nested) == ["9"]
        assert score_response("9", nested, pool)["reward"] == 1.0
        assert score_response("8", nested, pool)["reward"] == 0.0


@pytest.mark.parametrize("response", [
    "\\boxed{" * 20000 + "9",  # never closed
    "\\boxed{" * 10000 + "9" + "}" * 5000,  # half closed
    "\\boxed 9 " * 10000,  # unbraced boxes
    "\\boxed{9}" * 10000,  # many boxes of one list
    "\\boxed{" + "1+" * 40000 + "1}",  # one huge answer (80 KB)
    "\\boxed{9 " + " " * 60000 + "x}",  # long runs of spaces inside an answer
    "\\boxed{9}" + " " * 60000 + "\\boxed{9}",  # between two boxes (the list separator was quadratic: 3 s at 8000)
    "\\boxed{9}" + "$" * 60000 + "\\boxed{9}",
    "\\boxed{9}," + " " * 60000 + "\\boxed{9}",
    "\\boxed{" + "0" * 60000 + "x}",  # leading zeros of a non-number (quadratic: 3 s at 8000)
    "\\boxed{-" + "0" * 60000 + "x}",
    "#### 9\n" * 10000,
])
def test_hostile_responses_are_bounded(pool, response):
    with guard(60):
        out = score_response("9", response, pool)
    assert out["reward"] in (0.0, 1.0)


def test_the_deadline_covers_extraction(pool):
    """The response's budget starts before extraction: with no time at all, a right answer is not judged (0, never
    a false 1); with the pool's budget it is. No check reaches the tiny pool's workers."""
    from envs.math import VerifierPool

    response = "\\boxed{9}" + " filler" * 100_000
    broke = VerifierPool(n_workers=1, timeout_s=1e-9)
    try:
        out = score_response("9", response, broke)
        assert (out["reward"], out["verifier"]) == (0.0, "timeout")
    finally:
        broke.close()
    assert score_response("9", response, pool)["reward"] == 1.0
