"""Loaders for the code benchmarks in ``<data root>/code/`` into one :class:`CodeTask` shape.

- ``humaneval``: tests = the ``check`` function (each top-level assert statement is one test).
- ``humanevalplus``: tests = EvalPlus base + plus inputs compared with the canonical solution's outputs (computed
  once in the sandbox and cached under ``cache_dir()/code``, see :func:`humanevalplus_expected`).
- ``mbpp`` (974 tasks, ``mbpp_ase.jsonl``) and ``mbpp_sanitized`` (427): tests = the ``test_list`` asserts.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.data import cache_dir, dataset_dir

# MBPP (mbpp_ase.jsonl) task ids with a known issue, measured by scripts/check_code_canonical.py.
MBPP_KNOWN_ISSUES: dict[int, str] = {
    123: "reference is correct but slow: amicable_numbers_sum(9999) takes ~13 s, over the default 4 s call limit",
    367: "listed as broken in the data README; passes here (setup builds the program's Node tree via proxies)",
    927: "listed as broken in the data README; passes here (setup builds the program's Node tree via proxies)",
}


@dataclass(frozen=True)
class CodeTask:
    """One task. ``prompt`` is what the model sees (HumanEval: signature + docstring; MBPP: text + tests);
    ``context`` is prepended to the program (HumanEval prompt: imports and helper functions); ``spec`` is the test
    spec for the checker (without HumanEval+ expected outputs, which are attached lazily)."""

    uid: str
    dataset: str
    prompt: str
    entry_point: str
    canonical: str
    context: str
    spec: dict[str, Any] = field(default_factory=dict)
    task_type: str = ""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _humaneval(root: Path) -> list[CodeTask]:
    return [
        CodeTask(r["task_id"], "humaneval", r["prompt"], r["entry_point"], r["prompt"] + r["canonical_solution"],
                 r["prompt"], {"mode": "check", "context": r["prompt"], "test": r["test"],
                               "entry_point": r["entry_point"]}, "humaneval")
        for r in _read_jsonl(root / "HumanEval.jsonl.gz")
    ]


def _humanevalplus(root: Path) -> list[CodeTask]:
    tasks = []
    for r in _read_jsonl(root / "HumanEvalPlus.jsonl.gz"):
        inputs = list(r["base_input"]) + list(r["plus_input"])
        tasks.append(CodeTask(
            r["task_id"], "humanevalplus", r["prompt"], r["entry_point"], r["prompt"] + r["canonical_solution"],
            r["prompt"], {"mode": "io", "context": r["prompt"], "entry_point": r["entry_point"], "inputs": inputs,
                          "atol": float(r.get("atol") or 0)}, "humanevalplus"))
    return tasks


def _mbpp_entry(tests: list[str]) -> str:
    match = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:set\(|math\.isclose\(|abs\()?\s*([A-Za-z_]\w*)\s*\(", tests[0])
    return match.group(1) if match else ""


def _mbpp_prompt(text: str, tests: list[str]) -> str:
    return f"{text}\nYour code should pass these tests:\n\n" + "\n".join(tests)


def _mbpp(root: Path) -> list[CodeTask]:
    tasks = []
    for r in _read_jsonl(root / "mbpp_ase.jsonl"):
        tests = list(r["test_list"])
        tasks.append(CodeTask(
            f"mbpp/{r['task_id']}", "mbpp", _mbpp_prompt(r["text"], tests), _mbpp_entry(tests),
            r["code"].replace("\r\n", "\n"), "",
            {"mode": "asserts", "setup": r.get("test_setup_code") or "", "asserts": tests}, "mbpp"))
    return tasks


def _mbpp_sanitized(root: Path) -> list[CodeTask]:
    with open(root / "sanitized-mbpp.json", encoding="utf-8") as f:
        rows = json.load(f)
    tasks = []
    for r in rows:
        tests = list(r["test_list"])
        tasks.append(CodeTask(
            f"mbpp/{r['task_id']}", "mbpp_sanitized", _mbpp_prompt(r["prompt"], tests), _mbpp_entry(tests),
            r["code"], "", {"mode": "asserts", "setup": "\n".join(r.get("test_imports") or []), "asserts": tests},
            "mbpp_sanitized"))
    return tasks


LOADERS = {"humaneval": _humaneval, "humanevalplus": _humanevalplus, "mbpp": _mbpp, "mbpp_sanitized": _mbpp_sanitized}


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, root: str) -> tuple[CodeTask, ...]:
    return tuple(LOADERS[name](Path(root)))


def load_code(name: str, root: str | os.PathLike | None = None) -> list[CodeTask]:
    """Tasks of dataset ``name`` (humaneval, humanevalplus, mbpp, mbpp_sanitized).

    Raises:
        KeyError: unknown name (the message lists the valid names).
        FileNotFoundError: data root or file missing.
    """
    if name not in LOADERS:
        raise KeyError(f"unknown code dataset {name!r}; valid: {sorted(LOADERS)}")
    return list(_load_cached(name, str(dataset_dir("code", root))))


def expected_cache_path(uid: str) -> Path:
    """Where the HumanEval+ expected outputs of task ``uid`` live (one file per task, ~1 MB on average)."""
    return cache_dir() / "code" / "humanevalplus_expected" / (uid.replace("/", "_") + ".json")


@functools.lru_cache(maxsize=16)
def _read_expected(path: str, mtime: float) -> list[Any]:
    from envs.code import _codec

    with open(path, encoding="utf-8") as f:
        return _codec.decode(f.read())  # codec-encoded outputs back into plain Python values


def humanevalplus_expected(task: CodeTask, build: bool = True) -> list[Any]:
    """Expected outputs of ``task`` (the canonical solution's outputs on every input, EvalPlus' ground truth).

    Computed in the sandbox the first time a task needs them (one sandboxed run of the canonical solution, up to a
    few seconds for the largest tasks) and cached under :func:`expected_cache_path`. Raises RuntimeError if the
    canonical solution fails on some input, KeyError if missing and ``build`` is False.
    """
    path = expected_cache_path(task.uid)
    if path.exists():
        return _read_expected(str(path), path.stat().st_mtime)
    if not build:
        raise KeyError(task.uid)
    from envs.code.sandbox import SandboxLimits, run_tests

    spec = {**task.spec, "mode": "record"}
    result = run_tests(task.canonical, spec, SandboxLimits(wall_s=600, cpu_s=600, call_timeout_s=60))
    if result.load_error or result.outputs is None or not all(t["passed"] for t in result.tests):
        bad = [t for t in result.tests if not t["passed"]][:3]
        raise RuntimeError(f"canonical solution of {task.uid} failed while recording outputs: "
                           f"{result.load_error or bad or result.checker_error}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result.outputs, f, separators=(",", ":"))
    os.replace(tmp, path)
    return _read_expected(str(path), path.stat().st_mtime)
