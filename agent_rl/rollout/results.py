"""A rollout's results and their metrics: a group's spec (:class:`GroupSpec`), a run's kept episodes and metrics
(:class:`RolloutResult`), one training step's collection in rounds (:func:`collect_groups`: DAPO's dynamic sampling),
results of parallel workers merged (:func:`merge_parallel_results`), and the rollout metrics (algorithms.md
section 6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

import torch

from agent_rl.algos import dapo_keep_groups
from agent_rl.rollout.fork import FORK_COUNTS
from agent_rl.types import Episode, Task

TOKEN_COUNTS = ("throughput/prefill_tokens", "throughput/decode_tokens", "throughput/kv_reuse_tokens")
GATEWAY_COUNTS = ("gateway/requests", "gateway/prefix_breaks", "gateway/segments", "gateway/attempts",
                  "gateway/history_rewrites", "gateway/generated_tokens", "gateway/prefix_breaks/tools_changed",
                  "gateway/prefix_breaks/history_truncated", "gateway/prefix_breaks/reply_rewritten",
                  "gateway/prefix_breaks/history_edited", "gateway/prefix_breaks/text_edited")
"""The gateway's per-step counters (``env=external``, :class:`agent_rl.gateway.external.ProgramEpisode`): model
calls served, requests that did not extend their episode's segment (and by cause,
``agent_rl.gateway.recorder.BREAK_CAUSES``), segments, episode attempts (failed ones included), requests that extended
a segment under a history normalisation, tokens generated."""
EVENT_COUNTS = FORK_COUNTS + GATEWAY_COUNTS
"""Counters a group player keeps only when its runs have them (:meth:`agent_rl.rollout.groups.GroupPlayer.event_counts`:
forks, the gateway): summed over rounds, Ray workers' chunks and streams like :data:`TOKEN_COUNTS`, the asynchronous
producer logging each cycle's difference."""


@dataclass
class GroupSpec:
    """One group: a task and the (temperature, is_high) of each of its G episodes."""

    task: Task
    temperatures: list[tuple[float, bool]]


@dataclass
class RolloutResult:
    """Kept episodes (complete groups only, in group order) and rollout metrics (algorithms.md section 6 names).

    ``versions``: the policy version that sampled each kept group, in group order (the number of updates behind
    the engine's weights; set by the training backends). ``batch``: rows a collector built itself (behaviour
    cloning's expert rows); None: the training loop builds them from ``episodes``.
    """

    episodes: list[Episode]
    metrics: dict[str, float] = field(default_factory=dict)
    dropped_groups: int = 0
    filtered_groups: int = 0
    failures: list[str] = field(default_factory=list)  # one reason per dropped group (its first failed episode)
    versions: list[int] = field(default_factory=list)
    batch: Any = None
    outcomes: list[tuple[Task, list[bool]]] = field(default_factory=list)
    """Every group played to its end in this collect, kept or DAPO-filtered: (its task, each episode's ``won``);
    what the task sampler observes (``agent_rl.rollout.samplers.TaskSampler.observe``, the curriculum)."""


def group_temperatures(algo: Any, step: int, t_high: float | None = None) -> list[tuple[float, bool]]:
    """(temperature, is_high) of the G episodes of a group at 1-based ``step``: ``algo.group_temperatures(step,
    t_high)`` (``AlgoConfig``, the one home of the TGRL sampling and warm-up rule; algorithms.md, TGRL). ``t_high``:
    the step's T1 (``algo.t_high=auto``: the pick of ``agent_rl.algos.AdaptiveHighTemperature``); None = the fixed
    ``algo.t_high`` (``agent_rl.learner.config.t_high_value``)."""
    return algo.group_temperatures(step, t_high)


