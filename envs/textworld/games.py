"""TextWorld game families generated offline from fixed seeds into the cache, once, with a manifest.

Families (TextWorld 1.7.0 challenges, the generators ``tw-make`` runs):

- ``coin_collector`` (``tw-coin_collector``, levels 1-300): walk a chain of rooms to the coin and take it. Level
  ``l`` has quest length ``(l - 1) % 100 + 1``; levels 101+ add distractor rooms.
- ``treasure_hunter`` (``tw-treasure_hunter``, levels 1-30): find and take one object; 1-10 easy (5 rooms, no doors),
  11-20 medium (10 rooms, closed doors and containers), 21-30 hard (20 rooms, locked doors, keys).
- ``cooking`` (``tw-cooking``, the First TextWorld Problems family, levels 1-8 of :data:`COOKING_LEVELS`): find the
  kitchen, read the cookbook, fetch the ingredients, cut/cook them as the recipe says, prepare and eat the meal.
  TextWorld's own ``split`` setting is passed through: train games use the training foods and preparations,
  valid/test games also use foods never seen in training (the FTWP protocol).

Determinism: TextWorld's generators iterate over sets of strings, so games depend on Python's hash seed;
generation therefore runs with ``PYTHONHASHSEED=0`` (in a child process when the caller's hash seed is random).

Seeds: game ``index`` of split ``s`` has seed ``SPLIT_SEED_BASE[s] + index`` (train 0.., valid 1,000,000..,
test 2,000,000..; ``index < 1,000,000``), so the splits never share a seed. A seed for which TextWorld finds no
quest (it happens for some treasure-hunter maps) is retried with ``seed + k * 3,000,000`` (same split and index
modulo 3,000,000); ``meta.json`` records the seed used. Generation is deterministic: the same
seed gives byte-identical files on every machine (checked against the hashes of :data:`REFERENCE_SHA256`).

Cache layout (``envs.data.cache_dir()/textworld``, or ``$AGENT_RL_TEXTWORLD_GAMES``)::

    <family>/level_<L>/<split>/<index:06d>/game.z8     the compiled game (Inform 7 -> Z-machine)
                                          /game.json   TextWorld's game description (walkthrough, quests)
                                          /meta.json   family, level, split, index, seed, settings, sha256 of both
                                                       (game.json's without its machine-dependent grammar path)
    <family>/level_<L>/manifest.json                   every generated game of that family/level (meta.json rows)

A game folder is built under a temporary name and renamed into place (readers never see half a game; concurrent
generators of the same game keep the first). ``python -m envs.textworld.games --family cooking --level 3 --split
test --num 50`` generates ahead of time; the env generates a missing game on its first reset (1-4 s).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.generation import TEXTWORLD_MAX_INDEX_ENV, check_new_task, note_new_task
from envs.locks import TEXTWORLD_LOCK as _TEXTWORLD_LOCK

FAMILIES = ("coin_collector", "treasure_hunter", "cooking")
SPLITS = ("train", "valid", "test")
SPLIT_SEED_BASE = {"train": 0, "valid": 1_000_000, "test": 2_000_000}
MAX_INDEX = 1_000_000
MAX_INDEX_ENV = TEXTWORLD_MAX_INDEX_ENV  # where a host bounds the index range generated on demand
DEFAULT_MAX_GENERATED_INDEX = 10_000
LEVEL_RANGE = {"coin_collector": (1, 100), "treasure_hunter": (1, 30), "cooking": (1, 8)}

#: The cooking ladder (level -> ``tw-cooking`` settings), easiest first. ``recipe``: ingredients in the recipe;
#: ``take``: how many of them must be found (the rest start in the inventory); ``go``: rooms (1, 6, 9 or 12);
#: ``open``: closed containers/doors; ``cook``/``cut``: ingredients must be fried/roasted/grilled or
#: chopped/sliced/diced. ``drop`` (limited inventory) is never on: TextWorld's planner finds no policy with it.
COOKING_LEVELS: dict[int, dict[str, Any]] = {
    1: dict(recipe=1, take=1, go=1, open=False, cook=False, cut=False),
    2: dict(recipe=1, take=1, go=1, open=False, cook=False, cut=True),
    3: dict(recipe=1, take=1, go=1, open=True, cook=True, cut=True),
    4: dict(recipe=2, take=2, go=1, open=True, cook=True, cut=True),
    5: dict(recipe=2, take=2, go=6, open=True, cook=True, cut=True),
    6: dict(recipe=3, take=3, go=6, open=True, cook=True, cut=True),
    7: dict(recipe=3, take=3, go=9, open=True, cook=True, cut=True),
    8: dict(recipe=4, take=4, go=12, open=True, cook=True, cut=True),
}

#: Retries of a seed without a quest: attempt a uses seed ``SPLIT_SEED_BASE[split] + index + a * SEED_STRIDE``
#: (so seed mod SEED_STRIDE still identifies split and index: splits never share a seed).
SEED_STRIDE, MAX_ATTEMPTS = 3_000_000, 20

#: TextWorld's logic/grammar parsers (tatsu) are not thread-safe: every use of textworld in a process (generation,
#: loading, playing; ALFWorld's games too) holds this lock (``envs.locks``), so thread-pool envs are safe.
TEXTWORLD_LOCK = _TEXTWORLD_LOCK

GAME_FILE, JSON_FILE, META_FILE, MANIFEST_FILE = "game.z8", "game.json", "meta.json", "manifest.json"

#: sha256 (first 16 hex digits) of ``game.z8`` and ``game.json`` of a few games, as generated with textworld 1.7.0:
#: a changed generator (another textworld version) shows up as a mismatch in ``tests/envs/test_textworld.py``.
REFERENCE_SHA256: dict[tuple[str, int, str, int], tuple[str, str]] = {
    ("coin_collector", 2, "test", 0): ("70178ffda32876f9", "4326dc9b2ad375d0"),
    ("treasure_hunter", 3, "test", 0): ("6c55e128658a53ad", "36fc30dbaa771843"),
    ("cooking", 3, "test", 0): ("a60fcf2163bc26fa", "cecb43ed916a0dc2"),
}


def games_root() -> Path:
    """Root of the generated games: ``$AGENT_RL_TEXTWORLD_GAMES`` or ``envs.data.cache_dir()/textworld``."""
    explicit = os.environ.get("AGENT_RL_TEXTWORLD_GAMES")
    if explicit:
        path = Path(explicit).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path
    from envs.data import cache_dir

    return cache_dir() / "textworld"


def max_generated_index() -> int:
    """Games of index below this are generated on a reset's demand (``$AGENT_RL_TEXTWORLD_MAX_INDEX``, the env
    server's ``--textworld-max-index``; default :data:`DEFAULT_MAX_GENERATED_INDEX`); beyond, only games already in
    the cache are played."""
    raw = os.environ.get(MAX_INDEX_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_GENERATED_INDEX
    try:
        return max(0, min(int(raw), MAX_INDEX))
    except ValueError:
        raise ValueError(f"${MAX_INDEX_ENV} must be an integer, got {raw!r}") from None


def check_family_level(family: str, level: int) -> None:
    """Raise ``ValueError`` (naming the valid values) for an unknown family or a level out of its range."""
    if family not in FAMILIES:
        raise ValueError(f"unknown TextWorld family {family!r}; valid: {', '.join(FAMILIES)}")
    if isinstance(level, bool) or not isinstance(level, int):
        raise ValueError(f"level must be an integer, got {level!r}")
    lo, hi = LEVEL_RANGE[family]
    if not lo <= level <= hi:
        raise ValueError(f"{family} level must be in [{lo}, {hi}], got {level}")


def check_split_index(split: str, index: int) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown TextWorld split {split!r}; valid: {', '.join(SPLITS)}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_INDEX:
        raise ValueError(f"index must be an integer in [0, {MAX_INDEX}), got {index!r}")


def game_seed(split: str, index: int) -> int:
    """Generator seed of game ``index`` of ``split`` (disjoint ranges per split)."""
    check_split_index(split, index)
    return SPLIT_SEED_BASE[split] + index


def settings_of(family: str, level: int, split: str, seed: int) -> dict[str, Any]:
    """The ``settings`` dict the family's TextWorld ``make`` receives."""
    check_family_level(family, level)
    if family == "cooking":
        return dict(COOKING_LEVELS[level], drop=False, recipe_seed=seed, split=split)
    return {"level": level}


