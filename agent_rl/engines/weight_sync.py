"""Weight-sync routes of the ``vllm_server`` engine: how the learner's weights reach vLLM servers.

A route is chosen and checked once, when the engine is built (:func:`make_route`, from ``engine.weight_transfer`` and
``engine.lora_sync``; the same check refuses the config when it loads: :func:`check_weight_transfer`). The engine
then runs every sync the same way (:meth:`agent_rl.engines.vllm_server.VLLMServerEngine.sync_weights`)::

    sent = route.prepare(model, version)          # once: the file, the adapter folder, or the tensors to send
    for url in live servers:
        /pause?mode=wait -> route.load(url) -> /reset_prefix_cache -> /update_weight_version -> /resume
    route.finish()                                # once: what the sync no longer needs

Routes (one class each, :data:`ROUTES` in the order of ``engine.weight_transfer``'s valid values):

- :class:`ReloadFile` (``reload``, ``lora_sync=merged``): the policy (LoRA merged) written into the engine's sync
  folder as one safetensors file, then vLLM's ``/collective_rpc reload_weights``. CPU and GPU.
- :class:`AdapterReload` (``reload``, ``lora_sync=adapter``): the servers hold the frozen base weights and serve the
  adapter with vLLM's LoRA support; each sync writes only the adapter into a new folder and loads it in place under
  one name (``/v1/load_lora_adapter``, ``load_inplace``).
- :class:`VLLMTransfer` (``nccl`` | ``ipc``): vLLM's weight-transfer API, tensors over NCCL or CUDA IPC handles
  (:mod:`agent_rl.engines.vllm_transfer`: CUDA only, vLLM importable by the trainer).

A new route is a class beside these (its ``transfer`` name and the ``lora_sync`` it serves, its :meth:`check`,
:meth:`prepare` and :meth:`load`) and a line in :data:`ROUTES`.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from agent_rl.engines.vllm import write_sync_weights
from agent_rl.lora import adapter_config, save_adapter

log = logging.getLogger(__name__)

LORA_SYNCS = ("merged", "adapter")
"""``engine.lora_sync``'s valid values."""
LORA_NAME = "policy"
"""The name the policy's adapter is served under (``engine.lora_sync=adapter``): every request's ``model``."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM 0.32 accepts (``vllm/config/lora.py``, ``MaxLoRARanks``)."""


class SyncTarget(Protocol):
    """What a route uses of the engine it syncs: its sync folder (read by the servers), the servers' dtype, whether
    a tied head goes untied, one POST to a server, and a server's log tail for an error message."""

    sync_folder: Path
    dtype: torch.dtype
    untie: bool

    def post(self, url: str, path: str, **kw: Any) -> Any: ...

    def log_tail(self, url: str) -> str: ...


@dataclass(frozen=True)
class WeightSyncSpec:
    """A route's settings, built once from the engine's arguments.

    Attributes:
        weight_transfer: ``engine.weight_transfer`` (reload | nccl | ipc).
        lora_sync: ``engine.lora_sync`` (merged | adapter).
        host: the address the servers reach this process at for NCCL's rendezvous.
        tensor_parallel_size: the servers' workers (NCCL ranks 1..tp).
        timeout_s: seconds one transfer call may take.
        api_key: the servers' key (vLLM's transfer client sends it on each call).
    """

    weight_transfer: str = "reload"
    lora_sync: str = "merged"
    host: str = "127.0.0.1"
    tensor_parallel_size: int = 1
    timeout_s: float = 600.0
    api_key: str = ""


