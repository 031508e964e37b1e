"""Env observations and ``info`` as plain JSON types, the same in worker processes, threads and over HTTP."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """Convert an env's observation/info to plain JSON types (str, int, float, bool, None, list, dict).

    numpy scalars and arrays become Python numbers and lists (gymnasium's episode-statistics wrapper puts numpy
    floats in ``info``), tuples/sets become lists, bytes are decoded as UTF-8 (with replacement), non-finite floats
    become ``None`` (JSON has no NaN), and anything else becomes ``str(value)``.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalar or array
        return to_jsonable(value.tolist())
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)
