"""Task files: a user's own tasks read with Hugging Face ``datasets`` (the one task loader of the project).

:func:`load_tasks` reads JSONL, JSON, parquet, CSV, a folder written by ``Dataset.save_to_disk`` /
``DatasetDict.save_to_disk``, a folder of such files, or a hub name (where the machine can reach the hub), keeps
the rows of a split that pass a filter, and maps columns onto a task's keys (``fields``: ``{task key: column}``).
What it returns is a :class:`TaskList` (a ``list`` of plain, JSON-serialisable dicts) that also knows its source,
its columns and how to print itself (row count, columns, first row).

Errors name the file, the row and the field (:class:`TaskFileError`, a ``ValueError``): a missing column lists the
file's columns, an unreadable JSONL line names its line, a row without a value for a required key names its row.
Rows are 0-based positions in the split as read (``ds[i]``); JSONL lines are 1-based line numbers. A JSON/JSONL
file nested deeper than :data:`MAX_JSON_DEPTH` is refused (file and line named) before any reader parses it.
Nested fields come back as written: the ``None`` keys arrow adds to a struct for the keys of other rows are dropped
(:func:`_as_written`).

The rows are content, never paths: the trainer sends a row as an env's reset options (``envs.math``,
``envs.code``, any gym env), so a file's tasks reach a remote env server whose clients may not name host paths.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from envs.hosting.jsonable import lone_surrogate

__all__ = ["FILE_BUILDERS", "TaskFileError", "TaskList", "load_tasks"]

FILE_BUILDERS: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File suffix -> the ``datasets`` builder that reads it."""

MAX_SHOWN_CHARS = 400
""":meth:`TaskList.describe` cuts the printed first row at this many characters."""

MAX_JSON_DEPTH = 100
"""The deepest nesting of objects and lists a JSON/JSONL task file may hold (a tool schema is under 20), checked
line by line before any reader parses the file: pyarrow's JSON reader, which ``datasets`` uses, dies with a
segfault on a line nested 20,000 deep, and Python's ``json`` stops near 1,000."""


