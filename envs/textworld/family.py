"""TextWorld's self-description (:class:`envs.families.EnvFamily`): the walkthrough/planner expert behind
``expert=True`` (behaviour cloning), admissible actions listed. No evaluation panels: its games are generated from
seeds on demand, so a split has no fixed size (``benchmarks/bench_learning.py`` plays test games ``0..n-1``)."""

from __future__ import annotations

from envs.families import EnvFamily, replays_exactly

FAMILY = EnvFamily(deterministic=replays_exactly, name="textworld", env_id="agent_rl/TextWorld-v0", split_key="split", expert_kwarg="expert",
                   admissible_actions=True)