def task_type_of(family: str, level: int) -> str:
    """``info["task_type"]``: family and level, e.g. ``coin_collector_level5``."""
    return f"{family}_level{level}"


def game_dir(family: str, level: int, split: str, index: int, root: Path | None = None) -> Path:
    check_family_level(family, level)
    check_split_index(split, index)
    return (root or games_root()) / family / f"level_{level}" / split / f"{index:06d}"


# Z-machine header bytes 0x12..0x17: the serial number, which Inform sets to the compile date (YYMMDD).
_Z_SERIAL = slice(0x12, 0x18)


def _masked_sha256(path: Path, data: bytes) -> str:
    """sha256 hex digest of ``data`` (the bytes of ``path``) with a Z-machine file's serial zeroed."""
    if Path(path).suffix.startswith(".z") and len(data) >= 0x40:
        masked = bytearray(data)
        masked[_Z_SERIAL] = b"000000"
        data = bytes(masked)
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """sha256 of a compiled game without its serial number (the Z-machine header's compile date, so the same seed
    gives the same hash on any day; a test recorded on 2026-11-30 failed on 2026-12-01). Other files: plain sha256."""
    return _masked_sha256(path, Path(path).read_bytes())


def game_json_sha256(path: Path) -> str:
    """sha256 of TextWorld's ``game.json`` without what depends on the machine: ``KB.text_grammars_path`` is the
    absolute path of textworld's installed grammar files (it differs between virtual environments, the game does
    not). Canonical JSON (sorted keys) of the rest."""
    data = json.loads(Path(path).read_text())
    if isinstance(data.get("KB"), dict):
        data["KB"].pop("text_grammars_path", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class GameRecord:
    """One generated game: where it is and its ``meta.json``."""

    path: Path  # the game.z8
    meta: dict[str, Any]


def _generate_into(folder: Path, family: str, level: int, split: str, index: int) -> dict[str, Any]:
    """Generate the game into ``folder`` (an empty directory); return its meta dict."""
    import textworld
    import textworld.challenges
    from textworld.generator.game import GameOptions

    from textworld.generator import QuestGenerationError

    t0 = time.perf_counter()
    _, make, _ = textworld.challenges.CHALLENGES[f"tw-{family}"]
    for attempt in range(MAX_ATTEMPTS):
        # Some seeds give a map where no quest of the level's length exists (TextWorld raises and asks for another
        # seed): retry with the next seed of this game's own sequence, which stays in the split's residue class.
        seed = game_seed(split, index) + attempt * SEED_STRIDE
        settings = settings_of(family, level, split, seed)
        options = GameOptions()
        options.seeds = seed
        options.path = str(folder / GAME_FILE)
        options.file_ext = ".z8"
        options.force_recompile = True
        try:
            with TEXTWORLD_LOCK:
                game = make(settings, options)
                textworld.generator.compile_game(game, options)
            break
        except QuestGenerationError:
            if attempt == MAX_ATTEMPTS - 1:
                raise
    for leftover in folder.glob("game.ni"):  # the Inform 7 source: not needed to play
        leftover.unlink()
    return {
        "family": family, "level": level, "split": split, "index": index, "seed": seed, "attempt": attempt,
        "settings": settings,
        "task_type": task_type_of(family, level), "walkthrough": list(game.metadata.get("walkthrough") or []),
        "sha256": sha256_file(folder / GAME_FILE), "json_sha256": game_json_sha256(folder / JSON_FILE),
        "textworld_version": textworld.__version__, "generate_s": round(time.perf_counter() - t0, 3),
    }


def _hash_seed_fixed() -> bool:
    """True when this process's ``str`` hashes are not randomised (``PYTHONHASHSEED=0``)."""
    return os.environ.get("PYTHONHASHSEED") == "0"


def _build_one(family: str, level: int, split: str, index: int, root: Path) -> None:
    """Generate one game into its folder (atomically); call only with ``PYTHONHASHSEED=0``."""
    target = game_dir(family, level, split, index, root)
    if (target / META_FILE).is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        meta = _generate_into(tmp, family, level, split, index)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished the same game first: keep its copy
            if not (target / META_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build(specs: list[tuple[str, int, str, int]], root: Path) -> None:
    """Generate the games of ``specs`` that are missing under ``root``.

    TextWorld's generators iterate over sets of strings, so the games depend on Python's hash seed: generation runs
    with ``PYTHONHASHSEED=0`` (here when this process has it, else in one child process for all of ``specs``), which
    makes a seed give byte-identical games in every process and on every machine.

    Raises:
        RuntimeError: generation failed (the child's error output is in the message).
    """
    missing = [s for s in specs if not (game_dir(*s, root) / META_FILE).is_file()]
    if not missing:
        return
    if _hash_seed_fixed():
        for spec in missing:
            _build_one(*spec, root)
        return
    from envs.data import REPO_ROOT

    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "envs.textworld.games", "--build", json.dumps(missing), "--root", str(root)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"TextWorld game generation failed ({missing[:3]}...):\n{proc.stderr[-3000:]}")


def ensure_game(family: str, level: int, split: str, index: int, root: Path | None = None) -> GameRecord:
    """The game ``index`` of ``split`` for ``family``/``level``, generated into the cache if missing.

    Raises:
        ValueError: unknown family / level / split / index, or a missing game of index beyond
            :func:`max_generated_index`.
        envs.generation.NewTaskRefused: a missing game, and this request may generate none (its client's quota).
        RuntimeError: generation failed.
    """
    root = root or games_root()
    target = game_dir(family, level, split, index, root)
    if not (target / META_FILE).is_file():  # generated on demand: bounded (index range, the client's quota)
        limit = max_generated_index()
        if index >= limit:
            raise ValueError(f"TextWorld game {index} of split {split} is not generated, and games of index >= "
                             f"{limit} are not generated on demand (${MAX_INDEX_ENV}; python -m "
                             "envs.textworld.games generates ahead of time)")
        check_new_task(f"TextWorld game {family}/level_{level}/{split}/{index}")
        _build([(family, level, split, index)], root)
        note_new_task()
    meta = json.loads((target / META_FILE).read_text())
    return GameRecord(target / GAME_FILE, meta)


def verify_game(record: GameRecord) -> None:
    """Raise ``RuntimeError`` when the game file's sha256 differs from its ``meta.json``."""
    data = record.path.read_bytes()
    recorded, actual = record.meta["sha256"], _masked_sha256(record.path, data)
    if actual == recorded:
        return
    if hashlib.sha256(data).hexdigest() == recorded:  # meta.json from before the serial mask
        return
    raise RuntimeError(f"TextWorld game {record.path} is corrupt (sha256 {actual[:16]} != recorded "
                       f"{recorded[:16]}); delete {record.path.parent} to regenerate it")


def manifest(family: str, level: int, root: Path | None = None) -> list[dict[str, Any]]:
    """``meta.json`` rows of every generated game of ``family``/``level`` (sorted by split, index)."""
    check_family_level(family, level)
    base = (root or games_root()) / family / f"level_{level}"
    rows = [json.loads(p.read_text()) for p in sorted(base.glob(f"*/[0-9]*/{META_FILE}"))]
    return sorted(rows, key=lambda m: (SPLITS.index(m["split"]), m["index"]))


def write_manifest(family: str, level: int, root: Path | None = None) -> Path:
    """Write ``<family>/level_<L>/manifest.json`` (atomically) from the games' ``meta.json``; returns its path."""
    rows = manifest(family, level, root)
    base = (root or games_root()) / family / f"level_{level}"
    base.mkdir(parents=True, exist_ok=True)
    keep = ("family", "level", "split", "index", "seed", "attempt", "settings", "sha256", "json_sha256",
            "textworld_version")
    text = json.dumps({"games": [{k: m.get(k) for k in keep} for m in rows]}, indent=1)
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_FILE}.tmp-", dir=base)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, base / MANIFEST_FILE)
    return base / MANIFEST_FILE


