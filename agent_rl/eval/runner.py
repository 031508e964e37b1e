"""Panels, reference policies and the evaluation run (``python -m agent_rl.eval``).

A panel is a fixed list of tasks: ALFWorld ``valid_seen`` (140 games) / ``valid_unseen`` (134), WebShop ``test``
(= the env's ``val``: goals 0..499), a math dataset (aime24, aime25, amc23, math500, minerva, olympiadbench, ...) or a
code dataset (humanevalplus, mbpp, ...). ``eval.num_tasks=n`` keeps n tasks spread evenly over the split (indices
``i * N // n``), so a subset still covers every task type of ALFWorld (its games are sorted by type).

Each task is played ``eval.samples`` times at ``eval.temperature`` by the training orchestrator
(:func:`agent_rl.runtime.build_orchestrator`): the scripted reference policies (random, expert, oracle:
:mod:`agent_rl.rollout.policies`) answer a turn instead of the engine, and every finished turn/episode is reported
to the progress display. Env failures are recorded per episode (counted as not solved) instead of dropping the group
as training does. What a panel is for an env (its splits and sizes, default split, task types, expert, score) is the
env family's own description (``envs.families``): nothing here names a family.

Output (``<eval.output_dir>/eval/<panel>.json``): ``success``, ``per_task_type`` ({type: {success, games,
episodes}}), ``mean_turns``, ``invalid_action_rate``, ``pass_at_k`` ({"1": .., ..., "n": ..}), WebShop ``score``
(0..100) and ``per_category``, math/code ``accuracy``, and ``episodes`` (every episode: task, task id, type, sample,
success, reward, turns, actions); plus ``<panel>.png`` (bars per task type / category, or pass@k).
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from agent_rl.cli import run_cli
from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from agent_rl.engines import set_torch_threads
from agent_rl.eval import pass_at_k
from agent_rl.models import finish_tokenizer, load_policy, smollm2_tokenizer
from agent_rl.progress import Progress
from agent_rl.rollout.groups import GroupPlayer
from agent_rl.rollout.results import GroupSpec
from agent_rl.rollout.policies import ScriptedEngine, make_policy
from agent_rl.rollout.prompts.base import has_prompt
from agent_rl.runtime import (build_engine, build_orchestrator, close_engine, open_env_pool, resolve_device,
                              seed_everything, set_data_root)
from agent_rl.task_files import load_tasks
from agent_rl.types import Episode, Generation, Task
from envs.families import BUILTIN, EnvFamily, describe, family_of

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)


# ------------------------------------------------------------------------------------------------ panels
@dataclass
class Panel:
    """A fixed task list. ``family``: the env's description (``envs.families``); ``split``: the split or dataset
    name as given (``test`` stays ``test`` in the name); ``tasks[i].group_id == i``."""

    name: str
    family: EnvFamily
    split: str
    tasks: list[Task]
    size: int  # tasks in the whole split
    task_types: list[str] | None = None  # known before playing (ALFWorld: from the game path), aligned with tasks


def env_family(cfg: Any) -> EnvFamily:
    """The description of ``env.id`` (``envs.families``) when it defines panels.

    Raises:
        ValueError: the env describes no panel (the message lists the envs that do).
    """
    family = describe(cfg.env.id, cfg.env.name)
    if not family.has_panels:
        ids = sorted(i for i in BUILTIN if (family_of(i) or family).has_panels)
        raise ValueError(f"no evaluation panel for env.id={cfg.env.id!r}; panels exist for {ids} (a user's env "
                         "describes its own: envs.families.register_family)")
    return family


def spread(size: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``range(size)`` (``i * size // n``; all of them when n is 0 or >= size)."""
    if n <= 0 or n >= size:
        return list(range(size))
    return [i * size // n for i in range(n)]


def build_panels(cfg: Any, *, split: str = "", num_tasks: int | None = None) -> list[Panel]:
    """The panels of ``cfg`` (``eval.split`` / ``eval.dataset``, comma-separated for several; ``split`` overrides).

    Raises:
        ValueError: an env without panels, an unknown split or dataset.
    """
    ev = cfg.eval
    if ev.tasks:
        return [file_panel(cfg, num_tasks)]
    family = env_family(cfg)
    given = split or (ev.dataset if family.split_key == "dataset" else ev.split) or ev.split or ev.dataset
    names = [s.strip() for s in (given or family.default_split).split(",") if s.strip()]
    n_tasks = ev.num_tasks if num_tasks is None else num_tasks
    data_root = cfg.data.root or None
    # the panel's own turn budget reaches the env (gymnasium's max_episode_steps, as in training), and scores are the
    # env's own: training's invalid-action penalty (rollout.invalid_penalty) is not applied to an evaluation
    kwargs = cfg.make_env_kwargs(ev.max_turns or cfg.rollout.max_turns)
    if family.expert_kwarg and ev.policy in ("expert", "oracle"):
        kwargs[family.expert_kwarg] = True  # the env computes info["expert_action"] (its expert / scripted oracle)
    assert family.split_size is not None  # has_panels
    panels = []
    for name in names:
        env_split = family.env_split(name)
        size = family.split_size(env_split, data_root)
        types = family.task_types(env_split, data_root) if family.task_types is not None else None
        selected = kwargs.get(family.task_type_kwarg) if family.task_type_kwarg else None
        if selected and types is not None:  # the env indexes only the games of these types
            selected = {selected} if isinstance(selected, str) else set(selected)
            types = [t for t in types if t in selected]
            size = len(types)
        tasks = [Task(env_id=cfg.env.id, options={family.split_key: env_split, family.index_key: index}, group_id=i,
                      seed=ev.seed + index, env_kwargs=dict(kwargs)) for i, index in enumerate(spread(size, n_tasks))]
        panels.append(Panel(name=f"{family.name}_{name}", family=family, split=name, tasks=tasks, size=size,
                            task_types=[types[t.options[family.index_key]] for t in tasks] if types else None))
    return panels


def file_panel(cfg: Any, num_tasks: int | None = None) -> Panel:
    """The panel of ``eval.tasks`` (``eval.task_split``, columns mapped by ``env.task_fields``): ``num_tasks`` rows
    spread evenly over the file (default ``eval.num_tasks``; 0 = all), each row a task's reset options.

    Raises:
        agent_rl.task_files.TaskFileError, FileNotFoundError: the file (file, row and field named).
    """
    ev = cfg.eval
    rows = load_tasks(ev.tasks, cfg.env.task_fields or None, split=ev.task_split or None)
    print(rows.describe(), file=sys.stderr)
    kwargs = cfg.make_env_kwargs(ev.max_turns or cfg.rollout.max_turns)
    n_tasks = ev.num_tasks if num_tasks is None else num_tasks
    tasks = [Task(env_id=cfg.env.id, options=dict(rows[index]), group_id=i, seed=ev.seed + index,
                  env_kwargs=dict(kwargs), index=index) for i, index in enumerate(spread(len(rows), n_tasks))]
    family = describe(cfg.env.id, cfg.env.name)
    name = Path(ev.tasks.rstrip("/")).name.split(".")[0] or "tasks"
    return Panel(name=f"{cfg.env.name}_{name}", family=family, split=ev.task_split or "train", tasks=tasks,
                 size=len(rows))


# ------------------------------------------------------------------------------------------------ running
def _task_id(ep: Episode) -> str:
    last = ep.turns[-1].info if ep.turns else {}
    for key in ("task_id", "uid", "goal_idx"):
        if last.get(key) is not None:
            return str(last[key])
    return json.dumps(ep.task.options, sort_keys=True)


async def run_panel(orch: GroupPlayer, panel: Panel, *, temperature: float, samples: int,
                    progress: Any = None) -> dict[int, list[Episode]]:
    """Play every task of ``panel`` ``samples`` times at ``temperature``; returns episodes by task (group_id),
    failed episodes included (``Episode.failure`` set)."""
    by_task: dict[int, list[Episode]] = defaultdict(list)
    prev_turn, prev_ep = orch.on_turn, orch.on_episode

    def on_episode(ep: Episode) -> None:
        by_task[ep.task.group_id].append(ep)
        if progress is not None:
            progress.episode(ep.won)

    def on_turn(gen: Generation) -> None:
        if progress is not None:
            progress.turn(len(gen.token_ids))

    orch.on_turn, orch.on_episode = on_turn, on_episode
    try:
        if progress is not None:
            stage = getattr(progress, "stage", "")  # the warm start's round, named in the phase
            progress.phase(f"{stage}: panel {panel.name}" if stage else f"eval {panel.name}",
                           total=len(panel.tasks) * samples)
        groups = [GroupSpec(task, [(float(temperature), False)] * samples) for task in panel.tasks]
        await orch.run_groups(groups, seed_key=0)  # fixed generation seeds: reproducible
    finally:
        orch.on_turn, orch.on_episode = prev_turn, prev_ep
        if progress is not None:
            progress.end()
    return dict(by_task)


def summarize(panel: Panel, by_task: dict[int, list[Episode]], *, samples: int) -> dict[str, Any]:
    """The panel's numbers and its episode records (see the module docstring). Failed episodes count as not solved.
    A family with a ``score`` (WebShop) also reports ``score`` and, per task type (its goals' categories),
    ``per_category``; the episodes then carry their ``category``."""
    family = panel.family
    records: list[dict[str, Any]] = []
    per_type: dict[str, list[float]] = defaultdict(list)
    per_type_tasks: dict[str, set[int]] = defaultdict(set)
    per_cat: dict[str, list[tuple[float, float]]] = defaultdict(list)
    correct: list[int] = []
    n_turns = n_invalid = 0
    for i, task in enumerate(panel.tasks):
        eps = by_task.get(i, [])
        correct.append(sum(int(ep.won and ep.failure is None) for ep in eps))
        for j, ep in enumerate(eps):
            env_reward = sum(t.reward for t in ep.turns)
            won = bool(ep.won and ep.failure is None)
            kind = str(ep.task_type or (ep.turns[0].info.get("task_type") if ep.turns else "")
                       or (panel.task_types[i] if panel.task_types else "") or panel.split)
            rec: dict[str, Any] = {
                "task": dict(task.options), "task_id": _task_id(ep), "task_type": kind, "sample": j,
                "success": won, "reward": env_reward, "turns": len(ep.turns),
                "invalid_actions": sum(t.invalid for t in ep.turns), "actions": [t.action for t in ep.turns],
                "failure": ep.failure,
            }
            if family.score:  # the task type of a scored family's episode is its category (WebShop: the goal's)
                rec["category"] = str(ep.turns[-1].info.get(family.task_type_key)) if ep.turns else "unknown"
                per_cat[rec["category"]].append((env_reward, float(won)))
                kind = rec["task_type"] = rec["category"]
            records.append(rec)
            per_type[kind].append(float(won))
            per_type_tasks[kind].add(i)
            n_turns += len(ep.turns)
            n_invalid += rec["invalid_actions"]
    n_eps = max(len(records), 1)
    success = sum(r["success"] for r in records) / n_eps
    result: dict[str, Any] = {
        "panel": panel.name, "split": panel.split, "num_tasks": len(panel.tasks), "split_size": panel.size,
        "samples": samples, "episodes_played": len(records),
        "failed_episodes": sum(r["failure"] is not None for r in records),
        "success": success,
        "per_task_type": {k: {"success": sum(v) / len(v), "games": len(per_type_tasks[k]), "episodes": len(v)}
                          for k, v in sorted(per_type.items())},
        "mean_turns": n_turns / n_eps,
        "invalid_action_rate": n_invalid / max(n_turns, 1),
        "pass_at_k": {str(k): float(np.mean([pass_at_k(samples, c, k) for c in correct])) if correct else 0.0
                      for k in range(1, samples + 1)},
    }
    if family.score:
        result["score"] = 100.0 * sum(r["reward"] for r in records) / n_eps
        result["per_category"] = {k: {"score": 100.0 * sum(s for s, _ in v) / len(v),
                                      "success": sum(w for _, w in v) / len(v), "episodes": len(v)}
                                  for k, v in sorted(per_cat.items())}
    if family.answer_accuracy:
        result["accuracy"] = success
    result["episodes"] = records
    return result


def plot_panel(result: dict[str, Any], path: Path) -> None:
    """Bar chart: success per task type (ALFWorld), score and success per category (WebShop), pass@k (math/code)."""

    if "per_category" in result:
        groups = result["per_category"]
        labels = list(groups) + ["all"]
        values = [groups[k]["success"] for k in groups] + [result["success"]]
        scores = [groups[k]["score"] / 100 for k in groups] + [result["score"] / 100]
    elif len(result["per_task_type"]) > 1:
        groups = result["per_task_type"]
        labels, values, scores = list(groups) + ["all"], [g["success"] for g in groups.values()] + [
            result["success"]], None
    else:
        labels = [f"pass@{k}" for k in result["pass_at_k"]]
        values, scores = list(result["pass_at_k"].values()), None
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels)), 3.6))
    x = np.arange(len(labels))
    width = 0.4 if scores is not None else 0.7
    ax.bar(x - (width / 2 if scores is not None else 0), values, width, label="success")
    if scores is not None:
        ax.bar(x + width / 2, scores, width, label="score / 100")
        ax.legend(loc="lower left", fontsize=8)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{result['panel']}  ({result.get('policy', '')}, {result['num_tasks']} tasks)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_table(result: dict[str, Any], file: Any = None) -> None:
    """The panel's table (rich), per task type / category, then the totals."""
    title = (f"{result['panel']}: policy={result.get('policy')} prompt={result.get('prompt')} "
             f"T={result.get('temperature')} n={result['samples']}, {result['num_tasks']}/{result['split_size']} "
             f"tasks, {result.get('wall_s', 0):.0f} s")
    table = Table(title=title)
    webshop = "per_category" in result
    for col in ["group", "episodes", "success"] + (["score"] if webshop else []):
        table.add_column(col, justify="left" if col == "group" else "right")
    rows = result["per_category"] if webshop else result["per_task_type"]
    for name, g in rows.items():
        table.add_row(name, str(g["episodes"]), f"{100 * g['success']:.1f}%",
                      *([f"{g['score']:.1f}"] if webshop else []))
    table.add_row("all", str(result["episodes_played"]), f"{100 * result['success']:.1f}%",
                  *([f"{result['score']:.1f}"] if webshop else []), style="bold")
    console = Console(file=file or sys.stdout, width=120)
    console.print(table)
    extra = [f"mean turns {result['mean_turns']:.2f}", f"invalid actions {100 * result['invalid_action_rate']:.1f}%",
             "pass@k " + " ".join(f"{k}:{v:.3f}" for k, v in result["pass_at_k"].items())]
    if result["failed_episodes"]:
        extra.append(f"{result['failed_episodes']} episode(s) failed on env errors")
    console.print("  " + "; ".join(extra))


