"""Behaviour-preserving speed-ups for TextWorld's PDDL engine, and the fix of ALFWorld's handcoded expert.

Importing this module sets ``$ALFWORLD_DATA`` (if unset) to ``cache_dir()/alfworld`` *before* alfworld is imported,
because ``import alfworld`` creates that folder as a side effect.

Patches (installed once per process by :func:`install`, idempotent; each returns results equal to the original):

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
4. ALFWorld 0.4.2's handcoded expert, fixed in :class:`FixedHandCodedTWAgent` (its policies get
   :class:`_PolicyFixes`) and :class:`FixedAlfredExpert`:

   a. it tracks its own placements by looking for ``put`` in the last command, but the games' command is
      ``move X to Y``: after the first placement it loops (2/17 ``pick_two_obj`` games won). A last action starting
      with ``"move "`` is shown to the policy's state tracker as ``"put ..."`` (the same fault is reported upstream
      in an open pull request on alfworld/alfworld);
   b. asked to find a mug (bowl, pot, pan, plate, cup, box: object classes that are also receptacle classes) it
      ignored its object priors and searched the whole room in reverse order; it now searches as for any object;
   c. when it searches again for an object class (the second object of ``pick_two``) it no longer starts over in
      the same order: receptacles it has seen without that class are searched last;
   d. when it says ``go to R`` while standing at a receptacle that shares R's spot (not admissible; ALFWorld's
      wrapper then wastes a ``look`` and then a random command), it plays ``examine R`` (the same "On the R, you
      see ..." text) and its tracker is told ``go to R``;
   e. it breaks ties with its own seeded RNG instead of the global ``random`` (reproducible expert episodes);
   f. an expert that gives up or fails (``HandCodedAgentFailed``, timeout, a policy's own ``IndexError``) answers
      ``look`` instead of raising out of ``step``; the task parameters come from the game folder name when
      ``traj_data.json`` is missing.

The on-disk translation cache holds pickles: it must stay as private as the rest of ``cache_dir()``.
"""

from __future__ import annotations

import contextvars
import copy
import hashlib
import json
import os
import pickle
import random
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from envs.data import cache_dir

os.environ.setdefault("ALFWORLD_DATA", str(cache_dir() / "alfworld"))

import fast_downward  # noqa: E402
import textworld.envs.pddl.logic as _pddl_logic  # noqa: E402
import textworld.envs.pddl.textgen as _textgen  # noqa: E402
import textworld.logic as _tw_logic  # noqa: E402
from alfworld.agents.expert import handcoded_expert as _handcoded_expert  # noqa: E402
from alfworld.agents.environment.alfred_tw_env import AlfredExpert  # noqa: E402
from alfworld.agents.expert import HandCodedTWAgent  # noqa: E402

from envs.alfworld.data import traj_data_from_dirname  # noqa: E402

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
    """Install patches 1 and 2 (idempotent, process-wide)."""
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


# ---------------------------------------------------------------------------------------------------------------
# 3. the handcoded expert fix
# ---------------------------------------------------------------------------------------------------------------
def _move_as_put(action: str) -> str:
    """``"move apple 1 to fridge 1"`` -> ``"put apple 1 in/on fridge 1"``; other actions unchanged."""
    if action.startswith("move "):
        obj, _, recep = action[len("move ") :].rpartition(" to ")
        return f"put {obj} in/on {recep}"
    return action


class _PolicyFixes:
    """Mixin for the handcoded expert's task policies (module doc, 4a-c)."""

    def update_state_tracking(self, game_state: Any, last_action: str) -> None:
        # Feed the state tracker the ``put`` command it was written for.
        super().update_state_tracking(game_state, _move_as_put(last_action))  # type: ignore[misc]
        # Remember what each receptacle showed (used by get_list_of_receptacles_to_search_for_object_cls).
        seen = self.__dict__.setdefault("_contents_seen", {})
        obs = game_state["feedback"]
        for verb in ("go to ", "open ", "examine "):
            if last_action.startswith(verb) and "you see" in obs:
                seen[last_action[len(verb) :]] = obs

    def get_list_of_receptacles_to_search_for_object_cls(self, obj_cls: str) -> list[str]:
        # The policy searches receptacles from the end of this list. When it searches again (the second object of
        # pick_two, or after a wrong pick), it used to start over in the same order, revisiting receptacles it has
        # seen without any object of the class. Those now come first in the list, i.e. are searched last.
        priors = super().get_list_of_receptacles_to_search_for_object_cls(obj_cls)  # type: ignore[misc]
        seen = self.__dict__.get("_contents_seen", {})
        seen_without = [r for r in priors if r in seen and f" {obj_cls} " not in seen[r]]
        return seen_without + [r for r in priors if r not in seen_without]

    def get_list_of_receptacles_of_type(self, recep_cls: str) -> list[str]:
        # Mug, bowl, pot, pan, plate, cup, box ... are object classes *and* receptacle classes. To find a mug the
        # policy asks for "receptacles of type mug", gets none (mugs are not among the room's receptacles) and then
        # searches every receptacle in reverse room order, ignoring its object priors (a mug on countertop 2 is
        # found after 12 drawers). Search for such a class as an object instead, as for any other object.
        found = super().get_list_of_receptacles_of_type(recep_cls)  # type: ignore[misc]
        if found or recep_cls not in self.OBJECT_TO_VAL_RECEPTACLE:  # type: ignore[attr-defined]
            return found
        priors = self.get_list_of_receptacles_to_search_for_object_cls(recep_cls)  # type: ignore[attr-defined]
        return [r for r in self.receptacles if r not in priors] + priors  # type: ignore[attr-defined]


