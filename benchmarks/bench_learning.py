"""Does it learn, and which algorithm learns faster: held-out success vs training step for several algorithms and
seeds on one task; writes ``OUT/results.json``, ``OUT/curves.png`` and prints a table. Asserts nothing.

    python benchmarks/bench_learning.py --env textworld --env-kwargs '{"family": "coin_collector", "level": 5}' \\
        --algos grpo,tgrl --seeds 0,1,2 --steps 40 --eval-every 10 --panel 50 --out runs/learning
    python benchmarks/bench_learning.py --model tiny --steps 2 --eval-every 1 --panel 4 --seeds 0 --out /tmp/smoke

Each (algo, seed) run is ``python -m agent_rl.train`` (the library, in this process) trained in chunks of
``--eval-every`` steps (``trainer.resume=auto``: model, optimizer, RNG and data position restored, so the chunks add
up to one uninterrupted run); before the first chunk and after each one, the latest policy plays the held-out panel
(test-split games ``0..panel-1``) greedily (T = 0) in-process. ``--algos`` entries are config overrides joined by
``+``: ``grpo``, ``tgrl``, ``tgrl+credit=uniform`` (mixed groups, uniform credit: the ablation),
``tgrl+credit=tp+schedule=linear``, ``tampo`` (algorithms.md section 8), ``grpo+rollout.temperature_schedule=linear:0.9:1.5:8``
(GRPO's linear temperature schedule over 8 steps: give the length, the runs are trained in resumed chunks; ``:`` is
part of the value, ``+`` separates overrides). ``--train`` passes further overrides to every run (e.g. ``model.path=...`` for a
behaviour-cloned start, ``trainer.tasks_per_step=4``).

``results.json``: ``{algo: {seed: {"step": [...], "eval_success": [...], "wall_s": [...], "entropy": [...],
"eval_invalid_frac": [...], "eval_mean_turns": [...], "train_step", "temperature", "delta_R", "delta_R_groups",
"success_high", "success_low", "groups_equal_frac", "rollout_success", "learnable_frac", "generated_turns", ... (the
cost and fork columns of :func:`per_step_choices`): [...]}}}`` (the panel's invalid-action fraction and mean turns; per training step the
temperature the method chose, :func:`per_step_choices`, and TGRL's exploration gain)
(entropy: the learner's ``actor/entropy`` of the last training step before each evaluation; None at step 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def evaluate(cfg: Any, checkpoint: Path | None, panel: int, split: str, temperature: float = 0.0,
             stats: dict[str, Any] | None = None) -> float:
    """Success rate of the policy (``checkpoint``, else ``cfg.model``) on ``split`` games ``0..panel-1``, decoded at
    ``temperature`` (0 = greedy), ``cfg.rollout.max_turns`` turns, ``cfg.rollout.mode`` prompts. ``stats`` (if given)
    is filled with ``success``, ``invalid_frac`` (invalid actions / turns over the panel), ``mean_turns`` and
    ``wall_s`` (model load + panel, seconds) and ``episodes`` (index, won, actions of each game)."""
    from agent_rl.engines import get_engine
    from agent_rl.envclient import LocalEnvPool
    from agent_rl.models import load_policy
    from agent_rl.rollout import RolloutOrchestrator, get_prompt
    from agent_rl.rollout.orchestrator import GroupSpec
    from agent_rl.types import Task

    import dataclasses

    t0 = time.perf_counter()
    model_cfg = dataclasses.replace(cfg.model, path=str(checkpoint)) if checkpoint is not None else cfg.model
    model, tokenizer = load_policy(model_cfg)
    model.eval()
    engine = get_engine(cfg.engine.name, model, tokenizer, batch_size=cfg.engine.batch_size, seed=0,
                        gpu_memory_utilization=cfg.engine.gpu_memory_utilization, dtype=cfg.model.dtype)

    async def run() -> float:
        pool = LocalEnvPool(mode="process", max_workers=2, preload_envs=[cfg.env.id])
        # at most the pool's sessions at once (2 workers x 8): beyond that sessions are refused, not queued
        # a panel plays its games as given, like agent_rl.eval.runner.eval_rollout_config: no forked siblings (a
        # run's rollout.fork would add episodes to the panel, and select=js refuses an engine without T0/T1)
        rollout = dataclasses.replace(cfg.rollout, max_concurrent_episodes=16, fork=type(cfg.rollout.fork)())
        try:
            orch = RolloutOrchestrator(pool, engine, get_prompt(cfg.env.prompt), rollout,
                                       max_new_tokens=cfg.engine.max_new_tokens, seed=0)
            groups = [GroupSpec(Task(cfg.env.id, options={"split": split, "index": i}, group_id=i,
                                     env_kwargs=cfg.env_kwargs), [(temperature, False)]) for i in range(panel)]
            result = await orch.run_groups(groups)
            if result.dropped_groups:
                raise RuntimeError(f"{result.dropped_groups} of {panel} panel games failed (not a loss of the policy):"
                                   f" {sorted(set(result.failures))[:3]}")
            success = float(sum(ep.won for ep in result.episodes)) / panel
            if stats is not None:
                turns = sum(len(ep.turns) for ep in result.episodes)
                stats.update(success=success, invalid_frac=sum(t.invalid for ep in result.episodes for t in ep.turns)
                             / max(1, turns), mean_turns=turns / max(1, len(result.episodes)),
                             wall_s=time.perf_counter() - t0,
                             episodes=[{"index": ep.task.options.get("index"), "won": ep.won,
                                        "actions": [t.action for t in ep.turns]} for ep in result.episodes])
            return success
        finally:
            await pool.aclose()

    return asyncio.run(run())


def panel_key(cfg: Any, checkpoint: Path | None, panel: int, split: str, temperature: float) -> str:
    """The identity of one panel evaluation, for ``--eval-cache``: the policy (the checkpoint's, else
    ``cfg.model.path``'s, resolved path and the newest mtime of its files; the model name when neither is set) and
    everything the panel plays with (env id and kwargs, prompt, rollout mode, turns, new tokens, panel, split, T).
    Greedy panels with the same key give the same games (the engine's seed is 0), so a benchmark whose runs share a
    start plays the start's panel once."""
    path = checkpoint if checkpoint is not None else (Path(cfg.model.path) if cfg.model.path else None)
    policy: Any = cfg.model.name
    if path is not None:
        path = path.resolve()
        files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
        policy = [str(path), max((f.stat().st_mtime_ns for f in files), default=0)]
    return json.dumps([policy, cfg.env.id, cfg.env_kwargs, cfg.env.prompt, cfg.rollout.mode, cfg.rollout.max_turns,
                       cfg.rollout.history_length, cfg.engine.max_new_tokens, panel, split, temperature],
                      sort_keys=True, default=str)


def cached_evaluate(cfg: Any, checkpoint: Path | None, args: argparse.Namespace,
                    stats: dict[str, Any] | None = None) -> float:
    """``evaluate`` at T = 0 through ``args.eval_cache`` (a JSON file ``{panel_key: stats}``; none: always play).
    Several processes may share the file: each entry is written whole (read, update, atomic replace)."""
    st: dict[str, Any] = {}
    cache = Path(args.eval_cache) if args.eval_cache else None
    key = panel_key(cfg, checkpoint, args.panel, args.split, 0.0) if cache is not None else ""
    if cache is not None and cache.exists() and key in (known := json.loads(cache.read_text())):
        st = known[key]
        print(f"panel from {cache} (played before, {st['wall_s']:.0f} s then)", flush=True)
    else:
        evaluate(cfg, checkpoint, args.panel, args.split, 0.0, stats=st)
        if cache is not None:
            known = json.loads(cache.read_text()) if cache.exists() else {}
            known[key] = st
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known))
            tmp.replace(cache)
    if stats is not None:
        stats.update(st)
    return float(st["success"])


