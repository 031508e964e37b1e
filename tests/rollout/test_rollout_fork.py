"""Forked groups, the rollout side (``rollout.fork``, issue 40) on real TextWorld games: siblings replay their base's
actions (every replayed prompt and step equal to the base's), sample onward with their own seed slots, a
nondeterministic env is refused, and the rows mask the replayed prefix."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random

import pytest
from rollout_fakes import ByteTokenizer, SimplePool

from agent_rl.engines.base import EngineBase, row_seed
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, build_rollout_batch, get_prompt
from agent_rl.rollout.config import ForkConfig
from agent_rl.rollout.fork import FORK_COUNTS, fork_turns, sibling_slot
from agent_rl.types import Generation, Task

ENV = "agent_rl/TextWorld-v0"
KW = {"family": "coin_collector", "level": 2}
MOVES = ["look", "inventory", "go north", "go south", "go east", "go west", "take coin", "examine coin"]


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    from envs.textworld import games as tw_games

    root = tmp_path_factory.mktemp("tw_games")
    old = os.environ.get("AGENT_RL_TEXTWORLD_GAMES")
    os.environ["AGENT_RL_TEXTWORLD_GAMES"] = str(root)
    tw_games._build([("coin_collector", 2, "train", i) for i in range(2)], root)
    yield root
    if old is None:
        os.environ.pop("AGENT_RL_TEXTWORLD_GAMES", None)
    else:
        os.environ["AGENT_RL_TEXTWORLD_GAMES"] = old


class SeededEngine:
    """Picks a move with ``random.Random(row seed)``: a row's seed decides its action, so a sibling that sampled with
    its base's slot would repeat the base. Records (prompt, row seed) of every row."""

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer()
        self.rows: list[tuple[tuple[int, ...], int]] = []

    def generate(self, prompts, temperatures, *, max_new_tokens, top_p=1.0, top_k=0, stop=None, seed=None,
                 row_seeds=None):
        out = []
        for i, p in enumerate(prompts):
            rs = row_seeds[i] if row_seeds is not None else seed
            self.rows.append((tuple(p), rs))
            ids = self.tokenizer.encode(f"<action>{random.Random(rs).choice(MOVES)}</action>")
            out.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text=self.tokenizer.decode(ids),
                                  finish_reason="stop"))
        return out


class NoisyPool(SimplePool):
    """TextWorld made nondeterministic: every session's observations carry the session's own id."""

    async def step(self, session_id, action):
        out = await super().step(session_id, action)
        out.observation = f"{out.observation} [{session_id}]"
        return out


def play(pool, *, mode="trajectory", fork=None, groups=2, seed_key=1, deterministic=None):
    engine = SeededEngine()
    cfg = RolloutConfig(mode=mode, max_turns=5, fork=fork or ForkConfig(points=1, siblings=2))
    orch = RolloutOrchestrator(pool, engine, get_prompt("textworld"), cfg, max_new_tokens=64, seed=3,
                               deterministic=deterministic)
    specs = [GroupSpec(Task(ENV, {"split": "train", "index": g}, group_id=g, seed=7, env_kwargs=KW),
                       [(1.0, False)] * 2) for g in range(groups)]

    async def go():
        try:
            return await orch.run_groups(specs, seed_key=seed_key)
        finally:
            await pool.aclose()

    return orch, engine, asyncio.run(go())


