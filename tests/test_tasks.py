"""agent_rl.task_files.load_tasks: every source kind read by ``datasets`` gives the same rows; errors name file, row, field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from agent_rl.task_files import MAX_JSON_DEPTH, TaskFileError, load_tasks  # noqa: E402

ROWS = [
    {"question": "What is 2+3?", "final": "5", "level": 1},
    {"question": "What is 7*6?", "final": "42", "level": 2},
    {"question": "What is 10-4?", "final": "6", "level": 2},
]
FIELDS = {"problem": "question", "answer": "final"}
MAPPED = [{"problem": r["question"], "answer": r["final"]} for r in ROWS]


def _write(kind: str, tmp_path):
    if kind == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "json":
        path = tmp_path / "t.json"
        path.write_text(json.dumps(ROWS))
    elif kind == "parquet":
        path = tmp_path / "t.parquet"
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    elif kind == "csv":
        path = tmp_path / "t.csv"
        datasets.Dataset.from_list(ROWS).to_csv(str(path), index=False)
    elif kind == "disk":
        path = tmp_path / "saved"
        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    else:  # a DatasetDict with two splits
        path = tmp_path / "saved_dict"
        datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                              "test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "csv", "disk"])
def test_every_source_kind_gives_the_mapped_rows(kind, tmp_path):
    tasks = load_tasks(_write(kind, tmp_path), FIELDS, cache_dir=str(tmp_path / "cache"))
    # CSV has no types: its reader infers them ("5" is read as 5; the env turns an answer into a string)
    assert list(tasks) == ([{**r, "answer": int(r["answer"])} for r in MAPPED] if kind == "csv" else MAPPED)
    assert tasks.columns == ["question", "final", "level"]
    text = tasks.describe()
    assert "3 rows" in text and "question, final, level" in text and "What is 2+3?" in text


def test_no_fields_keeps_every_column_and_split_filter_limit(tmp_path):
    path = _write("dict", tmp_path)
    assert load_tasks(path, split="test") == [ROWS[0]]
    assert load_tasks(path, split="train", filter={"level": 2}) == ROWS[1:]
    assert load_tasks(path, split="train", filter={"level": [1, 2]}, limit=2) == ROWS[:2]
    assert load_tasks(path, split="train", filter=lambda r: r["final"] == "6") == [ROWS[2]]
    kept = load_tasks(path, FIELDS, split="train", filter={"level": 2})
    assert kept.num_rows_read == 3 and "the filter kept these" in kept.describe()
    with pytest.raises(TaskFileError, match="split 'validation' not in the saved dataset; its splits: train, test"):
        load_tasks(path, split="validation")
    with pytest.raises(TaskFileError, match="filter column"):
        load_tasks(path, split="train", filter={"difficulty": 2})
    with pytest.raises(TaskFileError, match="no task left"):
        load_tasks(path, split="train", filter={"level": 9})


def test_split_slice_of_a_file(tmp_path):
    tasks = load_tasks(_write("parquet", tmp_path), FIELDS, split="train[1:]", cache_dir=str(tmp_path / "c"))
    assert list(tasks) == MAPPED[1:]


def test_missing_column_names_file_field_and_columns(tmp_path):
    path = _write("parquet", tmp_path)
    with pytest.raises(TaskFileError) as err:
        load_tasks(path, {"problem": "question", "answer": "answer"}, cache_dir=str(tmp_path / "c"))
    message = str(err.value)
    assert str(path) in message and "'answer'" in message and "its columns: question, final, level" in message
    assert err.value.field == "answer"
    # an optional key whose column is absent is left out
    assert load_tasks(path, {**FIELDS, "solution": "solution"}, optional=["solution"],
                      cache_dir=str(tmp_path / "c")) == MAPPED


def test_unreadable_jsonl_row_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + '{"question": "x", "final": \n' + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl, line 3: unreadable row: not JSON") as err:
        load_tasks(path, FIELDS, cache_dir=str(tmp_path / "c"))
    assert err.value.row == 3


def test_empty_value_names_row_and_field(tmp_path):
    path = tmp_path / "gap.jsonl"
    rows = [ROWS[0], {"question": "q", "final": None, "level": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskFileError, match=r"gap\.jsonl, row 1: no value for task field 'answer' \(column 'final'\)"):
        load_tasks(path, FIELDS, cache_dir=str(tmp_path / "c"))
    # optional: the key is left out of that row only
    tasks = load_tasks(path, {"problem": "question", "answer": "final"}, optional=["answer"],
                       cache_dir=str(tmp_path / "c"))
    assert list(tasks) == [{"problem": "What is 2+3?", "answer": "5"}, {"problem": "q"}]


def test_not_json_serialisable_value_is_refused(tmp_path):
    path = tmp_path / "bin.parquet"
    datasets.Dataset.from_list([{"question": "q", "final": b"\x00\x01"}]).to_parquet(str(path))
    with pytest.raises(TaskFileError, match=r"row 0: task field 'answer' \(column 'final'\) is not JSON"):
        load_tasks(path, FIELDS, cache_dir=str(tmp_path / "c"))


@pytest.mark.parametrize("line,reason", [
    (b'{"question": "caf\xe9", "final": "1"}', r"not UTF-8"),  # latin-1 bytes: datasets failed lazily, unnamed
    (b'{"question": ' + b"[" * 5000 + b"]" * 5000 + b"}", r"JSON nested deeper than 100 levels"),  # RecursionError before
    (b'{"question": "a\\ud800b", "final": "1"}', r"question: lone UTF-16 surrogate U\+D800"),
])
def test_a_broken_jsonl_line_in_the_middle_names_file_line_and_field(tmp_path, line, reason):
    path = tmp_path / "mid.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in ROWS[:2]) + line + b"\n" +
                     json.dumps(ROWS[0]).encode() + b"\n")
    with pytest.raises(TaskFileError, match=r"mid\.jsonl, line 3: unreadable row: " + reason) as err:
        load_tasks(path, FIELDS, cache_dir=str(tmp_path / "c"))
    assert err.value.row == 3


@pytest.mark.parametrize("name,text", [("empty.jsonl", ""), ("blank.jsonl", "\n\n"), ("empty.csv", "")])
def test_an_empty_file_says_so(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)  # before: "unreadable json file: StopIteration: " (csv: "EmptyDataError")
    with pytest.raises(TaskFileError, match=rf"{name}: the file is empty"):
        load_tasks(path, cache_dir=str(tmp_path / "c"))


def test_paths_that_do_not_exist_and_unknown_types(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tasks(tmp_path / "nope.parquet")
    other = tmp_path / "t.txt"
    other.write_text("hello")
    with pytest.raises(TaskFileError, match="unknown task file type '.txt'"):
        load_tasks(other)


def test_a_folder_of_data_files_and_a_hub_name_offline(tmp_path, monkeypatch):
    folder = tmp_path / "hubstyle" / "data"
    folder.mkdir(parents=True)
    datasets.Dataset.from_list(ROWS[:2]).to_parquet(str(folder / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(ROWS[2:]).to_parquet(str(folder / "test-00000-of-00001.parquet"))
    cache = str(tmp_path / "c")
    assert list(load_tasks(tmp_path / "hubstyle", FIELDS, cache_dir=cache)) == MAPPED[:2]  # datasets infers splits
    assert list(load_tasks(tmp_path / "hubstyle", FIELDS, split="test", cache_dir=cache)) == MAPPED[2:]
    # a hub name the machine cannot fetch (offline here): one error naming it, not a traceback from deep inside
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TaskFileError, match="someone/no-such-tasks: neither a local file nor a dataset the hub"):
        load_tasks("someone/no-such-tasks", cache_dir=cache)


# ------------------------------------------------------------------------------------------ nesting depth
_LOAD = ("import sys\nfrom agent_rl.task_files import TaskFileError, load_tasks\ntry:\n"
         "    load_tasks(sys.argv[1], cache_dir=sys.argv[2])\nexcept TaskFileError as exc:\n    print(exc)\n")


def _load_in_child(path, tmp_path) -> subprocess.CompletedProcess:
    """load_tasks in a child process: a reader that segfaults kills the child, not the test run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", _LOAD, str(path), str(tmp_path / "c")], capture_output=True,
                          text=True, timeout=600, env=env)


