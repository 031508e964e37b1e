"""vLLM's weight-transfer API, the trainer's side (``engine=vllm_server engine.weight_transfer=nccl|ipc``).

The ``vllm_server`` engine is HTTP only and needs no vLLM in the trainer's environment for its default sync
(``reload``: a file the servers read). The GPU paths move tensors instead, and their trainer half is vLLM's own
code (``vllm.distributed.weight_transfer``, read from vLLM 0.32's source): this module is imported only for them,
so they need vLLM importable by the trainer (GPU machines usually have it: the ``engine=vllm`` engine needs it too).

- ``nccl`` (:class:`~vllm.distributed.weight_transfer.nccl_engine.NCCLTrainerWeightTransferEngine`): the trainer is
  rank 0 of an NCCL group with the server's workers (ranks 1..tp), joined over a TCPStore at
  ``master_address:master_port`` that the trainer opens; each sync broadcasts the tensors (packed into buffers).
  The server must be started with ``--weight-transfer-config '{"backend": "nccl"}'`` and reach the trainer at
  ``master_address`` (``engine.weight_transfer_host``; default 127.0.0.1, the run's own servers).
- ``ipc`` (:class:`~vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine`): CUDA IPC handles of
  the trainer's tensors, sent over HTTP pickled; the server must share the trainer's GPU, be started with
  ``--weight-transfer-config '{"backend": "ipc"}'`` and with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (it unpickles
  what ``/update_weights`` receives: a caller that reaches that route can run code in the server, so only ever on a
  server the run started itself, whose guard refuses every route to a caller without the run's key).

vLLM's HTTP client of these routes sends no key; :class:`KeyedWeightSyncClient` is the same client with the run's
``Authorization: Bearer`` header on each call.

One trainer-side engine per server (one group each); the sync's pause, prefix-cache reset, version and probe check
stay the engine's (:meth:`agent_rl.engines.vllm_server.VLLMServerEngine.sync_weights`). The tensors sent are those
the reload path writes (:func:`agent_rl.engines.vllm.state_for_vllm`: vLLM's names, the servers' dtype, a tied
head untied, LoRA merged), on the policy's device.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, TrainerWeightTransferEngine, WeightSource
from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

from agent_rl.engines.vllm import state_for_vllm
from servers.launch import free_port


class PolicySource(WeightSource):
    """vLLM's ``WeightSource`` over the policy's tensors as the servers load them (:func:`state_for_vllm`, on the
    policy's device). :meth:`refresh` takes the current weights before a send (views, no copy for a float32 policy
    sent in float32); ``metadata()`` and iteration then agree element for element, as vLLM's engines require."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, untie: bool) -> None:
        self.model, self.dtype, self.untie = model, dtype, untie
        self._state: dict[str, torch.Tensor] | None = None

    def refresh(self, model: torch.nn.Module | None = None) -> None:
        """Take ``model``'s (default: the source's) current weights for the next send."""
        self.model = model if model is not None else self.model
        device = next(self.model.parameters()).device
        self._state = state_for_vllm(self.model, self.dtype, self.untie, device=device)

    def release(self) -> None:
        """Drop the weights taken for the last send (after a sync: the policy's tensors are not held twice)."""
        self._state = None

    def _tensors(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            self.refresh()
        assert self._state is not None
        return self._state

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self._tensors().items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self._tensors().items()


class KeyedWeightSyncClient(HTTPVLLMWeightSyncClient):
    """vLLM's HTTP weight-sync client (``/init_weight_transfer_engine``, ``/start_weight_update``,
    ``/update_weights``, ``/finish_weight_update``, ``/shutdown_weight_transfer_engine``) with
    ``Authorization: Bearer api_key`` on every call ("" sends none); its ``_post`` is vLLM 0.32's with the header.

    Raises:
        requests.HTTPError: from each call, as vLLM's client (a 401: the server wants another key).
    """

    def __init__(self, base_url: str, timeout: float = 300, api_key: str = "") -> None:
        super().__init__(base_url, timeout=timeout)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _post(self, path: str, json: dict[str, Any] | None = None) -> None:
        import requests  # vLLM's client uses requests too (a dependency of vLLM)

        response = requests.post(f"{self.base_url}/{path}", json=json, timeout=self.timeout, headers=self.headers)
        response.raise_for_status()


def server_args(backend: str) -> list[str]:
    """``vllm serve`` arguments that make a server receive weights by ``backend`` (``nccl`` | ``ipc``)."""
    return ["--weight-transfer-config", json.dumps({"backend": backend})]


def trainer_engine(backend: str, url: str, source: PolicySource, *, master_address: str = "127.0.0.1",
                   tensor_parallel_size: int = 1, timeout_s: float = 300.0,
                   api_key: str = "") -> TrainerWeightTransferEngine:
    """A ready trainer-side engine for the server at ``url`` (vLLM's ``WeightTransferTrainerFactory.trainer_init``:
    for NCCL the rendezvous with the server's ``tensor_parallel_size`` workers, on a free port of
    ``master_address``; for IPC the ``packed`` handshake). Its ``send_weights()`` then runs the server's
    ``/start_weight_update`` -> ``/update_weights`` -> ``/finish_weight_update`` with the data moved by ``backend``,
    each call with the server's ``api_key`` (:class:`KeyedWeightSyncClient`).

    Raises:
        ValueError: an unknown ``backend``.
        requests.HTTPError: the server refused the handshake (not started with this backend's
            ``--weight-transfer-config``).
    """
    client = KeyedWeightSyncClient(url, timeout=timeout_s, api_key=api_key)
    info: Any
    if backend == "nccl":
        info = NCCLTrainerInitInfo(master_address=master_address, master_port=free_port(master_address),
                                   world_size=1 + tensor_parallel_size, rank=0)
    elif backend == "ipc":
        info = IPCTrainerInitInfo(rank=0)
    else:
        raise ValueError(f"engine.weight_transfer={backend!r}: vLLM's trainer-side transfer is nccl | ipc")
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
