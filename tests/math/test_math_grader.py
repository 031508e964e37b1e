"""Answer extraction, the tricky-pairs table, the pathological-answer deadline, and the env contract."""

from __future__ import annotations

import json
import threading
import time

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.math import MathEnv, VerifierPool, extract_answer, last_boxed, load_math, normalize_answer, score_response


@pytest.fixture(scope="module")
def pool():
    pool = VerifierPool(n_workers=2, timeout_s=5.0)
    yield pool
    pool.close()


# --- pure extraction -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces: not "\frac{1"
        ("\\boxed{\\boxed{7}}", "7"),
        ("a \\boxed{1} b \\boxed{2}", "2"),  # the last box
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not count
        ("\\fbox{12}", "12"),
        ("\\boxed 5 apples", "5"),
        ("\\boxed{3", None),  # never closed
        ("no box", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_extract_answer_gsm8k_marker():
    assert extract_answer("48/2 = <<48/2=24>>24\n#### 72") == "72"
    assert extract_answer("#### 1,234\nextra line") == "1,234"
    assert extract_answer("the answer is 5") is None


# Issue 20: the normal form used to drop the variable, the degree mark, the unit and the percent sign ("x = 3." -> "3",
# "10\text{ cm}" -> "10"), so "5 cm" and "5 km" had one normal form; now they are kept, in canonical spelling.
@pytest.mark.parametrize(
    "raw, normal",
    [("$1{,}000$", "1000"), ("x = 3.", "x=3"), ("0.50", "0.5"), ("30^\\circ", "30^\\circ"),
     ("\\dfrac{1}{2}", "\\frac{1}{2}"), ("10\\text{ cm}", "10\\text{centimeter}"), ("50\\%", "50\\%"),
     ("(1,2)", "(1, 2)"), ("\\textbf{(051) }", "51"), ("1, 000", "1, 000"), ("1 2", "1 2")],
)
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal
    assert normalize_answer(normal) == normal  # idempotent


# --- the tricky-pairs table: (reference, full response, expected reward) -----------------------------------------
TRICKY = [
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}}", 1),
    ("\\frac{1}{2}", "\\boxed{0.5}", 1),  # fraction vs decimal
    ("\\frac{1}{3}", "\\boxed{0.33}", 0),  # rounded decimal is not 1/3
    ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}", 1),
    ("\\frac{1}{2}", "\\boxed{\\boxed{\\frac{1}{2}}}", 1),  # nested boxes
    ("3", "first \\boxed{2} then \\boxed{3}", 0),  # a hedge (issue 20: this was 1, "the last box wins")
    ("2", "first \\boxed{2} then \\boxed{3}", 0),
    ("10", "\\boxed{10\\text{ cm}}", 1),  # units
    ("10", "\\boxed{10 \\text{ meters}}", 1),
    ("50\\%", "\\boxed{50}", 1),  # percentages
    ("50", "\\boxed{50\\%}", 1),
    ("0.5", "\\boxed{50\\%}", 0),  # "50%" is read as 50, not 0.5
    ("[1,2)", "\\boxed{[1,2)}", 1),  # intervals
    ("(1,2]", "\\boxed{[1,2]}", 0),
    ("(-\\infty, 3)", "\\boxed{(-\\infty,3)}", 1),
    ("\\{1,2\\}", "\\boxed{\\{2,1\\}}", 1),  # sets are unordered
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", 1),  # matrices
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix}2\\\\1\\end{pmatrix}}", 0),
    ("3", "\\boxed{x=3}", 1),  # x=3 vs 3
    ("3", "\\boxed{x = 4}", 0),
    ("1000", "\\boxed{1,000}", 1),  # thousands separators
    ("1000000", "\\boxed{1{,}000{,}000}", 1),
    ("-3", "\\boxed{3}", 0),  # negatives
    ("-3", "\\boxed{-3}", 1),
    ("\\pi", "\\boxed{\\pi}", 1),  # pi
    ("2\\pi", "\\boxed{6.28}", 0),  # 2 decimals are not 2*pi
    ("\\frac{\\pi}{2}", "\\boxed{\\frac{\\pi}{2}}", 1),
    ("3", "\\boxed{}", 0),  # empty answers
    ("3", "The answer is 3.", 0),  # no box, no ####
    ("3", "\\boxed{3", 0),  # unclosed box
    ("\\frac{1}{2004!}", "\\boxed{\\frac{1}{2006!}}", 0),  # equal after rounding, not equal
    ("\\frac{1}{2004!}", "\\boxed{\\frac{1}{2004!}}", 1),
    ("72", "24 + 48 = 72\n#### 72", 1),  # GSM8K marker
    ("1234", "#### 1,234", 1),
    ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}", 1),
    ("30", "\\boxed{30^\\circ}", 1),  # degrees
    ("\\text{(B)}", "\\boxed{B}", 1),  # choice letters
    ("(3, \\frac{\\pi}{2})", "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", 1),
    ("(1, 2)", "\\boxed{(2, 1)}", 0),  # tuples are ordered
    ("18", "\\boxed{\\$18}", 1),  # dollars
    ("0.5", "\\boxed{0.50}", 1),
    ("1", "\\boxed{9^9^9^9}", 0),  # pathological, but math-verify's own alarm answers in ~1 s
    # numbers compare by value (issue 10): exact when both sides are exact, else relative tolerance 1e-6
    ("3.2\\times10^{-19}", "\\boxed{1.6\\times10^{-19}}", 0),  # small magnitudes: 6 decimals called these equal
    ("0.0000002", "\\boxed{0.0000001}", 0),
    ("1\\times 10^{-34}", "\\boxed{6.6\\times 10^{-34}}", 0),
    ("6.6\\times 10^{-34}", "\\boxed{6.6\\times10^{-34}}", 1),
    ("\\frac{1}{12}", "\\boxed{0.0833333333333333}", 1),  # a float against an exact rational: relative
    ("1\\times10^{-10}", "\\boxed{1e-10}", 1),  # scientific notation (was read as Euler's e - 10)
    ("1e-10", "\\boxed{1\\times10^{-10}}", 1),
    ("1e-10", "\\boxed{2\\times10^{-10}}", 0),
    ("6.02\\times10^{23}", "\\boxed{6.02E23}", 1),  # large magnitudes
    ("6.02\\times10^{23}", "\\boxed{6.03\\times10^{23}}", 0),
    ("10^{20}", "\\boxed{10^{20} + 1}", 0),  # exact integers: exact, not 1 part in 1e20
    ("123456789", "\\boxed{123456788}", 0),
    ("1.5\\times10^{-7}", "\\boxed{1.5000001\\times10^{-7}}", 1),  # within 1e-6 relative
    ("1.5\\times10^{-7}", "\\boxed{1.51\\times10^{-7}}", 0),
    ("3.2\\times10^{-19}", "\\boxed{3.2\\times10^{-19}\\text{ C}}", 1),  # units around numbers
    ("3.2\\times10^{-19}", "\\boxed{1.6\\times10^{-19}\\text{ C}}", 0),
    ("3\\times10^{8}", "\\boxed{3 \\times 10^{8} \\mathrm{~m/s}}", 1),
    ("1.5", "\\boxed{1.5 \\mathrm{~kg}}", 1),
    ("1.5", "\\boxed{1.6 \\mathrm{~kg}}", 0),
    ("\\frac{1}{3}", "\\boxed{0.3333333}", 1),  # 7 significant digits
    ("-4500", "\\boxed{-4.5e+3}", 1),
    ("0", "\\boxed{0.0}", 1),
    ("0", "\\boxed{1\\times10^{-9}}", 0),  # nothing is relatively close to zero but zero
]