def eval_rollout_config(cfg: Any) -> Any:
    """``cfg.rollout`` with eval's turn budget and concurrency, forking off."""
    rollout = copy.deepcopy(cfg.rollout)
    if cfg.eval.max_turns > 0:
        rollout.max_turns = cfg.eval.max_turns
    rollout.max_concurrent_episodes = max(0, cfg.eval.concurrency)
    rollout.fork = type(rollout.fork)()  # a panel plays its episodes as given: no forked siblings
    return rollout


async def evaluate(cfg: Any, pool: Any, engine: Any, *, panels: list[Panel], folder: Path | None = None,
                   progress: Any = None) -> list[dict[str, Any]]:
    """Evaluate ``panels`` with ``cfg.eval``'s policy and decoding on an open env ``pool`` and ``engine`` (an
    engine, or a :class:`ScriptedEngine` for scripted policies). Writes ``folder/<panel>.json|.png`` when
    ``folder`` is given. Returns one result dict per panel (the JSON content)."""
    ev = cfg.eval
    results = []
    policy = make_policy(ev.policy, panels[0].family, ev.seed) if panels else None
    orch = build_orchestrator(cfg, pool, engine, rollout=eval_rollout_config(cfg),
                              max_new_tokens=ev.max_new_tokens or cfg.engine.max_new_tokens,
                              seed=cfg.engine.seed if cfg.engine.seed is not None else ev.seed, policy=policy)
    try:
        for panel in panels:
            t0 = time.perf_counter()
            by_task = await run_panel(orch, panel, temperature=ev.temperature, samples=ev.samples,
                                      progress=progress)
            result = summarize(panel, by_task, samples=ev.samples)
            wall = time.perf_counter() - t0
            result = {"policy": ev.policy, "model": cfg.model.path or cfg.model.name if ev.policy == "model" else None,
                      "prompt": cfg.env.prompt, "temperature": ev.temperature, "max_turns":
                      orch.cfg.max_turns, "seed": ev.seed, "wall_s": round(wall, 1), **result}
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{panel.name}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
                if ev.plot:
                    plot_panel(result, folder / f"{panel.name}.png")
            results.append(result)
    finally:
        await orch.aclose()
    return results


