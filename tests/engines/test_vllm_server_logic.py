"""The ``vllm_server`` engine's trainer-side logic, without vLLM (the main suite): consistent hashing and routing,
the server's command line and environment, the parsing of its answers (recorded from vLLM 0.32's real server),
config checks, the merge of the workers' engine metrics. The engine against a real ``vllm serve``:
``tests/engines/test_vllm_server_engine.py`` (mark ``vllm``)."""

from __future__ import annotations

import collections
import threading

import pytest
import torch
from omegaconf import OmegaConf

from agent_rl.config.schema import Config
from agent_rl.engines.config import EngineConfig
from agent_rl.engines import merge_engine_metrics
from agent_rl.engines.vllm_server import (GUARD_MIDDLEWARE, PLUGIN_DIR, SERVER_MODULE, HashRing, Router, VLLMServerEngine, check_config,
                                          parse_prefix_cache, response_generation, server_command, server_environment)
from agent_rl.engines.weight_sync import check_weight_transfer

URLS = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"]


# ------------------------------------------------------------------------------------------------ hashing
def test_ring_is_deterministic_and_spreads_keys():
    ring = HashRing(URLS)
    keys = [f"episode-{i}" for i in range(3000)]
    owners = [ring.node(k) for k in keys]
    assert owners == [HashRing(URLS).node(k) for k in keys]  # the same ring in another process: same owners
    counts = collections.Counter(owners)
    assert set(counts) == set(URLS)
    assert min(counts.values()) > 3000 / 3 * 0.6  # 64 points per node: no node starves


def test_ring_removal_moves_only_the_removed_nodes_keys():
    ring = HashRing(URLS)
    keys = [f"ep{i}" for i in range(2000)]
    before = {k: ring.node(k) for k in keys}
    after = {k: ring.node(k, excluded={URLS[1]}) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == URLS[1] for k in moved)  # only the dead node's keys move
    assert all(after[k] != URLS[1] for k in keys)
    assert ring.node("x", excluded=set(URLS)) is None


def test_ring_refuses_bad_nodes():
    with pytest.raises(ValueError):
        HashRing([])
    with pytest.raises(ValueError):
        HashRing(["a", "a"])


# ------------------------------------------------------------------------------------------------ routing
def test_router_affinity_keeps_an_episode_on_one_replica_and_moves_it_when_dead():
    r = Router(URLS, affinity=True)
    first = r.acquire("ep-7")
    r.release(first)
    for _ in range(5):
        url = r.acquire("ep-7")
        assert url == first
        r.release(url)
    r.mark_dead(first)
    moved = r.acquire("ep-7")
    assert moved != first and moved == HashRing(URLS).node("ep-7", excluded={first})
    r.release(moved)
    for u in URLS:
        r.mark_dead(u)
    with pytest.raises(RuntimeError, match="every vLLM server is down"):
        r.acquire("ep-7")


def test_router_without_affinity_or_episode_picks_the_least_loaded():
    r = Router(URLS, affinity=False)
    got = [r.acquire("same-episode") for _ in range(6)]
    assert collections.Counter(got) == {u: 2 for u in URLS}  # spread by in-flight count, the episode ignored
    assert r.take_in_flight_max() == 6
    for u in got[:5]:
        r.release(u)
    assert r.take_in_flight_max() == 6  # the largest seen since the last call
    assert r.take_in_flight_max() == 1  # now: what is still in flight
    a = Router(URLS, affinity=True)
    assert sorted(a.acquire(None) for _ in range(3)) == URLS  # no episode id: least loaded
    ties = Router(URLS[:2], affinity=False)
    picks = []
    for _ in range(40):  # all idle: a tie, drawn at random (not the first replica every time)
        picks.append(ties.acquire("ep"))
        ties.release(picks[-1])
    assert set(picks) == set(URLS[:2])