@pytest.mark.parametrize("reference, response, expected", TRICKY)
def test_tricky_pairs(pool, reference, response, expected):
    out = score_response(reference, response, pool)
    assert out["reward"] == expected, out
    json.dumps(out)


def test_table_is_large_enough():
    assert len(TRICKY) >= 30


def test_empty_answer_reason(pool):
    assert score_response("3", "\\boxed{}", pool)["reason"] == "no_answer"
    assert score_response("3", "\\boxed{4}", pool)["reason"] == "wrong_answer"


# --- the pathological answer: 0 within the deadline, without stalling the other checks -------------------------
def test_pathological_answer_times_out_without_stalling_others():
    # the deadline: the stuck check lasts this long, and the 5 fast checks (a fraction of a second each, more on a
    # busy machine) all finish well within it unless they queue behind the stuck one
    pool = VerifierPool(n_workers=2, timeout_s=6.0)
    try:
        pool.check("1", "1"), pool.check("1", "1")  # start both workers (import time is not part of the test)
        slow: dict = {}

        def pathological() -> None:
            slow["out"] = score_response("1", "\\boxed{9^{9^{9^{9}}}}", pool)

        thread = threading.Thread(target=pathological)
        thread.start()
        time.sleep(0.2)  # lets the stuck check take its worker first
        fast = [score_response("\\frac{1}{2}", "\\boxed{0.5}", pool)["reward"] for _ in range(5)]
        still_stuck = thread.is_alive()
        thread.join(timeout=600)  # the ceiling only catches a deadline that is not enforced
        assert fast == [1.0] * 5
        assert still_stuck  # the other worker kept answering while the first was stuck
        assert slow["out"]["reward"] == 0.0 and slow["out"]["verifier"] == "timeout"
        assert pool.n_killed == 1  # ended by the outer deadline: its worker was killed
        assert score_response("2", "\\boxed{2}", pool)["reward"] == 1.0  # a fresh worker replaced the stuck one
    finally:
        pool.close()


