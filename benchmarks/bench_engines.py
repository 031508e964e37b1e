"""Engines side by side: hf vs vllm (vs vllm_server: ``--engines hf,vllm,vllm_server``) on the same prompts (a benchmark, not a test; ~10 minutes on 2 CPU cores).

    .venv-vllm/bin/python benchmarks/bench_engines.py                  # SmolLM2, batch 32, mixed temperatures
    .venv-vllm/bin/python benchmarks/bench_engines.py --model tiny --rounds 2 --sync-variants
    .venv-vllm/bin/python benchmarks/bench_engines.py --engines hf,vllm,vllm_server,vllm_server_affinity \
        --batch 1,4,16 --max-new-tokens 32 --rounds 2          # batch sizes, and 2 replicas on ALFWorld

Run it with ``.venv-vllm`` (``bash scripts/setup_vllm.sh``): both engines are there (the hf engine needs only
transformers). Each engine is measured in a process of its own (``--engine NAME`` is that process), so peak memory
is that engine's alone: the sum of the resident memory of the process and its children (vLLM's engine core and
worker), sampled every 50 ms. Per engine:

- ``start_s``: building the engine (vLLM: its engine processes, weight load, KV cache; hf: nothing to build);
- ``tokens_per_s_b<B>``: generated tokens / wall time of a ``generate`` call over B prompts (each size of
  ``--batch``, one engine start for all), rows alternating T = 0.3 and 1.2, ``--max-new-tokens`` each (EOS ends a
  row early; the count is of tokens actually generated), mean over ``--rounds`` calls after one warm-up call;
- ``tokens_per_cpu_s_b<B>``: the same tokens / the CPU seconds the call cost this process and its children (vLLM's
  engine core), which a loaded machine moves less than the wall time (spinning OpenMP threads still count);
- ``sync_s``: ``sync_weights`` after a change of every weight, mean over ``--syncs`` (hf: shares the module);
- ``logprob_diff``: max |engine - learner| log-prob of the sampled tokens at each row's temperature (sanity);
- ``peak_rss_gb``.

``vllm_server_affinity`` (:func:`run_affinity`): two replicas play one real ALFWorld rollout (``--affinity-tasks``
x 4 episodes x ``--affinity-turns`` turns, trajectory mode) with and without episode affinity: the prefix-cache hit
rate of each.

``--sync-variants`` (vllm only) adds a run with vLLM's engine core in this process and times there the reload
inputs vLLM offers, for the choice the engine made: the
safetensors file in the system temp folder or in ``/dev/shm`` (both process modes), and a weights iterator handed
to ``collective_rpc("reload_weights")`` (in-process mode only: it cannot cross to an engine-core process).
Threads: ``--threads`` (torch intra-op threads of the hf engine; vLLM's CPU build binds one OpenMP thread per
allowed core). Results: ``--out/results.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class PeakRSS:
    """Peak of the summed RSS of this process and its descendants, sampled in a thread."""

    def __init__(self, period_s: float = 0.05) -> None:
        import psutil

        self.peak, self._stop, self._me = 0, threading.Event(), psutil.Process()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _run(self, period_s: float) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            for p in [self._me, *self._me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(period_s)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**30


def _cpu_s() -> float:
    """CPU seconds (user + system, all threads) of this process and its live descendants (vLLM's engine core and
    worker): the difference over a call is the call's CPU time when no descendant starts or ends during it."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _prompts(tok, n: int) -> list[list[int]]:
    items = ["apple", "lamp", "key", "book", "mug", "towel", "knife", "plate"]
    return [list(tok.apply_chat_template(
        [{"role": "system", "content": "You are an agent in a text game. Answer with <action>...</action>."},
         {"role": "user", "content": f"Task {i}: pick up the {items[i % 8]} from the {items[(i + 3) % 8]} "
                                     f"shelf; you see {', '.join(items[:(i % 5) + 3])}."}],
        add_generation_prompt=True, tokenize=True, return_dict=False)) for i in range(n)]


