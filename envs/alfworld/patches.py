"""Install and uninstall, in one place, everything this package changes in TextWorld and ALFWorld:

- ``$ALFWORLD_DATA`` (when unset) -> ``cache_dir()/alfworld``, *before* alfworld is first imported, because
  ``import alfworld`` creates that folder as a side effect;
- :mod:`envs.alfworld.speedups`: behaviour-preserving speed-ups of TextWorld's PDDL engine (memoised parsers and
  PDDL-to-SAS translation, pooled fast-downward libraries);
- :mod:`envs.alfworld.expert`: the fixes of ALFWorld's handcoded expert (behaviour changes, listed there), including
  the seeded-RNG shim inside ``handcoded_expert``.

Importing this module has no side effect and imports neither alfworld nor textworld; :func:`install` does it all
(idempotent, process-wide), :func:`uninstall` undoes it all (the byte-identity test compares with the originals).
"""

from __future__ import annotations

import os
import threading

from envs.data import cache_dir

__all__ = ["install", "uninstall"]

_LOCK = threading.RLock()
_SET_ALFWORLD_DATA = False  # install() set $ALFWORLD_DATA (so uninstall() removes it)


def install() -> None:
    """Set ``$ALFWORLD_DATA`` if unset, then install the speed-ups and the expert fixes (idempotent)."""
    global _SET_ALFWORLD_DATA
    with _LOCK:
        if "ALFWORLD_DATA" not in os.environ:
            os.environ["ALFWORLD_DATA"] = str(cache_dir() / "alfworld")
            _SET_ALFWORLD_DATA = True
        from envs.alfworld import expert, speedups  # alfworld is imported here, after $ALFWORLD_DATA

        speedups.install()
        expert.install()


def uninstall() -> None:
    """Undo :func:`install`: TextWorld's original functions, ``random`` inside the expert, and ``$ALFWORLD_DATA`` if
    :func:`install` set it."""
    global _SET_ALFWORLD_DATA
    with _LOCK:
        from envs.alfworld import expert, speedups

        speedups.uninstall()
        expert.uninstall()
        if _SET_ALFWORLD_DATA:
            os.environ.pop("ALFWORLD_DATA", None)
            _SET_ALFWORLD_DATA = False