def test_siblings_replay_the_base_exactly_and_sample_with_their_own_seeds(games):
    orch, engine, res = play(SimplePool())
    m = res.metrics
    assert set(FORK_COUNTS) <= set(m) and m["fork/replay_mismatch"] == 0 and not orch.fork_refused
    sibs = [ep for ep in res.episodes if ep.fork is not None]
    assert sibs and m["fork/extra_episodes"] == len(sibs) and m["fork/groups"] >= 1 and m["fork/replay_s"] > 0
    assert res.dropped_groups == 0
    for ep in sibs:
        group = [e for e in res.episodes if e.task.group_id == ep.task.group_id and e.fork is None]
        base, t = group[ep.fork.base_slot], ep.fork.turn
        assert 1 <= t < len(base.turns)
        for k in range(t):  # the replayed prefix: the base's turns, prompts and env answers equal
            a, b = ep.turns[k], base.turns[k]
            assert (a.prompt_ids, a.response_ids, a.action, a.observation, a.reward) == \
                (b.prompt_ids, b.response_ids, b.action, b.observation, b.reward)
        # the fork turn's prompt (trajectory mode: the whole conversation) is the base's: the same state
        assert ep.turns[t].prompt_ids == base.turns[t].prompt_ids
    # the rows that sampled a fork turn's prompt: the base's and each sibling's, all with different seeds
    for ep in sibs:
        group = [e for e in res.episodes if e.task.group_id == ep.task.group_id and e.fork is None]
        prompt = tuple(group[ep.fork.base_slot].turns[ep.fork.turn].prompt_ids)
        seeds = [rs for p, rs in engine.rows if p == prompt]
        n_sibs = sum(1 for s in sibs if s.task.group_id == ep.task.group_id and s.fork == ep.fork)
        # (another base that reached the same conversation sampled it too)
        assert len(seeds) >= 1 + n_sibs and len(set(seeds)) == len(seeds)
    # and they are the documented slots: after the group's G = 2
    assert sibling_slot(2, 0, 0, 0, ForkConfig(points=1, siblings=2)) == 2
    assert sibling_slot(2, 1, 0, 1, ForkConfig(points=1, siblings=2)) == 5


def test_same_seed_same_forks(games):
    _, _, a = play(SimplePool())
    _, _, b = play(SimplePool())
    assert [(ep.fork, [t.action for t in ep.turns]) for ep in a.episodes] == \
        [(ep.fork, [t.action for t in ep.turns]) for ep in b.episodes]


def test_nondeterministic_env_is_refused_with_the_reason(games):
    orch, _, res = play(NoisyPool())
    assert res.metrics["fork/replay_mismatch"] >= 1 and res.metrics["fork/extra_episodes"] == 0
    assert "differs from the base's" in orch.fork_refused[ENV]
    assert all(ep.fork is None for ep in res.episodes) and len(res.episodes) == 4 and res.dropped_groups == 0


@pytest.mark.parametrize("mode", ["trajectory", "turn"])
def test_rows_mask_the_replayed_prefix(games, mode):
    _, _, res = play(SimplePool(), mode=mode)
    batch = build_rollout_batch(res.episodes, pad_token_id=0, mode=mode)
    ex = batch.extras
    tt, rm = ex["token_turn"], batch.response_mask
    for e, ep in enumerate(res.episodes):
        rows = (batch.episode_index == e).nonzero().flatten().tolist()
        for k, turn in enumerate(ep.turns):
            r = rows[k] if mode == "turn" else rows[0]
            start = len(turn.prompt_ids)
            span = rm[r, start:start + len(turn.response_ids)]
            assert (tt[r, start:start + len(turn.response_ids)] == k).all()
            trained = ep.fork is None or k >= ep.fork.turn
            assert float(span.min()) == float(span.max()) == (1.0 if trained else 0.0)
        if ep.fork is not None:
            base = int(ex["episode_fork_base"][e])
            assert res.episodes[base].fork is None and res.episodes[base].task.group_id == ep.task.group_id
            assert int(ex["episode_fork_turn"][e]) == ep.fork.turn
        else:
            assert int(ex["episode_fork_base"][e]) == -1


