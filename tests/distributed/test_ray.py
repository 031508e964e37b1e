"""Ray backend: data-parallel learner ranks (gloo + torch DDP) and the ``trainer.backend=ray`` loop, on a small
local Ray cluster (``ray.init(num_cpus=2)``, shut down after the module). Ray is a dependency of ``.[all]``."""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest
import torch

import ray  # installed by scripts/setup.sh's .[all]: absent is a broken install, not a skip

from agent_rl.distributed.actors import LearnerRank, LearnerSpec  # noqa: E402
from agent_rl.distributed.data_parallel import shard_batch, shard_indices, unshard_rows  # noqa: E402
from agent_rl.engines import get_engine  # noqa: E402
from agent_rl.learner import AlgoConfig, Learner, OptimConfig  # noqa: E402
from agent_rl.learner.config import CreditConfig, ModelConfig  # noqa: E402
from agent_rl.logging import read_metrics  # noqa: E402
from agent_rl.models import load_policy  # noqa: E402
from agent_rl.rollout import build_rollout_batch  # noqa: E402
from agent_rl.types import Episode, Task, Turn  # noqa: E402

pytestmark = pytest.mark.slow  # Ray actors on a local cluster (fast tier: pytest -m 'not slow')


def _batch(model, tok, groups: int = 4, seed: int = 0):
    """A TGRL-shaped batch of ``groups`` groups (1 low + 3 high episodes, 1-2 turns each, rewards differ within a
    group and response lengths differ across groups, so the ranks' token counts differ)."""
    engine = get_engine("hf", model, tok)
    episodes = []
    for g in range(groups):
        task = Task(env_id="x", options={"i": g}, group_id=g)
        for k in range(4):
            temp = 0.3 if k == 0 else 1.2
            ep = Episode(task=task, temperature=temp, is_high=k > 0, reward=float((g + k) % 2), won=(g + k) % 2 == 1)
            for t in range(1 + (g + k) % 2):
                text = f"task {g} turn {t}: pick item {k}" + " please" * g
                prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
                gen = engine.generate([list(prompt)], [temp], max_new_tokens=3 + 2 * g, seed=seed + 31 * g + k)[0]
                ep.turns.append(Turn(prompt_ids=list(prompt), response_ids=gen.token_ids,
                                     response_logprobs=gen.logprobs, action=gen.text))
            episodes.append(ep)
    return build_rollout_batch(episodes, pad_token_id=tok.pad_token_id, mode="turn")


def test_shard_batch_keeps_whole_groups_and_episode_tensors():
    model, tok = load_policy(ModelConfig(name="tiny"))
    batch = _batch(model, tok, groups=3)
    shards = shard_batch(batch, 2)
    assert [sorted(set(s.group_index.tolist())) for s in shards] == [[0, 2], [1]]
    assert sum(s.num_rows for s in shards) == batch.num_rows
    for s in shards:
        e = s.episode_rewards.shape[0]
        assert s.episode_index.max().item() == e - 1 and s.extras["episode_won"].shape == (e,)
        # each row's reward is its episode's reward, and the episode's group is the row's group
        assert torch.equal(s.rewards, s.episode_rewards[s.episode_index])
        assert torch.equal(s.group_index, s.episode_group_index[s.episode_index])
        assert s.extras["obs_key"].shape == (s.num_rows,)
    # the ranks' per-row numbers go back in the batch's row order (the episode store's token stats)
    split = shard_indices(batch, 2)
    back = unshard_rows([s.input_ids.float() for s in shards], [rows for rows, _ in split], batch.num_rows)
    assert torch.equal(back, batch.input_ids.float())
    assert torch.equal(unshard_rows([s.rewards for s in shards[::-1]], [rows for rows, _ in split[::-1]],
                                    batch.num_rows), batch.rewards)
    with pytest.raises(ValueError, match="cannot be split"):
        shard_batch(batch, 4)


