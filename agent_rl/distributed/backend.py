"""``trainer.backend=ray``: the loop's steps done by Ray actors (:class:`RayBackend`, driven by
:func:`agent_rl.loop.run`; docs/scaling.md).

One step: the driver draws ``trainer.tasks_per_step`` tasks -> the M rollout workers play their share of the groups
(contiguous chunks, in parallel; DAPO's extra rounds draw more tasks, as on the local backend:
:func:`agent_rl.rollout.collect_groups`) -> ``build_rollout_batch`` on the driver -> ``shard_indices`` (whole groups)
-> the N learner ranks update together (torch DDP, :mod:`agent_rl.distributed.data_parallel`; the ranks agree on the
mini-batch count themselves) -> rank 0's weights go through the Ray object store to every worker, as weight version
``step`` -> the episode store and, when due, the eval panel on rollout worker 0 -> log -> rank 0 writes
``DIR/checkpoints/step_N`` (the local backend's format, ``extra.json`` with the run's config: resume works for any N,
and across backends).

Placement: learner ranks in one ``PACK`` placement group (one node when they fit: DDP traffic stays local), env-server
replicas in a ``SPREAD`` group (one per node when possible), rollout workers by plain resource requests.

Faults: a rollout worker that dies (``RayActorError``) is replaced by a fresh actor with the current weights and
its groups are re-run (at most ``MAX_WORKER_RESTARTS`` times per step); an env-server replica that dies loses its
sessions, the orchestrator re-runs those episodes and ``HTTPEnvPool`` opens new sessions on the other replicas.

Same numbers as the local backend with N = 1 (docs/scaling.md, Determinism): every worker samples with the local
``engine.seed`` and per-row keys (step and round, group, slot, turn), so the episodes do not depend on M or on timing.

What it does not do: no env-reset prefetch across steps (``RayPlayer.prefetch`` is None). A step with fewer kept
groups than learner ranks skips the update (loud). ``DIR/checkpoints`` must be on a file system rank 0 and the driver
share (one node, or NFS).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agent_rl import algos
from agent_rl.config.schema import Config
from agent_rl.distributed.actors import EnvServerReplica, LearnerRank, LearnerSpec, RolloutWorker
from agent_rl.distributed.data_parallel import shard_indices, take_shard, unshard_rows
from agent_rl.engines import merge_engine_metrics
from agent_rl.eval.training import TrainingEval
from agent_rl.loop import SkipUpdate
from agent_rl.rollout import GroupSpec, RolloutResult, merge_parallel_results
from agent_rl.rollout.orchestrator import sum_counters
from agent_rl.rollout.schedule import plays_ahead
from agent_rl.runtime import REPO, import_modules, load_run_policy, seed_everything
from agent_rl.types import RolloutBatch, Task
from servers.launch import new_token

#: times one step replaces dead rollout workers before giving up.
MAX_WORKER_RESTARTS = 3


def _ray_init(cfg: Config) -> bool:
    """Connect to (or start) Ray; True when this call started it (and so shuts it down)."""
    if ray.is_initialized():
        return False
    env_vars = {"PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH")
                                           else ""),
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
    return len(set(placement_group_table(pg).get("bundles_to_node_id", {}).values()))


#: learner metrics that are means over the trained tokens (algorithms.md section 7): merged weighted by each rank's
#: trained tokens (``batch/response_tokens * credit/trained_token_frac``).
TRAINED_TOKEN_MEANS = ("async/staleness_mean", "async/behaviour_weight_mean", "async/behaviour_weight_capped_frac",
                       "async/behaviour_weight_zero_frac")


def merge_learner_metrics(ranks: list[dict[str, float]], batch: RolloutBatch) -> dict[str, float]:
    """One record from the ranks' metrics: ``actor/pg_loss`` is the ranks' mean (each rank's loss is already over the
    global denominator / N: module docstring of data_parallel), ``actor/grad_norm``, ``actor/lr``, ``schedule/S``,
    ``actor/optimizer_steps``, ``actor/skipped_nonfinite`` are equal on every rank (rank 0's), ``time/update_s``, ``async/staleness_max`` and the
    ``perf/`` memory metrics the ranks' maximum, the :data:`TRAINED_TOKEN_MEANS` (``async/staleness_mean``,
    ``async/behaviour_weight_*``) the trained-token-weighted mean, the additive ``tampo_sum/*`` summed (TAMPO's
    driver divides by the batch's episodes), TGRL group metrics recomputed on the whole batch,
    every other metric the response-token-weighted mean over ranks."""
    weights = [max(m.get("batch/response_tokens", 1.0), 1e-9) for m in ranks]
    out: dict[str, float] = {}
    for key in ranks[0]:
        vals = [m.get(key, 0.0) for m in ranks]
        if key == "actor/pg_loss":
            out[key] = sum(vals) / len(vals)
        elif key in ("actor/grad_norm", "actor/lr", "schedule/S", "actor/optimizer_steps", "actor/skipped_nonfinite"):
            out[key] = vals[0]
        elif key in ("time/update_s", "async/staleness_max") or key.startswith("perf/"):
            out[key] = max(vals)
        elif key in TRAINED_TOKEN_MEANS:  # means over trained tokens: weighted by each rank's trained tokens
            tw = [m.get("batch/response_tokens", 0.0) * m.get("credit/trained_token_frac", 0.0) for m in ranks]
            out[key] = sum(v * w for v, w in zip(vals, tw)) / sum(tw) if sum(tw) > 0 else 0.0
        elif key == "batch/response_tokens" or key.startswith(algos.TAMPO_SUM_PREFIX):  # [tampo hook] additive
            out[key] = sum(vals)
        else:
            out[key] = sum(v * w for v, w in zip(vals, weights)) / sum(weights)
    b = batch
    out.update(algos.tgrl_metrics(b.rewards, b.group_index, b.is_high.bool(), success=b.won,
                                  episode_index=b.episode_index))
    return out


class RayBackend:
    """Learner ranks, rollout workers and env-server replicas as Ray actors (:class:`agent_rl.loop.Backend`).

    The driver holds the tokenizer (rows, the episode store) and the prompt budget of the loaded model, which the
    workers get in ``cfg``; its copy of the weights is dropped. The eval panel runs on rollout worker 0
    (:meth:`RolloutWorker.evaluate`), which after each update holds exactly the weights the next rollout samples with
    (rank 0's, version ``step``), next to an engine (vLLM on GPU) and an env client: evaluating in the driver would
    need another policy copy and engine there (on a GPU cluster the driver usually has no GPU). Greedy panels match
    the local backend's numbers: the panel's sampling is keyed per row as the rollout's.
    """

    kind = "train"

    def __init__(self, cfg: Config, out: Path, progress: Any, config_file: Path | None = None) -> None:
        self.cfg, self.out, self.progress = cfg, out, progress
        import_modules(cfg.trainer.imports)
        seed_everything(cfg.trainer.seed)
        model, self.tokenizer = load_run_policy(cfg, progress, config_file)
        del model
        self.total_steps = cfg.trainer.total_steps
        self.started = False
        self.actors: list[Any] = []
        self.groups: list[Any] = []
        self.ranks: list[Any] = []
        self.workers: list[Any] = []
        self.urls = list(cfg.env_server.urls)
        self.env_token: str | None = None  # the replicas' token when this run starts them (open)
        self.version = 0  # updates behind the workers' weights
        self.lr = 0.0  # the next optimiser step's (read from rank 0 at a resume)
        self.weights: Any = None
        self.incarnation = [0] * cfg.rollout.num_workers
        self.restarts = 0  # worker replacements not yet reported in a step's metrics
        self.versions_log: Any = None
        self._split: list[Any] = []  # the last update's (rows, episodes) per rank
        self._rows = 0  # the last update's batch rows

    # ------------------------------------------------------------------ start: learner ranks, resume
    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        """Ray, the learner ranks (packed) in their process group, and ``ckpt`` loaded on every rank (whatever N
        wrote it). Every Ray call is awaited: nothing blocks the event loop."""
        t = self.cfg.trainer
        self.started = _ray_init(self.cfg)
        gpu = t.learner_gpus > 0
        bundle = {"CPU": t.learner_cpus, **({"GPU": t.learner_gpus} if gpu else {})}
        pg_learn = placement_group([bundle] * t.num_learners, strategy="PACK")
        self.groups.append(pg_learn)
        await asyncio.wait_for(pg_learn.ready(), timeout=600)
        spec = LearnerSpec.from_config(self.cfg, device="cuda" if gpu else "cpu")
        Rank = ray.remote(LearnerRank)
        self.ranks = [Rank.options(num_cpus=t.learner_cpus, num_gpus=t.learner_gpus,
                                   scheduling_strategy=PlacementGroupSchedulingStrategy(
                                       placement_group=pg_learn, placement_group_bundle_index=i)).remote(
            i, t.num_learners, spec) for i in range(t.num_learners)]
        self.actors += self.ranks
        addr, port = await self.ranks[0].address.remote()
        backend = (await asyncio.gather(*[rk.setup.remote(addr, port) for rk in self.ranks]))[0]
        print(f"{t.num_learners} learner rank(s) on {_nodes(pg_learn)} node(s), process group: {backend}",
              file=sys.stderr)
        if ckpt is None:
            return None
        extra = (await asyncio.gather(*[rk.load.remote(str(ckpt), t.resume_weights_only) for rk in self.ranks]))[0]
        self.version = int(extra["step"])
        self.lr = float(await self.ranks[0].lr.remote())
        return extra

    # ------------------------------------------------------------------ open: env replicas, rollout workers
    async def open(self) -> RayPlayer:
        """Env-server replicas (http mode without URLs: spread over nodes), then the rollout workers loaded with
        weight version ``start - 1`` (the updates behind them)."""
        es = self.cfg.env_server
        if es.mode == "http" and not self.urls:
            pg_env = placement_group([{"CPU": es.replica_cpus}] * es.replicas, strategy="SPREAD")
            self.groups.append(pg_env)
            await asyncio.wait_for(pg_env.ready(), timeout=600)
            Replica = ray.remote(EnvServerReplica)
            # the replicas' token: env_server.token, else one made for this run (the rollout workers get it as an
            # actor argument, never in the saved config); loopback when every worker is on this one node
            self.env_token = es.token or new_token()
            loopback = sum(1 for n in await asyncio.to_thread(ray.nodes) if n.get("Alive")) <= 1
            replicas = [Replica.options(num_cpus=es.replica_cpus, name=f"agent_rl-env-{i}",
                                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg_env, placement_group_bundle_index=i)).remote(
                [self.cfg.env.id], list(es.imports), self.env_token, es.max_sessions, es.workers, self.cfg.data.root,
                loopback)
                for i in range(es.replicas)]
            self.actors += replicas
            self.urls = list(await asyncio.gather(*[a.url.remote(es.startup_timeout_s) for a in replicas]))
            print(f"env-server replicas on {_nodes(pg_env)} node(s): {', '.join(self.urls)}", file=sys.stderr)
        self.weights = await self._rank0_weights()
        self.workers = [await self._new_worker(i) for i in range(self.cfg.rollout.num_workers)]
        self.versions_log = open(self.out / "weight_versions.jsonl", "a", encoding="utf-8")
        return RayPlayer(self)

    async def _new_worker(self, i: int) -> Any:
        """Worker i (named ``agent_rl-rollout-<i>-<incarnation>``) loaded with the current weights; a worker that
        dies while loading is replaced too."""
        r, t = self.cfg.rollout, self.cfg.trainer
        Worker = ray.remote(RolloutWorker)
        while True:
            threads = {"max_concurrency": t.tasks_per_step * (t.max_staleness + 1) + 4}
            w = Worker.options(num_cpus=r.worker_cpus, num_gpus=r.worker_gpus,
                              **(threads if plays_ahead(self.cfg) else {}),  # a stream: groups at once
                              name=f"agent_rl-rollout-{i}-{self.incarnation[i]}").remote(self.cfg, i, self.urls,
                                                                                         self.env_token)
            self.incarnation[i] += 1
            try:
                await w.set_weights.remote(self.version, self.weights)
                return w
            except RayActorError:
                self.restarts += 1
                if self.restarts > MAX_WORKER_RESTARTS * self.total_steps:
                    raise

    async def replace(self, i: int) -> None:
        """Worker i died: a new one with the current weights in its place."""
        self.restarts += 1
        ray.kill(self.workers[i], no_restart=True)
        self.workers[i] = await self._new_worker(i)

    async def set_temperatures(self, t_low: float, t_high: float) -> None:
        """The calibrated (T0, T1) into the driver's config (workers built later get it), every learner rank's JS
        and every rollout worker's sampling."""
        self.cfg.algo.t_low, self.cfg.algo.t_high = float(t_low), float(t_high)
        await asyncio.gather(*[a.set_temperatures.remote(t_low, t_high) for a in [*self.ranks, *self.workers]])

    # ------------------------------------------------------------------ update
    async def update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """The ranks' update on their shards of ``batch`` (whole groups), awaited.

        Raises:
            SkipUpdate: fewer groups than learner ranks (each needs a whole group).
        """
        n_groups, n_learners = len(set(batch.group_index.tolist())), self.cfg.trainer.num_learners
        if n_groups < n_learners:
            raise SkipUpdate(f"{n_groups} group(s) for {n_learners} learner ranks (each needs a whole group)")
        self._split = shard_indices(batch, n_learners)  # once: the shards and their inverse
        shards = [take_shard(batch, rows, eps) for rows, eps in self._split]
        rank_metrics = list(await asyncio.gather(*[rk.update.remote(s, step, self.total_steps)
                                                   for rk, s in zip(self.ranks, shards)]))
        self._rows = batch.num_rows
        return merge_learner_metrics(rank_metrics, batch)

    async def token_stats(self) -> dict[str, Any] | None:
        """The ranks' per-token numbers put back in the batch's row order."""
        stats = await asyncio.gather(*[rk.last_token_stats.remote() for rk in self.ranks])
        return {key: unshard_rows([st[key] for st in stats], [rows for rows, _ in self._split], self._rows)
                for key in stats[0]}

    async def load_weights(self, version: int) -> None:
        """Rank 0's weights after ``version`` steps to every worker (object store: one copy per node; each worker
        swaps them between two engine calls)."""
        self.weights = await self._rank0_weights()
        self.version = version
        await asyncio.gather(*[w.set_weights.remote(version, self.weights) for w in self.workers])

    async def engine_metrics(self) -> dict[str, float]:
        """The workers' engine metrics merged (:func:`merge_engine_metrics`)."""
        return merge_engine_metrics(list(await asyncio.gather(*[w.engine_metrics.remote() for w in self.workers])))

    # ------------------------------------------------------------------ evaluate, save, close
    async def evaluate(self, step: int, evaluator: TrainingEval) -> list[dict[str, Any]]:
        """The eval panel on rollout worker 0 (replaced if it dies, as in a rollout)."""
        self.progress.phase(f"eval at step {step} ({', '.join(p.name for p in evaluator.panels)}, rollout worker 0)")
        for attempt in range(MAX_WORKER_RESTARTS + 1):
            try:
                results = await self.workers[0].evaluate.remote(step, str(self.out))
                break
            except RayActorError:
                if attempt == MAX_WORKER_RESTARTS:
                    raise
                print(f"warning: rollout worker 0 died during the eval at step {step}; replacing it", file=sys.stderr)
                await self.replace(0)
        self.progress.end()
        return results

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        if self.cfg.trainer.learner_strategy == "fsdp":  # every rank writes its DCP shards, rank 0 the rest
            await asyncio.gather(*[rk.save.remote(str(path), extra) for rk in self.ranks])
        else:
            await self.ranks[0].save.remote(str(path), extra)

    async def _rank0_weights(self) -> Any:
        """The object ref of rank 0's full weights (fsdp: every rank takes part in the gather, layer by layer, and
        only rank 0 returns a copy; the other ranks' calls are awaited for their errors)."""
        if self.cfg.trainer.learner_strategy != "fsdp":
            return self.ranks[0].get_weights.remote()
        refs = [rk.get_weights.remote() for rk in self.ranks]
        await asyncio.gather(*refs[1:])
        return refs[0]

    async def close(self) -> None:
        if self.versions_log is not None:
            self.versions_log.close()
        for w in self.workers:
            try:
                await asyncio.wait_for(w.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 (a dead worker: nothing to close)
                pass
        for a in self.actors + self.workers:
            ray.kill(a, no_restart=True)
        for g in self.groups:
            remove_placement_group(g)
        if self.started:
            ray.shutdown()


class RayPlayer:
    """Where the Ray backend plays groups (:class:`agent_rl.rollout.schedule.Player`): its rollout workers. A round
    is split in contiguous chunks, one per worker, played in parallel; a group of the stream goes to the least
    recently used worker (threaded actors: groups play concurrently on each). A dead worker is replaced and its
    groups played again. No env-reset prefetch."""

    prefetch = None

    def __init__(self, backend: RayBackend) -> None:
        self.b = backend
        self.min_version = backend.version  # the stream's bound: the version every worker has loaded
        self._next_worker = 0
        self._counters: dict[str, dict[str, float]] = {}  # per worker actor: its stream's totals
        self._played: list[tuple[int, int, Any]] = []  # this step's (worker, version, episode) of the rounds
        self._used: list[int] = []  # this step's weight version of every chunk played

    async def play_round(self, tasks: list[Task], step: int, seed_key: int, t_high: float | None) -> RolloutResult:
        """One round: contiguous chunks of ``tasks``, one per worker, in parallel; a dead worker is replaced and its
        chunk played again (at most ``MAX_WORKER_RESTARTS`` times a round)."""
        b = self.b
        return await self._play_chunks(tasks, f"step {step}",
                                       lambda w, chunk: w.play.remote(chunk, step, seed_key, b.version, t_high))

    async def play_specs(self, specs: list[GroupSpec], seed_key: int) -> RolloutResult:
        """Groups at the temperatures their specs give (the calibration probe, algorithms.md 3b), split over the
        workers as a round is, rollout seed key ``seed_key``."""
        b = self.b
        return await self._play_chunks(specs, "the calibration probe",
                                       lambda w, chunk: w.play_specs.remote(chunk, seed_key, b.version))

    async def _play_chunks(self, items: list[Any], what: str, call: Any) -> RolloutResult:
        """``items`` in contiguous chunks, one per worker (``call(worker, chunk)`` -> the remote reference), played in
        parallel; a dead worker is replaced and its chunk played again (at most ``MAX_WORKER_RESTARTS`` times)."""
        b, n_workers = self.b, self.b.cfg.rollout.num_workers
        restarts = 0
        t0 = time.perf_counter()
        chunks = [items[i * len(items) // n_workers:(i + 1) * len(items) // n_workers] for i in range(n_workers)]
        results: list[dict[str, Any] | None] = [None] * n_workers
        pending = {i: call(b.workers[i], chunks[i]) for i in range(n_workers) if chunks[i]}
        while pending:
            i, ref = next(iter(pending.items()))
            try:
                results[i] = await ref
                del pending[i]
                for ep in results[i]["result"].episodes:  # the phase's counts, as the local callbacks give
                    for turn in ep.turns:
                        b.progress.turn(len(turn.response_ids))
                    b.progress.episode(ep.won)
            except RayActorError as exc:
                restarts += 1
                if restarts > MAX_WORKER_RESTARTS:
                    raise RuntimeError(f"{what}: rollout workers died {restarts} times") from exc
                print(f"warning: {what}: rollout worker {i} died ({type(exc).__name__}); replacing it "
                      f"and re-running its {len(chunks[i])} group(s)", file=sys.stderr)
                await b.replace(i)
                pending[i] = call(b.workers[i], chunks[i])
        done = [res for res in results if res is not None]
        for res in done:
            self._used.append(res["weight_version"])
            self._played.extend((res["worker"], res["weight_version"], ep) for ep in res["result"].episodes)
        return merge_parallel_results([res["result"] for res in done], wall_s=time.perf_counter() - t0)

    async def play_group(self, spec: Any) -> Any:
        """One group of the stream on the least recently used worker; a worker that dies is replaced (once per
        death, whichever group sees it first) and the group played again on it."""
        b = self.b
        for attempt in range(MAX_WORKER_RESTARTS + 1):
            i = self._next_worker % len(b.workers)
            self._next_worker += 1
            worker = b.workers[i]
            try:
                res = await worker.play_group.remote(spec.task, spec.temperatures, self.min_version)
            except RayActorError:
                if attempt == MAX_WORKER_RESTARTS:
                    raise
                if b.workers[i] is worker:
                    print(f"warning: rollout worker {i} died; replacing it and re-running its groups",
                          file=sys.stderr)
                    await b.replace(i)
                continue
            self._counters[f"{i}-{b.incarnation[i]}"] = res["counters"]
            for ep in res["episodes"]:
                for turn in ep.turns:
                    b.progress.turn(len(turn.response_ids))
                b.progress.episode(ep.won)
            return res["episodes"]
        raise AssertionError("unreachable")

    async def load_weights(self, version: int) -> None:
        await self.b.load_weights(version)
        self.min_version = version

    def counters(self) -> dict[str, float]:
        return sum_counters(self._counters.values())

    def collected(self, step: int, result: RolloutResult) -> None:
        """The step's worker restarts into its metrics, and the weight version of every kept episode into
        ``weight_versions.jsonl`` (rounds: the worker's and the version it played with, plus
        ``rollout/weight_version`` and ``rollout/weight_lag``; the stream: its oldest turn's)."""
        b = self.b
        if not plays_ahead(b.cfg):
            versions, self._used = self._used, []
            result.metrics["rollout/weight_version"] = float(min(versions)) if versions else float(b.version)
            result.metrics["rollout/weight_lag"] = float(step - 1 - min(versions)) if versions else 0.0  # 0: on-policy
        result.metrics["rollout/worker_restarts"] = float(b.restarts)  # since the last logged step
        b.restarts = 0
        kept = {id(ep) for ep in result.episodes}
        for worker, version, ep in self._played:
            if id(ep) in kept:
                b.versions_log.write(json.dumps({"step": step, "worker": worker, "group": ep.task.group_id,
                                                 "temperature": ep.temperature, "weight_version": version}) + "\n")
        if plays_ahead(b.cfg):
            for ep in result.episodes:  # the oldest weight version each kept episode was sampled with
                b.versions_log.write(json.dumps({
                    "step": step, "group": ep.task.group_id, "temperature": ep.temperature,
                    "weight_version": min((t.policy_version for t in ep.turns), default=0)}) + "\n")
        b.versions_log.flush()
        self._played = []