def test_fork_turn_selection():
    from agent_rl.types import Episode, Turn

    def ep(actions, lps, high=True):
        return Episode(task=Task(ENV), temperature=1.0, is_high=high,
                       turns=[Turn([1], [2], [lp], a) for a, lp in zip(actions, lps)])

    t0 = ep(["look", "go east", "take coin"], [-0.1, -0.1, -0.1], high=False)
    t1 = ep(["look", "go west", "go east", "look"], [-0.1, -2.0, -0.5, -3.0])
    ent = fork_turns(ForkConfig(points=2, select="entropy"), [t0, t1], seed=0, group_id=0)
    assert ent[1] == [1, 3]  # the two turns of highest surprisal (turn 0 is never a fork turn)
    div = fork_turns(ForkConfig(points=2, select="divergence"), [t0, t1], seed=0, group_id=0)
    assert div == [[1], [1]]  # T0 and T1 first act differently at turn 1
    uni = fork_turns(ForkConfig(points=2), [t0, t1], seed=5, group_id=3)
    assert uni == fork_turns(ForkConfig(points=2), [t0, t1], seed=5, group_id=3)
    assert all(len(u) == 2 and all(1 <= t < n for t in u) for u, n in zip(uni, (3, 4)))
    one_turn = ep(["look"], [-1.0])
    assert fork_turns(ForkConfig(points=1), [one_turn], seed=0, group_id=0) == [[]]
    # js: the highest mean token JS per turn; hand values (turn 0 is never a fork turn; a tie goes to the earlier)
    js = [[[0.6], [0.1, 0.3], [0.05]], [[0.9], [0.2], [0.5, 0.1], [0.25, 0.25]]]
    assert fork_turns(ForkConfig(points=1, select="js"), [t0, t1], seed=0, group_id=0, token_js=js) == [[1], [2]]
    tie = [js[0], [[0.9], [0.2], [0.1, 0.3], [0.2, 0.2]]]  # all three candidates 0.2: the earliest
    assert fork_turns(ForkConfig(points=1, select="js"), [t0, t1], seed=0, group_id=0, token_js=tie)[1] == [1]
    assert fork_turns(ForkConfig(points=2, select="js"), [t0, t1], seed=0, group_id=0, token_js=js) == [[1, 2], [2, 3]]
    with pytest.raises(ValueError, match="no token JS for base slot 0"):
        fork_turns(ForkConfig(points=1, select="js"), [t0, t1], seed=0, group_id=0)


