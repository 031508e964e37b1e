"""Issue 33: ``parse_action`` is linear in the model's text and answers what its former patterns answered (kept
here as the reference; their lazy tails backtracked quadratically: ``"Action: a" + 4000 spaces + "b"`` ran past
60 s, 1000 ``<action>`` tags took seconds)."""

from __future__ import annotations

import random
import re

import pytest

from agent_rl.rollout.parsing import parse_action

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_OPEN_RE = re.compile(r"<action>", re.IGNORECASE)
_REACT_RE = re.compile(r"^[ \t>]*action\s*:\s*(.+?)\s*(?:</action>)?\s*$", re.IGNORECASE | re.MULTILINE)
_REACT_PROMPT_RE = re.compile(r"^[ \t]*>[ \t]*(?!think\s*:)(\S.*?)\s*$", re.IGNORECASE | re.MULTILINE)


def _reference(text: str, normalize: bool) -> tuple[str, bool]:
    """The former parse_action, pattern for pattern."""
    matches = _ACTION_RE.findall(text)
    if matches:
        action, ok = matches[-1], True
    else:
        opens = list(_OPEN_RE.finditer(text))
        react = (_REACT_RE.search(text) or _REACT_PROMPT_RE.search(text)) if normalize else None
        if opens:
            action, ok = text[opens[-1].end():], True
        elif react is not None:
            action, ok = react.group(1), True
        else:
            action, ok = text, False
    action = " ".join(action.split()) if normalize else action.strip()
    return action[:512], ok and bool(action)


def test_equals_the_former_patterns():
    rng = random.Random(0)
    alphabet = ["<action>", "</action>", "<ACTION>", "Action:", "action :", "> ", ">", "think:", " ", "\n", "\t",
                "go", "x", "</action>\n"]
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        for normalize in (True, False):
            got = parse_action(text, normalize_whitespace=normalize)
            assert (got.action, got.well_formed) == _reference(text, normalize), text


@pytest.mark.parametrize(("text", "action", "ok"), [
    ("<action>" * 100_000, "", False),
    ("<action>" * 100_000 + "go</action>", "<action>" * 64, True),  # an inner <action> is content; 512 chars
    ("Action: a" + " " * 400_000 + "b", "a b", True),
    ("> a" + " " * 400_000 + "b", "a b", True),
    ("action" + " " * 400_000, "action", False),
    (("Action:" + " " * 1000 + "\n") * 400, "Action:", True),  # the spaces after ":" run into the next line
])
def test_hostile_texts_are_linear(text, action, ok):
    got = parse_action(text)  # a quadratic pass over 400 KB is hours: finishing at all bounds the complexity
    assert (got.action, got.well_formed) == (action[:512].strip(), ok)
