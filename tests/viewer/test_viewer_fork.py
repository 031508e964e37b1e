"""The viewer draws a forked group (``rollout.fork``, issue 40) as a tree: each base with its fork turns and each
sibling's return, from the records of the acceptance-style run's files."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from agent_rl.viewer.app import create_app
from agent_rl.viewer.data import fork_tree


def _rec(i, reward, fork=None):
    return {"schema": 1, "id": f"1-{i}", "step": 1, "index": i, "source": "train", "task_id": "g0", "task_type": None,
            "task": {"env_id": "agent_rl/TextWorld-v0", "options": {}, "seed": 1, "group_id": 0}, "group": 0,
            "slot": i, "temperature": 1.0, "is_high": False, "temp_label": "T0", "reward": reward, "won": reward > 0,
            "failure": None, "num_turns": 3, "num_tokens": 0, "prompt": "", "prompt_cut": False,
            "advantage_mean": None, "trained_frac": None, "turns": [], **({"fork": fork} if fork else {})}


RECS = [_rec(0, 1.0), _rec(1, 0.0), _rec(2, 1.0, {"base": "1-1", "base_slot": 1, "turn": 1}),
        _rec(3, 1.0, {"base": "1-1", "base_slot": 1, "turn": 1}), _rec(4, 0.0, {"base": "1-1", "base_slot": 1, "turn": 2})]


def test_fork_tree_nodes():
    tree = fork_tree(RECS)
    assert len(tree) == 1 and tree[0]["base"]["id"] == "1-1"
    assert [(f["turn"], [s["id"] for s in f["siblings"]], round(f["mean"], 4)) for f in tree[0]["forks"]] == \
        [(1, ["1-2", "1-3"], 0.6667), (2, ["1-4"], 0.0)]
    assert fork_tree(RECS[:2]) == []


def test_step_page_draws_the_tree(tmp_path):
    (tmp_path / "episodes").mkdir()
    (tmp_path / "episodes" / "step_000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECS))
    client = TestClient(create_app(tmp_path))
    page = client.get("/steps/1").text
    assert page.count('class="fork-tree"') == 1 and page.count('class="sibling"') == 3
    assert 'data-turn="1"' in page and 'data-turn="2"' in page and "step-group mean 0.667" in page
    ep = client.get("/episodes/1-2").text
    assert "forked from" in ep and 'href="/episodes/1-1"' in ep
    base = client.get("/episodes/1-1")  # a record without "fork" (every base, every run without forks)
    assert base.status_code == 200 and "forked from" not in base.text
