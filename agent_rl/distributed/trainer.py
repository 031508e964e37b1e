"""``trainer.backend=ray``: the local loop's steps with Ray actors doing the work (docs/scaling.md).

One step: the driver samples ``trainer.tasks_per_step`` tasks -> the M rollout workers play their share of the
groups (contiguous chunks, in parallel) -> ``build_rollout_batch`` on the driver -> ``shard_batch`` (whole groups) ->
the N learner ranks update together (torch DDP, :mod:`agent_rl.distributed.data_parallel`) -> rank 0's weights go
through the Ray object store to every worker, as weight version ``step`` -> the episode store and, when due, the
eval panel on rollout worker 0 -> log (same ``MetricsLogger`` as local) -> rank 0 writes ``DIR/checkpoints/step_N``
(the local backend's format, ``extra.json`` with the run's config included: resume works for any N, and across
backends, and compares configs as the local one does).

Placement: learner ranks in one ``PACK`` placement group (one node when they fit: DDP traffic stays local), env-server
replicas in a ``SPREAD`` group (one per node when possible), rollout workers by plain resource requests.

Faults: a rollout worker that dies (``RayActorError``) is replaced by a fresh actor with the current weights and
its groups are re-run (at most ``MAX_WORKER_RESTARTS`` times per step); an env-server replica that dies loses its
sessions, the orchestrator re-runs those episodes and ``HTTPEnvPool`` opens new sessions on the other replicas.

Same numbers as the local backend with N = 1 (docs/scaling.md, Determinism): every worker samples with the local
``engine.seed`` and per-row keys (step, group, slot, turn), so the episodes do not depend on M or on timing.

Differences from the local backend: no env-reset prefetch across steps; DAPO dynamic sampling drops uniform groups
without refilling (``max_extra_rounds`` is 0 per worker); a step with fewer kept groups than learner ranks skips the
update (warned); ``DIR/checkpoints`` must be on a file system rank 0 and the driver share (one node, or NFS).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agent_rl.distributed.actors import EnvServerReplica, LearnerRank, LearnerSpec, RolloutWorker

#: times one step replaces dead rollout workers before giving up.
MAX_WORKER_RESTARTS = 3


def _ray_init(cfg: Any) -> bool:
    """Connect to (or start) Ray; True when this call started it (and so shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    repo = str(Path(__file__).resolve().parents[2])
    env_vars = {"PYTHONPATH": repo + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
                "TOKENIZERS_PARALLELISM": "false"}
    if cfg.data.root:
        env_vars["AGENT_RL_DATA"] = cfg.data.root
    address = cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"include_dashboard": False, "runtime_env": {"env_vars": env_vars}}
    if address is None:  # a local cluster with enough logical CPUs for every role (the OS shares the real ones)
        t, r, e = cfg.trainer, cfg.rollout, cfg.env_server
        need = t.num_learners * t.learner_cpus + r.num_workers * r.worker_cpus + e.replicas * e.replica_cpus
        kwargs["num_cpus"] = max(os.cpu_count() or 1, int(need + 0.999))
    ray.init(address=address, **kwargs)
    return True


def _nodes(pg: Any) -> int:
    """Distinct nodes a placement group's bundles landed on."""
    from ray.util.placement_group import placement_group_table

    return len(set(placement_group_table(pg).get("bundles_to_node_id", {}).values()))


