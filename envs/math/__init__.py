"""Single-turn math environments (``agent_rl/Math-v0``) with math-verify rewards. See ``docs/math_code_envs.md``."""

from envs.math.datasets import LOADERS, MathProblem, load_math
from envs.math.env import DEFAULT_INSTRUCTION, MathEnv, score_response
from envs.math.grader import (
    AnswerParts,
    extract_answer,
    final_answers,
    last_boxed,
    normalize_answer,
    split_answer,
    strings_match,
)
from envs.math.pool import VerifierPool, default_pool

__all__ = [
    "AnswerParts", "DEFAULT_INSTRUCTION", "LOADERS", "MathEnv", "MathProblem", "VerifierPool", "default_pool",
    "extract_answer", "final_answers", "last_boxed", "load_math", "normalize_answer", "score_response",
    "split_answer", "strings_match",
]
