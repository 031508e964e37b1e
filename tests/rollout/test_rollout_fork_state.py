"""Forked groups by state copy (``rollout.fork.restore=state``) on the real local env pool: on TextWorld (which
replays exactly) the state route gives the replay route's episodes token for token; an env that does not replay
(its observations carry noise the reset seed does not fix) is refused by replay and forked by state, each sibling
continuing from its base's state (its env's random stream included); an env without ``clone_state`` is refused
with the reason and its groups play on; every snapshot is dropped when its group ends."""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # user_env_module

from test_rollout_fork import ENV, KW, SeededEngine, games  # noqa: E402,F401  (the module's games fixture)

from agent_rl.envclient import LocalEnvPool  # noqa: E402
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, get_prompt  # noqa: E402
from agent_rl.rollout.config import ForkConfig  # noqa: E402
from agent_rl.types import Generation, Task  # noqa: E402

DRIFT, ECHO = "user/Drift-v0", "user/Echo-v0"


class WalkEngine(SeededEngine):
    """``left`` or ``right`` by the row seed (the Drift env's actions)."""

    def generate(self, prompts, temperatures, *, max_new_tokens, top_p=1.0, top_k=0, stop=None, seed=None,
                 row_seeds=None):
        out = []
        for i, p in enumerate(prompts):
            rs = row_seeds[i] if row_seeds is not None else seed
            ids = self.tokenizer.encode(f"<action>{random.Random(rs).choice(['left', 'right'])}</action>")
            out.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text=self.tokenizer.decode(ids),
                                  finish_reason="stop"))
        return out


def play(tasks, fork, engine, *, mode="trajectory", max_turns=5, deterministic=None, max_snapshots=4096):
    pool = LocalEnvPool(max_workers=4, mode="thread", imports=["user_env_module"], max_snapshots=max_snapshots)
    cfg = RolloutConfig(mode=mode, max_turns=max_turns, fork=fork)
    orch = RolloutOrchestrator(pool, engine, get_prompt("textworld"), cfg, max_new_tokens=64, seed=3,
                               deterministic=deterministic)
    specs = [GroupSpec(task, [(1.0, False)] * 2) for task in tasks]

    async def go():
        try:
            res = await orch.run_groups(specs, seed_key=1)
            return res, dict(pool.manager.snapshots), dict(pool.manager.pool._host.snapshots)
        finally:
            await pool.aclose()

    res, left, host_left = asyncio.run(go())
    assert not left and not host_left  # every snapshot dropped with its group
    return orch, res


def episodes_of(res):
    return [(ep.task.group_id, ep.fork, [(t.prompt_ids, t.response_ids, t.action, t.observation, t.reward,
                                          t.terminated) for t in ep.turns]) for ep in res.episodes]


@pytest.mark.parametrize("mode", ["trajectory", "turn"])
def test_state_route_equals_the_replay_route_on_textworld(games, mode):
    tasks = [Task(ENV, {"split": "train", "index": g}, group_id=g, seed=7, env_kwargs=KW) for g in range(2)]
    _, by_replay = play(tasks, ForkConfig(points=1, siblings=2), SeededEngine(), mode=mode)
    orch, by_state = play(tasks, ForkConfig(points=1, siblings=2, restore="state"), SeededEngine(), mode=mode)
    assert not orch.fork_refused and by_state.metrics["fork/extra_episodes"] >= 1
    assert episodes_of(by_state) == episodes_of(by_replay)
    # a snapshot after every base turn that has a next turn; no env step is replayed to start a sibling
    bases = [ep for ep in by_state.episodes if ep.fork is None]
    expected = sum(len(ep.turns) - 1 + (not ep.turns[-1].terminated and len(ep.turns) < 5) for ep in bases)
    assert by_state.metrics["fork/snapshots"] == expected
    assert by_replay.metrics["fork/snapshots"] == 0