# --- datasets and env contract ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, split, count",
    [("gsm8k", "train", 7473), ("gsm8k", "test", 1319), ("math500", "test", 500), ("math_train", "test", 7474),
     ("aime", "test", 975), ("aime24", "test", 30), ("aime25", "test", 30), ("amc23", "test", 40),
     ("minerva", "test", 272), ("olympiadbench", "test", 675)],
)
def test_dataset_sizes(name, split, count):
    problems = load_math(name, split)
    assert len(problems) == count
    assert all(p.problem for p in problems)


def test_reference_fields():
    assert load_math("gsm8k", "train")[0].answer == "72"
    assert load_math("amc23")[0].answer == "27"  # stored as 27.0
    assert load_math("math500")[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert load_math("olympiadbench")[0].answer == "2"


def test_env_contract():
    env = gymnasium.make("agent_rl/Math-v0", datasets=["math500", "gsm8k"])
    obs, info = env.reset(seed=0, options={"dataset": "gsm8k", "split": "test", "index": 0})
    assert obs.startswith("Janet") and obs.endswith("within \\boxed{}.")
    assert info["dataset"] == "gsm8k" and info["task_type"] == "gsm8k" and info["prompt"] == obs
    assert "reference" not in info
    obs, reward, terminated, truncated, info = env.step("16 - 3 - 4 = 9; 9 * 2 = 18. \\boxed{18}")
    # one step ends the episode: terminated, not truncated (registered without a TimeLimit)
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert env.unwrapped._problem is None
    assert info["extracted"] == "18" and info["reference"] == "18" and info["reason"] == "correct"
    json.dumps(info)
    _, info = env.reset(seed=3)  # random draw is reproducible under a seed
    _, info2 = env.reset(seed=3)
    assert (info["dataset"], info["index"]) == (info2["dataset"], info2["index"])
    _, info = env.reset(options={"dataset": "math500", "index": 4})
    problem = load_math("math500")[4]
    assert info["task_type"] == problem.task_type and info["level"] == problem.meta["level"]


def test_env_rejects_unknown_dataset_and_double_step():
    with pytest.raises(ValueError, match="valid"):
        MathEnv(datasets="nope")
    env = MathEnv(datasets="aime25")
    env.reset(options={"index": 0})
    env.step("\\boxed{70}")
    with pytest.raises(RuntimeError):
        env.step("\\boxed{70}")
    with pytest.raises(ValueError, match=r"unknown reset options \['datset'\]; allowed: dataset, split, index"):
        env.reset(options={"datset": "gsm8k"})  # a typo must not silently draw a random problem
