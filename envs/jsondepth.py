"""Nesting depth of JSON, bounded before parsing: the one rule for every JSON a client sends (request bodies, WebSocket
frames, MCP JSON-RPC, tool calls inside actions).

Python's ``json`` (and pickle, ``jsonschema``, pydantic's error encoding) recurse once per level: text nested about a
thousand deep (``[[[[...``, a few KB, even unterminated) raises ``RecursionError``, which is not a ``ValueError`` and
so escapes every ``except ValueError`` around a parse. :func:`json_depth` counts the depth of the raw text without
parsing it (brackets outside strings, iteratively, stopping as soon as the limit is passed), so a caller refuses
the text first; :func:`loads_bounded` is ``json.loads`` behind that check.

This module imports nothing of the project (``envs.tools`` and ``servers`` both use it).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JSONTooDeep", "json_depth", "loads_bounded", "value_depth"]

MAX_JSON_DEPTH = 64
"""Deepest nesting accepted (objects and arrays): far above any env's kwargs, options or tool arguments, far below
the ~1000 levels where Python's recursion limit is reached."""

# a string (closed, or running to the end of the text) or one bracket; everything else is skipped by finditer
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)
_TOKENS_B = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


class JSONTooDeep(ValueError):
    """JSON text nested deeper than the limit (refused before parsing)."""

    def __init__(self, depth: int, limit: int, where: str = "JSON") -> None:
        super().__init__(f"{where} nested deeper than {limit} levels (reached {depth}; refused before parsing)")
        self.depth, self.limit = depth, limit


def json_depth(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """Deepest bracket nesting of JSON ``text`` (``[`` and ``{`` outside strings), counted without parsing; stops
    at ``limit + 1`` (so the cost is one scan, at most, whatever the text). Unbalanced or invalid text is counted
    the same way (``[[[`` is 3). Pure function."""
    if isinstance(text, (bytes, bytearray)):
        if text.count(b"[") + text.count(b"{") <= limit:
            return min(text.count(b"[") + text.count(b"{"), limit)
        tokens, opening, closing = _TOKENS_B, (b"[", b"{"), (b"]", b"}")
    else:
        if text.count("[") + text.count("{") <= limit:  # cannot be deeper than the brackets it holds
            return min(text.count("[") + text.count("{"), limit)
        tokens, opening, closing = _TOKENS, ("[", "{"), ("]", "}")
    depth = deepest = 0
    for match in tokens.finditer(text):
        token = match.group()
        if token in opening:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif token in closing:
            depth = max(0, depth - 1)
    return deepest


def loads_bounded(text: str | bytes, limit: int = MAX_JSON_DEPTH, where: str = "JSON") -> Any:
    """``json.loads(text)`` after :func:`json_depth`: raises :class:`JSONTooDeep` (a ``ValueError``) beyond
    ``limit`` levels, ``ValueError`` for text that is not JSON; never ``RecursionError``."""
    depth = json_depth(text, limit)
    if depth > limit:
        raise JSONTooDeep(depth, limit, where)
    try:
        return json.loads(text)
    except RecursionError:  # cannot happen below the limit; kept so no parse can raise anything but ValueError
        raise JSONTooDeep(depth, limit, where) from None


def value_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """Deepest nesting of a parsed JSON-like value (dicts, lists, tuples), iteratively; stops at ``limit + 1``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