def _merge_learner_metrics(ranks: list[dict[str, float]], batch: Any) -> dict[str, float]:
    """One record from the ranks' metrics: ``actor/pg_loss`` is the ranks' mean (each rank's loss is already over the
    global denominator / N: module docstring of data_parallel), ``actor/grad_norm``, ``actor/lr``, ``schedule/S``,
    ``actor/optimizer_steps`` are equal on every rank (rank 0's), ``time/update_s`` the slowest rank's, TGRL group
    metrics recomputed on the whole batch, every other metric the response-token-weighted mean over ranks."""
    from agent_rl import algos

    weights = [max(m.get("batch/response_tokens", 1.0), 1e-9) for m in ranks]
    out: dict[str, float] = {}
    for key in ranks[0]:
        vals = [m.get(key, 0.0) for m in ranks]
        if key == "actor/pg_loss":
            out[key] = sum(vals) / len(vals)
        elif key in ("actor/grad_norm", "actor/lr", "schedule/S", "actor/optimizer_steps"):
            out[key] = vals[0]
        elif key == "time/update_s":
            out[key] = max(vals)
        elif key == "batch/response_tokens":
            out[key] = sum(vals)
        else:
            out[key] = sum(v * w for v, w in zip(vals, weights)) / sum(weights)
    b = batch
    out.update(algos.tgrl_metrics(b.rewards, b.group_index, b.is_high.bool(), success=b.won,
                                  episode_index=b.episode_index))
    return out