def scalar_metrics(result: dict[str, Any]) -> dict[str, float]:
    """``eval/<panel>/...`` scalars of one result (training logs these)."""
    p = f"eval/{result['panel']}"
    metrics = {f"{p}/success": result["success"], f"{p}/mean_turns": result["mean_turns"],
               f"{p}/invalid_action_rate": result["invalid_action_rate"]}
    if "score" in result:
        metrics[f"{p}/score"] = result["score"]
    for name, g in result["per_task_type"].items():
        if len(result["per_task_type"]) > 1:
            metrics[f"{p}/success/{name}"] = g["success"]
    for k, v in result["pass_at_k"].items():
        if k != "1":
            metrics[f"{p}/pass@{k}"] = v
    return metrics


# ------------------------------------------------------------------------------------------------ CLI
def split_overrides(overrides: list[str]) -> list[str]:
    """CLI shorthands: ``policy=X`` -> ``eval.policy=X``; ``prompt=X`` -> ``env.prompt=X`` (``prompt=react`` on
    WebShop -> ``react_webshop``)."""
    out, prompt = [], None
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key == "policy":
            out.append(f"eval.policy={value}")
        elif key == "prompt":
            prompt = value
        else:
            out.append(ov)
    if prompt is not None:
        env = next((ov.partition("=")[2] for ov in out if ov.startswith("env=")), "alfworld")
        name = f"{prompt}_{env}" if has_prompt(f"{prompt}_{env}") else prompt
        out.append(f"env.prompt={name}")
    return out