# The expert breaks ties with ``random.choice`` from the global ``random`` module (e.g. it plays a random admissible
# command when its own choice repeats the last one). Inside ``handcoded_expert`` only, ``random`` is replaced by a
# shim whose ``choice`` uses the RNG of the agent that is acting, so an expert episode is reproducible from the env's
# seed and envs do not disturb each other (or the user's global ``random``).
_ACTING_RNG: contextvars.ContextVar[random.Random | None] = contextvars.ContextVar("alfworld_expert_rng", default=None)


class _ExpertRandom:
    """Stands in for the ``random`` module inside ``alfworld.agents.expert.handcoded_expert``."""

    def choice(self, seq: Any) -> Any:
        rng = _ACTING_RNG.get()
        return (rng or random).choice(seq)

    def __getattr__(self, name: str) -> Any:
        return getattr(random, name)


_handcoded_expert.random = _ExpertRandom()


class FixedHandCodedTWAgent(HandCodedTWAgent):
    """ALFWorld's ``HandCodedTWAgent`` with the ``move``/``put`` state-tracking fix and its own RNG (``self.rng``,
    see :meth:`seed`); needs no ``traj_data.json``."""

    _fixed_policies: dict[type, type] = {}

    def __init__(self, max_steps: int = 150) -> None:
        super().__init__(max_steps=max_steps)
        self.rng = random.Random()
        self._played_for: dict[str, str] = {}

    def seed(self, seed: int | None) -> None:
        """Seed the expert's tie-breaking RNG."""
        self.rng.seed(seed)

    def reset(self, game: str = "INVALID") -> None:
        self._played_for = {}
        self._reset_policy(game)

    def act(self, game_state: Any, reward: Any, done: Any, last_action: str = "") -> str:
        # The state tracker sees the command the policy asked for (``go to R``) when we played a stand-in for it.
        tracked = self._played_for.get(last_action, last_action)
        self._played_for = {}
        token = _ACTING_RNG.set(self.rng)
        try:
            action = super().act(game_state, reward, done, tracked)
        finally:
            _ACTING_RNG.reset(token)
        # Co-located receptacles ("You are facing the drawer 3, and drawer 2"): ``go to drawer 3`` is not admissible
        # from drawer 2, ALFWorld's wrapper then says ``look`` and the policy asks again, and then plays a random
        # command. ``examine drawer 3`` shows the same "On the drawer 3, you see ..." as arriving there would.
        admissible = game_state["admissible_commands"]
        if action.startswith("go to ") and action not in admissible:
            examine = "examine " + action[len("go to ") :]
            if examine in admissible:
                self._played_for = {examine: action}
                return examine
        return action

    def get_task_policy(self, task_param: dict) -> type:
        base = super().get_task_policy(task_param)
        fixed = self._fixed_policies.get(base)
        if fixed is None:
            fixed = type(base.__name__ + "Fixed", (_PolicyFixes, base), {})
            self._fixed_policies[base] = fixed
        return fixed

    def _reset_policy(self, game: str) -> None:
        traj_path = os.path.join(os.path.dirname(game), "traj_data.json")
        if os.path.exists(traj_path):
            return super().reset(game)
        # A read-only download without traj_data.json: derive the same fields from the folder name.
        traj = traj_data_from_dirname(Path(game).parent.parent.name)
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "traj_data.json").write_text(json.dumps(traj))
            return super().reset(os.path.join(tmp, "game.tw-pddl"))


class FixedAlfredExpert(AlfredExpert):
    """``AlfredExpert`` (handcoded) using :class:`FixedHandCodedTWAgent`; an expert that gives up or fails says
    ``look``.

    ALFWorld's wrapper lets the expert's exceptions escape from ``step`` (``HandCodedAgentFailed``, its timeout, and
    bugs of its policies such as ``IndexError: Cannot choose from an empty sequence`` when a policy has no object of
    interest left, e.g. after the agent moved the pot of ``pick_cool_then_place_in_recep-Pot-None-StoveBurner-25``
    back). The game has already stepped when the expert runs, so here any expert failure makes the plan
    ``["look"]`` (what ALFWorld itself uses when the expert's action is not admissible): the game never crashes
    because of the expert. ``expert_failures`` counts them.
    """

    expert_failures = 0

    def load(self, gamefile: str) -> None:
        super().load(gamefile)
        self._handcoded_expert = FixedHandCodedTWAgent(max_steps=200)
        self._handcoded_expert.seed(getattr(self, "_expert_seed", None))

    def seed_expert(self, seed: int | None) -> None:
        """Seed the expert's tie-breaking RNG (applies now and to games loaded later)."""
        self._expert_seed = seed
        if hasattr(self, "_handcoded_expert"):
            self._handcoded_expert.seed(seed)

    def _gather_infos(self) -> None:
        # AlfredExpert._gather_infos runs only the expert (the inner wrappers built the state already), so an
        # exception here is the expert's own: HandCodedAgentFailed, Exception("Timeout") (its HandCodedAgentTimeout),
        # or a bug of a policy (IndexError from random.choice([])).
        try:
            super()._gather_infos()
        except Exception:  # noqa: BLE001 (see above: never the game's failure)
            self.expert_failures += 1
            self.state["extra.expert_plan"] = ["look"]
