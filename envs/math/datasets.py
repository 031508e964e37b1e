"""Loaders for the math benchmarks in ``<data root>/math/`` (field names differ per file; see its README).

Every loader returns a list of :class:`MathProblem` with the same fields, so the env never branches on a name.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from envs.data import dataset_dir
from envs.math.grader import last_boxed


@dataclass(frozen=True)
class MathProblem:
    """One problem. ``answer`` is the bare reference answer (no ``\\boxed``); ``solution`` the worked solution
    when the file has one (else ""); ``task_type`` the per-type key for success rates (subject / type / year)."""

    uid: str
    problem: str
    answer: str
    solution: str = ""
    task_type: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _read_json(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def answer_str(value: Any) -> str:
    """27.0 -> "27"; strings stripped (AMC stores floats, AIME strings; a task file's numbers too)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def gsm8k_final(answer_field: str) -> str:
    """GSM8K's final answer: the text after ``####``, thousands separators removed."""
    return answer_field.rsplit("####", 1)[1].strip().replace(",", "")


def _gsm8k(root: Path, split: str) -> list[MathProblem]:
    rows = _read_jsonl(root / f"gsm8k_{split}.jsonl")
    return [
        MathProblem(f"gsm8k/{split}/{i}", r["question"], gsm8k_final(r["answer"]), r["answer"], "gsm8k")
        for i, r in enumerate(rows)
    ]


def _math500(root: Path, split: str) -> list[MathProblem]:
    rows = _read_jsonl(root / "math500.jsonl")
    return [
        MathProblem(
            r["unique_id"], r["problem"], r["answer"], r["solution"], r["subject"], {"level": int(r["level"])}
        )
        for r in rows
    ]


def _math_train(root: Path, split: str) -> list[MathProblem]:
    rows = _read_json(root / "math_train_deepscaler.json")
    return [
        MathProblem(f"math_train/{i}", r["problem"], answer_str(r["answer"]), "", r.get("type", ""),
                    {"difficulty": r.get("difficulty")})
        for i, r in enumerate(rows)
    ]


def _aime_1983_2023(root: Path, split: str) -> list[MathProblem]:
    rows = _read_json(root / "aime_1983_2023_deepscaler.json")
    return [
        MathProblem(
            f"aime/{r['year']}/{r['aime_number']}/{r['problem_number']}", r["problem"], answer_str(r["answer"]),
            r.get("solution", ""), f"aime{r['year']}",
        )
        for r in rows
    ]


def _simple(filename: str, task_type: str) -> Callable[[Path, str], list[MathProblem]]:
    def load(root: Path, split: str) -> list[MathProblem]:
        rows = _read_jsonl(root / filename)
        return [
            MathProblem(
                f"{task_type}/{r.get('id', i)}", r.get("problem") or r["question"], answer_str(r["answer"]),
                r.get("solution", "") or "", task_type,
            )
            for i, r in enumerate(rows)
        ]

    return load


def _minerva(root: Path, split: str) -> list[MathProblem]:
    rows = _read_jsonl(root / "minerva_math.jsonl")
    out = []
    for r in rows:  # no answer field: the reference is the last \boxed{} of the solution
        answer = last_boxed(r["solution"])
        if answer is None:
            raise ValueError(f"minerva_math idx {r['idx']} has no \\boxed answer")
        out.append(MathProblem(f"minerva/{r['idx']}", r["problem"], answer, r["solution"], "minerva"))
    return out


def _olympiadbench(root: Path, split: str) -> list[MathProblem]:
    rows = _read_jsonl(root / "olympiadbench.jsonl")
    out = []
    for r in rows:
        # final_answer is a list of "$...$" strings; several answers are joined as a tuple-like list
        answers = [a.strip().strip("$").strip() for a in r["final_answer"]]
        solution = "\n".join(r["solution"]) if isinstance(r["solution"], list) else (r["solution"] or "")
        problem = r["question"] if not r.get("context") else f"{r['context']}\n\n{r['question']}"
        out.append(
            MathProblem(
                f"olympiadbench/{r['id']}", problem, ", ".join(answers), solution, r.get("subfield") or "olympiad",
                {"answer_type": r.get("answer_type"), "unit": r.get("unit"),
                 "is_multiple_answer": bool(r.get("is_multiple_answer"))},
            )
        )
    return out


# name -> (loader, splits). Datasets without a train split serve their one split under every name.
LOADERS: dict[str, Callable[[Path, str], list[MathProblem]]] = {
    "gsm8k": _gsm8k,
    "math500": _math500,
    "math_train": _math_train,
    "aime": _aime_1983_2023,
    "aime24": _simple("aime24.jsonl", "aime24"),
    "aime25": _simple("aime25.jsonl", "aime25"),
    "amc23": _simple("amc23.jsonl", "amc23"),
    "minerva": _minerva,
    "olympiadbench": _olympiadbench,
}
SPLITS: dict[str, tuple[str, ...]] = {"gsm8k": ("train", "test")}
# file-stem spellings accepted as well (configs may name the file)
ALIASES: dict[str, str] = {"math_train_deepscaler": "math_train", "aime_1983_2023": "aime",
                           "aime_1983_2023_deepscaler": "aime", "minerva_math": "minerva"}


def canonical_name(name: str) -> str:
    """Dataset name after aliases (``math_train_deepscaler`` -> ``math_train``). Raises KeyError if unknown."""
    name = ALIASES.get(name, name)
    if name not in LOADERS:
        raise KeyError(f"unknown math dataset {name!r}; valid: {sorted(LOADERS)} (aliases: {sorted(ALIASES)})")
    return name


@functools.lru_cache(maxsize=32)
def _load_cached(name: str, split: str, root: str) -> tuple[MathProblem, ...]:
    return tuple(LOADERS[name](Path(root), split))


def load_math(name: str, split: str = "test", root: str | os.PathLike | None = None) -> list[MathProblem]:
    """Problems of dataset ``name`` (one of :data:`LOADERS`); ``split`` matters only for gsm8k (train/test).

    Raises:
        KeyError: unknown name (the message lists the valid names).
        ValueError: unknown split.
        FileNotFoundError: data root or file missing.
    """
    name = canonical_name(name)
    splits = SPLITS.get(name)
    if splits is not None and split not in splits:
        raise ValueError(f"dataset {name!r} has splits {splits}, got {split!r}")
    split = split if splits is not None else "test"
    return list(_load_cached(name, split, str(dataset_dir("math", root))))