class WeightSyncRoute:
    """One way weights reach the servers (module docstring). Class attributes declare what the servers need:

    Attributes:
        transfer: the ``engine.weight_transfer`` values it serves.
        lora_sync: the ``engine.lora_sync`` value it serves.
        merged_start: the servers start from the merged policy (false: from the base weights, and the engine's first
            sync loads the rest).
        lora_updates: the servers load LoRA adapters at run time (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
        served_name: the ``model`` every request names (None: the server's default).
        unpickle (per instance): the servers unpickle what ``/update_weights`` receives
            (``VLLM_ALLOW_INSECURE_SERIALIZATION``: CUDA IPC handles).
    """

    transfer: ClassVar[tuple[str, ...]] = ()
    lora_sync: ClassVar[str] = "merged"
    merged_start: ClassVar[bool] = True
    lora_updates: ClassVar[bool] = False
    served_name: ClassVar[str | None] = None

    def __init__(self, target: SyncTarget, spec: WeightSyncSpec, model: Any) -> None:
        self.target, self.spec = target, spec
        self.unpickle = False

    @classmethod
    def check(cls, weight_transfer: str, lora_sync: str) -> None:
        """Refuse what this process cannot drive (``ValueError``: the reason and what to use); nothing by default."""

    def server_args(self) -> list[str]:
        """``vllm serve`` arguments the route needs of the run's own servers."""
        return []

    def prepare(self, model: Any, version: int) -> int:
        """Take ``model``'s current weights for this sync (labelled ``version``); returns the bytes sent."""
        raise NotImplementedError

    def load(self, url: str) -> None:
        """The prepared weights into server ``url`` (paused by the engine).

        Raises:
            RuntimeError: the server refused or the transfer failed (its message and log tail).
        """
        raise NotImplementedError

    def finish(self) -> None:
        """After every live server was loaded: drop what this sync no longer needs."""

    def close(self) -> None:
        """Release what the route holds (the engine's close); idempotent."""


class ReloadFile(WeightSyncRoute):
    """``reload``: one safetensors file in the sync folder, then vLLM's ``reload_weights`` on each server."""

    transfer = ("reload",)

    def prepare(self, model: Any, version: int) -> int:
        t = self.target
        return write_sync_weights(model, t.sync_folder, t.dtype, t.untie).stat().st_size

    def load(self, url: str) -> None:
        self.target.post(url, "/collective_rpc", json={"method": "reload_weights",
                                                       "kwargs": {"weights_path": str(self.target.sync_folder)}})


def lora_server_args(rank: int) -> list[str]:
    """``vllm serve`` arguments that serve one LoRA adapter of rank ``rank`` (``engine.lora_sync=adapter``):
    ``--enable-lora --max-loras 1 --max-lora-rank R``, R the smallest rank vLLM accepts that is >= ``rank``.

    Raises:
        ValueError: ``rank`` < 1 or above vLLM's largest (512).
    """
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if rank < 1 or not fits:
        raise ValueError(f"model.lora.rank={rank}: vLLM serves LoRA ranks 1..{VLLM_LORA_RANKS[-1]} "
                         f"(--max-lora-rank in {list(VLLM_LORA_RANKS)}); use engine.lora_sync=merged")
    return ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(fits[0])]


class AdapterReload(WeightSyncRoute):
    """``reload`` with ``lora_sync=adapter``: the adapter alone (peft's layout, ``agent_rl.lora.save_adapter``) into
    ``adapter-<version>/`` of the sync folder (a new folder per version: vLLM keys its loaded adapter by path too),
    loaded in place under :data:`LORA_NAME` on each server.

    Raises:
        ValueError: the policy has no LoRA adapter, or one of a rank vLLM does not serve.
    """

    transfer = ("reload",)
    lora_sync = "adapter"
    merged_start = False
    lora_updates = True
    served_name = LORA_NAME

    def __init__(self, target: SyncTarget, spec: WeightSyncSpec, model: Any) -> None:
        super().__init__(target, spec, model)
        adapter = adapter_config(model)
        if adapter is None:
            raise ValueError("engine.lora_sync=adapter: the policy has no LoRA adapter (model.lora.rank=0)")
        self.lora_args = lora_server_args(int(adapter.r))
        self.folder: Path | None = None

    def server_args(self) -> list[str]:
        return list(self.lora_args)

    def prepare(self, model: Any, version: int) -> int:
        self.folder = self.target.sync_folder / f"adapter-{version}"
        shutil.rmtree(self.folder, ignore_errors=True)
        return save_adapter(model, self.folder, self.target.dtype)

    def load(self, url: str) -> None:
        """Raises: RuntimeError: the server cannot load adapters at run time (404: started without
        ``--enable-lora`` or ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), or refused this one (its message)."""
        try:
            self.target.post(url, "/v1/load_lora_adapter",
                             json={"lora_name": LORA_NAME, "lora_path": str(self.folder), "load_inplace": True})
        except RuntimeError as exc:
            if "HTTP 404" in str(exc) and "/v1/load_lora_adapter" in str(exc):
                raise RuntimeError(
                    f"vllm server {url} does not load LoRA adapters at run time (engine.lora_sync=adapter): start it "
                    f"with {' '.join(self.lora_args)} and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or use "
                    "engine.lora_sync=merged") from None
            raise

    def finish(self) -> None:
        for old in self.target.sync_folder.glob("adapter-*"):
            if old != self.folder:
                shutil.rmtree(old, ignore_errors=True)