class NoFork(EngineBase):
    """The hf engine declaring no fork cache (``EngineCaps.fork_cache``): siblings prefill their replayed prefix
    themselves."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.caps = dataclasses.replace(engine.caps, fork_cache=False)
        self.tokenizer, self.eos_token_ids = engine.tokenizer, engine.eos_token_ids

    def generate(self, *args, **kwargs):
        return self._engine.generate(*args, **kwargs)

    def end_episode(self, episode_id):
        self._engine.end_episode(episode_id)


def test_siblings_prefill_the_shared_prefix_once_with_the_hf_engine(games):
    """Trajectory mode, the tiny model in float64 (exact ties): with ``fork_episode`` each sibling's first sampled
    prompt reuses all of it but its last token from the base's cache (``throughput/kv_reuse_tokens`` higher by
    exactly that sum), and the episodes are the same as without the reuse."""
    import copy

    from agent_rl.engines import HFEngine
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    model, tok = load_policy(ModelConfig(name="tiny"))
    model = copy.deepcopy(model).double()
    out = []
    for wrap in (lambda e: e, NoFork):
        engine = wrap(HFEngine(model, tok, seed=0, shared_prefill=False))  # the counts of the kept caches alone
        cfg = RolloutConfig(mode="trajectory", max_turns=3, fork=ForkConfig(points=1, siblings=2))
        orch = RolloutOrchestrator(SimplePool(), engine, get_prompt("textworld"), cfg, max_new_tokens=6, seed=3)
        spec = GroupSpec(Task(ENV, {"split": "train", "index": 0}, group_id=0, seed=7, env_kwargs=KW), [(1.0, False)] * 2)
        out.append(asyncio.run(orch.run_groups([spec], seed_key=1)))
    shared, alone = out
    sibs = [ep for ep in shared.episodes if ep.fork is not None]
    assert sibs and [[t.response_ids for t in ep.turns] for ep in shared.episodes] == \
        [[t.response_ids for t in ep.turns] for ep in alone.episodes]
    prefix = sum(len(ep.turns[ep.fork.turn].prompt_ids) - 1 for ep in sibs)
    gain = shared.metrics["throughput/kv_reuse_tokens"] - alone.metrics["throughput/kv_reuse_tokens"]
    assert gain == prefix
    assert shared.metrics["throughput/prefill_tokens"] == alone.metrics["throughput/prefill_tokens"] - prefix


def test_stream_play_group_holds_its_forks_and_budget_episodes(games):
    """The asynchronous producer's path (``trainer.max_staleness``): ``play_group`` returns the group with its
    siblings (admitted or discarded as one), the stream's counters carry ``fork/*``; ``budget=episodes`` takes the
    siblings out of G: G = 4, 1 point x 1 sibling -> 2 bases and at most 2 siblings."""
    engine = SeededEngine()
    cfg = RolloutConfig(mode="trajectory", max_turns=5, fork=ForkConfig(points=1, siblings=1, budget="episodes"))
    orch = RolloutOrchestrator(SimplePool(), engine, get_prompt("textworld"), cfg, max_new_tokens=64, seed=3)
    spec = GroupSpec(Task(ENV, {"split": "train", "index": 0}, group_id=0, seed=7, env_kwargs=KW), [(1.0, False)] * 4)

    async def go():
        await orch.open_stream(seed_key=1)
        try:
            return await orch.play_group(spec), orch.stream_counters()
        finally:
            await orch.close_stream()
            await orch.env.pool.aclose()

    eps, counters = asyncio.run(go())
    bases = [ep for ep in eps if ep.fork is None]
    assert len(bases) == 2 and 1 <= len(eps) - 2 <= 2 and len(eps) <= 4
    assert counters["fork/extra_episodes"] == len(eps) - 2 and counters["fork/replay_mismatch"] == 0
    assert {ep.fork.base_slot for ep in eps if ep.fork is not None} <= {0, 1}


def test_an_env_declared_nondeterministic_is_refused_up_front(games):
    """``EnvFamily.deterministic`` False (math with the python tool): no sibling is started, the reason is kept."""
    from agent_rl.config.compose import load_config
    from agent_rl.runtime import env_deterministic

    orch, engine, res = play(SimplePool(), deterministic=False, groups=1)
    assert "declares that its episodes do not replay exactly" in orch.fork_refused[ENV]
    assert all(ep.fork is None for ep in res.episodes) and res.metrics["fork/replay_mismatch"] == 0
    assert len(engine.rows) == sum(len(ep.turns) for ep in res.episodes)  # the bases' turns only
    assert env_deterministic(load_config(["env=math_python", "model=tiny"])) is False
    assert env_deterministic(load_config(["env=textworld", "model=tiny"])) is True


@pytest.mark.parametrize("mode", ["trajectory", "turn"])
def test_js_fork_turns_are_the_learners_tgrl_js(games, mode):
    """``rollout.fork.select=js`` with the hf engine: the JS the rollout ranks turns by is the learner's TGRL token JS
    (``OldPolicyOutputs.js`` of the no-grad pass, algorithms.md 3.3) of the same tokens to 1e-5, in trajectory mode (one
    forward over the chained conversation) and per-turn mode (one per turn), and each base forks at the turn of highest
    mean JS; the scoring time is counted (``fork/select_s``)."""
    import torch

    from agent_rl.engines import HFEngine
    from agent_rl.learner import AlgoConfig, Learner, OptimConfig
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    model, tok = load_policy(ModelConfig(name="tiny"))
    engine = HFEngine(model, tok, seed=0)
    cfg = RolloutConfig(mode=mode, max_turns=3, fork=ForkConfig(points=1, siblings=1, select="js"))
    orch = RolloutOrchestrator(SimplePool(), engine, get_prompt("textworld"), cfg, max_new_tokens=6, seed=3,
                               fork_js_temperatures=(0.3, 1.2))
    spec = GroupSpec(Task(ENV, {"split": "train", "index": 0}, group_id=0, seed=7, env_kwargs=KW),
                     [(0.3, False), (1.2, True)])
    out = asyncio.run(orch.run_groups([spec], seed_key=1))
    bases = [ep for ep in out.episodes if ep.fork is None]
    assert len(bases) == 2 and all(len(ep.turns) == 3 for ep in bases)
    assert out.metrics["fork/select_s"] > 0
    # the learner's JS of the bases' rows (all rows scored at T0 = 0.3, T1 = 1.2 as high rows)
    batch = build_rollout_batch(bases, pad_token_id=tok.pad_token_id, mode=mode)
    batch.is_high[:] = True
    learner = Learner(model, tok, AlgoConfig(name="tgrl", t_low=0.3, t_high=1.2, warmup_steps=0), OptimConfig())
    ref = learner.evaluate(batch).js
    rows = [(i, k) for i, ep in enumerate(bases) for k in ([None] if mode == "trajectory" else range(len(ep.turns)))]
    picked = []
    for i, ep in enumerate(bases):
        got = engine.token_js([(t.prompt_ids, t.response_ids) for t in ep.turns], 0.3, 1.2)
        assert [len(g) for g in got] == [len(t.response_ids) for t in ep.turns]
        flat = [x for g in got for x in g]
        want = torch.cat([ref[r][batch.response_mask[r].bool()] for r, (j, _) in enumerate(rows) if j == i])
        assert torch.allclose(torch.tensor(flat), want.float(), atol=1e-5), (flat, want)
        means = [sum(g) / len(g) for g in got]
        picked.append(max((1, 2), key=lambda k: (means[k], -k)))
    assert sorted((ep.fork.base_slot, ep.fork.turn) for ep in out.episodes if ep.fork is not None) == \
        [(b, t) for b, t in enumerate(picked)]
    turns = [(t.prompt_ids, t.response_ids) for t in bases[0].turns]
    with pytest.raises(ValueError, match="temperatures > 0"):
        engine.token_js(turns, 0.0, 1.2)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.token_js([([], turns[0][1])], 0.3, 1.2)
    assert engine.token_js([], 0.3, 1.2) == []


def test_js_fork_needs_the_hf_engines_logits():
    """select=js is refused, with the reason, for an engine without token JS and for engine=vllm / vllm_server."""
    from agent_rl.config.compose import load_config

    cfg = RolloutConfig(mode="trajectory", max_turns=3, fork=ForkConfig(points=1, select="js"))
    with pytest.raises(ValueError, match="needs the engine's token JS"):
        RolloutOrchestrator(SimplePool(), SeededEngine(), get_prompt("textworld"), cfg, max_new_tokens=4,
                            fork_js_temperatures=(0.3, 1.2))
    for engine in ("vllm", "vllm_server"):
        with pytest.raises(ValueError, match="returns no full logits"):
            load_config(["env=textworld", "model=tiny", "algo=grpo", f"engine={engine}", "rollout.fork.points=1",
                         "rollout.fork.select=js", "rollout.max_turns=4"])


def test_turn_budget_keeps_the_siblings_within_g_plain_episodes_of_turns():
    """``budget=turns``, hand example: G = 4, two bases of 4 and 2 turns -> budget round(4 * 3) = 12 turns, 6 spent
    by the bases; siblings (base, fork turn) cost the base's turns after the fork: (0, 1) 3 -> 9, (0, 1) 3 -> 12,
    (0, 3) 1 -> 13 > 12 skipped, (1, 1) 1 -> 13 skipped. ``generated_turns`` excludes a sibling's replayed prefix."""
    from agent_rl.rollout.fork import generated_turns, turn_budget_jobs
    from agent_rl.types import Episode, ForkOrigin, Turn

    def ep(n, fork=None):
        e = Episode(task=Task(ENV, {}), temperature=1.0, is_high=False, fork=fork)
        e.turns = [Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1], action="look") for _ in range(n)]
        return e

    bases = [ep(4), ep(2)]
    jobs = [(0, 1, 4), (0, 1, 5), (0, 3, 6), (1, 1, 7)]
    assert turn_budget_jobs(jobs, bases, 4) == [(0, 1, 4), (0, 1, 5)]
    assert turn_budget_jobs(jobs, bases, 8) == jobs  # budget 24: everything fits
    assert turn_budget_jobs(jobs, [], 4) == []
    assert generated_turns([*bases, ep(4, ForkOrigin(0, 1)), ep(3, ForkOrigin(0, 2))]) == 6 + 3 + 1


