"""Issue 23 in the episode store and the viewer: each turn's policy version and its staleness (a badge coloured by
staleness), and the overview's async curves with the stale discards per task type."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from agent_rl.episodes import load_episodes, write_episodes
from agent_rl.viewer import create_app
from agent_rl.viewer.data import Filters, RunReader
from viewer_helpers import ByteTokenizer, make_episode


def test_turns_carry_their_version_and_staleness_and_the_page_colours_it(tmp_path):
    tok = ByteTokenizer()
    ep = make_episode(tok, 0, is_high=True, responses=["look", "pick cup"], observations=["a cup", "done"], won=True)
    ep.turns[0].policy_version, ep.turns[1].policy_version = 1, 3  # a partial rollout across a weight sync
    write_episodes(tmp_path, 4, [ep], tokenizer=tok)
    turns = load_episodes(tmp_path, 4)[0]["turns"]
    assert [(t["policy_version"], t["staleness"]) for t in turns] == [(1, 2), (3, 0)]  # (4 - 1) - v
    page = TestClient(create_app(tmp_path)).get(f"/episodes/{load_episodes(tmp_path, 4)[0]['id']}").text
    assert 'class="badge stale2"' in page and "v1 · staleness 2" in page
    assert 'class="badge stale0"' in page and "v3 · staleness 0" in page
    write_episodes(tmp_path, 5, [ep], tokenizer=tok, source="eval")  # evaluation: no staleness
    assert "staleness" not in load_episodes(tmp_path, 5)[0]["turns"][0]


def test_overview_draws_async_curves_only_for_async_runs_with_discards_per_task_type(tmp_path):
    rows = [{"step": s, "kind": "train", "reward/mean": 0.5, "async/staleness_mean": 0.5, "async/staleness_max": 1.0,
             "async/groups_stale_dropped": 1.0, "async/groups_stale_dropped/cup": 1.0, "async/engine_version": s - 1}
            for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    curves = dict(RunReader(tmp_path).curves(Filters()))
    assert set(curves["stale groups discarded (async)"]) == {"async/groups_stale_dropped",
                                                             "async/groups_stale_dropped/cup"}
    assert set(curves["staleness (async)"]) == {"async/staleness_mean", "async/staleness_max"}
    sync = [{k: v for k, v in r.items() if k != "async/engine_version"} for r in rows]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sync))
    assert "staleness (async)" not in dict(RunReader(tmp_path).curves(Filters()))