class VLLMTransfer(WeightSyncRoute):
    """``nccl`` | ``ipc``: the policy's tensors (:class:`agent_rl.engines.vllm_transfer.PolicySource`) sent through
    vLLM's trainer-side engine, one per server, built at the first sync to it (the NCCL rendezvous or IPC
    handshake); a failed send tears it down and the next sync builds a new one."""

    transfer = ("nccl", "ipc")

    def __init__(self, target: SyncTarget, spec: WeightSyncSpec, model: Any) -> None:
        super().__init__(target, spec, model)
        self.unpickle = spec.weight_transfer == "ipc"  # CUDA IPC handles travel pickled
        self.senders: dict[str, Any] = {}  # url -> vLLM's trainer-side engine
        self.source: Any = None

    @classmethod
    def check(cls, weight_transfer: str, lora_sync: str) -> None:
        if not torch.cuda.is_available():
            raise ValueError(f"engine.weight_transfer={weight_transfer}: vLLM's {weight_transfer.upper()} weight "
                             "transfer needs CUDA devices and torch finds none; on CPU use "
                             "engine.weight_transfer=reload (the default: weights written to engine.sync_dir, then "
                             "reload_weights)")
        if lora_sync == "adapter":
            raise ValueError(f"engine.weight_transfer={weight_transfer} with engine.lora_sync=adapter: an adapter is "
                             "loaded from a folder (/v1/load_lora_adapter); use engine.weight_transfer=reload, or "
                             "engine.lora_sync=merged to send the merged weights by "
                             f"{weight_transfer.upper()}")
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(f"engine.weight_transfer={weight_transfer}: the trainer's half of vLLM's weight "
                             "transfer is vLLM's own code (vllm.distributed.weight_transfer), and vllm is not "
                             f"importable by this Python ({sys.executable}): install vllm here, or use "
                             "engine.weight_transfer=reload (HTTP and a file only)")

    def server_args(self) -> list[str]:
        from agent_rl.engines import vllm_transfer  # deferred: imports vLLM (nccl|ipc only)

        return vllm_transfer.server_args(self.spec.weight_transfer)

    def prepare(self, model: Any, version: int) -> int:
        from agent_rl.engines import vllm_transfer  # deferred: imports vLLM (nccl|ipc only)

        if self.source is None:
            self.source = vllm_transfer.PolicySource(model, self.target.dtype, self.target.untie)
        self.source.refresh(model)
        return sum(m.dtype.itemsize * math.prod(m.shape) for m in self.source.metadata())

    def load(self, url: str) -> None:
        from agent_rl.engines import vllm_transfer  # deferred: imports vLLM (nccl|ipc only)

        spec = self.spec
        try:
            sender = self.senders.get(url)
            if sender is None:
                sender = vllm_transfer.trainer_engine(
                    spec.weight_transfer, url, self.source, master_address=spec.host,
                    tensor_parallel_size=spec.tensor_parallel_size, timeout_s=spec.timeout_s, api_key=spec.api_key)
                self.senders[url] = sender
            sender.send_weights()
        except Exception as exc:  # noqa: BLE001 (requests' and NCCL's errors alike: one message with the log)
            self.drop(url)  # vLLM: after a failed send the group is unusable and must be torn down
            raise RuntimeError(f"vllm server {url}: weight transfer ({spec.weight_transfer}) failed: "
                               f"{type(exc).__name__}: {exc}{self.target.log_tail(url)}") from exc

    def finish(self) -> None:
        if self.source is not None:
            self.source.release()

    def drop(self, url: str) -> None:
        """Forget server ``url``'s trainer-side engine and shut its communicator down (a failed send, or the
        close); the next sync to ``url`` builds a new one."""
        sender = self.senders.pop(url, None)
        if sender is None:
            return
        try:
            sender.shutdown()  # the trainer's communicator (a remote server keeps its own until it stops)
        except Exception:  # noqa: BLE001 (a group already broken has nothing left to free)
            log.warning("vllm_server engine: the weight-transfer group of %s did not shut down cleanly", url)

    def close(self) -> None:
        for url in list(self.senders):
            self.drop(url)