@pytest.mark.timeout(900)  # a hang ceiling, far above the run on a busy machine
def test_ray_ddp_matches_single_learner(ray_cluster):
    """2 learner actors (gloo process group, torch DDP, each on half the groups) make the same update as one learner
    on the whole batch: every parameter equal within 1e-5 after one step. token_mean over ranks whose shards hold
    different token counts, so a per-rank denominator would fail this; grad clip on, 2 micro-batches per rank."""
    algo = AlgoConfig(name="tgrl", micro_batch_size=3, warmup_steps=0)
    # lr 1e-4, eps 1e-6: AdamW's first step is ~lr * g / (|g| + eps), so a float-summation-order difference in a
    # gradient entry of size ~eps would move a weight by up to ~lr / 4: keep that well under the 1e-5 check
    optim = OptimConfig(lr=1e-4, eps=1e-6, max_grad_norm=1.0, warmup=0)
    credit = CreditConfig(name="js")  # TGRL's own credit (its preset's)
    spec = LearnerSpec(model=ModelConfig(name="tiny"), algo=algo, optim=optim, credit=credit, device="cpu", seed=0)
    Rank = ray.remote(num_cpus=1)(LearnerRank)
    ranks = [Rank.remote(r, 2, spec) for r in range(2)]
    addr, port = ray.get(ranks[0].address.remote())
    assert ray.get([r.setup.remote(addr, port) for r in ranks], timeout=240) == ["gloo", "gloo"]
    init = ray.get(ranks[0].get_weights.remote())

    model, tok = load_policy(ModelConfig(name="tiny"))
    model.load_state_dict(init)
    batch = _batch(copy.deepcopy(model), tok, groups=4)
    single = Learner(model, tok, algo, optim, credit=credit, device="cpu", seed=0)
    ref = single.update(batch, step=1, total_steps=10)

    shards = shard_batch(batch, 2)
    assert shards[0].response_mask.sum() != shards[1].response_mask.sum()  # unequal token counts per rank
    metrics = ray.get([r.update.remote(s, 1, 10) for r, s in zip(ranks, shards)], timeout=240)
    w0, w1 = ray.get([r.get_weights.remote() for r in ranks])
    moved = 0.0
    for name, p in model.state_dict().items():
        torch.testing.assert_close(w0[name], p, atol=1e-5, rtol=0, msg=name)
        torch.testing.assert_close(w1[name], w0[name], atol=0, rtol=0, msg=name)  # ranks in lockstep
        moved = max(moved, float((p - init[name]).abs().max()))
    assert moved > 5e-5  # the step did move the weights
    # the clipped global grad norm is the single learner's, and the DDP-averaged pg_loss is the whole batch's
    assert metrics[0]["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-4)
    assert sum(m["actor/pg_loss"] for m in metrics) / 2 == pytest.approx(ref["actor/pg_loss"], rel=1e-4, abs=1e-6)
    ray.get([r.shutdown.remote() for r in ranks])
    for r in ranks:
        ray.kill(r)


def _ready_actor(name: str, deadline: float):
    """The actor ``name`` once it has answered a call (a rollout worker: its weights are loaded), or None."""
    while time.monotonic() < deadline:
        try:
            actor = ray.get_actor(name)
        except ValueError:
            time.sleep(0.1)
            continue
        ray.get(actor.pid.remote())
        return actor
    return None


def _kill_during_rollout(killed: list[str], timeout_s: float = 300.0) -> None:
    """Once rollout workers 0 and 1 are loaded (step 1's rollout starts): kill env replica 0 one second later
    (sessions it holds are lost), then rollout worker 0 (its group is in flight or about to be)."""
    deadline = time.monotonic() + timeout_s
    worker0 = _ready_actor("agent_rl-rollout-0-0", deadline)
    if _ready_actor("agent_rl-rollout-1-0", deadline) is None or worker0 is None:
        return
    time.sleep(1.0)
    ray.kill(ray.get_actor("agent_rl-env-0"), no_restart=True)
    killed.append("agent_rl-env-0")
    ray.kill(worker0, no_restart=True)
    killed.append("agent_rl-rollout-0-0")


@pytest.mark.timeout(900)
def test_ray_backend_two_steps_kill_a_worker_and_a_replica_then_resume_with_one_learner(ray_cluster, tmp_path):
    """The acceptance command (2 learner ranks, 2 rollout workers, 2 env-server replicas, 2 TGRL steps on
    ChooseItem) on the module's 2-CPU cluster: rollout worker 0 and env replica 0 are killed during the run; the
    worker is replaced and its group re-run, the replica's episodes re-run on the other replica (no group lost,
    none dropped); metrics.jsonl has steps 1-2, checkpoints/step_2 exists, step 2 samples with weight version 1; then
    the run resumes with 1 learner and 1 worker for step 3."""
    from agent_rl.train import main

    out = tmp_path / "run"
    common = ["env=choose_item", "model=tiny", "algo=tgrl", "trainer.backend=ray", "trainer.tasks_per_step=2",
              f"trainer.output_dir={out}", "env_server.replicas=2", "env_server.replica_cpus=0.5",
              "trainer.learner_cpus=0.25", "rollout.worker_cpus=0.25", "trainer.progress=false", "trainer.loggers=[jsonl]",
              "engine.max_new_tokens=12"]
    killed: list[str] = []
    killer = threading.Thread(target=_kill_during_rollout, args=(killed,), daemon=True)
    killer.start()
    main(common + ["trainer.num_learners=2", "rollout.num_workers=2", "trainer.total_steps=2"])
    killer.join(timeout=5)
    assert sorted(killed) == ["agent_rl-env-0", "agent_rl-rollout-0-0"]
    records = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in records] == [1, 2]
    assert sum(r["rollout/worker_restarts"] for r in records) >= 1
    assert all(r["rollout/dropped_groups"] == 0 for r in records)
    assert [r["rollout/weight_version"] for r in records] == [0.0, 1.0]
    assert (out / "checkpoints" / "step_2" / "model.safetensors").is_file()
    from agent_rl.episodes import load_episodes  # the episode store, with the per-token numbers of both ranks

    stored = load_episodes(out, 2)
    assert len(stored) == 8 and len({e["task"]["group_id"] for e in stored}) == 2
    assert all(t["learner_logprob"] is not None and len(t["learner_logprob"]) == len(t["token_ids"])
               for e in stored for t in e["turns"])
    versions = [json.loads(line) for line in (out / "weight_versions.jsonl").read_text().splitlines()]
    for step in (1, 2):  # no group lost: both groups of the step, G episodes each, were played and trained on
        per_group = {}
        for v in versions:
            if v["step"] == step:
                per_group[v["group"]] = per_group.get(v["group"], 0) + 1
        assert len(per_group) == 2 and len(set(per_group.values())) == 1, per_group
        assert records[step - 1]["batch/rows"] >= sum(per_group.values())  # >= 1 row per episode
    # resume the 2-rank checkpoint with one rank and one worker
    main(common + ["trainer.num_learners=1", "rollout.num_workers=1", "trainer.total_steps=3", "trainer.resume=auto"])
    records = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[-1]["rollout/weight_version"] == 2.0
    assert ray.is_initialized()  # the module's cluster was reused, not shut down by the trainer