def _logprob_diff(model, prompts, gens, temps) -> float:
    import torch

    worst = 0.0
    for p, g, t in zip(prompts, gens, temps):
        if not g.token_ids:
            continue
        x = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            z = model(x).logits[0, len(p) - 1:-1].float()
        ref = torch.log_softmax(z / t, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        worst = max(worst, float((torch.tensor(g.logprobs) - ref).abs().max()))
    return worst


def _perturb(model, scale: float = 1e-3) -> None:
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def _time_sync_variants(engine, model, syncs: int) -> dict[str, float]:
    """Reload inputs other than the engine's default file in its sync folder (vllm, in-process engine)."""
    import shutil

    from safetensors.torch import save_file

    from agent_rl.engines.vllm import state_for_vllm

    out: dict[str, float] = {}
    if Path("/dev/shm").is_dir():
        shm = Path("/dev/shm") / f"bench-engines-{os.getpid()}"
        shm.mkdir(exist_ok=True)
        try:
            times = []
            for _ in range(syncs):
                _perturb(model)
                t0 = time.perf_counter()
                save_file(state_for_vllm(model, engine.dtype, engine.untie), str(shm / "model.safetensors"))
                engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(shm)})
                engine.llm.reset_prefix_cache()
                times.append(time.perf_counter() - t0)
            out["sync_file_dev_shm_s"] = sum(times) / len(times)
        except Exception as exc:  # noqa: BLE001 (a small /dev/shm: say so)
            print(f"  /dev/shm sync failed: {exc}", flush=True)
        finally:
            shutil.rmtree(shm, ignore_errors=True)
    times = []
    for _ in range(syncs):
        _perturb(model)
        t0 = time.perf_counter()
        items = list(state_for_vllm(model, engine.dtype, engine.untie).items())
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        engine.llm.reset_prefix_cache()
        times.append(time.perf_counter() - t0)
    out["sync_iterator_inprocess_s"] = sum(times) / len(times)
    return out


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    """The benchmark's policy (``--model``; tiny: hidden size 128) in eval mode and its tokenizer, with
    ``--threads`` torch threads."""
    import torch

    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    torch.set_num_threads(args.threads)
    kw = {"tiny_hidden_size": 128} if args.model == "tiny" else {}
    model, tok = load_policy(ModelConfig(name=args.model, **kw))
    return model.eval(), tok


def run_engine(args: argparse.Namespace) -> dict[str, float]:
    """One engine, in this process (``--engine NAME``)."""
    from agent_rl.engines import caps_of, get_engine

    model, tok = _load(args)
    batches = _batches(args.batch)
    prompts = _prompts(tok, max(batches))
    temps = [0.3 if i % 2 == 0 else 1.2 for i in range(max(batches))]
    peak = PeakRSS()
    t0 = time.perf_counter()
    extra = {}
    if args.engine == "vllm":
        extra = dict(dtype="float32", kv_cache_gb=args.kv_cache_gb, enforce_eager=args.enforce_eager,
                     multiprocessing=not args.in_process)
    elif args.engine == "vllm_server":  # its own `vllm serve` (this Python), reached over HTTP
        extra = dict(dtype="float32", kv_cache_gb=args.kv_cache_gb, enforce_eager=args.enforce_eager,
                     server="auto", server_python=sys.executable)
    engine = get_engine(args.engine, model, tok, batch_size=max(batches), seed=0, **extra)
    start_s = time.perf_counter() - t0
    result: dict[str, float] = {}
    try:
        for b in batches:  # smallest first; each after a warm-up call of its own size
            engine.generate(prompts[:b], temps[:b], max_new_tokens=args.max_new_tokens, seed=0)
            rates, cpu_rates = [], []
            for r in range(args.rounds):
                t0, c0 = time.perf_counter(), _cpu_s()
                gens = engine.generate(prompts[:b], temps[:b], max_new_tokens=args.max_new_tokens, seed=r + 1)
                dt, dc = time.perf_counter() - t0, _cpu_s() - c0
                n = sum(len(g.token_ids) for g in gens)
                rates.append(n / dt)
                cpu_rates.append(n / max(dc, 1e-9))
                print(f"  {args.engine}: batch {b}, round {r + 1}: {n} tokens in {dt:.2f} s, {dc:.2f} CPU-s",
                      flush=True)
            result[f"tokens_per_s_b{b}"] = sum(rates) / len(rates)
            result[f"tokens_per_cpu_s_b{b}"] = sum(cpu_rates) / len(cpu_rates)
        diff = _logprob_diff(model, prompts[:b], gens, temps[:b])
        syncs = []
        for _ in range(args.syncs):
            _perturb(model)
            t0 = time.perf_counter()
            engine.sync_weights(model)
            syncs.append(time.perf_counter() - t0)
        gens = engine.generate(prompts[:4], temps[:4], max_new_tokens=8, seed=99)
        diff_after_sync = _logprob_diff(model, prompts[:4], gens, temps[:4])
        result.update({"start_s": start_s, "sync_s": sum(syncs) / len(syncs), "logprob_diff": diff,
                       "logprob_diff_after_sync": diff_after_sync})
        if args.engine == "vllm" and args.sync_variants and args.in_process:
            result.update(_time_sync_variants(engine, model, args.syncs))
        if caps_of(engine).prefix_cache_stats:
            result["prefix_cache_hit_rate"] = engine.prefix_cache_stats()["hit_rate"]
    finally:
        engine.close()
    result["peak_rss_gb"] = peak.stop()
    return result


