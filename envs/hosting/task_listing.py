"""Task listings of served envs (the data behind the OpenEnv Task API routes of ``servers/openenv.py``): which splits
an env has, how many tasks each holds, and the reset options that select task ``index`` of ``split``.

Runs where the env lives (a worker process: the data is there, e.g. WebShop's goal list), on a made env, and has no
side effect on it (it never resets or steps). Two kinds of env answer:

- an env that implements OpenEnv's ``TaskProvider`` methods on its unwrapped instance (``list_splits()``,
  ``num_tasks(split)`` and ``get_task_range(split, start, stop)`` or ``get_task(split, index)``): its own answers;
- the built-in envs (ALFWorld, WebShop, TextWorld, math, the calculator): from their data modules, below.

Any other env has no task listing (:class:`NoTaskApi`; HTTP 501). A task spec is a dict with at least ``id``,
``split``, ``index`` and ``reset``: the ``options`` of ``env.reset`` that play it (e.g. ``{"split": "valid_unseen",
"index": 3}``; the calculator's ``{"index": 3}``; math's ``{"dataset", "split", "index"}``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["NoTaskApi", "split_type", "task_catalog", "task_range"]

_TYPES = {"train": "train", "valid": "validation", "validation": "validation", "val": "validation", "test": "test"}


class NoTaskApi(NotImplementedError):
    """The env publishes no task listing (neither OpenEnv's ``TaskProvider`` methods nor a built-in adapter)."""


def split_type(name: str) -> str:
    """OpenEnv's split ``type`` for a split name: ``train``, ``test`` or ``validation`` (its rule for any other name:
    ``valid_unseen``, ``val``, ``all`` are ``validation``); a ``dataset/split`` name takes its last part's type."""
    return _TYPES.get(name.rsplit("/", 1)[-1], "validation")


def _builtin(env: Any) -> str | None:
    """Which built-in adapter fits ``env`` (by its class, without importing any env module)."""
    name = f"{type(env).__module__}.{type(env).__qualname__}"
    return {
        "envs.alfworld.env.ALFWorldEnv": "alfworld",
        "envs.webshop.env.WebShopEnv": "webshop",
        "envs.textworld.env.TextWorldEnv": "textworld",
        "envs.math.env.MathEnv": "math",
        "envs.examples.calculator.CalculatorEnv": "calculator",
    }.get(name)


def _provider(env: Any) -> bool:
    return callable(getattr(env, "list_splits", None)) and callable(getattr(env, "num_tasks", None)) and (
        callable(getattr(env, "get_task_range", None)) or callable(getattr(env, "get_task", None)))


def _math_splits(env: Any) -> dict[str, tuple[str, str]]:
    from envs.math.datasets import SPLITS

    return {f"{name}/{split}": (name, split) for name in env.datasets for split in SPLITS.get(name, ("test",))}


def task_catalog(env: Any) -> list[dict[str, Any]]:
    """``[{"name", "type", "num_tasks"}, ...]`` for the unwrapped ``env``, one entry per split.

    Raises:
        NoTaskApi: the env publishes no task listing.
        EnvDataError (FileNotFoundError): the env's data is missing (as its reset would say).
    """
    if _provider(env):
        out = []
        for entry in env.list_splits():
            split = entry if isinstance(entry, str) else dict(entry).get("name")
            kind = split_type(split) if isinstance(entry, str) else dict(entry).get("type", split_type(str(split)))
            out.append({"name": str(split), "type": kind, "num_tasks": int(env.num_tasks(split))})
        return out
    kind = _builtin(env)
    if kind == "alfworld":
        from envs.alfworld.data import SPLITS, list_games

        counts = {s: len(list_games(s, env.task_types, root=env.data_root)) for s in SPLITS}
    elif kind == "webshop":
        from envs.webshop.env import SPLITS

        counts = {s: len(env.split_range(s)) for s in SPLITS}
    elif kind == "textworld":
        from envs.textworld.games import SPLITS

        counts = {s: int(env.num_games) for s in SPLITS}
    elif kind == "math":
        from envs.math.datasets import load_math

        counts = {label: len(load_math(name, split, env.root)) for label, (name, split) in _math_splits(env).items()}
    elif kind == "calculator":
        counts = {"test": int(env.num_problems)}
    else:
        raise NoTaskApi(f"{type(env).__name__} publishes no task listing (implement OpenEnv's TaskProvider methods "
                        "list_splits, num_tasks and get_task on the env to add one)")
    return [{"name": s, "type": split_type(s), "num_tasks": n} for s, n in counts.items()]


def task_range(env: Any, split: str, start: int, stop: int) -> list[dict[str, Any]]:
    """Task specs ``start <= index < stop`` of ``split`` (the caller has checked the split and the bounds).

    Raises:
        NoTaskApi: the env publishes no task listing.
    """
    if _provider(env):
        if callable(getattr(env, "get_task_range", None)):
            tasks = list(env.get_task_range(split, start, stop))
        else:
            tasks = [env.get_task(split, i) for i in range(start, stop)]
        out = []
        for index, task in zip(range(start, stop), tasks):
            spec = dict(task) if isinstance(task, dict) else {"task": task}
            spec.setdefault("id", f"{split}-{index}")
            spec.setdefault("split", split)
            spec.setdefault("index", index)
            spec.setdefault("reset", {"split": split, "index": index})
            out.append(spec)
        return out
    kind = _builtin(env)
    indices = range(start, stop)
    if kind == "alfworld":
        from envs.alfworld.data import list_games, task_id_of, task_type_of

        games = list_games(split, env.task_types, root=env.data_root)
        return [{"id": task_id_of(games[i]), "split": split, "index": i, "task_type": task_type_of(games[i]),
                 "reset": {"split": split, "index": i}} for i in indices]
    if kind == "webshop":
        goals = env.split_range(split)
        return [{"id": f"webshop/{goals[i]}", "split": split, "index": i, "goal_idx": goals[i],
                 "instruction": env.catalog.goals[goals[i]]["instruction_text"],
                 "reset": {"split": split, "index": i}} for i in indices]
    if kind == "textworld":
        return [{"id": f"textworld/{env.family}-{env.level}/{split}/{i}", "split": split, "index": i,
                 "reset": {"split": split, "index": i}} for i in indices]
    if kind == "math":
        from envs.math.datasets import load_math

        name, part = _math_splits(env)[split]
        problems = load_math(name, part, env.root)
        return [{"id": problems[i].uid, "split": split, "index": i, "task_type": problems[i].task_type or name,
                 "reset": {"dataset": name, "split": part, "index": i}} for i in indices]
    if kind == "calculator":
        return [{"id": f"calculator/{i}", "split": split, "index": i, "reset": {"index": i}} for i in indices]
    raise NoTaskApi(f"{type(env).__name__} publishes no task listing")