def run_one(env: str, algo: str, seed: int, args: argparse.Namespace, out: Path) -> dict[str, list]:
    from agent_rl.config.compose import load_config
    from agent_rl.learner.checkpoint import latest_checkpoint
    from agent_rl.logging import read_metrics
    from agent_rl.train import main as train_main

    run_dir = out / "runs" / f"{algo.replace('+', '_').replace('=', '-')}_seed{seed}"
    name, *extra = algo.split("+")
    overrides = [f"env={env}", f"algo={name}", *extra, f"model={args.model}", f"trainer.seed={seed}",
                 f"engine.seed={seed}", f"trainer.output_dir={run_dir}", "trainer.progress=false",
                 "env_server.mode=local", "env_server.local_kind=process", "trainer.resume=auto",
                 f"trainer.save_every={args.eval_every}", "trainer.keep_checkpoints=1", *args.train]
    overrides += [f"env.kwargs.{k}={v}" for k, v in args.env_kwargs.items()]
    cfg = load_config([o for o in overrides if not o.startswith("trainer.total_steps")] + ["trainer.total_steps=1"])
    curve: dict[str, list] = {"step": [], "eval_success": [], "wall_s": [], "entropy": [], "eval_invalid_frac": [],
                              "eval_mean_turns": []}
    wall = 0.0

    def panel(step: int, checkpoint: Path | None) -> float:
        st: dict[str, Any] = {}
        success = cached_evaluate(cfg, checkpoint, args, stats=st)
        curve["step"].append(step)
        curve["eval_success"].append(success)
        curve["eval_invalid_frac"].append(st["invalid_frac"])
        curve["eval_mean_turns"].append(st["mean_turns"])
        return success

    panel(0, None)
    curve["wall_s"].append(0.0)
    curve["entropy"].append(None)
    print(f"{algo} seed {seed}: step 0 success {curve['eval_success'][-1]:.2f}", flush=True)
    for step in range(args.eval_every, args.steps + 1, args.eval_every):
        t0 = time.perf_counter()
        train_main([*overrides, f"trainer.total_steps={step}"])
        wall += time.perf_counter() - t0
        records = read_metrics(run_dir / "metrics.jsonl", "train")
        ckpt = latest_checkpoint(run_dir)
        success = panel(step, ckpt)
        curve["wall_s"].append(wall)
        curve["entropy"].append(records[-1].get("actor/entropy"))
        print(f"{algo} seed {seed}: step {step} success {success:.2f} (train wall {wall:.0f} s)", flush=True)
    curve.update(per_step_choices(read_metrics(run_dir / "metrics.jsonl", "train")))
    # algo.calibration=probe: the probe's pairs, statistics and chosen pair (algorithms.md 3b)
    probe = read_metrics(run_dir / "metrics.jsonl", "calibration")
    if probe:
        curve["calibration"] = {k: probe[-1].get(k) for k in ("pairs", "chosen", "episodes", "wall_s")}
    return curve