def test_an_env_that_does_not_replay_is_forked_by_state():
    tasks = [Task(DRIFT, None, group_id=g, seed=g) for g in range(3)]
    orch, res = play(tasks, ForkConfig(points=1, siblings=3), WalkEngine(), max_turns=6)
    assert res.metrics["fork/replay_mismatch"] >= 1 and "differs from the base's" in orch.fork_refused[DRIFT]

    orch, res = play(tasks, ForkConfig(points=1, siblings=3, restore="state"), WalkEngine(), max_turns=6,
                     deterministic=False)  # declared non-replaying: the state route still forks it
    m = res.metrics
    assert not orch.fork_refused and m["fork/replay_mismatch"] == 0 and res.dropped_groups == 0
    sibs = [ep for ep in res.episodes if ep.fork is not None]
    assert sibs and m["fork/extra_episodes"] == len(sibs)
    for ep in sibs:
        base = [e for e in res.episodes if e.task.group_id == ep.task.group_id and e.fork is None][ep.fork.base_slot]
        t = ep.fork.turn
        assert ep.turns[:t] == base.turns[:t] and ep.turns[t].prompt_ids == base.turns[t].prompt_ids
        # the sibling's env continued from the base's state: its position moved by its own action, and its noise
        # is the next draw of the base's random stream (the same as the base's turn t, whatever the action)
        before = base.turns[t - 1].info["pos"]
        assert ep.turns[t].info["pos"] == before + (1 if ep.turns[t].action == "right" else -1)
        assert ep.turns[t].observation.split("noise ")[1] == base.turns[t].observation.split("noise ")[1]
        assert ep.turns[-1].terminated or ep.turns[-1].truncated or len(ep.turns) == 6


def test_an_env_without_clone_state_is_refused_and_its_groups_play_on():
    tasks = [Task(ECHO, None, group_id=g, seed=g) for g in range(2)]
    orch, res = play(tasks, ForkConfig(points=1, siblings=2, restore="state"), WalkEngine(), max_turns=3)
    assert "clone_state" in orch.fork_refused[ECHO]
    assert all(ep.fork is None for ep in res.episodes) and len(res.episodes) == 4 and res.dropped_groups == 0
    assert res.metrics["fork/snapshots"] == 0


def test_state_route_needs_a_pool_with_snapshots():
    class NoSnapshots:
        async def reset(self, *a, **k): ...

    with pytest.raises(ValueError, match="snapshot/restore/drop_snapshot"):
        RolloutOrchestrator(NoSnapshots(), SeededEngine(), get_prompt("textworld"),
                            RolloutConfig(fork=ForkConfig(points=1, siblings=2, restore="state")), max_new_tokens=8)
    with pytest.raises(ValueError, match="rollout.fork.restore='copy' is not valid"):
        ForkConfig(points=1, siblings=2, restore="copy")


def test_a_full_snapshot_store_skips_forks_and_drops_no_group():
    # 3 groups x 2 bases snapshot up to 5 turns each at once; the pool keeps 4: the bases that find it full fork
    # from fewer turns (fork/snapshots_refused), nothing fails
    tasks = [Task(DRIFT, None, group_id=g, seed=g) for g in range(3)]
    orch, res = play(tasks, ForkConfig(points=1, siblings=2, restore="state"), WalkEngine(), max_turns=6,
                     max_snapshots=4)
    m = res.metrics
    assert m["fork/snapshots_refused"] >= 1 and res.dropped_groups == 0 and not orch.fork_refused
    assert m["fork/snapshots"] + m["fork/snapshots_refused"] >= 6
    assert len([ep for ep in res.episodes if ep.fork is None]) == 6


def test_textworld_state_names_the_game_that_runs(games):
    import gymnasium

    a = gymnasium.make(ENV, **KW).unwrapped
    b = gymnasium.make(ENV, **KW).unwrapped
    try:
        _, info = a.reset(seed=0, options={"split": "train", "index": 0})
        a.step(info["walkthrough"][0])
        b.reset(seed=0, options={"split": "train", "index": 1})
        state = a.clone_state()
        b.set_state(state)
        assert (b.task_id, b.gamefile) == (a.task_id, a.gamefile)
        # the state is left as it was: it starts a second env, and both continue as the source does
        c = gymnasium.make(ENV, **KW).unwrapped
        c.reset(seed=0, options={"split": "train", "index": 0})
        c.set_state(state)
        rest = info["walkthrough"][1:]
        assert [b.step(x)[:3] for x in rest] == [c.step(x)[:3] for x in rest] == [a.step(x)[:3] for x in rest]
        c.close()
    finally:
        a.close()
        b.close()
