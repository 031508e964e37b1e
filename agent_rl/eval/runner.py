"""Panels, reference policies and the evaluation run (``python -m agent_rl.eval``).

A panel is a fixed list of tasks: ALFWorld ``valid_seen`` (140 games) / ``valid_unseen`` (134), WebShop ``test``
(= the env's ``val``: goals 0..499), a math dataset (aime24, aime25, amc23, math500, minerva, olympiadbench, ...) or a
code dataset (humanevalplus, mbpp, ...). ``eval.num_tasks=n`` keeps n tasks spread evenly over the split (indices
``i * N // n``), so a subset still covers every task type of ALFWorld (its games are sorted by type).

Each task is played ``eval.samples`` times at ``eval.temperature`` by :class:`PolicyOrchestrator`, the training
orchestrator with two hooks: scripted reference policies (random, expert, oracle) answer a turn instead of the
engine, and every finished turn/episode is reported to the progress display. Env failures are recorded per episode
(counted as not solved) instead of dropping the group as training does.

Output (``<eval.output_dir>/eval/<panel>.json``): ``success``, ``per_task_type`` ({type: {success, games,
episodes}}), ``mean_turns``, ``invalid_action_rate``, ``pass_at_k`` ({"1": .., ..., "n": ..}), WebShop ``score``
(0..100) and ``per_category``, math/code ``accuracy``, and ``episodes`` (every episode: task, task id, type, sample,
success, reward, turns, actions); plus ``<panel>.png`` (bars per task type / category, or pass@k).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from agent_rl.eval import pass_at_k
from agent_rl.rollout.orchestrator import GroupSpec, RolloutOrchestrator
from agent_rl.types import Episode, Generation, Task

# eval.split aliases: WebShop's held-out goals are its paper's "test" split; this env calls them "val".
SPLIT_ALIASES = {"webshop": {"test": "val"}}
DEFAULT_SPLIT = {"alfworld": "valid_unseen", "webshop": "test", "math": "math500", "code": "humanevalplus"}
AGENT_ENVS = ("alfworld", "webshop")
# envs whose ``expert=True`` gives ``info["expert_action"]`` (the expert / oracle reference row)
EXPERT_ENVS = ("alfworld", "webshop")


# ------------------------------------------------------------------------------------------------ panels
@dataclass
class Panel:
    """A fixed task list. ``family``: alfworld | webshop | math | code; ``split``: the split or dataset name as
    given (``test`` stays ``test`` in the name); ``tasks[i].group_id == i``."""

    name: str
    family: str
    split: str
    tasks: list[Task]
    size: int  # tasks in the whole split
    task_types: list[str] | None = None  # known before playing (ALFWorld: from the game path), aligned with tasks


def env_family(cfg: Any) -> str:
    """alfworld | webshop | math | code from ``env.id`` (``ValueError`` for other envs: no panel defined)."""
    ids = {"agent_rl/ALFWorld-v0": "alfworld", "agent_rl/WebShop-v0": "webshop", "agent_rl/Math-v0": "math",
           "agent_rl/Code-v0": "code"}
    if cfg.env.id not in ids:
        raise ValueError(f"no evaluation panel for env.id={cfg.env.id!r}; panels exist for {sorted(ids)}")
    return ids[cfg.env.id]


def spread(size: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``range(size)`` (``i * size // n``; all of them when n is 0 or >= size)."""
    if n <= 0 or n >= size:
        return list(range(size))
    return [i * size // n for i in range(n)]


def split_size(family: str, split: str, data_root: str | None) -> int:
    """Tasks in ``split`` (ALFWorld split, WebShop split, math/code dataset); errors name the valid values."""
    if family == "alfworld":
        from envs.alfworld.data import list_games

        return len(list_games(split, root=data_root))
    if family == "webshop":
        from envs.webshop.catalog import get_catalog
        from envs.webshop.env import SPLITS, VAL_GOALS

        if split not in SPLITS:
            raise ValueError(f"unknown WebShop split {split!r}; valid: test (= val), {', '.join(SPLITS)}")
        n = len(get_catalog(data_root).goals)
        return {"val": min(VAL_GOALS, n), "train": max(n - VAL_GOALS, 0), "all": n}[split]
    if family == "math":
        from envs.math.datasets import load_math

        return len(load_math(split, root=data_root))
    from envs.code.datasets import load_code

    return len(load_code(split, root=data_root))


def build_panels(cfg: Any, *, split: str = "", num_tasks: int | None = None) -> list[Panel]:
    """The panels of ``cfg`` (``eval.split`` / ``eval.dataset``, comma-separated for several; ``split`` overrides).

    Raises:
        ValueError: an env without panels, an unknown split or dataset.
    """
    family = env_family(cfg)
    ev = cfg.eval
    given = split or (ev.dataset if family in ("math", "code") else ev.split) or ev.split or ev.dataset
    names = [s.strip() for s in (given or DEFAULT_SPLIT[family]).split(",") if s.strip()]
    n_tasks = ev.num_tasks if num_tasks is None else num_tasks
    data_root = cfg.data.root or None
    # the panel's own turn budget reaches the env (gymnasium's max_episode_steps, as in training), and scores are the
    # env's own: training's invalid-action penalty (rollout.invalid_penalty) is not applied to an evaluation
    kwargs = cfg.make_env_kwargs(ev.max_turns or cfg.rollout.max_turns)
    if family in EXPERT_ENVS and ev.policy in ("expert", "oracle"):
        kwargs["expert"] = True  # the env computes info["expert_action"] (handcoded expert / scripted oracle)
    panels = []
    for name in names:
        env_split = SPLIT_ALIASES.get(family, {}).get(name, name)
        size = split_size(family, env_split, data_root)
        types = None
        if family == "alfworld":  # .../<split>/<task_type>-<objects>-<scene>/trial_.../game.tw-pddl
            from envs.alfworld.data import list_games

            types = [Path(g).parent.parent.name.split("-")[0] for g in list_games(env_split, root=data_root)]
        tasks = []
        for i, index in enumerate(spread(size, n_tasks)):
            if family in ("alfworld", "webshop"):
                options = {"split": env_split, "index": index}
            else:
                options = {"dataset": env_split, "index": index}
            tasks.append(Task(env_id=cfg.env.id, options=options, group_id=i, seed=ev.seed + index,
                              env_kwargs=dict(kwargs)))
        panels.append(Panel(name=f"{family}_{name}", family=family, split=name, tasks=tasks, size=size,
                            task_types=[types[t.options["index"]] for t in tasks] if types else None))
    return panels


# ------------------------------------------------------------------------------------------------ policies
class RandomPolicy:
    """Uniform over the admissible actions (lower bound); turn t of task i, sample j draws from
    ``default_rng([seed, i, j, t])``, so a run is reproducible whatever the episodes' interleaving. WebShop lists
    its search box as the placeholder ``search[<query>]``: the random policy types the task's instruction there
    (searching the literal text "<query>" finds no product, which would make every episode score 0)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def act(self, ctx: Any, task: Task, slot: int) -> str:
        if not ctx.admissible:
            raise ValueError("policy=random needs an env that lists admissible actions (ALFWorld, WebShop)")
        rng = np.random.default_rng([self.seed, task.group_id, slot, ctx.step])
        action = str(ctx.admissible[int(rng.integers(len(ctx.admissible)))])
        return f"search[{ctx.task}]" if action == "search[<query>]" else action


class ExpertPolicy:
    """The env's own upper-bound policy, ``info["expert_action"]`` (env made with ``expert=True``): ALFWorld's fixed
    handcoded expert, WebShop's scripted oracle (:class:`envs.webshop.oracle.OraclePolicy`, which knows the goal)."""

    def act(self, ctx: Any, task: Task, slot: int) -> str:
        if "expert_action" not in ctx.info:
            raise ValueError("the env gives no info['expert_action'] (it needs env.kwargs.expert=true)")
        return str(ctx.info["expert_action"])


def make_policy(name: str, family: str, seed: int) -> Any:
    """The scripted policy ``name`` for ``family`` (None for ``model``); expert and oracle are both names of the
    env's upper-bound reference. ``ValueError`` when the env has none."""
    if name == "model":
        return None
    if name == "random":
        if family not in AGENT_ENVS:
            raise ValueError(f"policy=random needs admissible actions; {family} has none")
        return RandomPolicy(seed)
    if family in EXPERT_ENVS:
        return ExpertPolicy()
    raise ValueError(f"policy={name}: {family} has no scripted reference policy (valid: model)")


class ScriptedEngine:
    """Stands in for the engine under a scripted policy: only the tokenizer is used (prompts are still rendered,
    so the prompt budget applies as in training)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]

    def generate(self, *args: Any, **kwargs: Any) -> list[Generation]:  # never called by PolicyOrchestrator
        raise RuntimeError("a scripted policy does not generate")


class PolicyOrchestrator(RolloutOrchestrator):
    """:class:`RolloutOrchestrator` with an optional scripted ``policy`` (``act(ctx, task, slot) -> action``) and
    progress hooks ``on_turn(generation)`` / ``on_episode(episode)``. Training uses it with ``policy=None``."""

    def __init__(self, *args: Any, policy: Any = None, on_turn: Callable[[Generation], None] | None = None,
                 on_episode: Callable[[Episode], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policy, self.on_turn, self.on_episode = policy, on_turn, on_episode

    async def _generate(self, ctx: Any, task: Task, slot: int, prompt_ids: list[int], temperature: float,
                        is_high: bool) -> Generation:
        if self.policy is None:
            gen = await super()._generate(ctx, task, slot, prompt_ids, temperature, is_high)
        else:
            action = self.policy.act(ctx, task, slot)
            gen = Generation(token_ids=[], logprobs=[], text=f"<action>{action}</action>", finish_reason="stop")
        if self.on_turn is not None:
            self.on_turn(gen)
        return gen

    async def _episode(self, task: Task, temperature: float, is_high: bool, slot: int = 0) -> Episode:
        ep = await super()._episode(task, temperature, is_high, slot)
        if self.on_episode is not None:
            self.on_episode(ep)
        return ep


# ------------------------------------------------------------------------------------------------ running
def _task_id(ep: Episode) -> str:
    last = ep.turns[-1].info if ep.turns else {}
    for key in ("task_id", "uid", "goal_idx"):
        if last.get(key) is not None:
            return str(last[key])
    return json.dumps(ep.task.options, sort_keys=True)


async def run_panel(orch: PolicyOrchestrator, panel: Panel, *, temperature: float, samples: int,
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
            progress.phase(f"eval {panel.name}", total=len(panel.tasks) * samples)
        groups = [GroupSpec(task, [(float(temperature), False)] * samples) for task in panel.tasks]
        await orch.run_groups(groups, seed_key=0)  # fixed generation seeds: reproducible
    finally:
        orch.on_turn, orch.on_episode = prev_turn, prev_ep
        if progress is not None:
            progress.end()
    return dict(by_task)


def summarize(panel: Panel, by_task: dict[int, list[Episode]], *, samples: int,
              categories: list[str] | None = None) -> dict[str, Any]:
    """The panel's numbers and its episode records (see the module docstring). Failed episodes count as not solved.

    ``categories``: WebShop goal category by goal index (``per_category`` and the episodes' ``category``).
    """
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
            if categories is not None:
                goal = (ep.turns[-1].info.get("goal_idx") if ep.turns else None)
                rec["category"] = categories[int(goal)] if goal is not None else "unknown"
                per_cat[rec["category"]].append((env_reward, float(won)))
                kind = rec["task_type"] = rec["category"]  # WebShop's "task type" is the goal's category
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
    if panel.family == "webshop":
        result["score"] = 100.0 * sum(r["reward"] for r in records) / n_eps
        result["per_category"] = {k: {"score": 100.0 * sum(s for s, _ in v) / len(v),
                                      "success": sum(w for _, w in v) / len(v), "episodes": len(v)}
                                  for k, v in sorted(per_cat.items())}
    if panel.family in ("math", "code"):
        result["accuracy"] = success
    result["episodes"] = records
    return result


def plot_panel(result: dict[str, Any], path: Path) -> None:
    """Bar chart: success per task type (ALFWorld), score and success per category (WebShop), pass@k (math/code)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    from rich.console import Console
    from rich.table import Table

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
    """``cfg.rollout`` with eval's turn budget and concurrency."""
    rollout = copy.deepcopy(cfg.rollout)
    if cfg.eval.max_turns > 0:
        rollout.max_turns = cfg.eval.max_turns
    rollout.max_concurrent_episodes = max(0, cfg.eval.concurrency)
    return rollout


async def evaluate(cfg: Any, pool: Any, engine: Any, *, panels: list[Panel], folder: Path | None = None,
                   progress: Any = None) -> list[dict[str, Any]]:
    """Evaluate ``panels`` with ``cfg.eval``'s policy and decoding on an open env ``pool`` and ``engine`` (an
    engine, or a :class:`ScriptedEngine` for scripted policies). Writes ``folder/<panel>.json|.png`` when
    ``folder`` is given. Returns one result dict per panel (the JSON content)."""
    from agent_rl.rollout import get_prompt

    ev = cfg.eval
    results = []
    policy = make_policy(ev.policy, panels[0].family, ev.seed) if panels else None
    max_new = ev.max_new_tokens or cfg.engine.max_new_tokens
    orch = PolicyOrchestrator(pool, engine, get_prompt(cfg.env.prompt), eval_rollout_config(cfg),
                              max_new_tokens=max_new, top_p=cfg.engine.top_p, top_k=cfg.engine.top_k,
                              seed=cfg.engine.seed if cfg.engine.seed is not None else ev.seed, policy=policy,
                              action_format=cfg.env.action_format, tool_call_format=cfg.model.tool_call_format)
    categories = None
    try:
        for panel in panels:
            if panel.family == "webshop" and categories is None:
                from envs.webshop.catalog import get_catalog

                categories = [g["category"] for g in get_catalog(cfg.data.root or None).goals]
            t0 = time.perf_counter()
            by_task = await run_panel(orch, panel, temperature=ev.temperature, samples=ev.samples,
                                      progress=progress)
            result = summarize(panel, by_task, samples=ev.samples,
                               categories=categories if panel.family == "webshop" else None)
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
        from agent_rl.rollout.prompts.base import _PROMPTS

        env = next((ov.partition("=")[2] for ov in out if ov.startswith("env=")), "alfworld")
        name = f"{prompt}_{env}" if f"{prompt}_{env}" in _PROMPTS else prompt
        out.append(f"env.prompt={name}")
    return out


def load_tokenizer_only(cfg: Any) -> Any:
    """A tokenizer for scripted policies without loading the model (SmolLM2's for the built-in models)."""
    from agent_rl.models import _finish_tokenizer, smollm2_tokenizer

    if cfg.model.path or cfg.model.name not in ("smollm2", "tiny"):
        from transformers import AutoTokenizer

        return _finish_tokenizer(AutoTokenizer.from_pretrained(cfg.model.path or cfg.model.name))
    return _finish_tokenizer(smollm2_tokenizer())


async def _run(cfg: Any, out: Path, progress: Any) -> list[dict[str, Any]]:
    from agent_rl.engines import engine_kwargs, get_engine, set_torch_threads
    from agent_rl.train import open_env_pool, resolve_device, seed_everything

    seed_everything(cfg.eval.seed)
    set_torch_threads(cfg.engine.num_threads)
    panels = build_panels(cfg)
    if cfg.eval.policy == "model":
        from agent_rl.models import load_policy

        progress.note(f"loading model {cfg.model.path or cfg.model.name} (SmolLM2: converted on first use, ~30 s)")
        model, tokenizer = load_policy(cfg.model)
        model.to(resolve_device(cfg.trainer.device)).eval()
        engine = get_engine(cfg.engine.name, model, tokenizer, **engine_kwargs(cfg))
    else:
        engine = ScriptedEngine(load_tokenizer_only(cfg))
    if cfg.env_server.mode != "local" and not cfg.env_server.urls:
        progress.note(f"starting the {cfg.env.id} env server (log: {out / 'env_server.log'})")
    try:
        async with open_env_pool(cfg, out) as pool:
            return await evaluate(cfg, pool, engine, panels=panels, folder=out / "eval", progress=progress)
    finally:
        getattr(engine, "close", lambda: None)()  # vllm: its engine processes and sync files


def main(overrides: list[str] | None = None) -> dict[str, Any]:
    """Compose the config (as ``agent_rl.train`` does, plus the ``policy=`` / ``prompt=`` shorthands), evaluate
    every panel, print its table and write ``DIR/eval/<panel>.json|.png``. Returns ``{panel name: result}``."""
    from agent_rl.config import load_config
    from agent_rl.progress import Progress

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
    if cfg.data.root:
        os.environ["AGENT_RL_DATA"] = cfg.data.root
    progress = Progress(enabled=cfg.trainer.progress)
    results = asyncio.run(_run(cfg, out, progress))
    for result in results:
        print_table(result)
        print(f"  -> {out / 'eval' / (result['panel'] + '.json')}")
    return {r["panel"]: r for r in results}


def cli() -> None:
    """``python -m agent_rl.eval``: :func:`main`; a config error is one message (exit code 2)."""
    from agent_rl.config import ConfigError

    try:
        main()
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
