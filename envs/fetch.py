"""Fetch the data sets for real users: ``python -m envs.fetch alfworld`` (or ``all``).

Downloads land in ``cache_dir()/data/<name>/``, which :func:`envs.data.data_root` picks up automatically (after
``$AGENT_RL_DATA``). Never called by tests: they use the workplace's data (``../shared/data``).

- ``alfworld``: ALFWorld's release archives, the same URLs as ALFWorld's own ``alfworld-download``: the TextWorld
  games (``json_2.1.2_tw-pddl.zip``: ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl``) and the ALFRED trajectory
  files (``json_2.1.1_json.zip``: ``traj_data.json`` beside each game), unzipped into ``cache_dir()/data/alfworld``
  (the ``$ALFWORLD_DATA`` layout), plus ``logic/alfred.pddl`` and ``logic/alfred.twl2`` from the alfworld package.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

from envs.data import cache_dir

# name -> function(dest: Path, force: bool) -> None. One signature for every fetcher.
FETCHERS: dict[str, Callable[[Path, bool], None]] = {}


def register_fetcher(name: str) -> Callable[[Callable[[Path, bool], None]], Callable[[Path, bool], None]]:
    """Decorator: register ``fn(dest, force)`` as the fetcher of data set ``name`` (duplicates raise ``ValueError``)."""

    def decorator(fn: Callable[[Path, bool], None]) -> Callable[[Path, bool], None]:
        if name in FETCHERS:
            raise ValueError(f"a fetcher for {name!r} is already registered")
        FETCHERS[name] = fn
        return fn

    return decorator


def download(url: str, dest: Path, force: bool = False) -> Path:
    """Download ``url`` to the file ``dest`` (via a temporary file, renamed when complete); returns ``dest``."""
    if dest.exists() and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=".download-", delete=False) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (fixed https URLs)
                total = int(response.headers.get("Content-Length") or 0)
                done = 0
                while chunk := response.read(1 << 20):
                    tmp.write(chunk)
                    done += len(chunk)
                    if total:
                        print(f"\r{dest.name}: {done / 1e6:.0f}/{total / 1e6:.0f} MB", end="", file=sys.stderr)
            print(file=sys.stderr)
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise
    Path(tmp.name).replace(dest)
    return dest


def unzip(archive: Path, dest: Path, force: bool = False) -> int:
    """Extract ``archive`` into ``dest``, skipping existing files unless ``force``; returns files written."""
    written = 0
    root = dest.resolve()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.infolist():
            target = (dest / member.filename).resolve()
            if not target.is_relative_to(root):
                raise ValueError(f"unsafe path in {archive.name}: {member.filename}")
            if member.is_dir() or (target.exists() and not force):
                continue
            zf.extract(member, dest)
            written += 1
    return written


ALFWORLD_URLS = (
    # TextWorld games (game.tw-pddl), as in alfworld-download (alfworld 0.4.2, TW_PDDL_FILES_URL).
    "https://github.com/alfworld/alfworld/releases/download/0.4.0/json_2.1.2_tw-pddl.zip",
    # ALFRED trajectory annotations (traj_data.json), as in alfworld-download (JSON_FILES_URL).
    "https://github.com/alfworld/alfworld/releases/download/0.2.2/json_2.1.1_json.zip",
)


@register_fetcher("alfworld")
def fetch_alfworld(dest: Path, force: bool = False) -> None:
    """Download and unzip ALFWorld's games into ``dest`` (``$ALFWORLD_DATA`` layout) and copy the logic files."""
    import importlib.util

    dest.mkdir(parents=True, exist_ok=True)
    for url in ALFWORLD_URLS:
        archive = download(url, dest / url.rsplit("/", 1)[-1], force=force)
        print(f"{archive.name}: {unzip(archive, dest, force=force)} files extracted", file=sys.stderr)
        archive.unlink()
    spec = importlib.util.find_spec("alfworld")
    if spec is not None and spec.submodule_search_locations:
        package_data = Path(next(iter(spec.submodule_search_locations))) / "data"
        (dest / "logic").mkdir(exist_ok=True)
        for name in ("alfred.pddl", "alfred.twl2"):
            if force or not (dest / "logic" / name).exists():
                shutil.copyfile(package_data / name, dest / "logic" / name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fetch data sets into the agent_rl cache (cache_dir()/data).")
    parser.add_argument("names", nargs="+", help=f"data sets: {sorted(FETCHERS)} or 'all'")
    parser.add_argument("-f", "--force", action="store_true", help="download and overwrite again")
    args = parser.parse_args(argv)
    names = sorted(FETCHERS) if "all" in args.names else args.names
    unknown = [n for n in names if n not in FETCHERS]
    if unknown:
        parser.error(f"no fetcher for {unknown}; known: {sorted(FETCHERS)} or 'all'")
    for name in names:
        dest = cache_dir() / "data" / name
        print(f"fetching {name} into {dest}", file=sys.stderr)
        FETCHERS[name](dest, args.force)


if __name__ == "__main__":
    main()