@pytest.mark.timeout(600)
def test_ray_backend_with_one_learner_and_one_worker_matches_local(ray_cluster, tmp_path):
    """``trainer.backend=ray`` with N = M = 1 gives the local backend's numbers for the same seed: 2 TGRL steps on
    ChooseItem, every logged metric of both runs (timings aside) within 1e-5 + 1e-4 relative, and the step-2
    checkpoints' parameters within 1e-5 (``scripts/compare_runs.py``). Rows sample with per-row keys (group, slot,
    turn), so the rollout worker's batches need not be the local engine's; the learner seeds as the local one."""
    import subprocess
    import sys
    from pathlib import Path

    from agent_rl.train import main

    common = ["env=choose_item", "model=tiny", "algo=tgrl", "trainer.total_steps=2", "trainer.tasks_per_step=2",
              "trainer.progress=false", "trainer.loggers=[jsonl]", "engine.max_new_tokens=12",
              "env_server.mode=local", "trainer.save_episodes=none"]
    main(common + [f"trainer.output_dir={tmp_path / 'local'}"])
    main(common + [f"trainer.output_dir={tmp_path / 'ray'}", "trainer.backend=ray", "trainer.num_learners=1",
                   "rollout.num_workers=1", "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"])
    script = Path(__file__).resolve().parents[2] / "scripts" / "compare_runs.py"
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "local"), str(tmp_path / "ray"),
                          "--checkpoint", "step_2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "metrics: " in run.stdout and "checkpoint step_2: 21 tensors compared" in run.stdout
    local, ray_ = (read_metrics(tmp_path / name / "metrics.jsonl", "train") for name in ("local", "ray"))
    assert [r["step"] for r in ray_] == [1, 2] and all(r["batch/rows"] > 0 for r in ray_)
    for a, b in zip(local, ray_):  # the Ray backend logs every metric the local one does (and its own extras)
        assert set(a) <= set(b), sorted(set(a) - set(b))


