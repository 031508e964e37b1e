"""ALFWorld game files: find them, unpack them on first use, list them by split and task type.

Layout (the same as ALFWorld's own ``alfworld-download``, i.e. ``$ALFWORLD_DATA``)::

    <games_home>/json_2.1.1/<split>/<task_type>-<Obj>-<MRecep>-<Recep>-<scene>/trial_*/game.tw-pddl
    <games_home>/json_2.1.1/.../traj_data.json      (minimal, derived from the folder name; see below)
    <games_home>/logic/alfred.pddl, alfred.twl2     (copied from the alfworld package)

Where ``<games_home>`` is, first match wins:

1. ``data_root()/alfworld`` if it already holds ``json_2.1.1/`` (a real user's download, ``python -m envs.fetch
   alfworld``, or any ``alfworld-download`` folder pointed at by ``$AGENT_RL_DATA``);
2. ``cache_dir()/alfworld``, filled on first use from the archive ``data_root()/alfworld/json_2.1.1_tw-pddl.tar.xz``
   (unpacked into a temporary folder beside it, then renamed into place: atomic, and safe when processes race).

This module imports neither alfworld nor textworld.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from envs.data import cache_dir, data_root
from envs.errors import EnvDataError

ARCHIVE_NAME = "json_2.1.1_tw-pddl.tar.xz"
GAMES_DIRNAME = "json_2.1.1"
GAME_FILENAME = "game.tw-pddl"
SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
# ALFWorld's six task types (alfworld.agents.environment.alfred_tw_env.TASK_TYPES), in ALFWorld's id order.
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# Marker written inside the unpacked folder before it is renamed into place.
_UNPACKED_MARKER = ".agent_rl_unpacked"


def traj_data_from_dirname(dirname: str) -> dict:
    """Minimal ``traj_data.json`` content for a game folder ``<task_type>-<Obj>-<MRecep>-<Recep>-<scene>``.

    Only ``task_type`` and ``pddl_params`` are read by ALFWorld's loader and handcoded expert
    (``alfworld/agents/expert/handcoded_expert.py::HandCodedAgent.reset``). ``MRecep`` is ``"None"`` when unused
    (mapped to ``""``); for ``look_at_obj_in_light`` the fourth field is the lamp: it goes to ``toggle_target`` and
    ``parent_target`` is ``""`` (see ``docs/alfworld.md`` of the shared docs).

    Example: ``"pick_cool_then_place_in_recep-Apple-None-Microwave-19"`` ->
    ``{"task_type": "pick_cool_then_place_in_recep", "pddl_params": {"object_target": "Apple",
    "parent_target": "Microwave", "mrecep_target": "", "toggle_target": "", "object_sliced": False}}``.

    Raises:
        ValueError: if the name does not have 5 dash-separated fields or an unknown task type.
    """
    fields = dirname.split("-")
    if len(fields) != 5 or fields[0] not in TASK_TYPES:
        raise ValueError(f"not an ALFWorld game folder name: {dirname!r}")
    task_type, obj, mrecep, recep, _scene = fields
    is_look = task_type == "look_at_obj_in_light"
    return {
        "task_type": task_type,
        "pddl_params": {
            "object_target": obj,
            "parent_target": "" if is_look else recep,
            "mrecep_target": "" if mrecep == "None" else mrecep,
            "toggle_target": recep if is_look else "",
            "object_sliced": False,
        },
    }


def _copy_logic_files(home: Path) -> None:
    """Copy ``alfred.pddl`` and ``alfred.twl2`` from the installed alfworld package into ``home/logic`` (no import)."""
    import importlib.util

    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        return  # alfworld not installed: the files are only needed by ALFWorld's own loaders.
    src = Path(next(iter(spec.submodule_search_locations))) / "data"
    logic = home / "logic"
    logic.mkdir(parents=True, exist_ok=True)
    for name in ("alfred.pddl", "alfred.twl2"):
        dst = logic / name
        if not dst.exists() and (src / name).exists():
            tmp = logic / f".{name}.{os.getpid()}.tmp"
            shutil.copyfile(src / name, tmp)
            os.replace(tmp, dst)  # atomic


def write_traj_data(games_dir: Path) -> int:
    """Write the minimal ``traj_data.json`` beside every ``game.tw-pddl`` under ``games_dir`` that lacks one.

    Returns:
        number of files written.
    """
    written = 0
    for game in games_dir.glob(f"*/*/*/{GAME_FILENAME}"):
        path = game.parent / "traj_data.json"
        if not path.exists():
            path.write_text(json.dumps(traj_data_from_dirname(game.parent.parent.name)))
            written += 1
    return written


def _check_member(member: tarfile.TarInfo, dest: Path) -> None:
    """The ``"data"`` extraction filter (PEP 706), for interpreters without ``filter=``: leading slashes are
    stripped from names; names or link targets leaving ``dest``, absolute link targets, device files and FIFOs
    are refused.

    Raises:
        tarfile.TarError: a member that filter would refuse (the message names it).
    """
    if member.name.startswith(("/", os.sep)):
        member.name = member.name.lstrip("/" + os.sep)
    name = member.name
    if os.path.isabs(name):
        raise tarfile.TarError(f"refusing absolute path {name!r} in the archive")
    target = (dest / name).resolve()
    if target != dest and dest not in target.parents:
        raise tarfile.TarError(f"refusing {name!r}: it would be written outside {dest}")
    if member.issym() or member.islnk():
        base = dest if member.islnk() else target.parent
        if os.path.isabs(member.linkname):
            raise tarfile.TarError(f"refusing link {name!r} to the absolute path {member.linkname!r}")
        link = (base / member.linkname).resolve()
        if link != dest and dest not in link.parents:
            raise tarfile.TarError(f"refusing link {name!r} -> {member.linkname!r}: it leaves {dest}")
    elif not (member.isfile() or member.isdir()):
        raise tarfile.TarError(f"refusing special file {name!r} (device or FIFO)")


def safe_extractall(tar: tarfile.TarFile, dest: Path) -> None:
    """``tar.extractall(dest, filter="data")`` on every interpreter ``requires-python`` admits.

    CPython 3.10.0-3.10.11 and 3.11.0-3.11.3 have no ``filter`` argument (PEP 706 came in 3.10.12 / 3.11.4 /
    3.12): there every member is checked first as the ``data`` filter would (:func:`_check_member`), and
    extracted without owner, group or special mode bits.

    Raises:
        tarfile.TarError: a member the ``data`` filter refuses (outside ``dest``, absolute link, special file).
    """
    dest = Path(dest).resolve()
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    members = tar.getmembers()
    for member in members:
        _check_member(member, dest)
        if member.isfile():  # the data filter's modes: no set-id/sticky/group-or-other-write bits, owner rw
            mode = member.mode & 0o755
            member.mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
        elif member.isdir():  # the data filter ignores directory modes
            member.mode = 0o755
        member.uid = member.gid = 0
        member.uname = member.gname = ""
    tar.extractall(dest, members=members, numeric_owner=True)


def unpack_archive(archive: Path, home: Path) -> Path:
    """Unpack ``archive`` (``json_2.1.1/...``) into ``home/json_2.1.1`` once; return that folder.

    Atomic: extraction and the ``traj_data.json`` files go to a temporary folder inside ``home`` that is renamed
    into place; if another process renamed first, ours is deleted and theirs is used. Idempotent.

    Raises:
        EnvDataError: (a ``FileNotFoundError``) ``archive`` is missing.
    """
    target = home / GAMES_DIRNAME
    if (target / _UNPACKED_MARKER).exists():
        return target
    if not archive.is_file():
        raise EnvDataError(f"no ALFWorld games: neither {archive.parent / GAMES_DIRNAME}/ nor the archive {archive} "
                           f"exists (unpacked copy expected in {target}); run `python -m envs.fetch alfworld` or "
                           "set $AGENT_RL_DATA / data.root")
    home.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=home))
    try:
        with tarfile.open(archive, "r:xz") as tar:
            safe_extractall(tar, tmp)
        write_traj_data(tmp / GAMES_DIRNAME)
        (tmp / GAMES_DIRNAME / _UNPACKED_MARKER).write_text(archive.name + "\n")
        try:
            os.rename(tmp / GAMES_DIRNAME, target)
        except OSError:
            if not (target / _UNPACKED_MARKER).exists():  # neither ours nor a racing process's complete copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def games_home(root: str | os.PathLike | None = None) -> Path:
    """The ALFWorld data folder (``$ALFWORLD_DATA`` layout) holding ``json_2.1.1/``; unpacks on first use.

    Args:
        root: data root override (``data.root`` config key); ``None`` uses :func:`envs.data.data_root`.

    Raises:
        EnvDataError: (a ``FileNotFoundError``) neither an unpacked game folder nor the archive exists (the message
            names both paths).
    """
    source = data_root(root) / "alfworld"
    if (source / GAMES_DIRNAME).is_dir():  # a real user's download (alfworld-download / envs.fetch layout)
        return source
    home = cache_dir() / "alfworld"
    unpack_archive(source / ARCHIVE_NAME, home)
    _copy_logic_files(home)
    return home


@functools.lru_cache(maxsize=16)
def _list_split(games_dir: str, split: str) -> tuple[str, ...]:
    # As ALFWorld's own loader (AlfredTWEnv.collect_game_files): only the six task types, no sliced objects
    # (a full release download also holds ``pick_and_place_with_movable_recep`` and ``*Sliced*`` trajectories).
    games = []
    for path in Path(games_dir, split).glob(f"*/*/{GAME_FILENAME}"):
        name = path.parent.parent.name
        if name.split("-", 1)[0] in TASK_TYPES and "Sliced" not in name and "movable" not in name:
            games.append(str(path))
    return tuple(sorted(games))


def task_type_of(gamefile: str | os.PathLike) -> str:
    """Task type of a game file, from its folder name ``<task_type>-...`` (e.g. ``"pick_two_obj_and_place"``)."""
    return Path(gamefile).parent.parent.name.split("-", 1)[0]


def check_selection(split: str, task_types: list[str] | tuple[str, ...] | None) -> None:
    """Validate a split name and an optional task-type filter.

    Raises:
        ValueError: unknown split or task type (the message lists the valid names).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; expected one of {list(SPLITS)}")
    if task_types is not None:
        unknown = sorted(set(task_types) - set(TASK_TYPES))
        if unknown:
            raise ValueError(f"unknown ALFWorld task types {unknown}; expected a subset of {list(TASK_TYPES)}")