def test_turn_budget_group_generates_at_most_its_budget(games):
    """budget=turns on real games: the group's generated turns (``fork/generated_turns``) stay within G times the
    bases' mean turns, and more siblings are played than ``budget=episodes`` allows (G - bases)."""
    fork = ForkConfig(points=1, siblings=3, budget="turns")
    engine = SeededEngine()
    cfg = RolloutConfig(mode="trajectory", max_turns=5, fork=fork)
    orch = RolloutOrchestrator(SimplePool(), engine, get_prompt("textworld"), cfg, max_new_tokens=64, seed=3)
    spec = GroupSpec(Task(ENV, {"split": "train", "index": 0}, group_id=0, seed=7, env_kwargs=KW), [(1.0, False)] * 8)
    out = asyncio.run(orch.run_groups([spec], seed_key=1))
    bases = out.episodes[:2]  # max(1, 8 // (1 + 1 * 3)) bases, then the plain episodes filling the budget
    fill = [ep for ep in out.episodes[2:] if ep.fork is None]
    sibs = [ep for ep in out.episodes if ep.fork is not None]
    assert all(ep.fork is None for ep in bases) and out.metrics["fork/filled_episodes"] == len(fill)
    mean = sum(len(b.turns) for b in bases) / len(bases)
    budget = round(8 * mean)
    assert out.metrics["fork/generated_turns"] == sum(len(e.turns) - (e.fork.turn if e.fork else 0)
                                                      for e in out.episodes)
    expected = (sum(len(b.turns) for b in bases) + sum(len(bases[s.fork.base_slot].turns) - s.fork.turn for s in sibs)
                + len(fill) * mean)
    assert expected <= budget and len(sibs) >= 1
    assert budget - expected < mean or len(bases) + len(fill) == 8  # what is left would not buy one more episode


