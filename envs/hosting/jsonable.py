"""Env observations and ``info`` as plain JSON types, the same in worker processes, threads and over HTTP, and the
one rule for text that is not valid Unicode (lone UTF-16 surrogates).

A lone surrogate (``"\\ud800"`` with no partner) is valid JSON (``"\\ud800"`` is a legal escape) and a legal Python
``str``, but not a Unicode character: it has no UTF-8 encoding, so it cannot be sent as UTF-8 JSON nor tokenized.
The rule, the same for both env pools:

- **text from an env** (observations, ``info`` strings and keys, error messages): every lone surrogate becomes
  U+FFFD (the replacement character), one per surrogate; a surrogate pair split over two code points is joined into
  the character it encodes (:func:`scrub_text`, applied by :func:`to_jsonable`).
- **text from a client** (an action, an env id, a session id, options, env kwargs): refused with the location of
  the first lone surrogate (:func:`lone_surrogate`): HTTP 422, ``EnvClientError(code="invalid_request")`` in both
  pools, never handed to an env.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["lone_surrogate", "scrub_text", "to_jsonable"]


def scrub_text(text: str) -> str:
    """``text`` with every lone UTF-16 surrogate replaced by U+FFFD (a high + low pair stored as two code points is
    joined into its character). Text that encodes as UTF-8 is returned as is (the common case costs one encode)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        # UTF-16 code units -> characters: pairs join, each unpaired unit decodes as one U+FFFD
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _surrogate_at(text: str) -> int | None:
    """Index of the first lone surrogate in ``text`` (``None`` if it encodes as UTF-8)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return exc.start


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """Where the first lone UTF-16 surrogate in a JSON-like value is (strings, dict keys and values, list items),
    as a message naming the path and the code point, e.g. ``"options['task'][2]: lone UTF-16 surrogate U+D800 at
    index 3 (not a Unicode character; send valid UTF-8 text)"``; ``None`` when every string is valid Unicode."""
    if isinstance(value, str):
        index = _surrogate_at(value)
        if index is None:
            return None
        return (f"{where or 'value'}: lone UTF-16 surrogate U+{ord(value[index]):04X} at index {index} "
                "(not a Unicode character; send valid UTF-8 text)")
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _surrogate_at(key) is not None:
                return lone_surrogate(key, f"{where or 'value'} key {scrub_text(key)!r}")
            found = lone_surrogate(item, f"{where}[{scrub_text(str(key))!r}]" if where else scrub_text(str(key)))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = lone_surrogate(item, f"{where}[{i}]")
            if found:
                return found
    return None


def to_jsonable(value: Any) -> Any:
    """Convert an env's observation/info to plain JSON types (str, int, float, bool, None, list, dict).

    numpy scalars and arrays become Python numbers and lists (gymnasium's episode-statistics wrapper puts numpy
    floats in ``info``), tuples/sets become lists, bytes are decoded as UTF-8 (with replacement), non-finite floats
    become ``None`` (JSON has no NaN), anything else becomes ``str(value)``, and every string (dict keys included)
    is valid Unicode: lone surrogates become U+FFFD (:func:`scrub_text`).
    """
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {scrub_text(str(k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalar or array
        return to_jsonable(value.tolist())
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return scrub_text(str(value))