def test_router_counts_are_thread_safe():
    r = Router(URLS, affinity=True)

    def work(i: int) -> None:
        for j in range(200):
            r.release(r.acquire(f"e{i}-{j}"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.in_flight == {u: 0 for u in URLS}
    assert 1 <= r.take_in_flight_max() <= 8


# ------------------------------------------------------------------------------------------------ the server
def test_server_command_has_the_runs_options_and_no_secret():
    cmd = server_command("/venv/bin/python", "/models/tiny", 41234, dtype="float32", seed=3, kv_cache_gb=0.5,
                         max_model_len=2048, enforce_eager=True, extra_args=["--max-num-seqs", "32"])
    assert cmd[:3] == ["/venv/bin/python", "-m", SERVER_MODULE]
    joined = " ".join(cmd)
    for part in ("--model /models/tiny", "--host 127.0.0.1", "--port 41234", "--enable-scale-out",
                 "--logprobs-mode processed_logprobs", "--enable-prefix-caching", "--enable-prompt-tokens-details",
                 "--dtype float32", "--seed 3", f"--kv-cache-memory-bytes {2**29}", "--max-model-len 2048",
                 "--enforce-eager"):
        assert part in joined
    assert cmd[-2:] == ["--max-num-seqs", "32"]
    assert "api-key" not in joined
    assert f"--middleware {GUARD_MIDDLEWARE}" in joined  # the run's key on every route
    default = server_command("py", "m", 1)
    assert f"--kv-cache-memory-bytes {2**30}" in " ".join(default) and "--max-model-len" not in default


def test_server_environment_carries_the_key_and_dev_mode():
    env = server_environment("secret-key", base={"PATH": "/bin", "PYTHONPATH": "/repo"})
    assert env == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": "secret-key",
                   "PYTHONPATH": str(PLUGIN_DIR)}  # the guard's folder alone: the trainer's path is not the server's


def test_server_environment_leaves_the_trainers_secrets_out():
    """The servers inherited the trainer's whole environment: the env servers' token and the trackers' keys reached
    a process that needs none of them. They are left out; what vLLM reads itself stays."""
    base = {"PATH": "/bin", "AGENT_RL_SERVER_TOKEN": "t", "WANDB_API_KEY": "w", "MLFLOW_TRACKING_PASSWORD": "p",
            "MLFLOW_TRACKING_TOKEN": "m", "OPENAI_API_KEY": "o", "AWS_SECRET_ACCESS_KEY": "a",
            "GOOGLE_APPLICATION_CREDENTIALS": "/k.json", "HF_TOKEN": "h", "VLLM_API_KEY": "old",
            "CUDA_VISIBLE_DEVICES": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env = server_environment("k", base=base)
    assert env == {"PATH": "/bin", "HF_TOKEN": "h", "VLLM_API_KEY": "k", "CUDA_VISIBLE_DEVICES": "0",
                   "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(PLUGIN_DIR)}


# vLLM 0.32's answer to POST /inference/v1/generate (output_mode=text, logprobs=0), recorded from the real server
# (tiny model, top_logprobs trimmed to the sampled token as it sends them)
RECORDED = {
    "request_id": "generate-tokens-9d8853d955d3c22b", "model": "/tmp/h36/model", "output_mode": "text",
    "usage": {"prompt_tokens": 5, "total_tokens": 11, "completion_tokens": 6,
              "prompt_tokens_details": {"cached_tokens": 3, "created_cache_tokens": None, "multimodal_tokens": None},
              "completion_tokens_details": None},
    "choices": [{"index": 0, "finish_reason": "length", "stop_reason": None,
                 "token_ids": [7241, 28592, 20776, 12641, 7726, 35752], "routed_experts": None,
                 "sampling_mask": None, "weight_versions": [{"version": "3", "start": 0, "end": 2},
                                                            {"version": "4", "start": 2, "end": 6}],
                 "text": " troubleractionsanguages countingyroidubin",
                 "logprobs": {"content": [{"token": "t", "logprob": lp, "bytes": [116], "top_logprobs": []}
                                          for lp in (-2.77532958984375, -2.958773136138916, -2.7966275215148926,
                                                     -1.5, -9999.0, -0.25)]}}]}


def test_response_generation_reads_ids_logprobs_versions_and_cache():
    gen = response_generation(RECORDED)
    assert gen.token_ids == [7241, 28592, 20776, 12641, 7726, 35752]
    assert gen.logprobs[:3] == [-2.77532958984375, -2.958773136138916, -2.7966275215148926]
    assert gen.finish_reason == "length" and gen.cached_tokens == 3
    assert gen.policy_version == 3  # the oldest span: staleness counts the oldest token
    assert gen.text.startswith(" trouble")
    default = dict(RECORDED, choices=[dict(RECORDED["choices"][0], weight_versions=[
        {"version": "default", "start": 0, "end": 6}], finish_reason="stop")])
    g = response_generation(default)
    assert g.policy_version is None and g.finish_reason == "stop"
    with pytest.raises(ValueError, match="without a choice"):
        response_generation({"choices": []})
    broken = dict(RECORDED, choices=[dict(RECORDED["choices"][0], token_ids=[1])])
    with pytest.raises(ValueError, match="1 token ids but 6 log-probs"):
        response_generation(broken)


METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="/tmp/h36/model"} 15.0
vllm:prefix_cache_queries_created{engine="0",model_name="/tmp/h36/model"} 1.796180861304554e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="/tmp/h36/model"} 4.0
vllm:prefix_cache_hits_total{engine="1",model_name="/tmp/h36/model"} 2.0
vllm:num_requests_running{engine="0",model_name="/tmp/h36/model"} 0.0
"""


def test_parse_prefix_cache_sums_the_counters_only():
    assert parse_prefix_cache(METRICS) == (15.0, 6.0)
    assert parse_prefix_cache("") == (0.0, 0.0)


def test_merge_engine_metrics_of_workers():
    parts = [{"engine/weight_version": 3.0, "engine/requests_in_flight_max": 4.0, "time/weight_sync_s": 0.5,
              "engine/prefix_cache_hit_rate": 0.8, "engine/sync_logprob_diff": 1e-6},
             {"engine/weight_version": 2.0, "engine/requests_in_flight_max": 3.0, "time/weight_sync_s": 0.9,
              "engine/prefix_cache_hit_rate": 0.4}]
    assert merge_engine_metrics(parts) == {
        "engine/weight_version": 2.0, "engine/requests_in_flight_max": 7.0, "time/weight_sync_s": 0.9,
        "engine/prefix_cache_hit_rate": pytest.approx(0.6), "engine/sync_logprob_diff": 1e-6}
    assert merge_engine_metrics([{}, {}]) == {}


# ------------------------------------------------------------------------------------------------ config
def _cfg(**engine):
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config),
                                              {"engine": {"name": "vllm_server", **engine}}))
    return cfg


def test_config_checks(tmp_path):
    assert "1 server(s) at http://h:1" in check_config(_cfg(urls=["http://h:1"]))[0]
    with pytest.raises(ValueError, match="engine.urls"):
        check_config(_cfg(server="none"))
    with pytest.raises(ValueError, match="does not exist"):
        check_config(_cfg(server_python=str(tmp_path / "no-python")))
    python = tmp_path / "python"
    python.write_text("")
    assert check_config(_cfg(server_python=str(python))) == []
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            check_config(_cfg(urls=["http://h:1"], weight_transfer="nccl"))


@pytest.mark.parametrize("bad", [dict(server="maybe"), dict(server_replicas=0), dict(weight_transfer="tcp"),
                                 dict(sync_check_tol=0.0), dict(urls=["127.0.0.1:8000"]),
                                 dict(request_timeout_s=0.0)])
def test_engine_config_refuses(bad):
    with pytest.raises(ValueError):
        EngineConfig(**bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU message")
def test_weight_transfer_nccl_is_refused_on_cpu_before_anything_starts():
    with pytest.raises(ValueError, match="needs CUDA devices"):
        VLLMServerEngine(torch.nn.Linear(2, 2), None, server="auto", weight_transfer="ipc")


def test_weight_transfer_refusals_in_order(monkeypatch):
    """nccl/ipc: refused without CUDA; on a CUDA machine (availability patched: the order of the checks is what is
    tested) with the adapter sync, and without vLLM importable by the trainer's Python (the main suite's .venv has
    none: the real import machinery answers)."""
    import importlib.util

    check_weight_transfer("reload", "adapter")  # the file path serves every policy
    with pytest.raises(ValueError, match="valid: reload"):
        check_weight_transfer("tcp")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs CUDA devices"):
        check_weight_transfer("nccl", "adapter")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="lora_sync=adapter: an adapter is loaded from a folder"):
        check_weight_transfer("ipc", "adapter")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ValueError, match="vllm is not importable by this Python"):
            check_weight_transfer("nccl")
        with pytest.raises(ValueError, match="vllm is not importable"):
            check_config(_cfg(urls=["http://h:1"], weight_transfer="ipc"))
    else:
        check_weight_transfer("nccl")


def test_ipc_servers_get_unpickling_and_nothing_else_does():
    base = {"PATH": "/bin"}
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in server_environment("k", base=base)
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in server_environment("k", base=base, lora=True)
    assert server_environment("k", base=base, unpickle=True)["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"


def test_load_config_of_engine_vllm_server():
    from agent_rl.config.compose import load_config
    from agent_rl.config.schema import ConfigError

    cheap = ["env=choose_item", "model=tiny", "env_server.mode=local"]
    cfg = load_config([*cheap, "engine=vllm_server", "engine.urls=[http://127.0.0.1:8000,http://10.0.0.2:8000]"])
    assert cfg.engine.name == "vllm_server" and cfg.engine.server == "auto"
    assert cfg.engine.urls == ["http://127.0.0.1:8000", "http://10.0.0.2:8000"]
    with pytest.raises(ConfigError, match="engine.urls"):
        load_config([*cheap, "engine=vllm_server", "engine.server=none"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([*cheap, "engine=vllm_server", "engine.server_python=/no/such/python"])


def test_lora_adapter_sync_args_environment_and_refusals():
    """``engine.lora_sync=adapter``: the server's LoRA arguments (the smallest rank vLLM accepts that holds the
    adapter), runtime adapter loading in its environment, and the configs refused at load with the reason."""
    from agent_rl.config.compose import load_config
    from agent_rl.config.schema import ConfigError
    from agent_rl.engines.vllm_server import lora_server_args

    assert lora_server_args(8) == ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"]
    assert lora_server_args(5)[-1] == "8" and lora_server_args(1)[-1] == "1" and lora_server_args(300)[-1] == "320"
    for bad in (0, 513):
        with pytest.raises(ValueError, match="vLLM serves LoRA ranks"):
            lora_server_args(bad)
    env = server_environment("k", base={}, lora=True)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in server_environment("k", base={})
    with pytest.raises(ValueError, match="lora_sync"):
        EngineConfig(lora_sync="delta")
    cheap = ["env=choose_item", "model=tiny", "env_server.mode=local", "engine=vllm_server",
             "engine.urls=[http://127.0.0.1:8000]", "engine.lora_sync=adapter"]
    with pytest.raises(ConfigError, match="model.lora.rank=0"):
        load_config(cheap)
    with pytest.raises(ConfigError, match="trainer.backend=ray"):
        load_config([*cheap, "model.lora.rank=8", "trainer.backend=ray"])
    with pytest.raises(ConfigError, match="vLLM serves LoRA ranks"):
        load_config([*cheap, "model.lora.rank=1024"])
    cfg = load_config([*cheap, "model.lora.rank=8"])
    assert cfg.engine.lora_sync == "adapter"
    with pytest.raises(ValueError, match="no LoRA adapter"):
        VLLMServerEngine(torch.nn.Linear(2, 2), None, server="auto", lora_sync="adapter")


def test_cpu_prefill_limits_and_the_server_flags():
    """On vLLM's CPU build a seeded prompt's prefill must never be split (``cpu_prefill_limits``): chunked prefill
    off and a step budget that holds the longest sequence, at least vLLM's CPU floor of 4096; the server gets them
    as flags (before the user's ``server_args``, which may override them)."""
    from types import SimpleNamespace

    from agent_rl.engines.vllm import cpu_prefill_limits

    smol = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=8192))
    assert cpu_prefill_limits(smol, 0) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    assert cpu_prefill_limits(smol, 2048)["max_num_batched_tokens"] == 4096
    assert cpu_prefill_limits(smol, 16384)["max_num_batched_tokens"] == 16384
    assert cpu_prefill_limits(torch.nn.Linear(2, 2), 0)["max_num_batched_tokens"] == 4096
    cmd = server_command("py", "m", 1, prefill_limits=cpu_prefill_limits(smol, 0), extra_args=["--x"])
    joined = " ".join(cmd)
    assert "--no-enable-chunked-prefill --max-num-batched-tokens 8192 --x" in joined
    assert "chunked" not in " ".join(server_command("py", "m", 1))