def test_divergence_keeps_two_bases_under_a_budget():
    """``budget=episodes|turns`` with ``select=divergence``: a lone base has no other base to diverge from, so it
    would never fork (a TGRL group of G = 4, 1 point x 3 siblings played 1 base and 0 siblings): 2 bases are kept
    (the T0 episode and a T1 one), and the T1 base forks where it first acts differently from the T0 one."""
    from agent_rl.rollout.fork import base_count

    for budget in ("episodes", "turns"):
        assert base_count(ForkConfig(points=1, siblings=3, budget=budget, select="divergence"), 4) == 2
        assert base_count(ForkConfig(points=1, siblings=3, budget=budget, select="uniform"), 4) == 1
        assert base_count(ForkConfig(points=1, siblings=1, budget=budget, select="divergence"), 8) == 4
        assert base_count(ForkConfig(points=1, siblings=3, budget=budget, select="divergence"), 1) == 1
    assert base_count(ForkConfig(points=1, siblings=3, budget="extra", select="divergence"), 4) == 4


@pytest.mark.parametrize("select", ["uniform", "js", "entropy", "divergence"])
def test_a_tgrl_group_keeps_a_t1_base_and_forks_it_first(select):
    """A sibling samples at its base's temperature, and TGRL trains only T1 rows: the bases reach the group's first
    T1 slot whatever ``select`` (a TGRL group of G = 4, 1 point x 8 siblings under ``budget=turns`` played its T0
    episode and 8 T0 siblings and trained nothing), and a budget takes a T1 base's siblings first."""
    from agent_rl.rollout.fork import base_count, budget_order
    from agent_rl.types import Episode

    for budget in ("episodes", "turns"):
        cfg = ForkConfig(points=1, siblings=8, budget=budget, select=select)
        assert base_count(cfg, 4, first_high=1) == 2  # T0 at slot 0, T1 from slot 1 (n_low = 1)
        assert base_count(cfg, 4, first_high=2) == 3  # n_low = 2: the bases reach the first T1 slot
        assert base_count(cfg, 4, first_high=0) == (2 if select == "divergence" else 1)  # warm-up: all at T1
        assert base_count(cfg, 4) == (2 if select == "divergence" else 1)  # one temperature (GRPO)
        assert base_count(cfg, 1, first_high=3) == 1  # never more bases than slots
    bases = [Episode(task=Task(ENV, {}), temperature=0.3, is_high=False),
             Episode(task=Task(ENV, {}), temperature=1.2, is_high=True)]
    jobs = [(0, 1, 4), (0, 1, 5), (1, 2, 6), (1, 3, 7)]
    assert budget_order(jobs, bases) == [(1, 2, 6), (1, 3, 7), (0, 1, 4), (0, 1, 5)]
    low = [bases[0], Episode(task=Task(ENV, {}), temperature=1.0, is_high=False)]
    assert budget_order(jobs, low) == jobs  # no T1 base: order kept


