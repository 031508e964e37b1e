"""Read-only access to a run (or eval output) directory for the viewer: episode files, metrics, config, eval
summaries. Every file is re-read only when its size or modification time changed, so a run still training shows
what is there at each request and an idle one costs nothing. Lists over many steps use per-file summaries (a few
hundred bytes per episode); full records (tokens and numbers) are kept for the last :data:`FULL_FILES` step files
read."""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rl.episodes import list_steps, parse_episode_id, read_step_file, step_path
from agent_rl.logging import check_kind, read_metrics

#: Curves of the overview: (title, metric names drawn in it). ``eval/*success*`` metrics join "success". Each name is
#: read from the metrics rows of its kind (:func:`row_kind_of`): ``eval/`` from ``eval`` rows, ``sft/`` from ``sft``
#: rows (behaviour cloning), the others from ``train`` rows.
CURVES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean",)),
    ("success (train / eval)", ("success/rate",)),
    ("entropy", ("actor/entropy",)),
    ("clip fraction", ("actor/clipfrac",)),
    ("delta_R (TGRL)", ("tgrl/delta_R",)),
    ("T1 (TGRL; algo.t_high=auto picks it per step)", ("tgrl/t_high",)),
    ("temperature (TAMPO's draw per step; rollout.temperature_schedule)", ("tampo/t", "rollout/temperature")),
    ("TAMPO meta-policy entropy", ("tampo/pi_entropy",)),
    ("JS mean", ("credit/js_mean",)),
    ("S (schedule)", ("schedule/S",)),
    ("trained token fraction", ("credit/trained_token_frac",)),
    ("loss (behaviour cloning)", ("sft/loss",)),
    ("staleness (async)", ("async/staleness_mean", "async/staleness_max")),
    ("stale groups discarded (async)", ("async/groups_stale_dropped",)),
)
#: Curves drawn only for runs with asynchronous rollouts (``trainer.max_staleness`` >= 1: rows with
#: ``async/engine_version``); the discards add one series per task type (``async/groups_stale_dropped/<type>``).
ASYNC_CURVES = ("staleness (async)", "stale groups discarded (async)")
#: Step files whose full records stay in memory (least recently used dropped first).
FULL_FILES = 8
#: Summary fields of an episode (what lists and the JSON API show; the full record adds prompt and turns).
SUMMARY_KEYS = ("id", "step", "index", "source", "task_id", "task_type", "group", "slot", "temperature", "is_high",
                "temp_label", "reward", "won", "failure", "num_turns", "num_tokens", "advantage_mean",
                "trained_frac", "fork")


@dataclass(frozen=True)
class Filters:
    """Episode filters of every list page and of ``/api/episodes`` (query parameters of the same names)."""

    task_type: str = ""
    outcome: str = ""  # "" | won | lost
    temp: str = ""  # "" | T0 | T1
    step_min: int | None = None
    step_max: int | None = None
    source: str = ""

    def match(self, rec: dict[str, Any]) -> bool:
        if self.task_type and (rec.get("task_type") or "") != self.task_type:
            return False
        if self.outcome and bool(rec.get("won")) != (self.outcome == "won"):
            return False
        if self.temp and rec.get("temp_label") != self.temp:
            return False
        if self.source and rec.get("source") != self.source:
            return False
        return self.step_ok(int(rec.get("step", 0)))

    def step_ok(self, step: int) -> bool:
        return (self.step_min is None or step >= self.step_min) and (self.step_max is None or step <= self.step_max)

    def query(self, **changes: Any) -> str:
        """These filters (with ``changes``) as a URL query string (stable, shareable links)."""
        from urllib.parse import urlencode

        values = {"task_type": self.task_type, "outcome": self.outcome, "temp": self.temp,
                  "step_min": self.step_min, "step_max": self.step_max, "source": self.source, **changes}
        return urlencode({k: v for k, v in values.items() if v not in (None, "")})


