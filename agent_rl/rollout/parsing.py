"""The one action parser: model text -> action string (``<action>...</action>``, docs/alfworld.md conventions)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_OPEN_RE = re.compile(r"<action>", re.IGNORECASE)
# ReAct layout (Yao et al. 2023): "Thought: ...\nAction: go to desk 1" (also "> go to desk 1" as in its ALFWorld
# few-shot examples, where "> think: ..." lines are thoughts).
_REACT_RE = re.compile(r"^[ \t>]*action\s*:\s*(.+?)\s*(?:</action>)?\s*$", re.IGNORECASE | re.MULTILINE)
_REACT_PROMPT_RE = re.compile(r"^[ \t]*>[ \t]*(?!think\s*:)(\S.*?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class ParsedAction:
    """``action`` is what goes to the env; ``well_formed`` is False when no ``<action>`` tag was found."""

    action: str
    well_formed: bool


def parse_action(text: str, *, max_chars: int = 512, normalize_whitespace: bool = True,
                 react: bool | None = None) -> ParsedAction:
    """Extract the action from a model response.

    Rules (one place, used for every env): the content of the LAST complete ``<action>...</action>``; else, when the
    response was cut by the ``</action>`` stop string or the token budget, the text after the last ``<action>``;
    else (``react``, default on unless ``normalize_whitespace`` is off, i.e. not for math/code answers) the FIRST
    ReAct ``Action: ...`` line, else the first ``> ...`` line that is not a ``> think: ...`` line (a ReAct model often
    goes on to imagine the next observation and actions: the first one is its action for this turn);
    else the whole stripped response, flagged ``well_formed=False`` (it is still passed to the env, which answers as
    the game does). Whitespace runs are collapsed to one space (``normalize_whitespace``; off for code and math,
    whose answers keep their lines); the result is cut to ``max_chars`` characters (servers bound the action size).

    Examples: ``"<think>x</think><action>go to desk 1</action>"`` -> ``("go to desk 1", True)``;
    ``"<action>open drawer 2"`` -> ``("open drawer 2", True)``; ``"Thought: mug first.\\nAction: take mug 1 from
    desk 1"`` -> ``("take mug 1 from desk 1", True)``; ``"hello"`` -> ``("hello", False)``.
    """
    if react is None:
        react = normalize_whitespace
    matches = _ACTION_RE.findall(text)
    if matches:
        action, ok = matches[-1], True
    else:
        opens = list(_OPEN_RE.finditer(text))
        react_match = (_REACT_RE.search(text) or _REACT_PROMPT_RE.search(text)) if react else None
        if opens:
            action, ok = text[opens[-1].end():], True
        elif react_match is not None:
            action, ok = react_match.group(1), True
        else:
            action, ok = text, False
    action = " ".join(action.split()) if normalize_whitespace else action.strip()
    return ParsedAction(action[:max_chars], ok and bool(action))
