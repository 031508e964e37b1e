"""Single-turn code environments (``agent_rl/Code-v0``) with a real sandbox. See ``docs/math_code_envs.md``."""

from envs.code.datasets import LOADERS, MBPP_KNOWN_ISSUES, CodeTask, humanevalplus_expected, load_code
from envs.code.env import CodeEnv, build_program, extract_code, summarize
from envs.code.sandbox import RunResult, SandboxLimits, isolation_level, run_tests

__all__ = [
    "LOADERS", "MBPP_KNOWN_ISSUES", "CodeEnv", "CodeTask", "RunResult", "SandboxLimits", "build_program",
    "extract_code", "humanevalplus_expected", "isolation_level", "load_code", "run_tests", "summarize",
]