def load_tokenizer_only(cfg: Any) -> Any:
    """A tokenizer for scripted policies without loading the model (SmolLM2's for the built-in models)."""
    if cfg.model.path or cfg.model.name not in ("smollm2", "tiny"):
        return finish_tokenizer(AutoTokenizer.from_pretrained(cfg.model.path or cfg.model.name))
    return finish_tokenizer(smollm2_tokenizer())


async def _run(cfg: Any, out: Path, progress: Any) -> list[dict[str, Any]]:
    seed_everything(cfg.eval.seed)
    set_torch_threads(cfg.engine.num_threads)
    panels = build_panels(cfg)
    if cfg.eval.policy == "model":
        progress.note(f"loading model {cfg.model.path or cfg.model.name} (SmolLM2: converted on first use, ~30 s)")
        model, tokenizer = load_policy(cfg.model)
        model.to(resolve_device(cfg.trainer.device)).eval()
        engine = build_engine(cfg, model, tokenizer)
    else:
        engine = ScriptedEngine(load_tokenizer_only(cfg))
    if cfg.env_server.mode != "local" and not cfg.env_server.urls:
        progress.note(f"starting the {cfg.env.id} env server (log: {out / 'env_server.log'})")
    try:
        async with open_env_pool(cfg, out) as pool:
            return await evaluate(cfg, pool, engine, panels=panels, folder=out / "eval", progress=progress)
    finally:
        close_engine(engine)  # vllm: its engine processes and sync files


