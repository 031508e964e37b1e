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

What it does not do (``agent_rl.config.BACKENDS["ray"]``): no env-reset prefetch across steps. A step with fewer kept
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
from typing import Any, Callable

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agent_rl import algos
from agent_rl.config import BACKENDS, Config
from agent_rl.distributed.actors import EnvServerReplica, LearnerRank, LearnerSpec, RolloutWorker
from servers.launch import new_token
from agent_rl.distributed.data_parallel import shard_indices, take_shard, unshard_rows
from agent_rl.eval.training import TrainingEval
from agent_rl.rollout import RolloutResult, collect_groups, group_temperatures, merge_parallel_results
from agent_rl.rollout.producer import AsyncProducer, warmup_horizon
from agent_rl.runtime import REPO, import_modules, load_run_policy, seed_everything
from agent_rl.types import RolloutBatch, Task

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
    ``actor/optimizer_steps`` are equal on every rank (rank 0's), ``time/update_s``, ``async/staleness_max`` and the
    ``perf/`` memory metrics the ranks' maximum, the :data:`TRAINED_TOKEN_MEANS` (``async/staleness_mean``,
    ``async/behaviour_weight_*``) the trained-token-weighted mean, TGRL group metrics recomputed on the whole batch,
    every other metric the response-token-weighted mean over ranks."""
    weights = [max(m.get("batch/response_tokens", 1.0), 1e-9) for m in ranks]
    out: dict[str, float] = {}
    for key in ranks[0]:
        vals = [m.get(key, 0.0) for m in ranks]
        if key == "actor/pg_loss":
            out[key] = sum(vals) / len(vals)
        elif key in ("actor/grad_norm", "actor/lr", "schedule/S", "actor/optimizer_steps"):
            out[key] = vals[0]
        elif key in ("time/update_s", "async/staleness_max") or key.startswith("perf/"):
            out[key] = max(vals)
        elif key in TRAINED_TOKEN_MEANS:  # means over trained tokens: weighted by each rank's trained tokens
            tw = [m.get("batch/response_tokens", 0.0) * m.get("credit/trained_token_frac", 0.0) for m in ranks]
            out[key] = sum(v * w for v, w in zip(vals, tw)) / sum(tw) if sum(tw) > 0 else 0.0
        elif key == "batch/response_tokens":
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
    capabilities = BACKENDS["ray"]
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
        self.weights: Any = None
        self.incarnation = [0] * cfg.rollout.num_workers
        self.restarts = 0  # worker replacements not yet reported in a step's metrics
        self.producer: AsyncProducer | None = None  # trainer.max_staleness >= 1 (rollout/producer.py)
        self._t_high: float | None = None
        self._next_worker = 0
        self._counters: dict[str, dict[str, float]] = {}  # per worker actor: its stream's totals
        self.versions_log: Any = None
        self._split: list[Any] = []  # the last update's (rows, episodes) per rank
        self._rows = 0  # the last update's batch rows

    @property
    def pending_tasks(self) -> int:
        """Tasks drawn and not trained (asynchronous rollouts; 0 when synchronous: this backend never prefetches)."""
        return self.producer.pending_tasks if self.producer is not None else 0

    @property
    def groups_in_flight(self) -> int:
        return self.producer.groups_in_flight if self.producer is not None else 0

    @property
    def lr(self) -> float:
        return float(ray.get(self.ranks[0].lr.remote()))

    # ------------------------------------------------------------------ start: learner ranks, resume
    async def start(self, ckpt: Path | None) -> dict[str, Any] | None:
        """Ray, the learner ranks (packed) in their process group, and ``ckpt`` loaded on every rank (whatever N
        wrote it)."""
        t = self.cfg.trainer
        self.started = _ray_init(self.cfg)
        gpu = t.learner_gpus > 0
        bundle = {"CPU": t.learner_cpus, **({"GPU": t.learner_gpus} if gpu else {})}
        pg_learn = placement_group([bundle] * t.num_learners, strategy="PACK")
        self.groups.append(pg_learn)
        ray.get(pg_learn.ready(), timeout=600)
        spec = LearnerSpec.from_config(self.cfg, device="cuda" if gpu else "cpu")
        Rank = ray.remote(LearnerRank)
        self.ranks = [Rank.options(num_cpus=t.learner_cpus, num_gpus=t.learner_gpus,
                                   scheduling_strategy=PlacementGroupSchedulingStrategy(
                                       placement_group=pg_learn, placement_group_bundle_index=i)).remote(
            i, t.num_learners, spec) for i in range(t.num_learners)]
        self.actors += self.ranks
        addr, port = ray.get(self.ranks[0].address.remote())
        backend = ray.get([rk.setup.remote(addr, port) for rk in self.ranks])[0]
        print(f"{t.num_learners} learner rank(s) on {_nodes(pg_learn)} node(s), process group: {backend}",
              file=sys.stderr)
        if ckpt is None:
            return None
        extra = ray.get([rk.load.remote(str(ckpt), t.resume_weights_only) for rk in self.ranks])[0]
        self.version = int(extra["step"])
        return extra

    # ------------------------------------------------------------------ open: env replicas, rollout workers
    async def open(self) -> None:
        """Env-server replicas (http mode without URLs: spread over nodes), then the rollout workers loaded with
        weight version ``start - 1`` (the updates behind them)."""
        es = self.cfg.env_server
        if es.mode == "http" and not self.urls:
            pg_env = placement_group([{"CPU": es.replica_cpus}] * es.replicas, strategy="SPREAD")
            self.groups.append(pg_env)
            ray.get(pg_env.ready(), timeout=600)
            Replica = ray.remote(EnvServerReplica)
            # the replicas' token: env_server.token, else one made for this run (the rollout workers get it as an
            # actor argument, never in the saved config); loopback when every worker is on this one node
            self.env_token = es.token or new_token()
            loopback = sum(1 for n in ray.nodes() if n.get("Alive")) <= 1
            replicas = [Replica.options(num_cpus=es.replica_cpus, name=f"agent_rl-env-{i}",
                                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg_env, placement_group_bundle_index=i)).remote(
                [self.cfg.env.id], list(es.imports), self.env_token, es.max_sessions, es.workers, self.cfg.data.root,
                loopback)
                for i in range(es.replicas)]
            self.actors += replicas
            self.urls = ray.get([a.url.remote(es.startup_timeout_s) for a in replicas])
            print(f"env-server replicas on {_nodes(pg_env)} node(s): {', '.join(self.urls)}", file=sys.stderr)
        self.weights = self._rank0_weights()
        self.workers = [self._new_worker(i) for i in range(self.cfg.rollout.num_workers)]
        self.versions_log = open(self.out / "weight_versions.jsonl", "a", encoding="utf-8")
        t, algo = self.cfg.trainer, self.cfg.algo
        if t.max_staleness > 0:
            self.producer = AsyncProducer(
                self._play_group, self._load_weights, self._sum_counters,
                lambda step: group_temperatures(algo, step, self._t_high), max_staleness=t.max_staleness,
                tasks_per_step=t.tasks_per_step, total_steps=self.total_steps,
                max_replays=self.cfg.rollout.max_stale_replays, partial=self.cfg.rollout.partial,
                filter_groups=algo.dapo_dynamic_sampling, max_extra_rounds=algo.dapo_max_extra_rounds,
                version=self.version, horizon=lambda step: warmup_horizon(algo, step, self.total_steps))

    # ------------------------------------------------------------------ asynchronous rollouts (max_staleness >= 1)
    async def _play_group(self, spec: Any) -> Any:
        """One group on the least recently used worker (round robin; the workers are threaded actors, so groups
        play concurrently on each); a worker that dies is replaced (once per death, whichever group sees it first)
        and the group played again on it."""
        min_version = self.producer.version if self.producer is not None else self.version
        for attempt in range(MAX_WORKER_RESTARTS + 1):
            i = self._next_worker % len(self.workers)
            self._next_worker += 1
            worker = self.workers[i]
            try:
                res = await worker.play_group.remote(spec.task, spec.temperatures, min_version)
            except RayActorError:
                if attempt == MAX_WORKER_RESTARTS:
                    raise
                if self.workers[i] is worker:
                    print(f"warning: rollout worker {i} died; replacing it and re-running its groups",
                          file=sys.stderr)
                    self._replace(i)
                continue
            self._counters[f"{i}-{self.incarnation[i]}"] = res["counters"]
            for ep in res["episodes"]:
                for turn in ep.turns:
                    self.progress.turn(len(turn.response_ids))
                self.progress.episode(ep.won)
            return res["episodes"]
        raise AssertionError("unreachable")

    async def _load_weights(self, version: int) -> None:
        """Rank 0's weights after ``version`` steps to every worker (each swaps them between two engine calls)."""
        self.weights = self._rank0_weights()
        self.version = version
        await asyncio.gather(*[w.set_weights.remote(version, self.weights) for w in self.workers])

    def _sum_counters(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for counters in self._counters.values():
            for key, value in counters.items():
                out[key] = out.get(key, 0.0) + value
        return out

    def _new_worker(self, i: int) -> Any:
        """Worker i (named ``agent_rl-rollout-<i>-<incarnation>``) loaded with the current weights; a worker that
        dies while loading is replaced too."""
        r = self.cfg.rollout
        Worker = ray.remote(RolloutWorker)
        while True:
            threads = {"max_concurrency": self.cfg.trainer.tasks_per_step * (self.cfg.trainer.max_staleness + 1) + 4}
            w = Worker.options(num_cpus=r.worker_cpus, num_gpus=r.worker_gpus,
                               **(threads if self.cfg.trainer.max_staleness > 0 else {}),  # async: groups at once
                               name=f"agent_rl-rollout-{i}-{self.incarnation[i]}").remote(self.cfg, i, self.urls,
                                                                                          self.env_token)
            self.incarnation[i] += 1
            try:
                ray.get(w.set_weights.remote(self.version, self.weights))
                return w
            except RayActorError:
                self.restarts += 1
                if self.restarts > MAX_WORKER_RESTARTS * self.total_steps:
                    raise

    def _replace(self, i: int) -> None:
        self.restarts += 1
        ray.kill(self.workers[i], no_restart=True)
        self.workers[i] = self._new_worker(i)

    # ------------------------------------------------------------------ collect
    async def collect(self, step: int, sample_tasks: Callable[[int], list[Task]],
                      t_high: float | None = None) -> RolloutResult:
        cfg, n_workers = self.cfg, self.cfg.rollout.num_workers
        temps = group_temperatures(cfg.algo, step, t_high)  # the driver's T1 pick travels with the tasks
        self.progress.phase(f"step {step}/{self.total_steps} rollout", total=cfg.trainer.tasks_per_step * len(temps))
        if self.producer is not None:  # asynchronous: the step's admitted groups (rollout/producer.py)
            self._t_high = t_high
            result = await self.producer.collect(step, sample_tasks)
            result.metrics["rollout/worker_restarts"] = float(self.restarts)
            self.restarts = 0
            for ep in result.episodes:  # the oldest weight version each kept episode was sampled with
                self.versions_log.write(json.dumps({
                    "step": step, "group": ep.task.group_id, "temperature": ep.temperature,
                    "weight_version": min((t.policy_version for t in ep.turns), default=0)}) + "\n")
            self.versions_log.flush()
            return result
        step_restarts = 0
        used: list[tuple[int, int]] = []  # (worker, weight version) of every group played
        played: list[tuple[int, int, Any]] = []  # (worker, version, episode) for weight_versions.jsonl

        async def play(tasks: list[Task], seed_key: int) -> RolloutResult:
            """One round: contiguous chunks of ``tasks``, one per worker, in parallel; a dead worker is replaced
            and its chunk played again."""
            nonlocal step_restarts
            t0 = time.perf_counter()
            chunks = [tasks[i * len(tasks) // n_workers:(i + 1) * len(tasks) // n_workers] for i in range(n_workers)]
            results: list[dict[str, Any] | None] = [None] * n_workers
            pending = {i: self.workers[i].play.remote(chunks[i], step, seed_key, self.version, t_high)
                       for i in range(n_workers) if chunks[i]}
            while pending:
                i, ref = next(iter(pending.items()))
                try:
                    results[i] = ray.get(ref)
                    del pending[i]
                    for ep in results[i]["result"].episodes:  # the phase's counts, as the local callbacks give
                        for turn in ep.turns:
                            self.progress.turn(len(turn.response_ids))
                        self.progress.episode(ep.won)
                except RayActorError as exc:
                    step_restarts += 1
                    if step_restarts > MAX_WORKER_RESTARTS:
                        raise RuntimeError(f"step {step}: rollout workers died {step_restarts} times") from exc
                    print(f"warning: step {step}: rollout worker {i} died ({type(exc).__name__}); replacing it "
                          f"and re-running its {len(chunks[i])} group(s)", file=sys.stderr)
                    self._replace(i)
                    pending[i] = self.workers[i].play.remote(chunks[i], step, seed_key, self.version, t_high)
            done = [res for res in results if res is not None]
            for res in done:
                used.append((res["worker"], res["weight_version"]))
                played.extend((res["worker"], res["weight_version"], ep) for ep in res["result"].episodes)
            return merge_parallel_results([res["result"] for res in done], wall_s=time.perf_counter() - t0)

        result = await collect_groups(play, sample_tasks, cfg.trainer.tasks_per_step, len(temps), step,
                                      filter_groups=cfg.algo.dapo_dynamic_sampling,
                                      max_extra_rounds=cfg.algo.dapo_max_extra_rounds)
        versions = [v for _, v in used]
        result.metrics["rollout/weight_version"] = float(min(versions)) if versions else float(self.version)
        result.metrics["rollout/weight_lag"] = float(step - 1 - min(versions)) if versions else 0.0  # 0: on-policy
        result.metrics["rollout/worker_restarts"] = float(self.restarts)  # since the last logged step
        self.restarts = 0
        kept = {id(ep) for ep in result.episodes}
        by_episode = {id(ep): v for _, v, ep in played}
        result.versions = [by_episode[id(result.episodes[i])]
                           for i in range(0, len(result.episodes), len(temps))]
        for worker, version, ep in played:  # the weight version every kept episode was sampled with
            if id(ep) in kept:
                self.versions_log.write(json.dumps({"step": step, "worker": worker, "group": ep.task.group_id,
                                                    "temperature": ep.temperature,
                                                    "weight_version": version}) + "\n")
        self.versions_log.flush()
        return result

    def prefetch(self, tasks: list[Task]) -> None:  # not a capability of this backend (BACKENDS["ray"])
        raise NotImplementedError("the Ray backend does not prefetch env resets")

    # ------------------------------------------------------------------ update, sync
    def cannot_update(self, batch: RolloutBatch) -> str | None:
        n_groups, n_learners = len(set(batch.group_index.tolist())), self.cfg.trainer.num_learners
        if n_groups < n_learners:
            return f"{n_groups} group(s) for {n_learners} learner ranks (each needs a whole group)"
        return None

    async def update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        self._split = shard_indices(batch, self.cfg.trainer.num_learners)  # once: the shards and their inverse
        shards = [take_shard(batch, rows, eps) for rows, eps in self._split]
        refs = [rk.update.remote(s, step, self.total_steps) for rk, s in zip(self.ranks, shards)]
        if self.producer is not None:  # awaited: the producer keeps the workers playing meanwhile
            t0, a0 = time.perf_counter(), self.producer.active_seconds()
            rank_metrics = list(await asyncio.gather(*refs))
            overlap = min(self.producer.active_seconds() - a0, time.perf_counter() - t0)
        else:
            rank_metrics = ray.get(refs)
        self._rows = batch.num_rows
        merged = merge_learner_metrics(rank_metrics, batch)
        if self.producer is not None:
            merged["time/overlap_s"] = overlap
        return merged

    async def token_stats(self) -> dict[str, Any] | None:
        """The ranks' per-token numbers put back in the batch's row order."""
        stats = ray.get([rk.last_token_stats.remote() for rk in self.ranks])
        return {key: unshard_rows([st[key] for st in stats], [rows for rows, _ in self._split], self._rows)
                for key in stats[0]}

    async def sync(self, version: int) -> None:
        if self.producer is not None:  # rollout.partial=false: after the groups in flight (AsyncProducer.sync)
            await self.producer.sync(version)
            return
        self.version = version
        self.weights = self._rank0_weights()  # object store: one copy per node
        ray.get([w.set_weights.remote(version, self.weights) for w in self.workers])

    # ------------------------------------------------------------------ evaluate, save, close
    async def evaluate(self, step: int, evaluator: TrainingEval) -> list[dict[str, Any]]:
        """The eval panel on rollout worker 0 (replaced if it dies, as in a rollout)."""
        self.progress.phase(f"eval at step {step} ({', '.join(p.name for p in evaluator.panels)}, rollout worker 0)")
        for attempt in range(MAX_WORKER_RESTARTS + 1):
            try:
                results = ray.get(self.workers[0].evaluate.remote(step, str(self.out)))
                break
            except RayActorError:
                if attempt == MAX_WORKER_RESTARTS:
                    raise
                print(f"warning: rollout worker 0 died during the eval at step {step}; replacing it", file=sys.stderr)
                self._replace(0)
        self.progress.end()
        return results

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        if self.cfg.trainer.learner_strategy == "fsdp":  # every rank writes its DCP shards, rank 0 the rest
            ray.get([rk.save.remote(str(path), extra) for rk in self.ranks])
        else:
            ray.get(self.ranks[0].save.remote(str(path), extra))

    def _rank0_weights(self) -> Any:
        """The object ref of rank 0's full weights (fsdp: every rank takes part in the gather, layer by layer, and
        only rank 0 returns a copy; the other ranks' calls are awaited for their errors)."""
        if self.cfg.trainer.learner_strategy != "fsdp":
            return self.ranks[0].get_weights.remote()
        refs = [rk.get_weights.remote() for rk in self.ranks]
        ray.get(refs[1:])
        return refs[0]

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.aclose()
        if self.versions_log is not None:
            self.versions_log.close()
        for w in self.workers:
            try:
                ray.get(w.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 (a dead worker: nothing to close)
                pass
        for a in self.actors + self.workers:
            ray.kill(a, no_restart=True)
        for g in self.groups:
            remove_placement_group(g)
        if self.started:
            ray.shutdown()