#: the temperature a method chose per training step: TGRL's T1, TAMPO's draw, a schedule's value (first present)
TEMPERATURE_KEYS = ("tampo/t", "tgrl/t_high", "rollout/temperature")


def per_step_choices(records: list[dict[str, Any]]) -> dict[str, list]:
    """Per training step of one run: ``train_step``, ``temperature`` (:data:`TEMPERATURE_KEYS`, None for a fixed-T
    method without one), and TGRL's ``delta_R``, ``delta_R_groups`` (informative groups), ``success_high`` /
    ``success_low`` (None for the other algorithms); for every method ``groups_equal_frac`` (the step's groups whose
    rewards were all equal: rollouts that taught nothing) and ``rollout_success``, and the pass-rate curriculum's
    ``learnable_frac`` (None under uniform sampling).

    What a step cost and what it trained on, for every method: ``generated_turns`` (turns the policy generated:
    ``fork/generated_turns`` under ``rollout.fork``, a sibling's replayed prefix not counted; otherwise episodes x
    mean turns), ``kv_reuse_tokens``, ``grad_norm`` (0: the step had no learning signal), ``dropped_groups``,
    ``rollout_s`` and ``update_s``; and under ``rollout.fork`` (None without) ``fork_groups``, ``fork_siblings``
    (``fork/extra_episodes``), ``filled_episodes``, ``replay_s`` (summed over siblings, not wall),
    ``replayed_turns`` and ``replay_mismatch``."""
    def col(key: str) -> list:
        return [r.get(key) for r in records]

    def generated(r: dict[str, Any]) -> float | None:
        if "fork/generated_turns" in r:
            return r["fork/generated_turns"]
        if "rollout/episodes" in r and "episode/turns_mean" in r:
            return r["rollout/episodes"] * r["episode/turns_mean"]
        return None
    temps = [next((r[k] for k in TEMPERATURE_KEYS if k in r), None) for r in records]
    return {"train_step": col("step"), "temperature": temps, "delta_R": col("tgrl/delta_R"),
            "delta_R_groups": col("tgrl/delta_R_groups"), "success_high": col("tgrl/success_high"),
            "success_low": col("tgrl/success_low"), "groups_equal_frac": col("rollout/groups_equal_frac"),
            "rollout_success": col("success/rate"), "learnable_frac": col("curriculum/learnable_frac"),
            "generated_turns": [generated(r) for r in records], "kv_reuse_tokens": col("throughput/kv_reuse_tokens"),
            "grad_norm": col("actor/grad_norm"), "dropped_groups": col("rollout/dropped_groups"),
            "rollout_s": col("time/rollout_s"), "update_s": col("time/update_s"), "fork_groups": col("fork/groups"),
            "fork_siblings": col("fork/extra_episodes"), "filled_episodes": col("fork/filled_episodes"),
            "replay_s": col("fork/replay_s"), "replayed_turns": col("fork/replayed_turns"),
            "replay_mismatch": col("fork/replay_mismatch")}