def test_a_tgrl_group_under_a_turn_budget_plays_t1_siblings(games):
    """End to end on real games: a TGRL-shaped group (1 at T0 = 0.3, 3 at T1 = 1.2) with 1 point x 8 siblings and
    ``budget=turns`` plays a T1 base and its siblings are T1 episodes (before: 1 T0 base, T0 siblings only)."""
    fork = ForkConfig(points=1, siblings=8, budget="turns", select="uniform")
    cfg = RolloutConfig(mode="trajectory", max_turns=5, fork=fork)
    orch = RolloutOrchestrator(SimplePool(), SeededEngine(), get_prompt("textworld"), cfg, max_new_tokens=64, seed=3)
    spec = GroupSpec(Task(ENV, {"split": "train", "index": 0}, group_id=0, seed=7, env_kwargs=KW),
                     [(0.3, False), (1.2, True), (1.2, True), (1.2, True)])
    out = asyncio.run(orch.run_groups([spec], seed_key=1))
    bases = [ep for ep in out.episodes if ep.fork is None]
    sibs = [ep for ep in out.episodes if ep.fork is not None]
    assert [(b.temperature, b.is_high) for b in bases] == [(0.3, False), (1.2, True)]
    assert sibs, "the T1 base has fork turns within the budget"
    high_first = [s.is_high for s in sibs]
    assert high_first == sorted(high_first, reverse=True) and high_first[0]  # a T1 base's siblings first
    assert all(s.temperature == bases[s.fork.base_slot].temperature for s in sibs)


@pytest.mark.parametrize("budget", ["episodes", "turns"])
def test_a_budget_the_forks_cannot_spend_is_played_as_plain_episodes(games, budget):
    """A group whose forks are refused (an env declared nondeterministic) or that has no fork turn still plays G
    episodes' worth under ``budget=episodes|turns``: the unspent slots are played as plain episodes at their own
    temperatures and seed slots (``fork/filled_episodes``). Before, the group played its one base only: TGRL with
    divergence forks generated half of TGRL's turns."""
    fork = ForkConfig(points=1, siblings=3, budget=budget)
    cfg = RolloutConfig(mode="trajectory", max_turns=5, fork=fork)
    engine = SeededEngine()
    orch = RolloutOrchestrator(SimplePool(), engine, get_prompt("textworld"), cfg, max_new_tokens=64, seed=3,
                               deterministic=False)
    temps = [(0.3, False), (1.2, True), (1.2, True), (1.2, True)]
    spec = GroupSpec(Task(ENV, {"split": "train", "index": 0}, group_id=0, seed=7, env_kwargs=KW), temps)
    out = asyncio.run(orch.run_groups([spec], seed_key=1))
    assert orch.fork_refused and out.metrics["fork/extra_episodes"] == 0
    assert [(ep.temperature, ep.is_high, ep.fork) for ep in out.episodes] == [(t, h, None) for t, h in temps]
    assert out.metrics["fork/filled_episodes"] == 2  # bases: slots 0 and 1 (T0 and the first T1), fill: 2 and 3
    # the fill samples with its own slots' row seeds (as the plain group would): the first turn's prompt (the same
    # reset for all four) was sampled 4 times, with 4 different row seeds
    first_prompt = tuple(out.episodes[0].turns[0].prompt_ids)
    first_turn_seeds = [rs for prompt, rs in engine.rows if prompt == first_prompt]
    assert len(first_turn_seeds) == 4 and len(set(first_turn_seeds)) == 4