async def collect_groups(play: Callable[[list[Task], int], Awaitable[RolloutResult]],
                         take_tasks: Callable[[int], list[Task]], num_groups: int, group_size: int, step: int, *,
                         filter_groups: bool = False, max_extra_rounds: int = 0) -> RolloutResult:
    """One training step's groups, in rounds: ``play(tasks, seed_key)`` plays one group of ``group_size`` episodes
    per task (one group player's :meth:`~agent_rl.rollout.groups.GroupPlayer.run_groups`, or the Ray workers'
    chunks of it merged by :func:`merge_parallel_results`) with the rollout seed key ``step * 1000 + round``;
    ``take_tasks(n)`` draws the round's tasks. The one implementation of a step's collection for every backend.

    With ``filter_groups`` (DAPO dynamic sampling, algorithms.md section 1) groups whose episode rewards are all
    equal are dropped and more tasks are drawn, at most ``max_extra_rounds`` extra rounds; the batch keeps at most
    ``num_groups`` groups (fewer when the rounds run out); failed groups count as missing there too. Without it,
    failed groups are dropped and counted and the batch is smaller. Metrics are over the kept episodes; times and
    counters add up over rounds.
    """
    kept: list[list[Episode]] = []
    total = RolloutResult(episodes=[])
    wall = env_wait = tokens = generate = retries = failed = 0.0
    counts: dict[str, float] = {}
    need, rounds = num_groups, 0
    while True:
        res = await play(take_tasks(need), step * 1000 + rounds)
        total.dropped_groups += res.dropped_groups
        total.failures += res.failures
        wall += res.metrics["time/rollout_s"]
        env_wait += res.metrics["time/env_wait_frac"] * res.metrics["time/rollout_s"]
        tokens += res.metrics["throughput/tokens_per_s"] * res.metrics["time/rollout_s"]
        counts = sum_counters([counts, res.metrics], TOKEN_COUNTS + present(EVENT_COUNTS, [res.metrics]))
        generate += res.metrics["time/generate_s"]
        retries += res.metrics["rollout/episode_retries"]
        failed += res.metrics["rollout/failed_episodes"]
        for group in split_groups(res.episodes):
            # the curriculum observes the group's base episodes (a forked sibling replays a base's start)
            total.outcomes.append((group[0].task, [ep.won for ep in group if ep.fork is None]))
            if filter_groups and all_equal([ep.reward for ep in group]):
                total.filtered_groups += 1
            else:
                kept.append(group)
        if len(kept) >= num_groups or not filter_groups or rounds >= max_extra_rounds:
            break
        rounds += 1
        need = num_groups - len(kept)
    total.episodes = [ep for group in kept[:num_groups] for ep in group]
    total.metrics = rollout_metrics(total.episodes)
    total.metrics.update({
        "rollout/dropped_groups": float(total.dropped_groups),
        "rollout/episode_retries": retries,
        "rollout/failed_episodes": failed,
        "rollout/filtered_groups": float(total.filtered_groups),
        "rollout/extra_rounds": float(rounds),
        "time/rollout_s": wall,
        "time/env_wait_frac": env_wait / wall if wall > 0 else 0.0,
        "time/generate_s": generate,
        "throughput/tokens_per_s": tokens / wall if wall > 0 else 0.0,
        **counts,
    })
    return total


def sum_counters(parts: Iterable[Mapping[str, float]], keys: Iterable[str] | None = None) -> dict[str, float]:
    """Key-wise totals of counter dicts (rounds, Ray workers' chunks or streams): ``keys`` (default: every key seen),
    a key missing from a part counting 0. The one place counters such as :data:`TOKEN_COUNTS` add up."""
    parts = list(parts)
    names = list(keys) if keys is not None else list(dict.fromkeys(k for part in parts for k in part))
    return {name: sum(part.get(name, 0.0) for part in parts) for name in names}


def merge_parallel_results(results: Sequence[RolloutResult], *, wall_s: float) -> RolloutResult:
    """Several group players' :meth:`~agent_rl.rollout.groups.GroupPlayer.run_groups` results of one round played in
    parallel (the Ray workers' chunks) as one result: episodes and failures in the given order, counters and
    generation time summed, ``time/rollout_s`` the round's wall time ``wall_s``, the env-wait fraction weighted by each
    part's rollout time, throughput = all generated tokens / ``wall_s``."""
    parts = [r.metrics for r in results]
    busy = [m.get("time/rollout_s", 0.0) for m in parts]
    out = RolloutResult(episodes=[ep for r in results for ep in r.episodes],
                        dropped_groups=sum(r.dropped_groups for r in results),
                        failures=[f for r in results for f in r.failures])
    out.metrics = rollout_metrics(out.episodes)
    out.metrics.update({
        "rollout/dropped_groups": float(out.dropped_groups),
        "rollout/episode_retries": sum(m.get("rollout/episode_retries", 0.0) for m in parts),
        "rollout/failed_episodes": sum(m.get("rollout/failed_episodes", 0.0) for m in parts),
        "time/rollout_s": wall_s,
        "time/env_wait_frac": sum(m.get("time/env_wait_frac", 0.0) * b for m, b in zip(parts, busy)) /
        max(sum(busy), 1e-9),
        "time/generate_s": sum(m.get("time/generate_s", 0.0) for m in parts),
        "time/env_calls_s": sum(m.get("time/env_calls_s", 0.0) for m in parts),
        "throughput/tokens_per_s": sum(m.get("throughput/tokens_per_s", 0.0) * b for m, b in zip(parts, busy)) /
        max(wall_s, 1e-9),
        **sum_counters(parts, TOKEN_COUNTS + present(EVENT_COUNTS, parts)),
    })
    return out