def test_a_jsonl_line_20000_deep_is_refused_before_any_reader(tmp_path):
    path = tmp_path / "deep.jsonl"
    line = '{"question": ' + "[" * 20_000 + "]" * 20_000 + "}"  # 40 KB; pyarrow's JSON reader segfaulted on it
    path.write_text(line + "\n")
    assert 40_000 <= path.stat().st_size < 41_000
    done = _load_in_child(path, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]  # -11 (SIGSEGV) before
    assert done.stdout.strip() == (f"{path}, line 1: unreadable row: JSON nested deeper than {MAX_JSON_DEPTH} "
                                   "levels (objects and lists)")


@pytest.mark.parametrize("kind", ["jsonl_third_line", "json_pretty", "folder"])
def test_deep_nesting_names_file_and_line_in_every_json_source(kind, tmp_path):
    deep = {"question": "q", "final": "1"}
    for _ in range(MAX_JSON_DEPTH):
        deep = {"a": [deep]}  # 2 * MAX_JSON_DEPTH + 1 levels
    if kind == "jsonl_third_line":
        path, line = tmp_path / "t.jsonl", 3
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]) + json.dumps(deep) + "\n")
    elif kind == "json_pretty":  # one value over many lines: the depth carries over them
        path = tmp_path / "t.json"
        text = json.dumps([ROWS[0], deep], indent=1)
        path.write_text(text)
        line = next(i for i, _ in enumerate(text.splitlines(), 1) if _too_deep_upto(text, i))
    else:
        path, line = tmp_path / "data", 2
        path.mkdir()
        (path / "train.jsonl").write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(deep) + "\n")
    with pytest.raises(TaskFileError, match=rf", line {line}: unreadable row: JSON nested deeper than") as err:
        load_tasks(path, cache_dir=str(tmp_path / "c"))
    assert err.value.row == line and str(path) in str(err.value)
    if kind == "folder":
        assert "(train.jsonl)" in str(err.value)