def list_games(
    split: str, task_types: list[str] | tuple[str, ...] | None = None, root: str | os.PathLike | None = None
) -> list[str]:
    """Absolute paths of the games of ``split``, sorted by path, optionally only the given task types.

    Raises:
        ValueError: unknown split or task type (the message lists the valid names).
        EnvDataError: (a ``FileNotFoundError``) no data (see :func:`games_home`), or no game at all in ``split``:
            the message names the resolved folder and the games per split.
    """
    check_selection(split, task_types)
    games_dir = games_home(root) / GAMES_DIRNAME
    games = _list_split(str(games_dir), split)
    if not games:  # the data is broken (an empty or partial download), not the request
        counts = {s: len(_list_split(str(games_dir), s)) for s in SPLITS}
        raise EnvDataError(f"no ALFWorld games in split {split!r} under {games_dir.resolve()} (games per split: "
                           f"{counts}); run `python -m envs.fetch alfworld` or set $AGENT_RL_DATA / data.root")
    if task_types is None:
        return list(games)
    wanted = set(task_types)
    return [g for g in games if task_type_of(g) in wanted]


def task_id_of(gamefile: str | os.PathLike) -> str:
    """Stable task id: the game folder relative to ``json_2.1.1``, e.g. ``"valid_unseen/pick_..-19/trial_T2019.."``.

    Falls back to the absolute folder path for a game outside any ``json_2.1.1`` tree.
    """
    folder = Path(gamefile).resolve().parent
    parts = folder.parts
    if GAMES_DIRNAME in parts:
        i = len(parts) - 1 - parts[::-1].index(GAMES_DIRNAME)
        return "/".join(parts[i + 1 :])
    return str(folder)
