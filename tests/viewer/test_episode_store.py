"""The episode store: settings, group sampling, token alignment (per-turn and full-trajectory rows), round trip,
append and live-reading rules, and values equal to the learner's own tensors on a tiny training run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agent_rl.config.compose import config_dict, load_config

from agent_rl.config.schema import ConfigError

from agent_rl.resume import compare_for_resume
from agent_rl.episodes import (load_episodes, list_steps, parse_episode_id, parse_save_episodes, read_step_file,
                               select_episodes, step_path, token_texts, write_episodes)
from agent_rl.rollout.batch import build_rollout_batch
from viewer_helpers import ByteTokenizer, make_episode, read_jsonl

TOK = ByteTokenizer()


def test_save_episodes_setting():
    assert parse_save_episodes("none") == 0 and parse_save_episodes("all") is None
    assert parse_save_episodes("8") == 8 and parse_save_episodes(3) == 3
    with pytest.raises(ValueError, match="none, all, or a number"):
        parse_save_episodes("some")
    assert load_config(["trainer.save_episodes=all"]).trainer.save_episodes == "all"
    assert load_config([]).trainer.save_episodes == "8"  # the default: two TGRL groups of 4 per step
    with pytest.raises(ConfigError, match="none, all, or a number"):
        load_config(["trainer.save_episodes=sometimes"])
    # what is stored does not change training: a resumed run may change it
    lines = compare_for_resume(config_dict(load_config([])), load_config(["trainer.save_episodes=all"]))
    assert lines == ["resume: trainer.save_episodes: '8' -> 'all' (may change)"]


def _groups(n_groups: int, g: int) -> list:
    return [make_episode(TOK, gid, is_high=slot > 0, responses=["a"], observations=["o"])
            for gid in range(n_groups) for slot in range(g)]


def test_select_whole_groups():
    eps = _groups(3, 4)  # 3 groups x G=4
    assert select_episodes(eps, None) == list(range(12))
    assert select_episodes(eps, 0) == []
    five = select_episodes(eps, 5, seed=1, step=3)
    # 5 episodes -> ceil(5/4) = 2 whole groups = 8 episodes
    chosen = sorted({i // 4 for i in five})
    assert len(chosen) == 2 and five == [i for g in chosen for i in range(4 * g, 4 * g + 4)]
    assert five == select_episodes(eps, 5, seed=1, step=3)  # deterministic per (seed, step)
    assert {tuple(select_episodes(eps, 4, seed=0, step=s)) for s in range(20)} == {(0, 1, 2, 3), (4, 5, 6, 7),
                                                                                    (8, 9, 10, 11)}
    assert select_episodes(eps, 100) == list(range(12))


def test_token_texts_join_to_the_decoded_text():
    ids = TOK.encode("é<x>")  # "é" is two bytes: the first byte alone is not a character
    pieces = token_texts(TOK, ids)
    assert pieces == ["", "é", "<", "x", ">"] and "".join(pieces) == TOK.decode(ids)
    assert token_texts(TOK, TOK.encode("ab")) == ["a", "b"]
    assert token_texts(TOK, []) == []


def _stats_like(batch) -> dict[str, torch.Tensor]:
    """token stats whose value at (row r, column c) is r * 1000 + c (+ a per-quantity offset): exact in float32."""
    b, length = batch.input_ids.shape
    base = torch.arange(b)[:, None] * 1000.0 + torch.arange(length)[None, :]
    return {"advantages": base.clone(), "old_logprobs": -base, "entropy": base + 0.5, "js": base + 0.25,
            "loss_mask": (torch.arange(length)[None, :] % 2 == 0).float().expand(b, length).clone()}


@pytest.mark.parametrize("mode", ["turn", "trajectory"])
def test_token_values_come_from_each_turns_row_and_columns(tmp_path, mode):
    traj = mode == "trajectory"
    eps = [make_episode(TOK, 0, is_high=False, responses=["ab", "cde"], observations=["X", "Y"], trajectory=traj),
           make_episode(TOK, 0, is_high=True, responses=["f", "gh", "i"], observations=["P", "Q", "R"], won=True,
                        trajectory=traj)]
    batch = build_rollout_batch(eps, pad_token_id=0, mode=mode)
    stats = _stats_like(batch)
    write_episodes(tmp_path, 3, eps, tokenizer=TOK, batch=batch, token_stats=stats)
    recs = load_episodes(tmp_path, 3)
    assert [r["id"] for r in recs] == ["3-0", "3-1"] and [r["temp_label"] for r in recs] == ["T0", "T1"]
    row = 0
    for e, (ep, rec) in enumerate(zip(eps, recs)):
        for k, (turn, stored) in enumerate(zip(ep.turns, rec["turns"])):
            # per-turn rows come in episode then turn order; a full-trajectory row is the episode's only row and
            # turn k's response starts after its prompt (the conversation so far)
            r = e if traj else row + k
            cols = range(len(turn.prompt_ids), len(turn.prompt_ids) + len(turn.response_ids))
            assert stored["advantage"] == [r * 1000.0 + c for c in cols]
            assert stored["learner_logprob"] == [-(r * 1000.0 + c) for c in cols]
            assert stored["js"] == [r * 1000.0 + c + 0.25 for c in cols]
            assert stored["trained"] == [int(c % 2 == 0) for c in cols]
            assert stored["token_ids"] == turn.response_ids and stored["action"] == turn.action
            assert stored["logprob"] == pytest.approx([-0.1 * (j + 1) for j in range(len(turn.response_ids))])
            assert stored["observation"] == turn.observation and stored["prompt_tokens"] == len(turn.prompt_ids)
            assert stored["info"] == {"won": ep.won}  # scalar info only (the list is left out)
        row += len(ep.turns)
    assert recs[1]["won"] and recs[1]["reward"] == 1.0 and recs[0]["turns"][0]["invalid"]


def test_misaligned_batch_is_an_error(tmp_path):
    eps = [make_episode(TOK, 0, is_high=False, responses=["ab"], observations=["x"])]
    other = [make_episode(TOK, 0, is_high=False, responses=["zz"], observations=["x"])]
    batch = build_rollout_batch(other, pad_token_id=0)
    with pytest.raises(ValueError, match="does not hold the response"):
        write_episodes(tmp_path, 1, eps, tokenizer=TOK, batch=batch, token_stats=_stats_like(batch))
    with pytest.raises(ValueError, match="need the batch"):
        write_episodes(tmp_path, 1, eps, tokenizer=TOK, token_stats=_stats_like(batch))


def test_round_trip_append_and_live_files(tmp_path):
    eps = [make_episode(TOK, g, is_high=g == 1, responses=["go", "stop"], observations=["o1", "o2"], won=g == 0)
           for g in range(2)]
    path = write_episodes(tmp_path, 1, eps, tokenizer=TOK, source="eval/valid_seen", append=True)
    assert path == step_path(tmp_path, 1) == tmp_path / "episodes" / "step_000001.jsonl"
    write_episodes(tmp_path, 1, eps[:1], tokenizer=TOK, source="eval/valid_unseen", append=True)
    recs = load_episodes(tmp_path, 1)
    assert [r["id"] for r in recs] == ["1-0", "1-1", "1-2"]  # ids continue after the lines already there
    assert [r["source"] for r in recs] == ["eval/valid_seen"] * 2 + ["eval/valid_unseen"]
    assert recs == read_jsonl(path)  # plain JSONL, readable by any tool
    assert recs[0]["turns"][0]["advantage"] is None and recs[0]["advantage_mean"] is None  # eval: no learner numbers
    assert recs[0]["prompt"] == "task: pick" and recs[0]["turns"][1]["response"] == "stop"
    # training replaces a step's file (a resumed run re-plays the step)
    write_episodes(tmp_path, 1, eps[1:], tokenizer=TOK)
    assert [r["id"] for r in load_episodes(tmp_path, 1)] == ["1-0"] and not list(tmp_path.glob("episodes/*.tmp"))
    # a line being appended (no newline yet) is not read; a broken line is skipped with a warning
    write_episodes(tmp_path, 4, eps, tokenizer=TOK)
    with step_path(tmp_path, 4).open("a") as f:
        f.write('{"id": "4-2", "half": ')
    assert [r["id"] for r in read_step_file(step_path(tmp_path, 4))] == ["4-0", "4-1"]
    assert list_steps(tmp_path) == [1, 4] and len(load_episodes(tmp_path)) == 3
    with step_path(tmp_path, 5).open("w") as f:
        f.write("not json\n" + json.dumps({"id": "5-0"}) + "\n")
    with pytest.warns(UserWarning, match="not a JSON line"):
        assert read_step_file(step_path(tmp_path, 5)) == [{"id": "5-0"}]
    with pytest.raises(FileNotFoundError):
        load_episodes(tmp_path / "missing")
    assert load_episodes(tmp_path, 99) == []
    assert parse_episode_id("12-3") == (12, 3)
    with pytest.raises(ValueError):
        parse_episode_id("../etc")


def test_long_texts_are_cut_and_flagged(tmp_path, monkeypatch):
    import agent_rl.episodes as store

    monkeypatch.setattr(store, "MAX_TEXT_CHARS", 10)
    eps = [make_episode(TOK, 0, is_high=False, responses=["ok"], observations=["x" * 25])]
    (rec,) = store.episode_records(eps, step=1, tokenizer=TOK)
    turn = rec["turns"][0]
    assert turn["observation"].startswith("x" * 10 + "\n... [15 characters cut") and turn["observation_cut"]


# ------------------------------------------------------------------------------------------------ tiny run
@pytest.mark.slow  # tiny_run: a real training run
@pytest.mark.parametrize("step", [1, 2])
def test_tiny_run_stores_every_episode_with_the_learners_numbers(tiny_run, step):
    """``trainer.save_episodes=all``: every episode of each step, and each stored per-token number equals the
    learner's tensor at that token (rows in episode/turn order, columns after the turn's prompt)."""
    recs = load_episodes(tiny_run["dir"], step)
    cap = tiny_run["steps"][step]
    eps, batch, stats = cap["episodes"], cap["batch"], cap["token_stats"]
    assert len(recs) == len(eps) == tiny_run["metrics"][step]["rollout/episodes"] == 8  # 2 groups x G=4
    assert list_steps(tiny_run["dir"]) == [1, 2] and {r["step"] for r in recs} == {step}
    assert [r["temp_label"] for r in recs] == ["T0", "T1", "T1", "T1"] * 2  # TGRL after warm-up: 1 x T0 + 3 x T1
    assert [r["group"] for r in recs] == [0] * 4 + [1] * 4
    row, n_tokens = 0, 0
    for e, (ep, rec) in enumerate(zip(eps, recs)):
        assert rec["reward"] == ep.reward and rec["won"] == ep.won and rec["temperature"] == ep.temperature
        assert rec["num_turns"] == len(ep.turns)
        for turn, stored in zip(ep.turns, rec["turns"]):
            sl = slice(len(turn.prompt_ids), len(turn.prompt_ids) + len(turn.response_ids))
            assert batch.input_ids[row, sl].tolist() == stored["token_ids"] == turn.response_ids
            for field, key in (("advantage", "advantages"), ("learner_logprob", "old_logprobs"),
                               ("entropy", "entropy"), ("js", "js")):
                # the stored decimals read back to the very float32 values of the learner
                assert np.array_equal(np.asarray(stored[field], dtype=np.float32), stats[key][row, sl].numpy()), field
            assert stored["trained"] == (stats["loss_mask"][row, sl] > 0).int().tolist()
            assert stored["logprob"] == pytest.approx(turn.response_logprobs, abs=1e-6)
            assert "".join(stored["token_text"]) == stored["response"]
            n_tokens += len(stored["token_ids"])
            row += 1
        if not ep.is_high:
            assert all(v == 0.0 for t in rec["turns"] for v in t["js"])  # JS is computed on T1 rows only
    assert row == batch.num_rows and n_tokens == int(batch.response_mask.sum())  # every response token, once
    assert any(v != 0.0 for r in recs if r["is_high"] for t in r["turns"] for v in t["js"])
    assert sum(m for r in recs for t in r["turns"] for m in t["trained"]) == int(stats["loss_mask"].sum())
    adv_sum = sum(a for r in recs for t in r["turns"] for a in t["advantage"])
    assert adv_sum == pytest.approx(float((stats["advantages"] * batch.response_mask).sum()), abs=1e-4)
