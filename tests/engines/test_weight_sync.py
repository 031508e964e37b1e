"""The ``vllm_server`` engine's weight-sync routes without a server (``agent_rl.engines.weight_sync``): which route
``engine.weight_transfer`` x ``engine.lora_sync`` picks, what each asks of the servers, and what a route sends to
a server (a recording target in place of the engine's HTTP). The routes against real servers:
``tests/engines/test_vllm_server_engine.py`` and ``test_vllm_transfer.py`` (mark ``vllm``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from agent_rl.engines.config import EngineConfig
from agent_rl.engines.weight_sync import (LORA_NAME, ROUTES, AdapterReload, ReloadFile, VLLMTransfer, WeightSyncSpec,
                                          check_names, make_route, route_class, transfer_names)


class Target:
    """What a route uses of the engine: a sync folder, the dtype, untie, and a recorded POST."""

    def __init__(self, folder: Path, fail: str = "") -> None:
        self.sync_folder, self.dtype, self.untie = folder, torch.float32, False
        self.posts: list[tuple[str, str, Any]] = []
        self.fail = fail

    def post(self, url: str, path: str, **kw: Any) -> Any:
        self.posts.append((url, path, kw.get("json")))
        if self.fail:
            raise RuntimeError(self.fail)
        return None

    def log_tail(self, url: str) -> str:
        return ""


def test_the_route_of_each_setting():
    assert transfer_names() == ["reload", "nccl", "ipc"]
    assert ROUTES == (ReloadFile, AdapterReload, VLLMTransfer)
    assert route_class("reload") is ReloadFile and route_class("reload", "merged") is ReloadFile
    assert route_class("reload", "adapter") is AdapterReload
    for bad, match in (dict(weight_transfer="tcp"), "engine.weight_transfer='tcp': valid: reload | nccl | ipc"), \
                      (dict(weight_transfer="reload", lora_sync="delta"),
                       "engine.lora_sync='delta': valid: merged | adapter"):
        with pytest.raises(ValueError, match=match):
            check_names(**bad)
        with pytest.raises(ValueError, match=match):
            route_class(**bad)
        with pytest.raises(ValueError, match=match):
            EngineConfig(**bad)  # the config's check is the same names'


def test_what_each_route_asks_of_the_servers(tmp_path):
    reload = make_route(Target(tmp_path), WeightSyncSpec(), torch.nn.Linear(2, 2))
    assert isinstance(reload, ReloadFile) and reload.server_args() == [] and reload.merged_start
    assert not reload.lora_updates and not reload.unpickle and reload.served_name is None
    assert (AdapterReload.merged_start, AdapterReload.lora_updates, AdapterReload.served_name) == \
        (False, True, LORA_NAME)
    with pytest.raises(ValueError, match=r"lora_sync=adapter: the policy has no LoRA adapter \(model.lora.rank=0\)"):
        make_route(Target(tmp_path), WeightSyncSpec(lora_sync="adapter"), torch.nn.Linear(2, 2))


def test_reload_file_writes_the_weights_and_reloads_each_server(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    target = Target(tmp_path)
    route = make_route(target, WeightSyncSpec(), model)
    sent = route.prepare(model, 1)
    file = tmp_path / "model.safetensors"
    assert sent == file.stat().st_size
    state = load_file(str(file))
    assert sorted(state) == ["bias", "weight"] and torch.equal(state["weight"], model.weight.detach())
    for url in ("http://a:1", "http://b:2"):
        route.load(url)
    route.finish()
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}}
    assert target.posts == [("http://a:1", "/collective_rpc", body), ("http://b:2", "/collective_rpc", body)]


def test_adapter_reload_loads_in_place_and_keeps_only_the_newest_folder(tmp_path):
    """The adapter route's load and finish, the adapter's folders made by hand (a peft policy is not needed for
    what is tested): each load names the sync's folder under one name; finish removes older folders; a server
    without runtime LoRA loading (404) gets the arguments it needs in the error."""
    route = AdapterReload.__new__(AdapterReload)
    target = Target(tmp_path)
    route.target, route.spec, route.lora_args, route.unpickle = target, WeightSyncSpec(lora_sync="adapter"), \
        ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"], False
    for version in (1, 2):
        (tmp_path / f"adapter-{version}").mkdir()
    route.folder = tmp_path / "adapter-2"
    route.load("http://a:1")
    route.finish()
    assert target.posts == [("http://a:1", "/v1/load_lora_adapter",
                             {"lora_name": LORA_NAME, "lora_path": str(tmp_path / "adapter-2"),
                              "load_inplace": True})]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter-2"]
    route.target = Target(tmp_path, fail="vllm server http://a:1/v1/load_lora_adapter: HTTP 404: Not Found")
    with pytest.raises(RuntimeError, match="does not load LoRA adapters at run time .* start it with --enable-lora "
                                           "--max-loras 1 --max-lora-rank 8 and VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        route.load("http://a:1")
    route.target = Target(tmp_path, fail="vllm server http://a:1/v1/load_lora_adapter: HTTP 400: bad")
    with pytest.raises(RuntimeError, match="HTTP 400: bad"):  # any other refusal as the server said it
        route.load("http://a:1")