def generate(family: str, level: int, split: str, num: int, start: int = 0,
             root: Path | None = None) -> list[GameRecord]:
    """Games ``start .. start+num-1`` of ``split`` (generated where missing), then the manifest rewritten."""
    root = root or games_root()
    _build([(family, level, split, i) for i in range(start, start + num)], root)
    records = [ensure_game(family, level, split, i, root) for i in range(start, start + num)]
    write_manifest(family, level, root)
    return records


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m envs.textworld.games", description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=FAMILIES)
    p.add_argument("--level", type=int)
    p.add_argument("--build", help=argparse.SUPPRESS)  # internal: JSON list of [family, level, split, index]
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--split", choices=SPLITS, default="test")
    p.add_argument("--num", type=int, default=50)
    p.add_argument("--start", type=int, default=0)
    args = p.parse_args(argv)
    if args.build:
        if not _hash_seed_fixed():
            p.error("--build needs PYTHONHASHSEED=0")
        for family, level, split, index in json.loads(args.build):
            _build_one(family, int(level), split, int(index), Path(args.root))
        return
    if args.family is None or args.level is None:
        p.error("--family and --level are required")
    t0 = time.perf_counter()
    records = generate(args.family, args.level, args.split, args.num, args.start)
    print(f"{len(records)} games of {args.family} level {args.level} ({args.split}) under "
          f"{records[0].path.parent.parent if records else games_root()} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
