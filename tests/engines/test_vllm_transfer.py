"""``engine.weight_transfer=nccl|ipc`` against vLLM's own trainer-side code (mark ``vllm``: runs in ``.venv-vllm``).

On CPU (CI) what can run without CUDA: the tensors the transfer sends (:class:`PolicySource`, a real vLLM
``WeightSource``) are exactly those the reload path writes, checked by vLLM's own consistency check; the server
arguments parse in vLLM's real ``vllm serve`` parser. The transfers themselves (a real server, one update, the
log-prob gap before and after) run on a GPU: the last tests, skipped without CUDA (``scripts/gpu_checks.sh``)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from safetensors.torch import load_file

from agent_rl.engines import get_engine
from agent_rl.engines import vllm as offline

from test_vllm_engine import TOL, _max_diff, _one_update, _prompt, _tiny

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_policy_source_sends_what_the_reload_path_writes(tmp_path, tie, dtype):
    """Names, dtypes, shapes and values of the transfer's tensors equal the reload file's (the names vLLM loads;
    a tied head sent as its own copy when the servers hold an untied model), metadata agrees with iteration
    (vLLM's ``NCCLTrainerWeightTransferEngine._checked_iter``, which raises on the first divergence), and a
    refresh after an update sends the new weights."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    from agent_rl.engines.vllm_transfer import PolicySource

    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = _tiny()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    untie = bool(offline.tied_names(model))  # as the engine decides: a tied head goes as its own copy
    assert untie == tie
    source = PolicySource(model, dtype, untie)
    meta = source.metadata()
    file = load_file(str(offline.write_sync_weights(model, tmp_path, dtype, untie)))
    assert sorted(m.name for m in meta) == sorted(file) and "lm_head.weight" in file  # a file sorts its keys
    for m in meta:
        assert m.dtype == file[m.name].dtype == dtype and m.shape == tuple(file[m.name].shape)
    # (a float32 policy's tensors go as views of its parameters: cloned here to compare with what follows)
    sent = {k: t.clone() for k, t in NCCLTrainerWeightTransferEngine._checked_iter(source, meta)}
    assert all(torch.equal(sent[k], file[k]) for k in file)

    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)
    source.refresh()
    after = dict(source)
    embed = model.get_input_embeddings().weight.detach().to(dtype)
    assert torch.equal(after["model.embed_tokens.weight"], embed)
    assert not torch.equal(after["model.embed_tokens.weight"], sent["model.embed_tokens.weight"])
    # the head follows the shared matrix when tied, and stays as it was when not
    assert torch.equal(after["lm_head.weight"], embed if tie else sent["lm_head.weight"])
    source.release()
    assert source._state is None


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_server_arguments_parse_in_vllm_serve(backend):
    """The arguments the engine gives ``vllm serve`` for a backend are what vLLM's own parser turns into its
    ``WeightTransferConfig``."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from agent_rl.engines.vllm_transfer import server_args

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", *server_args(backend)])
    assert AsyncEngineArgs.from_cli_args(args).weight_transfer_config.backend == backend


def test_the_weight_sync_client_sends_the_runs_key_on_every_call():
    """vLLM's HTTP weight-sync client sends no key, and the run's servers refuse every route without it: the
    engine's client (:class:`KeyedWeightSyncClient`) is vLLM's with ``Authorization: Bearer KEY`` on each of its
    five calls, its bodies vLLM's own (an ipc payload pickled by vLLM's ``_json_safe_update_payload``); a 401 raises
    as vLLM's client does."""
    import json as json_
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import requests

    from agent_rl.engines.vllm_transfer import KeyedWeightSyncClient

    seen: list[tuple[str, str | None, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, self.headers.get("Authorization"), json_.loads(body) if body else {}))
            self.send_response(200 if self.headers.get("Authorization") == "Bearer k3y" else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = KeyedWeightSyncClient(url, timeout=30, api_key="k3y")
        client.init_weight_transfer_engine({"rank": 0})
        client.start_weight_update()
        client.update_weights({"ipc_handles": [("handle", 1)], "names": ["w"]})
        client.finish_weight_update("3")
        client.shutdown_weight_transfer_engine()
        with pytest.raises(requests.HTTPError, match="401"):
            KeyedWeightSyncClient(url, timeout=30).start_weight_update()
    finally:
        server.shutdown()
    assert [p for p, _, _ in seen] == ["/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                                       "/finish_weight_update", "/shutdown_weight_transfer_engine",
                                       "/start_weight_update"]
    assert [a for _, a, _ in seen] == ["Bearer k3y"] * 5 + [None]
    assert "ipc_handles_pickled" in seen[2][2]["update_info"] and seen[3][2] == {"weight_version": "3"}


def test_a_failed_handshake_is_one_clear_error_and_leaves_no_sender(tmp_path):
    """The transfer path of the engine against a port nobody serves: vLLM's trainer engine fails to build (on CPU
    vLLM's IPC engine asks for the accelerator before its HTTP handshake; on a GPU its client finds the port
    closed), the engine raises one error naming the server, the backend and the cause, and keeps no sender for
    that server (the next sync builds a new one). The engine is assembled without servers (none can take a transfer
    on CPU)."""
    from agent_rl.engines.vllm_server import VLLMServerEngine
    from agent_rl.engines.vllm_transfer import PolicySource
    from agent_rl.engines.weight_sync import VLLMTransfer, WeightSyncSpec
    from servers.launch import free_port

    model, _ = _tiny()
    url = f"http://127.0.0.1:{free_port()}"
    eng = VLLMServerEngine.__new__(VLLMServerEngine)  # the route's target: its log tails (none: no server started)
    eng.servers = []
    route = VLLMTransfer(eng, WeightSyncSpec(weight_transfer="ipc", host="127.0.0.1", timeout_s=5.0,
                                             api_key="the-run-key"), model)
    route.source = PolicySource(model, torch.float32, False)
    for _ in range(2):  # the same error again: nothing half-built was kept
        cause = "ConnectionError" if torch.cuda.is_available() else "RuntimeError: Cannot access accelerator device"
        with pytest.raises(RuntimeError, match=rf"vllm server {url}: weight transfer \(ipc\) failed: {cause}"):
            route.load(url)
        assert route.senders == {}


# ------------------------------------------------------------------------------------------ GPU: the transfers
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's NCCL and CUDA IPC weight transfer need CUDA")
@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_transfer_gap_before_and_after_on_a_real_server(tmp_path, backend):
    """A server the engine starts with ``weight_transfer=backend``: its log-probs are off by > 0.01 after one update
    of the learner and within 1e-4 after the sync (tensors moved by ``backend``, no file written); twice, so the
    second sync reuses the group the first one built."""
    model, tok = _tiny()
    model = model.cuda()
    eng = get_engine("vllm_server", model, tok, server="auto", server_python=sys.executable, dtype="float32",
                     enforce_eager=True, kv_cache_gb=0.25, sync_dir=str(tmp_path / "sync"), run_dir=str(tmp_path),
                     weight_transfer=backend)
    try:
        started = (eng.sync_folder / "model.safetensors").stat().st_mtime_ns  # the start's weights
        prompt = _prompt(tok, " ".join(f"w{i}" for i in range(60)))
        for version in (1, 2):
            g = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[version])[0]
            _one_update(model, prompt, g.token_ids)
            stale = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[10 + version])[0]
            before = _max_diff(model, prompt, stale, 1.0)
            eng.sync_weights(model, version)
            fresh = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[10 + version])[0]
            after = _max_diff(model, prompt, fresh, 1.0)
            m = eng.step_metrics()
            print(f"{backend} sync {version}: before {before:.2e}, after {after:.2e}, "
                  f"{m['time/weight_sync_s']:.3f} s, {m['engine/weight_sync_mb']:.1f} MB")
            assert before > 0.01 and after < TOL and fresh.policy_version == version
            assert m["engine/sync_logprob_diff"] < TOL
        # the file path was not taken: the start's weights file is untouched
        assert (eng.sync_folder / "model.safetensors").stat().st_mtime_ns == started
    finally:
        eng.close()