def test_spare_slots_hand_example():
    """``spare_slots``: G = 4, one base of 4 turns. episodes: 4 - 1 - jobs. turns: budget round(4 * 4) = 16; a job
    forked at turn 1 costs 3: none -> (16 - 4) // 4 = 3 plain; one -> (16 - 7) // 4 = 2; three -> 16 - 13 = 3 < 4: 0."""
    from agent_rl.rollout.fork import spare_slots
    from agent_rl.types import Episode, Turn

    base = Episode(task=Task(ENV, {}), temperature=1.0, is_high=False)
    base.turns = [Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1], action="look") for _ in range(4)]
    job = (0, 1, 4)
    assert [spare_slots(ForkConfig(points=1, siblings=3, budget="episodes"), [base], [job] * n, 4)
            for n in (0, 1, 3)] == [3, 2, 0]
    assert [spare_slots(ForkConfig(points=1, siblings=3, budget="turns"), [base], [job] * n, 4)
            for n in (0, 1, 3)] == [3, 2, 0]
    assert spare_slots(ForkConfig(points=1, siblings=3, budget="extra"), [base], [], 4) == 0
    assert spare_slots(ForkConfig(points=1, siblings=3, budget="turns"), [], [], 4) == 0


def test_prefetched_sessions_a_forked_group_does_not_play_are_closed(games):
    """The trainer prefetches the resets of a step's G slots; a forked group under ``budget=episodes`` plays one
    base and 3 siblings (on sessions of their own), so 3 prefetched sessions were never taken and stayed open:
    step after step they filled the env pool until ``EnvUnavailable`` dropped groups (measured: 2-3 of 8 groups at
    every 4th step of the fork benchmark). With the real local pool capped at 8 sessions, three steps now each keep
    their group, and no session is left open after a step."""
    from agent_rl.envclient import LocalEnvPool

    async def go():
        pool = LocalEnvPool(mode="thread", max_workers=2, max_sessions=8)
        cfg = RolloutConfig(mode="trajectory", max_turns=5, fork=ForkConfig(points=1, siblings=3, budget="episodes"),
                            episode_retries=0)
        orch = RolloutOrchestrator(pool, SeededEngine(), get_prompt("textworld"), cfg, max_new_tokens=64, seed=3)
        out, open_after = [], []
        try:
            for step in range(3):
                task = Task(ENV, {"split": "train", "index": step % 2}, group_id=100 + step, seed=7, env_kwargs=KW)
                orch.prefetch([task], 4)
                res = await orch.run_groups([GroupSpec(task, [(1.0, False)] * 4)], seed_key=step)
                out.append((res.dropped_groups, len(res.episodes), res.metrics["fork/extra_episodes"]))
                open_after.append(len(pool.manager.sessions))
        finally:
            await orch.aclose()
            await pool.aclose()
        return out, open_after

    out, open_after = asyncio.run(go())
    assert [(dropped, episodes) for dropped, episodes, _ in out] == [(0, 4)] * 3, out  # 1 base + 3 siblings each
    assert [extra for _, _, extra in out] == [3.0] * 3  # the 3 siblings, every step (none refused for capacity)
    assert open_after == [0, 0, 0]
