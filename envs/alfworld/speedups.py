"""Behaviour-preserving speed-ups of TextWorld's PDDL engine for ALFWorld (installed by
:func:`envs.alfworld.patches.install`; each returns results equal to the original).

1. TextWorld's tatsu parse functions are memoised (bounded LRU, a deep copy returned since callers mutate the
   result): ``textworld.envs.pddl.textgen._parse_and_convert`` (grammar strings re-parsed at every step by
   ``ContextSensitiveGrammar.derive``), ``textworld.logic._parse_and_convert`` (grammar conditions, every step) and
   ``textworld.envs.pddl.logic._parse_and_convert`` (a game's whole grammar, at every load). Observations and
   admissible commands stay byte-identical (``tests/envs/test_alfworld.py::test_patches_keep_observations_identical``).
2. ``fast_downward.pddl2sas`` as seen by ``textworld.envs.pddl.logic`` (a proxy of the module is put there, the
   real module is untouched) is memoised by ``sha256(domain, problem, optimize)``: TextWorld translates PDDL to SAS
   twice per ``PddlState``, i.e. at every ``load`` *and* every ``reset``, which is most of the ~0.5-5 CPU-s cost of
   starting an episode. The cache is a bounded in-memory LRU plus an on-disk cache (``cache_dir()/alfworld/sas``)
   shared by processes. Entries are stored pickled, so every hit returns a fresh copy of the parsed ``Task``.
   The real translation runs under a lock and restores ``sys.argv`` (fast_downward overwrites it).
3. fast-downward library copies are pooled (:func:`acquire_downward_lib`): see the comment at ``_FREE_LIBS``.

The on-disk translation cache holds pickles: it must stay as private as the rest of ``cache_dir()``.
Import this module only after ``$ALFWORLD_DATA`` is set (``patches.install`` does it in that order).
"""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import fast_downward
import textworld.envs.pddl.logic as _pddl_logic
import textworld.envs.pddl.textgen as _textgen
import textworld.logic as _tw_logic

from envs.data import cache_dir

_LOCK = threading.RLock()
_INSTALLED = False