def present(keys: Sequence[str], parts: Sequence[Mapping[str, float]]) -> tuple[str, ...]:
    """The ``keys`` some part has (:data:`EVENT_COUNTS` exist only in runs that have them: forks, the gateway)."""
    return tuple(k for k in keys if any(k in part for part in parts))


def split_groups(episodes: Sequence[Episode]) -> list[list[Episode]]:
    """A result's episodes cut into its groups: runs of consecutive episodes sharing ``task.group_id`` (the
    group player's order). Groups need not have G episodes: a forked group (``rollout.fork``) also holds its
    siblings."""
    out: list[list[Episode]] = []
    for ep in episodes:
        if out and out[-1][0].task.group_id == ep.task.group_id:
            out[-1].append(ep)
        else:
            out.append([ep])
    return out


def all_equal(rewards: Sequence[float]) -> bool:
    """DAPO filter of one group: its rewards are all equal within the estimators' tolerance (``dapo_keep_groups``:
    range <= 1e-6 * max(1, max |R|)), so float rounding does not keep a group whose advantages are all 0."""
    r = torch.tensor(rewards, dtype=torch.float64)
    return not bool(dapo_keep_groups(r, torch.zeros(len(rewards), dtype=torch.long)).any())


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Rollout metrics of algorithms.md section 6 over finished episodes (NaN-free: 0.0 when there are none).

    ``reward/mean`` mean episode reward; ``success/rate`` and ``success/<task_type>`` fraction won;
    ``response/length_mean`` mean response tokens per turn; ``response/truncated_frac`` turns cut by the token budget;
    ``episode/turns_mean``; ``episode/truncated_frac`` episodes that ended without termination (turn/prompt budget or
    the env's time limit); ``episode/invalid_action_frac`` invalid turns / turns (``..._high``: of the T1 episodes'
    turns, when there are any); ``rollout/groups`` the groups
    (``Task.group_id``) and ``rollout/groups_equal_frac`` the fraction whose episodes' rewards are all equal (a
    group of zero reward variance: every group advantage 0; 1.0 = the step has no learning signal);
    ``rollout/groups_mixed_success_frac`` the fraction with both won and lost episodes (a signal of success itself,
    where unequal rewards can also come from shaping such as ``rollout.invalid_penalty``).
    """
    turns = [t for ep in episodes for t in ep.turns]
    n_ep, n_turns = max(len(episodes), 1), max(len(turns), 1)
    metrics = {
        "reward/mean": sum(ep.reward for ep in episodes) / n_ep,
        "success/rate": sum(ep.won for ep in episodes) / n_ep,
        "response/length_mean": sum(len(t.response_ids) for t in turns) / n_turns,
        "response/truncated_frac": sum(t.response_truncated for t in turns) / n_turns,
        "episode/turns_mean": len(turns) / n_ep,
        "episode/truncated_frac": sum(not (ep.turns and ep.turns[-1].terminated) for ep in episodes) / n_ep,
        "episode/invalid_action_frac": sum(t.invalid for t in turns) / n_turns,
        "rollout/episodes": float(len(episodes)),
    }
    high = [t for ep in episodes if ep.is_high for t in ep.turns]
    if high:  # TGRL's T1 episodes alone (the temperature a calibration probe chooses)
        metrics["episode/invalid_action_frac_high"] = sum(t.invalid for t in high) / len(high)
    groups: dict[Any, list[float]] = {}
    wins: dict[Any, set[bool]] = {}
    for ep in episodes:
        groups.setdefault(ep.task.group_id, []).append(ep.reward)
        wins.setdefault(ep.task.group_id, set()).add(bool(ep.won))
    metrics["rollout/groups"] = float(len(groups))
    metrics["rollout/groups_equal_frac"] = sum(map(all_equal, groups.values())) / max(len(groups), 1)
    # groups with both won and lost episodes: the signal of success itself (unequal rewards may come from shaping
    # alone, e.g. rollout.invalid_penalty)
    metrics["rollout/groups_mixed_success_frac"] = sum(len(w) == 2 for w in wins.values()) / max(len(wins), 1)
    by_type: dict[str, list[bool]] = {}
    for ep in episodes:
        if ep.task_type:
            by_type.setdefault(str(ep.task_type), []).append(ep.won)
    for name, wins in sorted(by_type.items()):
        metrics[f"success/{name}"] = sum(wins) / len(wins)
    return metrics
