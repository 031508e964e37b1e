"""One data root for every environment.

Resolution order of :func:`data_root` (first match wins):

1. the ``root`` argument (what the ``data.root`` config key passes down),
2. the environment variable ``AGENT_RL_DATA``,
3. ``<cache>/data`` when it exists (where ``python -m envs.fetch`` puts a real user's downloads),
4. ``../shared/data`` beside the repository checkout (the workplace's read-only data).

Derived, writable artefacts (the unpacked ALFWorld games, the converted default model) go under :func:`cache_dir`:
``AGENT_RL_CACHE`` or ``~/.cache/agent_rl``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

PATH_KWARGS = ("root", "data_root", "data_dir")
"""Constructor kwargs of the built-in envs that name a host path (the data root, a data folder). Where the data
lives is the machine's choice: an env server refuses them from clients (``servers.settings.ServerSettings.
refused_env_kwargs``); ``tests/servers/test_server_sandbox.py`` checks every registered env's constructor against
this list."""

PATH_OPTIONS = ("gamefile",)
"""Reset options of the built-in envs that name a host path (ALFWorld's ``gamefile``): an env server refuses them
from clients as it refuses :data:`PATH_KWARGS` (``servers.settings.ServerSettings.refused_options``); a client
selects a game by ``task_id``, ``split`` and ``index``. In-process callers may pass them."""


def cache_dir() -> Path:
    """Writable cache directory (``$AGENT_RL_CACHE`` or ``~/.cache/agent_rl``), created on demand."""
    path = Path(os.environ.get("AGENT_RL_CACHE") or Path.home() / ".cache" / "agent_rl").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Directory holding the source data sets (``alfworld/``, ``webshop/``, ``math/``, ``code/``).

    Raises:
        FileNotFoundError: if an explicitly given root (argument or ``$AGENT_RL_DATA``) does not exist, or if no
            candidate exists at all; the message lists what was tried and how to fetch the data.
    """
    explicit = root if root not in (None, "") else os.environ.get("AGENT_RL_DATA") or None
    if explicit is not None:
        path = Path(explicit).expanduser().resolve()
        if not path.is_dir():
            raise FileNotFoundError(f"data root {path} does not exist (from data.root / $AGENT_RL_DATA)")
        return path
    candidates = [cache_dir() / "data", SHARED_DATA]
    for path in candidates:
        if path.is_dir() and any(path.iterdir()):
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise FileNotFoundError(
        f"no data root found (tried {tried}); set $AGENT_RL_DATA or run `python -m envs.fetch all`"
    )


def dataset_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """``data_root(root) / name``, raising ``FileNotFoundError`` with a fetch hint if it is missing."""
    path = data_root(root) / name
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist; run `python -m envs.fetch {name}` or set $AGENT_RL_DATA")
    return path