def test_http_errors_carry_the_log_tail_of_a_server_the_engine_started_for_5xx_only(tmp_path):
    """A 5xx of a server the engine started carries its log's last lines (vLLM's 500 says the cause is in its log); a
    4xx, or a server started elsewhere, carries status and body only."""
    import httpx

    from agent_rl.engines.vllm_server import ServerProcess

    log = tmp_path / "server.log"
    log.write_text("\n".join(f"line {i}" for i in range(40)) + "\nRuntimeError: CPU Generator does not use offset\n")
    eng = VLLMServerEngine.__new__(VLLMServerEngine)  # the error builder alone: no server is started
    eng.servers = [ServerProcess(["python"], {}, "http://127.0.0.1:1", log)]
    err = str(eng._http_error("http://127.0.0.1:1", "/inference/v1/generate", httpx.Response(500, text="boom")))
    assert err.startswith("vllm server http://127.0.0.1:1/inference/v1/generate: HTTP 500: boom\n--- last 30 lines")
    # 41 lines: the last 30 are lines 11..39 and the error
    assert "CPU Generator does not use offset" in err and "\nline 11\n" in err and "\nline 10\n" not in err
    assert str(eng._http_error("http://127.0.0.1:1", "/pause", httpx.Response(400, text="bad mode"))) == \
        "vllm server http://127.0.0.1:1/pause: HTTP 400: bad mode"
    assert str(eng._http_error("http://10.0.0.2:8000", "/x", httpx.Response(503, text="down"))) == \
        "vllm server http://10.0.0.2:8000/x: HTTP 503: down"
