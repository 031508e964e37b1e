"""Process-wide locks shared by envs that use the same non-thread-safe library.

TextWorld's logic and grammar parsers (tatsu) are not thread-safe: every use of textworld in a process (TextWorld
game generation, loading and playing; ALFWorld's PDDL games, which run on TextWorld) holds :data:`TEXTWORLD_LOCK`,
so envs played from a thread pool (``LocalEnvPool`` in thread mode) are safe. Env servers run one env per worker
process and never contend for it.
"""

from __future__ import annotations

import threading

TEXTWORLD_LOCK = threading.RLock()
