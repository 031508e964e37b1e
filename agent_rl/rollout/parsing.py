"""The one action parser: model text -> action string (``<action>...</action>``, docs/alfworld.md conventions)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_OPEN_RE = re.compile(r"<action>", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedAction:
    """``action`` is what goes to the env; ``well_formed`` is False when no ``<action>`` tag was found."""

    action: str
    well_formed: bool


def parse_action(text: str, *, max_chars: int = 512, normalize_whitespace: bool = True) -> ParsedAction:
    """Extract the action from a model response.

    Rules (one place, used for every env): the content of the LAST complete ``<action>...</action>``; else, when the
    response was cut by the ``</action>`` stop string or the token budget, the text after the last ``<action>``;
    else the whole stripped response, flagged ``well_formed=False`` (it is still passed to the env, which answers as
    the game does). Whitespace runs are collapsed to one space (``normalize_whitespace``; off for code and math,
    whose answers keep their lines); the result is cut to ``max_chars`` characters (servers bound the action size).

    Examples: ``"<think>x</think><action>go to desk 1</action>"`` -> ``("go to desk 1", True)``;
    ``"<action>open drawer 2"`` -> ``("open drawer 2", True)``; ``"hello"`` -> ``("hello", False)``.
    """
    matches = _ACTION_RE.findall(text)
    if matches:
        action, ok = matches[-1], True
    else:
        opens = list(_OPEN_RE.finditer(text))
        if opens:
            action, ok = text[opens[-1].end():], True
        else:
            action, ok = text, False
    action = " ".join(action.split()) if normalize_whitespace else action.strip()
    return ParsedAction(action[:max_chars], ok and bool(action))