def _batches(spec: str) -> list[int]:
    """``--batch``: one size or a comma list (``1,4,16``), sorted."""
    sizes = sorted({int(b) for b in str(spec).split(",") if b.strip()})
    if not sizes or sizes[0] < 1:
        raise SystemExit(f"--batch {spec}: sizes must be >= 1")
    return sizes


def run_affinity(args: argparse.Namespace) -> dict[str, float]:
    """Two ``vllm serve`` replicas (one engine, ``server_replicas=2``) play the same real ALFWorld rollout twice,
    ``--affinity-tasks`` x 4 episodes x ``--affinity-turns`` turns in trajectory mode (each turn's prompt extends the
    episode's last): with episode affinity (an episode's turns on one replica) and without (each request to the
    least-loaded replica). Per arm: the servers' prefix-cache hit rate (per-request cached tokens over prompt
    tokens, and the servers' own ``/metrics``), generated tokens, wall time. The caches are reset between arms."""
    import asyncio

    from agent_rl.engines import get_engine
    from agent_rl.engines.vllm_server import Router
    from agent_rl.envclient import LocalEnvPool
    from agent_rl.learner.config import AlgoConfig
    from agent_rl.rollout import RolloutConfig, RolloutOrchestrator, TaskSampler, TaskSamplerConfig, get_prompt

    model, tok = _load(args)
    t0 = time.perf_counter()
    engine = get_engine("vllm_server", model, tok, batch_size=32, seed=0, dtype="float32",
                        kv_cache_gb=args.kv_cache_gb, enforce_eager=args.enforce_eager, server="auto",
                        server_python=sys.executable, server_replicas=2, run_dir=args.out)
    out: dict[str, float] = {"start_s": time.perf_counter() - t0}
    env_id = "agent_rl/ALFWorld-v0"

    async def arm() -> dict[str, float]:
        pool = LocalEnvPool()
        cfg = RolloutConfig(max_turns=args.affinity_turns, mode="trajectory")
        orch = RolloutOrchestrator(pool, engine, get_prompt("alfworld"), cfg, max_new_tokens=args.max_new_tokens,
                                   seed=0)
        sampler = TaskSampler(env_id, TaskSamplerConfig(kind="index", num_tasks=3553, options={"split": "train"}),
                              seed=0)
        t = time.perf_counter()
        try:
            res = await orch.collect(sampler.sample, args.affinity_tasks, AlgoConfig(name="grpo", group_size=4),
                                     step=1)
        finally:
            await orch.aclose()
            await pool.aclose()
        return {"wall_s": time.perf_counter() - t, "episodes": float(len(res.episodes)),
                "turns": float(sum(len(ep.turns) for ep in res.episodes)),
                "generated_tokens": float(sum(len(t.response_ids) for ep in res.episodes for t in ep.turns))}

    try:
        for affinity in (True, False):
            name = "affinity" if affinity else "no_affinity"
            for url in engine.urls:
                engine.post(url, "/reset_prefix_cache")
            engine.router = Router(engine.urls, affinity)
            engine.step_metrics()  # the /metrics counters from here
            before = engine.prefix_cache_stats()
            got = asyncio.run(arm())
            after = engine.prefix_cache_stats()
            q, h = after["queries"] - before["queries"], after["hits"] - before["hits"]
            got["hit_rate"] = h / q if q else 0.0
            got["hit_rate_server_metrics"] = engine.step_metrics()["engine/prefix_cache_hit_rate"]
            got["prompt_tokens"] = float(q)
            print(f"  {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in got.items()), flush=True)
            out.update({f"{name}_{k}": v for k, v in got.items()})
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", default="32", help="batch size, or a comma list of them (1,4,16)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-gb", type=float, default=1.0)
    ap.add_argument("--enforce-eager", action="store_true", help="vllm: no torch.compile")
    ap.add_argument("--sync-variants", action="store_true", help="vllm: also time the other reload inputs")
    ap.add_argument("--engines", default="hf,vllm",
                    help="comma list of hf, vllm, vllm_server, vllm_server_affinity (2 replicas, ALFWorld rollout)")
    ap.add_argument("--affinity-tasks", type=int, default=2, help="vllm_server_affinity: tasks (x 4 episodes)")
    ap.add_argument("--affinity-turns", type=int, default=10, help="vllm_server_affinity: turns per episode")
    ap.add_argument("--engine", help=argparse.SUPPRESS)  # the per-engine child process
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="runs/bench_engines")
    args = ap.parse_args()
    if args.engine:
        run = run_affinity if args.engine == "vllm_server_affinity" else run_engine
        print("RESULT " + json.dumps(run(args)), flush=True)
        return
    runs = []
    for name in args.engines.split(","):
        runs.append((name, False))
        if name == "vllm" and args.sync_variants:
            runs.append((name, True))  # vLLM with its engine core in this process (the other process mode)
    results: dict[str, dict[str, float]] = {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": args.model, "batch": args.batch, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
            "threads": args.threads, "temperatures": "0.3 / 1.2 alternating", "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()[0]}
    base = [f"--model={args.model}", f"--batch={args.batch}", f"--max-new-tokens={args.max_new_tokens}",
            f"--rounds={args.rounds}", f"--syncs={args.syncs}", f"--threads={args.threads}",
            f"--kv-cache-gb={args.kv_cache_gb}", *(["--enforce-eager"] if args.enforce_eager else []),
            f"--affinity-tasks={args.affinity_tasks}", f"--affinity-turns={args.affinity_turns}", f"--out={out}",
            *(["--sync-variants"] if args.sync_variants else [])]
    for name, in_process in runs:
        label = f"{name}{' (in-process)' if in_process else ''}"
        print(f"== {label}", flush=True)
        cmd = [sys.executable, __file__, *base, "--engine", name, *(["--in-process"] if in_process else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("  ")), flush=True)
        if proc.returncode != 0 or not lines:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{label}: exit {proc.returncode}")
        results[label] = json.loads(lines[-1][len("RESULT "):])
        (out / "results.json").write_text(json.dumps({"setup": meta, "results": results}, indent=2))  # so far
    keys = sorted({k for r in results.values() for k in r})
    print(f"\n{args.model}, batch {args.batch}, {args.max_new_tokens} new tokens, {args.threads} threads")
    print("| metric | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{r[k]:.3g}" if k in r else "-" for r in results.values()) + " |")


if __name__ == "__main__":
    main()