def train_ray(cfg: Any, out: Path, config_file: Path | None = None) -> dict[str, Any]:
    """Run steps ``start..trainer.total_steps`` on Ray; returns the last step's logged record (as ``train_loop``).

    The artefacts are the local backend's, written by the same code (:mod:`agent_rl.train`'s shared steps):
    ``metrics.jsonl`` / ``tb`` (``MetricsLogger``), ``checkpoints/step_N``, ``episodes/step_N.jsonl``
    (``save_step_episodes`` with the ranks' per-token statistics put back in the batch's row order), the eval panel
    (``TrainingEval``: ``eval/<panel>/...`` metrics and ``eval/step_N/``), the ``Progress`` phase lines; ``main``
    then writes ``curves.png`` and ``summary.md`` for both backends.

    The eval panel runs on rollout worker 0 (:meth:`RolloutWorker.evaluate`), which after each update holds exactly
    the weights the next rollout samples with (rank 0's, version ``step``), next to an engine (vLLM on GPU) and an
    env client: evaluating in the driver instead would need another policy copy and engine there (on a GPU cluster
    the driver usually has no GPU). Greedy panels match the local backend's numbers: the panel's sampling is keyed
    per row as the rollout's.
    """
    import ray
    from ray.exceptions import RayActorError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from agent_rl.distributed.data_parallel import shard_indices, take_shard, unshard_rows
    from agent_rl.episodes import parse_save_episodes, save_step_episodes
    from agent_rl.eval.training import TrainingEval
    from agent_rl.learner.checkpoint import latest_checkpoint
    from agent_rl.logging import MetricsLogger
    from agent_rl.progress import Progress
    from agent_rl.rollout import TaskSampler, build_rollout_batch, group_temperatures
    from agent_rl.rollout.orchestrator import rollout_metrics
    from agent_rl.train import (check_dropped_groups, checkpoint_extra, load_run_policy, prune_checkpoints,
                                resume_path, seed_everything, warn_idle_run, warn_idle_step)

    for module in cfg.trainer.imports:
        importlib.import_module(module)
    seed_everything(cfg.trainer.seed)
    t, r, es = cfg.trainer, cfg.rollout, cfg.env_server
    n_learners, n_workers = t.num_learners, r.num_workers
    if t.tasks_per_step < n_learners:
        raise ValueError(f"trainer.tasks_per_step={t.tasks_per_step} < trainer.num_learners={n_learners}: every "
                         "learner rank needs at least one whole group")
    progress = Progress(enabled=t.progress)  # the local backend's phase lines: rollout, update, checkpoint, eval
    # the driver's copy: tokenizer (batches, episode store) and the prompt budget of the loaded model, which the
    # workers then get in cfg; the weights stay unused here
    model, tokenizer = load_run_policy(cfg, progress, config_file)
    del model
    evaluator = TrainingEval(cfg, out, progress)  # raises ConfigError before any actor starts (panel not held out)
    keep_episodes = parse_save_episodes(t.save_episodes)
    started = _ray_init(cfg)
    actors: list[Any] = []
    groups: list[Any] = []
    workers: list[Any] = []
    logger = None
    try:
        # ---- env-server replicas (http mode without external URLs), spread over nodes
        urls = list(es.urls)
        if es.mode == "http" and not urls:
            pg_env = placement_group([{"CPU": es.replica_cpus}] * es.replicas, strategy="SPREAD")
            groups.append(pg_env)
            ray.get(pg_env.ready(), timeout=600)
            Replica = ray.remote(EnvServerReplica)
            replicas = [Replica.options(num_cpus=es.replica_cpus, name=f"agent_rl-env-{i}",
                                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg_env, placement_group_bundle_index=i)).remote(
                [cfg.env.id], list(es.imports), es.token, es.max_sessions, es.workers, cfg.data.root)
                for i in range(es.replicas)]
            actors += replicas
            urls = ray.get([a.url.remote(es.startup_timeout_s) for a in replicas])
            print(f"env-server replicas on {_nodes(pg_env)} node(s): {', '.join(urls)}", file=sys.stderr)

        # ---- learner ranks, packed
        gpu = t.learner_gpus > 0
        bundle = {"CPU": t.learner_cpus, **({"GPU": t.learner_gpus} if gpu else {})}
        pg_learn = placement_group([bundle] * n_learners, strategy="PACK")
        groups.append(pg_learn)
        ray.get(pg_learn.ready(), timeout=600)
        spec = LearnerSpec.from_config(cfg, device="cuda" if gpu else "cpu")
        Rank = ray.remote(LearnerRank)
        ranks = [Rank.options(num_cpus=t.learner_cpus, num_gpus=t.learner_gpus,
                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                  placement_group=pg_learn, placement_group_bundle_index=i)).remote(i, n_learners, spec)
                 for i in range(n_learners)]
        actors += ranks
        addr, port = ray.get(ranks[0].address.remote())
        backend = ray.get([rk.setup.remote(addr, port) for rk in ranks])[0]
        print(f"{n_learners} learner rank(s) on {_nodes(pg_learn)} node(s), process group: {backend}", file=sys.stderr)

        # ---- resume (every rank loads the same checkpoint, whatever N wrote it)
        sampler = TaskSampler(cfg.env.id, cfg.env.sampler, env_kwargs=cfg.env_kwargs, seed=t.seed)
        total, start = t.total_steps, 1
        ckpt = resume_path(cfg, out, latest_checkpoint)
        if ckpt is not None:  # the optimiser hyper-parameters and LR schedule are this config's (RESUME_APPLIED)
            extra = ray.get([rk.load.remote(str(ckpt), t.resume_weights_only) for rk in ranks])[0]
            start = int(extra["step"]) + 1
            sampler.load_state_dict(extra["sampler"])
            print(f"resumed from {ckpt} at step {start} (actor/lr {ray.get(ranks[0].lr.remote()):.6g})",
                  file=sys.stderr)
            if start > total:
                print(f"nothing to train: the checkpoint is at step {start - 1} and trainer.total_steps={total}; "
                      "raise trainer.total_steps to train further", file=sys.stderr)
                return {}

        # ---- rollout workers, loaded with weight version start - 1 (the updates behind them)
        Worker = ray.remote(RolloutWorker)
        version = start - 1
        weights = ranks[0].get_weights.remote()

        incarnation = [0] * n_workers
        restarts = 0  # worker replacements not yet reported in a step's metrics

        def new_worker(i: int) -> Any:
            """Worker i (named ``agent_rl-rollout-<i>-<incarnation>``) loaded with the current weights; a worker
            that dies while loading is replaced too."""
            nonlocal restarts
            while True:
                w = Worker.options(num_cpus=r.worker_cpus, num_gpus=r.worker_gpus,
                                   name=f"agent_rl-rollout-{i}-{incarnation[i]}").remote(cfg, i, urls)
                incarnation[i] += 1
                try:
                    ray.get(w.set_weights.remote(version, weights))
                    return w
                except RayActorError:
                    restarts += 1
                    if restarts > MAX_WORKER_RESTARTS * total:
                        raise

        workers = [new_worker(i) for i in range(n_workers)]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        logger = MetricsLogger(out, total_steps=total, start_step=start, tensorboard=t.tensorboard,
                               progress=False)  # one line per step; the live display is `progress` (as local)
        record: dict[str, Any] = {}
        idle_steps = 0

        def run_eval(step: int) -> dict[str, float]:
            """The eval panel on rollout worker 0 (replaced if it dies, as in a rollout)."""
            nonlocal restarts
            progress.phase(f"eval at step {step} ({', '.join(p.name for p in evaluator.panels)}, rollout worker 0)")
            for attempt in range(MAX_WORKER_RESTARTS + 1):
                try:
                    results = ray.get(workers[0].evaluate.remote(step, str(out)))
                    break
                except RayActorError:
                    if attempt == MAX_WORKER_RESTARTS:
                        raise
                    print(f"warning: rollout worker 0 died during the eval at step {step}; replacing it",
                          file=sys.stderr)
                    restarts += 1
                    ray.kill(workers[0], no_restart=True)
                    workers[0] = new_worker(0)
            progress.end()
            return evaluator.metrics(step, results)

        if start == 1 and evaluator.due(0, total):  # the panel before training, logged as step 0
            record = logger.log(0, run_eval(0), kind="eval")
        versions_log = open(out / "weight_versions.jsonl", "a", encoding="utf-8")
        try:
            for step in range(start, total + 1):
                # 1. rollout: contiguous chunks of the step's tasks, one per worker; a dead worker is replaced
                progress.phase(f"step {step}/{total} rollout",
                               total=t.tasks_per_step * len(group_temperatures(cfg.algo, step)))
                t0 = time.perf_counter()
                tasks = sampler.sample(t.tasks_per_step)
                chunks = [tasks[i * len(tasks) // n_workers:(i + 1) * len(tasks) // n_workers]
                          for i in range(n_workers)]
                results: list[dict[str, Any] | None] = [None] * n_workers
                step_restarts = 0
                pending = {i: workers[i].collect.remote(chunks[i], step, version) for i in range(n_workers)
                           if chunks[i]}
                while pending:
                    i, ref = next(iter(pending.items()))
                    try:
                        results[i] = ray.get(ref)
                        del pending[i]
                        for ep in results[i]["episodes"]:  # the phase's counts, as the local callbacks give
                            for turn in ep.turns:
                                progress.turn(len(turn.response_ids))
                            progress.episode(ep.won)
                    except RayActorError as exc:
                        restarts += 1
                        step_restarts += 1
                        if step_restarts > MAX_WORKER_RESTARTS:
                            raise RuntimeError(f"step {step}: rollout workers died {step_restarts} times") from exc
                        print(f"warning: step {step}: rollout worker {i} died ({type(exc).__name__}); replacing it "
                              f"and re-running its {len(chunks[i])} group(s)", file=sys.stderr)
                        ray.kill(workers[i], no_restart=True)
                        workers[i] = new_worker(i)
                        pending[i] = workers[i].collect.remote(chunks[i], step, version)
                done = [res for res in results if res is not None]
                episodes = [ep for res in done for ep in res["episodes"]]
                failures = [f for res in done for f in res["failures"]]
                wall = time.perf_counter() - t0
                metrics: dict[str, Any] = rollout_metrics(episodes)
                for key in ("rollout/dropped_groups", "rollout/filtered_groups", "rollout/episode_retries",
                            "rollout/failed_episodes", "time/generate_s"):
                    metrics[key] = sum(res["metrics"].get(key, 0.0) for res in done)
                metrics["rollout/extra_rounds"] = max((res["metrics"].get("rollout/extra_rounds", 0.0) for res in done),
                                                      default=0.0)
                metrics["time/rollout_s"] = wall
                metrics["throughput/tokens_per_s"] = sum(res["metrics"].get("throughput/tokens_per_s", 0.0) *
                                                         res["metrics"].get("time/rollout_s", 0.0)
                                                         for res in done) / max(wall, 1e-9)
                used = [res["weight_version"] for res in done]
                metrics["rollout/weight_version"] = float(min(used)) if used else float(version)
                metrics["rollout/weight_lag"] = float(step - 1 - min(used)) if used else 0.0  # 0: on-policy
                metrics["rollout/worker_restarts"] = float(restarts)  # since the last logged step
                restarts = 0
                metrics["time/env_wait_frac"] = sum(res["metrics"].get("time/env_wait_frac", 0.0) *
                                                    res["metrics"].get("time/rollout_s", 0.0) for res in done) / \
                    max(sum(res["metrics"].get("time/rollout_s", 0.0) for res in done), 1e-9)
                for res in done:  # the weight version every episode was sampled with
                    for ep in res["episodes"]:
                        versions_log.write(json.dumps({"step": step, "worker": res["worker"],
                                                       "group": ep.task.group_id, "temperature": ep.temperature,
                                                       "weight_version": res["weight_version"]}) + "\n")
                versions_log.flush()
                check_dropped_groups(step, start, failures, bool(episodes), int(metrics["rollout/filtered_groups"]))
                # 2-3. one data-parallel update over whole-group shards
                n_groups = len({ep.task.group_id for ep in episodes})
                if episodes and n_groups >= n_learners:
                    progress.phase(f"step {step}/{total} update")
                    batch = build_rollout_batch(episodes, pad_token_id=pad_id, mode=r.mode)
                    split = shard_indices(batch, n_learners)  # once: the shards and, below, their inverse
                    shards = [take_shard(batch, rows, eps) for rows, eps in split]
                    k = min([cfg.algo.num_mini_batches] + [len(set(s.group_index.tolist())) for s in shards])
                    rank_metrics = ray.get([rk.update.remote(s, step, total, k) for rk, s in zip(ranks, shards)])
                    metrics.update(_merge_learner_metrics(rank_metrics, batch))
                    if keep_episodes != 0:  # DIR/episodes: the ranks' per-token numbers on the whole batch
                        stats = ray.get([rk.last_token_stats.remote() for rk in ranks])
                        token_stats = {key: unshard_rows([st[key] for st in stats], [rows for rows, _ in split],
                                                         batch.num_rows) for key in stats[0]}
                        save_step_episodes(out, step, episodes, t.save_episodes, tokenizer=tokenizer, batch=batch,
                                           token_stats=token_stats, seed=t.seed)
                    metrics["batch/rows"] = batch.num_rows
                    version = step
                    weights = ranks[0].get_weights.remote()  # object store: one copy per node
                    ray.get([w.set_weights.remote(version, weights) for w in workers])
                else:  # loud: a run that never trains must not look like one that did
                    idle_steps += 1
                    metrics["batch/rows"] = 0
                    if episodes:
                        print(f"WARNING: step {step} trains on nothing: {n_groups} group(s) for {n_learners} learner "
                              "ranks (each needs a whole group); no update", file=sys.stderr)
                    else:
                        warn_idle_step(step, int(metrics["rollout/dropped_groups"]),
                                       int(metrics["rollout/filtered_groups"]))
                if evaluator.due(step, total):
                    metrics.update(run_eval(step))
                # 4. log and checkpoint (rank 0 writes)
                progress.end()
                record = logger.log(step, metrics)
                if step % t.save_every == 0 or step == total:
                    progress.phase(f"step {step}/{total} checkpoint")
                    ray.get(ranks[0].save.remote(str(out / "checkpoints" / f"step_{step}"),
                                                 checkpoint_extra(cfg, step, sampler.position)))
                    prune_checkpoints(out / "checkpoints", t.keep_checkpoints)
        finally:
            versions_log.close()
        warn_idle_run(idle_steps, total - start + 1)
        return record
    finally:
        progress.end()
        if logger is not None:
            logger.close()
        for w in workers:
            try:
                ray.get(w.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 (a dead worker: nothing to close)
                pass
        for a in actors + workers:
            ray.kill(a, no_restart=True)
        for g in groups:
            remove_placement_group(g)
        if started:
            ray.shutdown()
