"""Issue 33: env-side extractors are linear in the model's text, and answer exactly what the patterns they replace
answered (those patterns, kept here as the reference, backtrack quadratically or worse on hostile text)."""

from __future__ import annotations

import random
import re

from envs.code.env import extract_code, fenced_blocks
from envs.webshop.env import parse_action

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)  # the former extract_code pattern
_WEBSHOP = re.compile(r"(.+)\[(.+)\]")  # the WebShop reference engine's parse_action


def _random_texts(alphabet: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(n)]


def test_fenced_blocks_equal_the_pattern():
    texts = _random_texts(["`", "```", "\n", "python", " ", "x", "\t", "py```", "```\n"], 20000, seed=0)
    for text in texts:
        assert fenced_blocks(text) == _FENCE.findall(text), text
    assert fenced_blocks("a\n```python\nx = 1\n```\n```\ny\n```") == [("python", "x = 1\n"), ("", "y\n")]


def test_webshop_parse_action_equals_the_reference_pattern():
    for text in _random_texts(["[", "]", "a", "search", "click", "\n", " "], 20000, seed=1):
        match = _WEBSHOP.match(text)
        assert parse_action(text) == ((text, None) if match is None else (match.group(1), match.group(2))), text


def test_hostile_texts_are_linear():
    # each took seconds to minutes with the patterns (64 KB of unclosed fences: 6 s; "search[" + 4000 "[": 26 s);
    # at 400 KB a quadratic pass is hours, so finishing at all bounds the complexity
    assert fenced_blocks("``` " * 100_000) == []
    assert extract_code("``` " * 100_000, "f") == "``` " * 100_000  # no fence line: the whole response
    assert extract_code("``` " * 100_000 + "\n```\n```python\ndef f(): pass\n```", "f") == "def f(): pass\n"
    assert parse_action("search[" + "[" * 400_000) == ("search[" + "[" * 400_000, None)  # no "]"
    n = 400_000
    assert parse_action("click[" + "[" * n + "]") == ("click" + "[" * (n - 1), "[")  # as the pattern: n = 3 below
    assert _WEBSHOP.match("click[" + "[" * 3 + "]").groups() == ("click" + "[" * 2, "[")
