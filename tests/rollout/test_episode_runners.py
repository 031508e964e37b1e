"""The episode-runner seam: a new kind of episode is one :class:`EpisodeRunner` with ``run`` and a ``can_fork``
declaration, played by the same :class:`GroupPlayer` (concurrency, batching, retries, metrics) as the env episodes;
forks are refused from the declaration alone; env pools declare their snapshots (``PoolCaps``)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from rollout_fakes import ScriptedEngine
from agent_rl.envclient import HTTPEnvPool, LocalEnvPool, PoolCaps, pool_caps
from agent_rl.gateway.external import ProgramEpisode
from agent_rl.rollout import GroupSpec, RolloutConfig
from agent_rl.rollout.config import ForkConfig
from agent_rl.rollout.episode import EnvEpisode, EpisodeRunner, Sampling, ScriptedEpisode
from agent_rl.rollout.fork import EpisodeStart
from agent_rl.rollout.generation import Generator
from agent_rl.rollout.groups import GroupPlayer
from agent_rl.rollout.sessions import EnvCallFailed, EnvSessions
from agent_rl.types import Episode, Task, Turn


class EchoEpisode(EpisodeRunner):
    """A toy kind: one generated turn, reward = the number of ``a`` in the reply; the first attempt of slot 0 of
    every group fails (an env failure: the player re-runs it)."""

    kind = "an echo episode"

    def __init__(self, env: EnvSessions, generator: Generator) -> None:
        super().__init__(env, generator)
        self.attempts: dict[tuple[int, int], int] = {}

    async def run(self, task: Task, sampling: Sampling, slot: int, start: EpisodeStart | None = None) -> Episode:
        assert start is None  # this kind declares can_fork=False: never given a fork start
        n = self.attempts[(task.group_id, slot)] = self.attempts.get((task.group_id, slot), 0) + 1
        if slot == 0 and n == 1:
            raise EnvCallFailed("the first attempt of slot 0 fails")
        batcher = self.generator.batcher
        assert batcher is not None
        gen = await batcher.generate([5, 6, 7], sampling.temperature, key=(task.group_id, slot, 0))
        turn = Turn(prompt_ids=[5, 6, 7], response_ids=list(gen.token_ids), response_logprobs=list(gen.logprobs),
                    action=gen.text, reward=float(gen.text.count("a")), terminated=True)
        return Episode(task=task, temperature=sampling.temperature, is_high=sampling.is_high, turns=[turn],
                       reward=turn.reward, won=turn.reward > 0)


def player(cfg: RolloutConfig | None = None) -> tuple[GroupPlayer, EchoEpisode]:
    engine = ScriptedEngine(lambda prompt, t: "aa" if t > 1.0 else "a")
    runner = EchoEpisode(EnvSessions(None, 5.0), Generator(engine, max_new_tokens=8, seed=0))
    return GroupPlayer(runner, cfg or RolloutConfig(retry_backoff_s=0.0)), runner


def test_a_new_kind_of_episode_is_one_runner_played_by_the_group_player():
    orch, runner = player()
    specs = [GroupSpec(Task(env_id="echo", group_id=g), [(0.5, False), (1.5, True)]) for g in range(3)]
    res = asyncio.run(orch.run_groups(specs, seed_key=0))
    # 3 groups x 2 slots, in group then slot order; T0 replies "a" (reward 1), T1 "aa" (reward 2)
    assert [(ep.task.group_id, ep.temperature, ep.reward) for ep in res.episodes] == \
        [(g, t, r) for g in range(3) for t, r in ((0.5, 1.0), (1.5, 2.0))]
    assert res.dropped_groups == 0 and res.metrics["rollout/episode_retries"] == 3.0  # slot 0's re-run, each group
    assert res.metrics["reward/mean"] == 1.5 and res.metrics["throughput/decode_tokens"] == 9.0  # 3 x (1 + 2)
    assert runner.attempts == {(g, s): 2 - s for g in range(3) for s in range(2)}


def test_forks_are_refused_from_the_runners_declaration():
    with pytest.raises(ValueError, match="an echo episode does not fork groups"):
        player(RolloutConfig(fork=ForkConfig(points=1, siblings=2)))
    assert EnvEpisode.can_fork and not ScriptedEpisode.can_fork and not ProgramEpisode.can_fork


def test_the_gateways_episode_has_no_rollout_base_but_the_runner():
    rollout_bases = [c for c in inspect.getmro(ProgramEpisode)[1:] if c.__module__.startswith("agent_rl.rollout")]
    assert rollout_bases == [EpisodeRunner]


def test_env_pools_declare_their_snapshots():
    assert LocalEnvPool.caps == HTTPEnvPool.caps == PoolCaps(snapshots=True)
    assert pool_caps(object()) == PoolCaps()  # a duck-typed pool declares nothing