class TaskFileError(ValueError):
    """A task source that cannot be read or mapped; the message names the source, and the row and field if any."""

    def __init__(self, message: str, *, source: str, row: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.source, self.row, self.field = source, row, field


class TaskList(list):
    """The tasks (a list of dicts) plus where they came from: ``source``, ``split``, ``columns`` (the source's
    columns before mapping) and ``num_rows_read`` (rows of the split before the filter)."""

    def __init__(self, rows: list[dict[str, Any]], *, source: str, split: str | None, columns: list[str],
                 num_rows_read: int) -> None:
        super().__init__(rows)
        self.source, self.split, self.columns, self.num_rows_read = source, split, list(columns), num_rows_read

    def describe(self, max_chars: int = MAX_SHOWN_CHARS) -> str:
        """Three lines for the start of a run: row count (and how many the filter kept), columns, first row."""
        split = f" (split {self.split})" if self.split else ""
        kept = "" if len(self) == self.num_rows_read else f" (of {self.num_rows_read} read; the filter kept these)"
        first = json.dumps(self[0], ensure_ascii=False) if self else "(none)"
        if len(first) > max_chars:
            first = first[:max_chars] + f"... ({len(first)} chars)"
        return (f"tasks: {len(self)} rows from {self.source}{split}{kept}\n"
                f"  columns: {', '.join(self.columns)}\n  first row: {first}")


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars while reading (one line per split and file otherwise); restored afterwards."""
    from datasets.utils import disable_progress_bars, enable_progress_bars, is_progress_bar_enabled

    was = is_progress_bar_enabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if was:
            enable_progress_bars()


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[][{}]")


def _too_deep(path: Path, limit: int = MAX_JSON_DEPTH) -> tuple[int, int] | None:
    """``(1-based line, depth)`` of the first line of a JSON or JSONL file where the nesting of objects and lists
    passes ``limit`` (brackets inside strings do not count; the depth carries over lines, as a pretty-printed
    ``.json`` needs, and a JSONL line that leaves brackets open is refused by the reader anyway); None if none
    does. Reads the file as bytes without parsing it; linear, and a line with at most ``limit - depth`` opening
    brackets is passed on a count alone."""
    depth = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            opens = line.count(b"{") + line.count(b"[")
            if not opens and not depth:
                continue
            if b'"' in line:
                line = _STRING.sub(b"", line)
                opens = line.count(b"{") + line.count(b"[")
            if depth + opens <= limit:
                depth = max(0, depth + opens - line.count(b"}") - line.count(b"]"))
                continue
            for match in _BRACKET.finditer(line):
                depth = depth + 1 if match.group() in (b"{", b"[") else max(0, depth - 1)
                if depth > limit:
                    return number, depth
    return None


def _check_depth(source: str, path: Path) -> None:
    """Refuse a JSON/JSONL file (or such files in a folder) nested deeper than :data:`MAX_JSON_DEPTH`: a
    :class:`TaskFileError` naming the file and line."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    for file in files:
        if FILE_BUILDERS.get(file.suffix.lower()) != "json":
            continue
        found = _too_deep(file)
        if found is not None:
            name = source if file == path else f"{source} ({file.relative_to(path)})"
            raise TaskFileError(f"{name}, line {found[0]}: unreadable row: JSON nested deeper than "
                                f"{MAX_JSON_DEPTH} levels (objects and lists)", source=source, row=found[0])


def _first_bad_jsonl_line(path: Path) -> tuple[int, str] | None:
    """(1-based line, reason) of the first line of a JSONL file that is not a JSON object of text: not UTF-8, not
    JSON, nested too deeply for the parser, not an object, or holding a lone UTF-16 surrogate (the field named);
    None if all are fine."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM may open the file
            except UnicodeDecodeError as exc:
                return number, f"not UTF-8 text (byte {exc.start} of the line: {exc.reason})"
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except RecursionError:
                return number, "nested deeper than the JSON parser reads"
            except ValueError as exc:
                return number, f"not JSON ({exc})"
            if not isinstance(value, dict):
                return number, f"a JSON {type(value).__name__}, not an object"
            found = lone_surrogate(value, "")
            if found:
                return number, found
    return None


def _bad_line(source: str, path: Path) -> TaskFileError | None:
    """The error naming the first bad line of a JSONL task file (:func:`_first_bad_jsonl_line`); None for other
    sources or when every line reads."""
    bad = _first_bad_jsonl_line(path) if path.is_file() and path.suffix.lower() == ".jsonl" else None
    if bad is None:
        return None
    return TaskFileError(f"{source}, line {bad[0]}: unreadable row: {bad[1]}", source=source, row=bad[0])


def _is_saved_dataset(path: Path) -> bool:
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _read(source: str, split: str | None, cache_dir: str | None):
    """The ``datasets.Dataset`` of ``source``'s split (see :func:`load_tasks`)."""
    import datasets  # deferred: the trainer side's optional dependency (pyarrow, pandas)

    path = Path(source).expanduser()
    _check_depth(source, path)  # before any reader: pyarrow's JSON reader crashes on deep nesting
    if path.is_dir() and _is_saved_dataset(path):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split is None and len(loaded) == 1:
                return next(iter(loaded.values()))
            if split not in loaded:
                raise TaskFileError(f"{source}: split {split!r} not in the saved dataset; its splits: "
                                    f"{', '.join(loaded)}", source=source)
            return loaded[split]
        if split not in (None, "train"):
            raise TaskFileError(f"{source}: a saved Dataset has one split (no {split!r}); drop the split",
                                source=source)
        return loaded
    if path.is_file():
        builder = FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise TaskFileError(f"{source}: unknown task file type {path.suffix!r}; valid: "
                                f"{', '.join(FILE_BUILDERS)}, a save_to_disk folder or a hub name", source=source)
        try:
            return datasets.load_dataset(builder, data_files=str(path), split=split or "train", cache_dir=cache_dir)
        except (TaskFileError, FileNotFoundError):
            raise
        except Exception as exc:  # datasets wraps pyarrow's parse errors in its own; find the line ourselves
            if path.stat().st_size < 4096 and not path.read_bytes().strip():
                raise TaskFileError(f"{source}: the file is empty", source=source) from None
            bad = _bad_line(source, path)
            if bad is not None:
                raise bad from None
            cause = exc.__cause__ or exc
            raise TaskFileError(f"{source}: unreadable {builder} file: {type(cause).__name__}: {cause}",
                                source=source) from exc
    if path.is_dir():  # a folder of data files (data/train-*.parquet, ...): datasets infers the splits
        return datasets.load_dataset(str(path), split=split or "train", cache_dir=cache_dir)
    if path.suffix.lower() in FILE_BUILDERS or source.startswith((".", "/", "~")) or os.sep + os.sep in source:
        raise FileNotFoundError(f"task file {source} does not exist")
    try:  # a hub name ("owner/name")
        return datasets.load_dataset(source, split=split or "train", cache_dir=cache_dir)
    except Exception as exc:
        raise TaskFileError(f"{source}: neither a local file nor a dataset the hub could serve here "
                            f"({type(exc).__name__}: {exc})", source=source) from exc


def _rows(ds: Any, source: str) -> Iterator[dict[str, Any]]:
    """The rows of ``ds`` in order; text ``datasets`` cannot decode (not UTF-8: arrow reads it lazily, row by row) is
    a :class:`TaskFileError` naming the JSONL line, else the row."""
    rows = iter(ds)
    i = 0
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            bad = _bad_line(source, Path(source).expanduser())
            if bad is not None:
                raise bad from None
            raise TaskFileError(f"{source}, row {i}: text that is not UTF-8 ({exc.reason})", source=source,
                                row=i) from None
        yield row
        i += 1


def _as_written(value: Any, feature: Any) -> Any:
    """``value`` without the keys arrow added: a struct column (parquet, a saved dataset) holds the union of its
    rows' keys, and a row gets ``None`` for each key it did not have (one tool's schema picks up every other tool's
    properties). Arrow cannot tell such a key from one written as null, so a struct key whose value is ``None`` is
    dropped, at every depth (structs in lists too); values of ``Json`` features (how ``datasets`` reads differing
    JSON objects) and plain values come back as they are."""
    if isinstance(feature, dict) and isinstance(value, dict):
        return {k: _as_written(v, feature.get(k)) for k, v in value.items() if v is not None}
    inner = getattr(feature, "feature", None)  # List / LargeList / Sequence: the items' feature
    if inner is not None and isinstance(value, list):
        return [_as_written(v, inner) for v in value]
    return value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _matches(row: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:
    for column, wanted in filter.items():
        allowed = wanted if isinstance(wanted, (list, tuple, set, frozenset)) else (wanted,)
        if row[column] not in allowed:
            return False
    return True


def load_tasks(
    source: str | os.PathLike,
    fields: Mapping[str, str] | None = None,
    split: str | None = None,
    filter: Mapping[str, Any] | Callable[[dict[str, Any]], bool] | None = None,
    *,
    optional: Collection[str] = (),
    limit: int | None = None,
    cache_dir: str | None = None,
) -> TaskList:
    """The tasks of a file, saved dataset or hub dataset, one dict per kept row.

    Args:
        source: a ``.jsonl``/``.json``/``.parquet``/``.csv`` file, a ``save_to_disk`` folder, a folder of data
            files, or a hub name (read where the hub is reachable; ``HF_DATASETS_OFFLINE=1`` reads the local cache).
        fields: ``{task key: column}``; each returned dict holds exactly these keys (a key left out of the mapping
            is not read). None: every column under its own name.
        split: the split to read (``train`` when None; a saved ``DatasetDict`` with one split needs none; file
            sources also take ``datasets``' slices, ``train[:100]``).
        filter: ``{column: value or list of values}`` (a row is kept when each column holds one of them), or a
            callable ``row -> bool`` on the source's row; applied before the mapping.
        optional: task keys whose column may be absent (the key is then left out of every row) or empty in a row
            (left out of that row); every other key needs its column and a value in every kept row. ``"*"``: every
            key (rows with different keys: each row keeps the keys it has a value for).
        limit: keep at most this many rows (after the filter).
        cache_dir: ``datasets``' cache (default ``~/.cache/huggingface/datasets``).

    Returns:
        A :class:`TaskList` of dicts whose values are JSON-serialisable (an env's reset options, over HTTP too).

    Raises:
        FileNotFoundError: a path that does not exist.
        TaskFileError: unknown file type, unreadable file or row (the JSONL line), a split or a column the source
            does not have (the message lists those it has), a row without a value for a required key, a value that
            is not JSON-serialisable (the row and key are named), no row left after the filter.
    """
    source = os.fspath(source)
    with _quiet_datasets():
        ds = _read(source, split, cache_dir)
    columns = list(ds.column_names)
    mapping = dict(fields) if fields is not None else {c: c for c in columns}
    optional = set(mapping) if isinstance(optional, str) and optional == "*" else set(optional)
    unknown_filter = sorted(set(filter) - set(columns)) if isinstance(filter, Mapping) else []
    if unknown_filter:
        raise TaskFileError(f"{source}: filter column(s) {unknown_filter} not in the source; its columns: "
                            f"{', '.join(columns)}", source=source, field=unknown_filter[0])
    for key, column in mapping.items():
        if column not in columns and key not in optional:
            raise TaskFileError(f"{source}: no column {column!r} for task field {key!r}; its columns: "
                                f"{', '.join(columns)}", source=source, field=key)
    mapping = {k: c for k, c in mapping.items() if c in columns}
    rows: list[dict[str, Any]] = []
    for i, row in enumerate(_rows(ds, source)):
        if filter is not None and not (filter(row) if callable(filter) else _matches(row, filter)):
            continue
        task: dict[str, Any] = {}
        for key, column in mapping.items():
            value = _as_written(row[column], ds.features.get(column))
            if _missing(value):
                if key in optional:
                    continue
                raise TaskFileError(f"{source}, row {i}: no value for task field {key!r} (column {column!r})",
                                    source=source, row=i, field=key)
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TaskFileError(f"{source}, row {i}: task field {key!r} (column {column!r}) is not "
                                    f"JSON-serialisable ({exc})", source=source, row=i, field=key) from None
            task[key] = value
        rows.append(task)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise TaskFileError(f"{source}: no task left (read {len(ds)} rows"
                            f"{', the filter kept none' if filter is not None else ''})", source=source)
    return TaskList(rows, source=source, split=split, columns=columns, num_rows_read=len(ds))