class _LRU:
    """A small thread-safe LRU mapping ``key -> value`` with hit/miss counters (``maxsize`` entries)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Any) -> Any | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


# ---------------------------------------------------------------------------------------------------------------
# 1. parse memos (tatsu parsing of the same strings, again and again)
# ---------------------------------------------------------------------------------------------------------------
# (module, function name) -> cache. textgen: grammar strings derived at every step; logic: conjunctive queries in
# grammar conditions (every step); pddl logic: the game's whole grammar (once per game load).
_PARSE_TARGETS: tuple[tuple[Any, str, int], ...] = (
    (_textgen, "_parse_and_convert", 4096),
    (_tw_logic, "_parse_and_convert", 4096),
    (_pddl_logic, "_parse_and_convert", 64),
)
PARSE_CACHES: dict[str, _LRU] = {}
_ORIGINAL_PARSERS: dict[str, Callable[..., Any]] = {}


def _memoised(original: Callable[..., Any], cache: _LRU) -> Callable[..., Any]:
    """Wrap a pure parse function: same result, parsed once per distinct arguments, returned as a deep copy
    (callers mutate what they get, e.g. ``symbol.context`` in ``ContextSensitiveGrammar.derive``)."""

    def parse(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        cached = cache.get(key)
        if cached is None:
            cached = original(*args, **kwargs)
            cache.put(key, cached)
        return copy.deepcopy(cached)

    parse.__wrapped__ = original  # type: ignore[attr-defined]
    return parse


for _module, _name, _size in _PARSE_TARGETS:
    PARSE_CACHES[_module.__name__] = _LRU(maxsize=_size)
    _ORIGINAL_PARSERS[_module.__name__] = getattr(_module, _name)


# ---------------------------------------------------------------------------------------------------------------
# 2. PDDL -> SAS translation memo (memory LRU + disk)
# ---------------------------------------------------------------------------------------------------------------
SAS_CACHE = _LRU(maxsize=int(os.environ.get("AGENT_RL_ALFWORLD_SAS_CACHE", "256")))
SAS_DISK_STATS = {"hits": 0, "writes": 0}
_original_pddl2sas: Callable[..., Any] = fast_downward.pddl2sas
# Bump when the cached value's format changes; fast_downward's own version is part of the key too.
_SAS_CACHE_VERSION = "1"


def sas_disk_dir() -> Path | None:
    """Folder of the on-disk translation cache, or ``None`` when disabled (``AGENT_RL_ALFWORLD_SAS_DISK=0``)."""
    if os.environ.get("AGENT_RL_ALFWORLD_SAS_DISK", "1") in ("0", "false", "False", ""):
        return None
    return cache_dir() / "alfworld" / "sas"


def _sas_key(domain: str, problem: str, optimize: bool) -> str:
    h = hashlib.sha256()
    for part in (_SAS_CACHE_VERSION, getattr(fast_downward, "__version__", ""), str(bool(optimize)), domain, problem):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def _read_disk(key: str) -> bytes | None:
    folder = sas_disk_dir()
    if folder is None:
        return None
    try:
        return (folder / f"{key}.pkl").read_bytes()
    except OSError:
        return None


def _write_disk(key: str, blob: bytes) -> None:
    folder = sas_disk_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, folder / f"{key}.pkl")  # atomic: readers see the old or the whole new file
        SAS_DISK_STATS["writes"] += 1
    except OSError:
        pass  # a read-only cache only costs speed


def cached_pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> tuple[Any, str]:
    """``fast_downward.pddl2sas`` with a memory + disk cache; same signature and return ``(task, sas_text)``.

    Every call returns a freshly unpickled ``task`` (never shared between callers).
    """
    key = _sas_key(domain, problem, optimize)
    blob = SAS_CACHE.get(key)
    if blob is None:
        blob = _read_disk(key)
        if blob is not None:
            SAS_DISK_STATS["hits"] += 1
        else:
            with _LOCK:  # fast_downward's translator keeps global options and swaps sys.stdout
                argv = sys.argv
                try:
                    task, sas = _original_pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
                finally:
                    sys.argv = argv  # pddl2sas overwrites sys.argv
            blob = pickle.dumps((task, sas), protocol=pickle.HIGHEST_PROTOCOL)
            _write_disk(key, blob)
        SAS_CACHE.put(key, blob)
    return pickle.loads(blob)


class _FastDownwardProxy:
    """Stands in for the ``fast_downward`` module inside ``textworld.envs.pddl.logic`` only."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.pddl2sas = cached_pddl2sas

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def install() -> None:
    """Install speed-ups 1 and 2 (idempotent, process-wide)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        for module, name, _ in _PARSE_TARGETS:
            setattr(module, name, _memoised(_ORIGINAL_PARSERS[module.__name__], PARSE_CACHES[module.__name__]))
        _pddl_logic.fast_downward = _FastDownwardProxy(fast_downward)
        _INSTALLED = True


def uninstall() -> None:
    """Restore TextWorld's original functions (used by the byte-identity test)."""
    global _INSTALLED
    with _LOCK:
        for module, name, _ in _PARSE_TARGETS:
            setattr(module, name, _ORIGINAL_PARSERS[module.__name__])
        _pddl_logic.fast_downward = fast_downward
        _INSTALLED = False


# ---------------------------------------------------------------------------------------------------------------
# fast-downward library copies: pooled, never unloaded
# ---------------------------------------------------------------------------------------------------------------
# Each PddlEnv needs its own copy of libdownward.so (the planner keeps its task in C++ globals); TextWorld loads a
# fresh copy per env and never unloads it (a leak per env), and unloading with fast_downward.close_lib (dlclose)
# makes a later dlopen crash the process (seen here: SIGSEGV in ctypes.LoadLibrary after a few create/close
# cycles). So closed envs hand their copy back to this pool (after ``cleanup()``), and new envs take one from it:
# the number of copies is the peak number of live envs in the process.
_FREE_LIBS: list[Any] = []
LIB_STATS = {"loaded": 0, "reused": 0}


def acquire_downward_lib() -> Any:
    """A loaded copy of fast-downward's library for one env: a pooled one, else ``fast_downward.load_lib()``."""
    with _LOCK:
        if _FREE_LIBS:
            LIB_STATS["reused"] += 1
            return _FREE_LIBS.pop()
        LIB_STATS["loaded"] += 1
    return fast_downward.load_lib()


def release_downward_lib(lib: Any) -> None:
    """Free ``lib``'s planning task (``cleanup()``) and pool it for the next env. The caller must drop it."""
    lib.cleanup()
    with _LOCK:
        _FREE_LIBS.append(lib)


def free_lib_count() -> int:
    """Number of pooled, unused library copies."""
    return len(_FREE_LIBS)