class RunReader:
    """The files of one run directory, cached by (size, mtime).

    Args:
        run_dir: a training run directory (``config.yaml``, ``metrics.jsonl``, ``episodes/``) or an eval output
            directory (``eval/*.json``, ``episodes/``); either may still be being written.
    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir).resolve()
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"no run directory {self.run_dir}")
        self.name = self.run_dir.name
        self._files: dict[Path, tuple[tuple[int, int], Any]] = {}  # small files and per-step summaries
        self._full: OrderedDict[Path, tuple[tuple[int, int], Any]] = OrderedDict()  # LRU of full step records
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ cached file reads
    def _cached(self, path: Path, read: Any, cache: Any = None, max_items: int = 0) -> Any:
        cache = self._files if cache is None else cache
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        key = (st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = cache.get(path)
            if hit is not None and hit[0] == key:
                if isinstance(cache, OrderedDict):
                    cache.move_to_end(path)
                return hit[1]
        value = read(path)
        with self._lock:
            cache[path] = (key, value)
            if max_items and len(cache) > max_items:
                cache.popitem(last=False)
        return value

    def step_records(self, step: int) -> list[dict[str, Any]]:
        """Full records of one step ([] when the step has no file)."""
        return self._cached(step_path(self.run_dir, step), read_step_file, self._full, FULL_FILES) or []

    def step_summaries(self, step: int) -> list[dict[str, Any]]:
        """``SUMMARY_KEYS`` of each record of one step (cached apart from the full records)."""
        def read(path: Path) -> list[dict[str, Any]]:
            return [{k: rec.get(k) for k in SUMMARY_KEYS} for rec in read_step_file(path)]

        return self._cached(step_path(self.run_dir, step), read) or []

    def steps(self) -> list[int]:
        return list_steps(self.run_dir)

    def episode(self, episode_id: str) -> dict[str, Any] | None:
        """The record with this id, None when absent; ``ValueError`` for a malformed id."""
        step, index = parse_episode_id(episode_id)
        for rec in self.step_records(step):
            if rec.get("index") == index:
                return rec
        return None

    def summaries(self, filters: Filters, step: int | None = None) -> list[dict[str, Any]]:
        """Summaries (``SUMMARY_KEYS``) of the episodes matching ``filters`` (one step, or every step)."""
        steps = [step] if step is not None else [s for s in self.steps() if filters.step_ok(s)]
        return [rec for s in steps for rec in self.step_summaries(s) if filters.match(rec)]

    def step_table(self, filters: Filters) -> list[dict[str, Any]]:
        """One row per stored step in the filter's step range: episodes, groups, mean reward, success rate."""
        rows = []
        for s in self.steps():
            if not filters.step_ok(s):
                continue
            recs = [r for r in self.step_summaries(s) if filters.match(r)]
            n = len(recs)
            rows.append({"step": s, "episodes": n, "groups": len({(r.get("source"), r.get("group")) for r in recs}),
                         "reward": sum(r.get("reward", 0.0) for r in recs) / n if n else None,
                         "success": sum(bool(r.get("won")) for r in recs) / n if n else None})
        return rows

    def facets(self) -> dict[str, list[str]]:
        """Values the filters can take in this run: task types and sources."""
        types, sources = set(), set()
        for s in self.steps():
            for rec in self.step_summaries(s):
                if rec.get("task_type"):
                    types.add(str(rec["task_type"]))
                sources.add(str(rec.get("source", "")))
        return {"task_type": sorted(types), "source": sorted(sources)}

    # ------------------------------------------------------------------ run files
    def metrics(self, kind: str | None = None) -> list[dict[str, Any]]:
        """``metrics.jsonl`` rows (:func:`agent_rl.logging.read_metrics`: each with its ``kind``, one per (kind,
        step), sorted by step; a partial last line, e.g. one being written, is skipped), only ``kind``'s if given.

        Raises:
            ValueError: ``kind`` is not a row kind.
        """
        if kind is not None:
            check_kind(kind)
        rows = self._cached(self.run_dir / "metrics.jsonl", read_metrics) or []
        return rows if kind is None else [r for r in rows if r["kind"] == kind]

    def config_text(self) -> str:
        return self._cached(self.run_dir / "config.yaml",
                            lambda p: p.read_text(encoding="utf-8", errors="replace")) or ""

    def eval_results(self) -> list[dict[str, Any]]:
        """Scalar summary of each ``eval/<panel>.json`` (an eval output directory or a run's eval hook)."""
        folder = self.run_dir / "eval"
        if not folder.is_dir():
            return []
        out = []
        for path in sorted(folder.glob("*.json")):
            data = self._cached(path, _read_json)
            if not isinstance(data, dict):
                continue
            scalars = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool)) and k != "episodes"}
            out.append({"panel": path.stem, **scalars})
        return out

    def curves(self, filters: Filters) -> list[tuple[str, dict[str, tuple[list[float], list[float]]]]]:
        """(title, {metric: (steps, values)}) of each overview curve that has data in the step range."""
        recs = [r for r in self.metrics() if filters.step_ok(int(r["step"]))]
        eval_success = sorted({k for r in recs if r["kind"] == "eval" for k in r
                               if k.startswith("eval/") and "success" in k})
        asynchronous = any("async/engine_version" in r for r in recs)
        stale_types = sorted({k for r in recs if r["kind"] == "train" for k in r
                              if k.startswith("async/groups_stale_dropped/")})
        out = []
        for title, names in CURVES:
            if title in ASYNC_CURVES and not asynchronous:
                continue
            names = names + tuple(eval_success) if title.startswith("success") else names
            names = names + tuple(stale_types) if title.startswith("stale groups") else names
            series = {}
            for name in names:
                kind = row_kind_of(name)
                pts = [(float(r["step"]), float(r[name])) for r in recs
                       if r["kind"] == kind and isinstance(r.get(name), (int, float)) and math.isfinite(float(r[name]))]
                if pts:
                    series[name] = ([p[0] for p in pts], [p[1] for p in pts])
            if series:
                out.append((title, series))
        return out


def row_kind_of(name: str) -> str:
    """The kind of the metrics rows that hold the metric ``name`` (docs/training.md, "metrics.jsonl rows")."""
    return "eval" if name.startswith("eval/") else "sft" if name.startswith("sft/") else "train"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def fork_tree(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A forked group (``rollout.fork``) as a tree: one node per base episode record (no ``fork``) that
    has siblings, ``{"base": rec, "forks": [{"turn": t, "siblings": [rec, ...], "mean": the step group's mean
    return (base and siblings)}, ...]}`` in fork-turn order; [] for a group without forks. Siblings whose base is
    not among ``episodes`` are left out."""
    by_id = {str(rec.get("id")): rec for rec in episodes if not rec.get("fork")}
    forks: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for rec in episodes:
        fork = rec.get("fork") or {}
        if isinstance(fork, dict) and str(fork.get("base")) in by_id:
            forks.setdefault(str(fork["base"]), {}).setdefault(int(fork.get("turn", 0)), []).append(rec)
    tree = []
    for base_id, turns in forks.items():
        base = by_id[base_id]
        nodes = []
        for turn in sorted(turns):
            sibs = turns[turn]
            returns = [float(base.get("reward", 0.0))] + [float(r.get("reward", 0.0)) for r in sibs]
            nodes.append({"turn": turn, "siblings": sibs, "mean": sum(returns) / len(returns)})
        tree.append({"base": base, "forks": nodes})
    return tree