def main(overrides: list[str] | None = None) -> dict[str, Any]:
    """Compose the config (as ``agent_rl.train`` does, plus the ``policy=`` / ``prompt=`` shorthands), evaluate
    every panel, print its table and write ``DIR/eval/<panel>.json|.png``. Returns ``{panel name: result}``."""
    overrides = sys.argv[1:] if overrides is None else overrides
    if any(arg in ("-h", "--help") for arg in overrides):
        print(__doc__)
        return {}
    cfg = load_config(split_overrides(list(overrides)))
    if cfg.eval.samples > 1 and cfg.eval.temperature == 0 and cfg.eval.policy == "model":
        print("note: eval.samples > 1 at eval.temperature=0 (greedy) repeats one answer; pass@k>1 needs "
              "eval.temperature > 0", file=sys.stderr)
    out = Path(cfg.eval.output_dir or Path("runs") / f"eval-{cfg.env.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    set_data_root(cfg)
    progress = Progress(enabled=cfg.trainer.progress)
    results = asyncio.run(_run(cfg, out, progress))
    for result in results:
        print_table(result)
        print(f"  -> {out / 'eval' / (result['panel'] + '.json')}")
    return {r["panel"]: r for r in results}


def cli() -> None:
    """``python -m agent_rl.eval``: :func:`main`; a config error (or a panel's ``ValueError``: an unknown split or
    dataset) is one line ``config error: ...`` (exit code 2, :mod:`agent_rl.cli`)."""
    run_cli(main, config_errors=(ConfigError, ValueError))
