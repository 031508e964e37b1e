"""Checkpoint round trip: bit-identical weights, optimizer/scheduler state and RNG streams; atomic layout."""

from __future__ import annotations

import copy
import os
import random

import numpy as np
import torch

from agent_rl.learner import (AlgoConfig, Learner, OptimConfig, latest_checkpoint, load_checkpoint,
                              recover_checkpoints, save_checkpoint)
from learner_helpers import sample_batch


def _state_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_checkpoint_round_trip(tiny, tmp_path):
    model, tok = tiny
    fresh = copy.deepcopy(model)
    batch, _ = sample_batch(model, tok, max_new_tokens=4)
    algo = AlgoConfig(name="ppo", adv_estimator="gae")  # has a value head too
    learner = Learner(model, tok, algo, OptimConfig(lr=1e-3, warmup=3))
    learner.update(batch, step=1, total_steps=4)
    out = save_checkpoint(tmp_path / "checkpoints" / "step_1", model, tok, learner, {"step": 1, "data_pos": 7})
    expected_rand = (torch.rand(3), random.random(), np.random.rand())

    learner2 = Learner(fresh, tok, algo, OptimConfig(lr=1e-3, warmup=3))
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))
    extra = load_checkpoint(out, fresh, learner2)
    assert extra == {"step": 1, "data_pos": 7}
    for (n, p), q in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(p, q), n
    assert _state_equal(learner.optimizer.state_dict(), learner2.optimizer.state_dict())
    assert learner.scheduler.state_dict() == learner2.scheduler.state_dict()
    assert torch.equal(learner.value_head.weight, learner2.value_head.weight)
    assert torch.equal(learner.generator.get_state(), learner2.generator.get_state())
    got_rand = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got_rand[0], expected_rand[0]) and got_rand[1:] == expected_rand[1:]
    # the next step is identical from the original and the restored learner
    m1 = learner.update(batch, step=2, total_steps=4)
    m2 = learner2.update(batch, step=2, total_steps=4)
    assert m1["actor/pg_loss"] == m2["actor/pg_loss"] and m1["actor/lr"] == m2["actor/lr"]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))


def test_latest_checkpoint_and_overwrite(tiny, tmp_path):
    model, tok = tiny
    assert latest_checkpoint(tmp_path) is None
    for step in (2, 10, 9):
        save_checkpoint(tmp_path / "checkpoints" / f"step_{step}", model, None, None, {"step": step})
    (tmp_path / "checkpoints" / ".step_11.tmp-x").mkdir()  # an interrupted save is ignored
    (tmp_path / "checkpoints" / "step_12").mkdir()  # a folder without extra.json is not a checkpoint
    assert latest_checkpoint(tmp_path).name == "step_10"
    save_checkpoint(tmp_path / "checkpoints" / "step_10", model, None, None, {"step": 10, "again": True})
    assert load_checkpoint(tmp_path / "checkpoints" / "step_10", model)["again"] is True
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".step_10")) == []


def test_recover_after_a_crash_between_the_renames_of_a_replace(tiny, tmp_path):
    # save_checkpoint replacing step_3 moves it to .step_3.old-PID, then renames the new one in; a SIGKILL between
    # the two renames leaves no step_3: recover_checkpoints puts the complete old one back and drops temp folders.
    model, _ = tiny
    folder = tmp_path / "checkpoints"
    save_checkpoint(folder / "step_2", model, None, None, {"step": 2})
    save_checkpoint(folder / "step_3", model, None, None, {"step": 3})
    os.replace(folder / "step_3", folder / ".step_3.old-123")
    (folder / ".step_3.tmp-abc").mkdir()
    (folder / ".step_3.tmp-abc" / "model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(tmp_path).name == "step_2"  # without recovery the newest complete one is missed
    done = recover_checkpoints(folder)
    assert done == ["restored step_3 from .step_3.old-123", "deleted .step_3.tmp-abc (interrupted save)"]
    assert latest_checkpoint(tmp_path).name == "step_3"
    assert load_checkpoint(folder / "step_3", model)["step"] == 3
    assert sorted(p.name for p in folder.iterdir()) == ["step_2", "step_3"]
    assert recover_checkpoints(folder) == [] and recover_checkpoints(tmp_path / "missing") == []