ROUTES: tuple[type[WeightSyncRoute], ...] = (ReloadFile, AdapterReload, VLLMTransfer)
"""The routes, in the order of ``engine.weight_transfer``'s valid values."""


def transfer_names() -> list[str]:
    """``engine.weight_transfer``'s valid values (reload, nccl, ipc)."""
    return list(dict.fromkeys(name for route in ROUTES for name in route.transfer))


def check_names(weight_transfer: str, lora_sync: str = "merged") -> None:
    """Refuse a value that names no route (``EngineConfig``'s check; nothing about this machine).

    Raises:
        ValueError: ``weight_transfer`` or ``lora_sync`` not among the valid values (listed).
    """
    if weight_transfer not in transfer_names():
        raise ValueError(f"engine.weight_transfer={weight_transfer!r}: valid: {' | '.join(transfer_names())}")
    if lora_sync not in LORA_SYNCS:
        raise ValueError(f"engine.lora_sync={lora_sync!r}: valid: {' | '.join(LORA_SYNCS)}")


def route_class(weight_transfer: str, lora_sync: str = "merged") -> type[WeightSyncRoute]:
    """The route of ``engine.weight_transfer`` and ``engine.lora_sync``, checked for this process (its
    :meth:`WeightSyncRoute.check`: ``reload`` always runs).

    Raises:
        ValueError: an unknown value; nccl/ipc without CUDA devices, with ``lora_sync=adapter`` (an adapter is
            loaded from a folder: it has no tensor path), or without vLLM importable here.
    """
    check_names(weight_transfer, lora_sync)
    serving = [r for r in ROUTES if weight_transfer in r.transfer]
    route = next((r for r in serving if r.lora_sync == lora_sync), serving[0])
    route.check(weight_transfer, lora_sync)
    if route.lora_sync != lora_sync:  # pragma: no cover (every transfer's check refuses the lora_sync it lacks)
        raise ValueError(f"engine.weight_transfer={weight_transfer} has no route for engine.lora_sync={lora_sync}")
    return route


def check_weight_transfer(weight_transfer: str, lora_sync: str = "merged") -> None:
    """Refuse at load time an ``engine.weight_transfer`` this process cannot drive (:func:`route_class`)."""
    route_class(weight_transfer, lora_sync)


def make_route(target: SyncTarget, spec: WeightSyncSpec, model: Any) -> WeightSyncRoute:
    """The route of ``spec`` for the engine ``target`` syncing ``model`` (chosen and checked once).

    Raises:
        ValueError: what :func:`route_class` refuses; ``lora_sync=adapter`` for a policy without an adapter or of a
            rank vLLM does not serve.
    """
    return route_class(spec.weight_transfer, spec.lora_sync)(target, spec, model)