@pytest.mark.timeout(600)
def test_ray_backend_writes_the_local_artefacts_eval_panel_and_episode_store(ray_cluster, tmp_path):
    """The run artefacts of ``trainer.backend=ray`` are the local backend's, from the same code: the in-training eval
    panel (run on rollout worker 0 with the current weights; greedy, so equal to local at steps 0, 1 and 2), the
    episode store ``episodes/step_N.jsonl`` (per-token learner numbers gathered from the ranks in the batch's row
    order), ``curves.png`` and ``summary.md``. Math (choose_item has no panel), tiny model, 2 GRPO steps."""
    from agent_rl.episodes import load_episodes
    from agent_rl.train import main

    common = ["env=math", "model=tiny", "algo=grpo", "algo.group_size=2", "trainer.total_steps=2",
              "trainer.tasks_per_step=2", "engine.max_new_tokens=8", "env_server.mode=local", "trainer.progress=false",
              "trainer.loggers=[jsonl]", "trainer.eval_every=1", "trainer.eval_panel=amc23", "trainer.eval_tasks=2",
              "trainer.save_episodes=all"]
    main(common + [f"trainer.output_dir={tmp_path / 'local'}"])
    main(common + [f"trainer.output_dir={tmp_path / 'ray'}", "trainer.backend=ray", "trainer.num_learners=1",
                   "rollout.num_workers=1", "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"])
    local, ray_ = (read_metrics(tmp_path / name / "metrics.jsonl", "eval") for name in ("local", "ray"))
    assert [r["step"] for r in local] == [r["step"] for r in ray_] == [0, 1, 2]
    keys = sorted(k for k in local[0] if k.startswith("eval/math_amc23/"))
    assert "eval/math_amc23/success" in keys and "eval/math_amc23/mean_turns" in keys
    for a, b in zip(local, ray_):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, a["step"]
    for step in (0, 1, 2):  # the panel's episodes: same tasks, same greedy answers
        res = [json.loads((tmp_path / name / "eval" / f"step_{step}" / "math_amc23.json").read_text())
               for name in ("local", "ray")]
        assert res[0]["num_tasks"] == res[1]["num_tasks"] == 2
        assert res[0]["episodes"] == res[1]["episodes"]  # tasks, greedy actions, rewards
        assert all(ep["actions"] and ep["actions"][0] for ep in res[1]["episodes"])  # the policy did answer
    for step in (1, 2):  # the episode store: every episode, the same tokens and learner per-token numbers
        eps = [load_episodes(tmp_path / name, step) for name in ("local", "ray")]
        assert len(eps[0]) == len(eps[1]) == 4
        for a, b in zip(*eps):
            assert (a["id"], a["task"], a["reward"]) == (b["id"], b["task"], b["reward"])
            for ta, tb in zip(a["turns"], b["turns"]):
                assert ta["token_ids"] == tb["token_ids"] and ta["trained"] == tb["trained"]
                for name in ("learner_logprob", "entropy", "advantage"):
                    assert ta[name] == pytest.approx(tb[name], abs=1e-5), name
    run = tmp_path / "ray"
    assert (run / "curves.png").stat().st_size > 5000
    assert "eval math_amc23" in (run / "summary.md").read_text()


@pytest.mark.timeout(600)
def test_ray_dapo_refills_filtered_groups_as_the_local_backend_does(ray_cluster, tmp_path):
    """DAPO's dynamic sampling on ``trainer.backend=ray`` (N = M = 1) draws new tasks for the groups it filters, in
    the same extra rounds and with the same seeds as the local backend (one ``agent_rl.rollout.collect_groups`` for
    both): the same rounds, filtered counts and metrics, the same step-2 parameters. On ChooseItem with the tiny
    model most groups are all-equal (every episode loses), so step 1 needs extra rounds."""
    import subprocess
    import sys
    from pathlib import Path

    from agent_rl.train import main

    common = ["env=choose_item", "model=tiny", "algo=dapo", "trainer.total_steps=2", "trainer.tasks_per_step=2",
              "trainer.progress=false", "trainer.loggers=[jsonl]", "engine.max_new_tokens=12",
              "env_server.mode=local", "trainer.save_episodes=none"]
    main(common + [f"trainer.output_dir={tmp_path / 'local'}"])
    main(common + [f"trainer.output_dir={tmp_path / 'ray'}", "trainer.backend=ray", "trainer.num_learners=1",
                   "rollout.num_workers=1", "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"])
    local, ray_ = (read_metrics(tmp_path / name / "metrics.jsonl", "train") for name in ("local", "ray"))
    assert sum(r["rollout/extra_rounds"] for r in local) > 0  # the refill ran (else this test shows nothing)
    for a, b in zip(local, ray_):
        for key in ("rollout/extra_rounds", "rollout/filtered_groups", "rollout/episodes", "batch/rows"):
            assert a[key] == b[key], (a["step"], key)
    # every metric within 1e-5 + 1e-4 relative; parameters within 1e-4: the rank and the local learner sum in another
    # order (other thread counts), and AdamW's first steps move a weight whose gradient is near eps by up to ~lr / 4
    # (lr 1e-3 here) for a float-rounding difference of that gradient (see test_ray_ddp_matches_single_learner)
    script = Path(__file__).resolve().parents[2] / "scripts" / "compare_runs.py"
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "local"), str(tmp_path / "ray"),
                          "--checkpoint", "step_2", "--param-atol", "1e-4"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