def steps_to(curve: dict[str, list], threshold: float, key: str = "step") -> float | None:
    """First ``key`` value (step or wall time) at which the held-out success reaches ``threshold`` (None: never,
    or the start already does)."""
    if curve["eval_success"][0] >= threshold:
        return None
    for x, s in zip(curve[key], curve["eval_success"]):
        if s >= threshold:
            return x
    return None


def plot(results: dict[str, dict[str, dict[str, list]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    for algo, seeds in results.items():
        curves = list(seeds.values())
        n = min(len(c["step"]) for c in curves)
        steps = np.array(curves[0]["step"][:n])
        succ = np.array([c["eval_success"][:n] for c in curves])
        wall = np.array([c["wall_s"][:n] for c in curves]).mean(0)
        for ax, x in ((axes[0], steps), (axes[1], wall)):
            ax.plot(x, succ.mean(0), label=algo)
            ax.fill_between(x, succ.min(0), succ.max(0), alpha=0.2)
        ent = np.array([[np.nan if e is None else e for e in c["entropy"][:n]] for c in curves], dtype=float)
        if np.isfinite(ent).any():
            axes[2].plot(steps[1:], np.nanmean(ent[:, 1:], 0), label=algo)
    axes[0].set(xlabel="training step", ylabel="held-out success (greedy)")
    axes[1].set(xlabel="training wall time (s)", ylabel="held-out success (greedy)")
    axes[2].set(xlabel="training step", ylabel="policy entropy at the sampling T (nats/token)")
    # one legend under the panels (long override names do not fit inside them)
    handles, labels = axes[0].get_legend_handles_labels()
    ncol = 1 if max(map(len, labels), default=0) > 80 else 2  # a fork arm's name is wider than half the figure
    rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * rows, 1, 1))
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend's widest name is never clipped


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--env", default="textworld", help="env preset (configs/env), e.g. textworld, alfworld")
    p.add_argument("--env-kwargs", type=json.loads, default={"family": "coin_collector", "level": 5},
                   help="JSON env kwargs (env.kwargs.*)")
    p.add_argument("--algos", default="grpo,tgrl,tgrl+credit=uniform",
                   help="comma-separated; each an algo plus '+'-joined overrides")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=40, help="training steps per run")
    p.add_argument("--eval-every", type=int, default=10, help="evaluate the held-out panel every k steps")
    p.add_argument("--panel", type=int, default=50, help="held-out games (test split 0..panel-1)")
    p.add_argument("--split", default="test", help="held-out split")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--threshold", type=float, default=0.0,
                   help="success level for steps-to-threshold (default: start + 0.5 x (best - start))")
    p.add_argument("--train", nargs="*", default=[], help="extra training overrides for every run")
    p.add_argument("--out", default="runs/learning")
    p.add_argument("--eval-checkpoints", nargs="*", default=[],
                   help="train nothing: play the panel with each of these checkpoints (e.g. to choose a behaviour-"
                        "cloned start; 'base' = the --model itself, zero-shot) at each --eval-temperatures; prints "
                        "success, invalid-action fraction, mean turns and wall time, writes OUT/eval.json")
    p.add_argument("--eval-temperatures", default="0", help="comma-separated, for --eval-checkpoints")
    p.add_argument("--eval-cache", default="",
                   help="JSON file of greedy panel results shared by runs and processes: a panel whose policy and "
                        "settings were played before (e.g. the common start of every run) is read, not replayed")
    p.add_argument("--merge", nargs="*", default=[],
                   help="results.json files of earlier runs (e.g. one process per algorithm): train nothing, write "
                        "their union to OUT/results.json, plot and tabulate it")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.eval_checkpoints:
        from agent_rl.config.compose import load_config

        cfg = load_config([f"env={args.env}", f"model={args.model}", *args.train,
                           *[f"env.kwargs.{k}={v}" for k, v in args.env_kwargs.items()]])
        # "base": the model= policy itself (zero-shot), no checkpoint
        rates: dict[str, dict[str, dict[str, Any]]] = {}
        for ck in args.eval_checkpoints:
            for t in args.eval_temperatures.split(","):
                st: dict[str, Any] = {}
                evaluate(cfg, None if ck == "base" else Path(ck), args.panel, args.split, float(t), stats=st)
                rates.setdefault(ck, {})[t] = st
                print(f"{ck} T={t}: success {st['success']:.2f}, invalid {st['invalid_frac']:.2f}, turns "
                      f"{st['mean_turns']:.1f}, wall {st['wall_s']:.0f} s", flush=True)
                (out / "eval.json").write_text(json.dumps(rates, indent=1))
        return {"eval": rates}
    results: dict[str, dict[str, dict[str, list]]] = {}
    for path in args.merge:
        for algo, seeds in json.loads(Path(path).read_text()).items():
            results.setdefault(algo, {}).update(seeds)
    for algo in [a for a in args.algos.split(",") if a] if not args.merge else []:
        for seed in [int(s) for s in args.seeds.split(",") if s]:
            results.setdefault(algo, {})[str(seed)] = run_one(args.env, algo, seed, args, out)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "curves.png")

    start_mean = sum(c["eval_success"][0] for s in results.values() for c in s.values()) / max(
        1, sum(len(s) for s in results.values()))
    best = max(max(c["eval_success"]) for s in results.values() for c in s.values())
    thr = args.threshold or start_mean + 0.5 * (best - start_mean)
    print(f"\nthreshold {thr:.2f}; mean [min-max] over seeds; steps/wall to threshold: mean over the seeds that "
          "reach it (n/N reached)")
    print(f"{'algo':28s} {'start':>16s} {'final':>16s} {'steps->thr':>16s} {'wall->thr s':>12s} {'final H':>8s}")
    table = {}
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    for algo, seeds in results.items():
        curves = list(seeds.values())
        st = [steps_to(c, thr) for c in curves]
        wt = [steps_to(c, thr, "wall_s") for c in curves]
        ent = [c["entropy"][-1] for c in curves if c["entropy"][-1] is not None]
        starts = [c["eval_success"][0] for c in curves]
        finals = [c["eval_success"][-1] for c in curves]
        table[algo] = {"start": mean(starts), "start_min": min(starts), "start_max": max(starts),
                       "final": mean(finals), "final_min": min(finals), "final_max": max(finals),
                       "steps_to_threshold_per_seed": st, "wall_to_threshold_s_per_seed": wt,
                       "steps_to_threshold": mean([s for s in st if s is not None]),
                       "wall_to_threshold_s": mean([w for w in wt if w is not None]),
                       "reached": sum(s is not None for s in st), "seeds": len(curves),
                       "final_entropy": mean(ent)}
        r = table[algo]
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        print(f"{algo:28s} {r['start']:.2f} [{r['start_min']:.2f}-{r['start_max']:.2f}] "
              f"{r['final']:.2f} [{r['final_min']:.2f}-{r['final_max']:.2f}] "
              f"{fmt(r['steps_to_threshold'], '.1f'):>10s} ({r['reached']}/{r['seeds']}) "
              f"{fmt(r['wall_to_threshold_s'], '12.0f')} {fmt(r['final_entropy'], '8.3f')}")
    # the headline pair: the first entry of each algorithm that changes no credit rule (e.g. "tgrl+algo.warmup_steps=4")
    plain = lambda name: next((table[a] for a in table if a.split("+")[0] == name and "credit=" not in a), {})  # noqa
    tg, gr = plain("tgrl"), plain("grpo")
    ratio = None
    if tg.get("steps_to_threshold") and gr.get("steps_to_threshold"):
        ratio = tg["steps_to_threshold"] / gr["steps_to_threshold"]
        print(f"TGRL/GRPO steps to threshold {thr:.2f}: {ratio:.2f} "
              f"(reached by {tg['reached']}/{tg['seeds']} and {gr['reached']}/{gr['seeds']} seeds)")
    else:
        print(f"TGRL/GRPO steps to threshold {thr:.2f}: - (not reached by every algorithm)")
    (out / "table.json").write_text(json.dumps({"threshold": thr, "table": table, "tgrl_grpo_steps_ratio": ratio},
                                               indent=1))
    return {"results": results, "table": table}


if __name__ == "__main__":
    from agent_rl.progress import quiet_library_progress

    quiet_library_progress()  # a log (not a terminal) gets no carriage-return lines from library bars
    main()
