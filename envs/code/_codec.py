"""Plain-data codec between the checker and the worker process (self-contained: it is also pasted into both).

Only exact builtin types cross the boundary: None, bool, int, float (nan/inf included), str, bytes, complex, list,
tuple, set, frozenset, dict. ``decode`` builds nothing else, so a program can never hand the checker an object whose
``__eq__`` lies. Anything else is sent as an opaque reference (``{"$ref": n}``) that the checker can only pass back.
"""

import json
import math
import resource


class Unencodable(TypeError):
    """Raised for a value that is not plain data (the worker then sends a reference instead)."""


_TYPES = {int: "int", float: "float", str: "str", bool: "bool", list: "list", tuple: "tuple", dict: "dict",
          set: "set", frozenset: "frozenset", bytes: "bytes", complex: "complex", type(None): "NoneType",
          object: "object"}
_TYPES_BY_NAME = {name: t for t, name in _TYPES.items()}


def _cast_dict(value):
    return {k: v for k, v in dict.items(value)}


_BASE_CAST = {bool: lambda v: bool(int(v) != 0), int: int.__index__, float: float.__float__,
              str: str.__str__, bytes: bytes, complex: complex, dict: _cast_dict,
              list: lambda v: list(list.__iter__(v)), tuple: lambda v: tuple(tuple.__iter__(v)),
              frozenset: lambda v: frozenset(frozenset.__iter__(v)), set: lambda v: set(set.__iter__(v))}


class RefMarker:
    """A decoded ``{"$ref": n}``: the id of an object that lives in the worker."""

    __slots__ = ("id",)

    def __init__(self, ref_id):
        self.id = ref_id

    def __eq__(self, other):
        return type(other) is RefMarker and other.id == self.id

    def __hash__(self):
        return hash(("RefMarker", self.id))


def encode(value, _depth=0, ref=None):
    """Plain value -> JSON-compatible tagged structure.

    ``ref(value)`` (optional) encodes anything that is not plain data (a reference); without it such a value
    raises Unencodable.
    """
    if _depth > 200:
        raise Unencodable("nesting deeper than 200")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -(2**53) < value < 2**53 else {"$x": format(value, "x")}  # hex: linear-time for huge ints
    if t is float:
        return value if math.isfinite(value) else {"$f": repr(value)}
    if t is list:
        return [encode(v, _depth + 1, ref) for v in value]
    if t is tuple:
        return {"$t": [encode(v, _depth + 1, ref) for v in value]}
    if t is set or t is frozenset:
        items = [encode(v, _depth + 1, ref) for v in value]
        return {"$s" if t is set else "$fs": items}
    if t is dict:
        return {"$d": [[encode(k, _depth + 1, ref), encode(v, _depth + 1, ref)] for k, v in value.items()]}
    if t is bytes:
        return {"$b": value.hex()}
    if t is complex:
        return {"$c": [encode(value.real), encode(value.imag)]}
    if t is type and value in _TYPES:
        return {"$type": value.__name__}
    # subclasses of builtin types (Counter, defaultdict, OrderedDict, namedtuple, IntEnum, ...) travel as their
    # builtin base: the values survive, any overridden __eq__ / __hash__ does not
    for base in (bool, int, float, str, bytes, complex, dict, list, tuple, frozenset, set):
        if isinstance(value, base):
            return encode(_BASE_CAST[base](value), _depth + 1, ref)
    if ref is not None:
        return ref(value)
    raise Unencodable(t.__name__)


def _hook(obj):
    if len(obj) != 1:
        raise ValueError("bad tagged object")
    (tag, val), = obj.items()
    if tag == "$t":
        return tuple(val)
    if tag == "$s":
        return set(val)
    if tag == "$fs":
        return frozenset(val)
    if tag == "$d":
        return {k: v for k, v in val}
    if tag == "$x":
        return int(val, 16)
    if tag == "$i":
        return int(val)
    if tag == "$f":
        return float(val)
    if tag == "$b":
        return bytes.fromhex(val)
    if tag == "$c":
        return complex(val[0], val[1])
    if tag == "$type":
        return _TYPES_BY_NAME[val]
    if tag == "$ref":
        return RefMarker(int(val))
    raise ValueError("unknown tag " + repr(tag)[:40])


def decode(text):
    """JSON text -> plain value (tuples/sets/dicts rebuilt; ``$ref`` as RefMarker)."""
    return json.loads(text, object_hook=_hook)


def dumps(value, ref=None):
    """encode + compact JSON on one line (no newline inside)."""
    return json.dumps(encode(value, 0, ref), separators=(",", ":"))


def apply_limits(limits):
    """rlimits (soft = hard, so the program cannot raise them): cpu s, address space / file size bytes, procs."""
    pairs = [
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_AS, limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_size_bytes"]),
        (resource.RLIMIT_NPROC, limits["nproc"]),
        (resource.RLIMIT_NOFILE, limits["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ]
    for kind, value in pairs:
        if value is None:
            continue
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):  # e.g. NPROC below the current count in the no-isolation fallback
            pass
