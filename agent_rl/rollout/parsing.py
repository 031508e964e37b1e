"""The one action parser: model text -> action string (``<action>...</action>``, docs/alfworld.md conventions)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG_RE = re.compile(r"<(/?)action>", re.IGNORECASE)
# ReAct layout (Yao et al. 2023): "Thought: ...\nAction: go to desk 1" (also "> go to desk 1" as in its ALFWorld
# few-shot examples, where "> think: ..." lines are thoughts). Only the heads are patterns; the rest of the line is
# cut with str methods (the tails "(.+?)\s*(?:</action>)?\s*$" backtracked quadratically in a run of spaces).
_REACT_HEAD = re.compile(r"^[ \t>]*action\s*:\s*(?=[^\n])", re.IGNORECASE | re.MULTILINE)
_REACT_PROMPT_HEAD = re.compile(r"^[ \t]*>[ \t]*(?!think\s*:)(?=\S)", re.IGNORECASE | re.MULTILINE)
_CLOSE_TAIL = re.compile(r"</action>\Z", re.IGNORECASE)


def _last_tagged(text: str) -> tuple[str | None, int | None]:
    """``(content of the last complete <action>...</action>, end of the last <action>)``, each None when absent.

    What ``re.findall(r"<action>(.*?)</action>", text, re.DOTALL | re.IGNORECASE)[-1]`` gives (an ``<action>``
    pairs with the next ``</action>``; an ``<action>`` inside an open one is content), in one pass over the tags."""
    last, open_end, last_open = None, None, None
    for tag in _TAG_RE.finditer(text):
        if not tag.group(1):
            last_open = tag.end()
            if open_end is None:
                open_end = tag.end()
        elif open_end is not None:
            last, open_end = text[open_end : tag.start()], None
    return last, last_open


def _rest_of_line(text: str, start: int, close_tag: bool) -> str:
    """``text[start:]`` up to the line's end, without trailing whitespace (and, ``close_tag``, one trailing
    ``</action>``); never empty when the line is not (the patterns' ``(.+?)`` takes one character at least)."""
    end = text.find("\n", start)
    line = text[start : len(text) if end < 0 else end]
    stripped = line.rstrip()
    if close_tag:
        stripped = _CLOSE_TAIL.sub("", stripped).rstrip() or stripped
    return stripped or line[:1]


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
    tagged, last_open = _last_tagged(text)  # linear in the text, like every step here
    if tagged is not None:
        action, ok = tagged, True
    elif last_open is not None:
        action, ok = text[last_open:], True
    else:
        head = _REACT_HEAD.search(text) if react else None
        prompt_head = _REACT_PROMPT_HEAD.search(text) if react and head is None else None
        if head is not None:
            action, ok = _rest_of_line(text, head.end(), close_tag=True), True
        elif prompt_head is not None:
            action, ok = _rest_of_line(text, prompt_head.end(), close_tag=False), True
        else:
            action, ok = text, False
    action = " ".join(action.split()) if normalize_whitespace else action.strip()
    return ParsedAction(action[:max_chars], ok and bool(action))