def _too_deep_upto(text: str, line: int) -> bool:
    """Whether the first ``line`` lines open more than MAX_JSON_DEPTH brackets at once (no strings hold any)."""
    depth = peak = 0
    for ch in "\n".join(text.splitlines()[:line]):
        depth += (ch in "[{") - (ch in "]}")
        peak = max(peak, depth)
    return peak > MAX_JSON_DEPTH


def test_brackets_in_strings_and_depth_at_the_limit_are_read(tmp_path):
    at_limit = "x"
    for _ in range(MAX_JSON_DEPTH - 1):
        at_limit = [at_limit]  # MAX_JSON_DEPTH levels with the row's object
    rows = [{"question": "[" * 5000 + '{\\"' + "{" * 5000, "final": "1"}, {"question": at_limit, "final": "2"}]
    path = tmp_path / "ok.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert list(load_tasks(path, cache_dir=str(tmp_path / "c"))) == rows


# ------------------------------------------------------------------------------------------ nested fields
TOOL_ROWS = [  # two tasks whose tool schemas differ: arrow's struct column holds the union of their keys
    {"question": "q0", "tools": [{"type": "function", "function": {
        "name": "calc", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                       "required": ["expression"]}}}]},
    {"question": "q1", "tools": [
        {"type": "function", "function": {"name": "search", "description": "web search", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "open", "parameters": {"type": "object", "properties": {}}}}]},
]


@pytest.mark.parametrize("kind", ["parquet", "disk", "jsonl", "json"])
def test_nested_fields_come_back_as_written(kind, tmp_path):
    if kind == "parquet":
        path = tmp_path / "t.parquet"
        datasets.Dataset.from_list(TOOL_ROWS).to_parquet(str(path))
    elif kind == "disk":
        path = tmp_path / "saved"
        datasets.Dataset.from_list(TOOL_ROWS).save_to_disk(str(path))
    elif kind == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in TOOL_ROWS))
    else:
        path = tmp_path / "t.json"
        path.write_text(json.dumps(TOOL_ROWS))
    # before: parquet's q0 came back with "description": None and properties query/k: None, q1 with
    # "required": None and expression: None
    assert list(load_tasks(path, cache_dir=str(tmp_path / "c"))) == TOOL_ROWS


def test_a_null_written_in_json_stays(tmp_path):
    rows = [{"question": "q", "meta": {"a": None, "b": [{"c": None}]}}, {"question": "r", "meta": {"d": 1}}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert list(load_tasks(path, cache_dir=str(tmp_path / "c"))) == rows
