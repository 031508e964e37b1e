"""Cancelling a rollout at any point (vllm PR #35506's kind): ``RolloutOrchestrator.collect`` cancelled before, during
and after its env resets and generations leaves no task running (``asyncio.all_tasks()`` is the test's own), no
exception unretrieved (the loop's exception handler sees nothing, after a ``gc.collect``), every env session closed
and no engine cache kept. Before the fix only the awaited group was cancelled: the other groups' episodes kept running
and died with ``AssertionError`` at ``assert self._batcher is not None`` ("Task exception was never retrieved").
Real hf engine on the tiny model, ChooseItem through ``LocalEnvPool``; the same for the asynchronous producer's
stream (``play_group``)."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import torch

from agent_rl.engines import get_engine
from agent_rl.learner.config import AlgoConfig, ModelConfig
from agent_rl.models import load_policy
from agent_rl.rollout import GroupSpec, RolloutConfig, RolloutOrchestrator, TaskSampler, TaskSamplerConfig
from agent_rl.rollout import get_prompt
from waiting import HANG_S

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def policy():
    model, tok = load_policy(ModelConfig(name="tiny"))
    return model.eval(), tok


async def _settle(engine) -> None:
    """Let cancelled tasks finish their ``finally`` blocks and a generation still running in a worker thread end."""
    deadline = time.monotonic() + HANG_S  # the ceiling only catches a generation or a task that never ends
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        if not engine.store.in_flight and asyncio.all_tasks() == {asyncio.current_task()}:
            break
    for _ in range(5):
        await asyncio.sleep(0)
    gc.collect()  # an unretrieved task exception is reported when its task is collected
    await asyncio.sleep(0)


def _run_and_cancel(policy, when, *, stream: bool = False):
    """Start a 4-group collect (or 4 ``play_group`` calls on a stream), cancel it when ``when(state)`` says, and
    return what was left: (tasks still alive, loop error contexts, open env sessions, engine cached tokens)."""
    from agent_rl.envclient import LocalEnvPool

    model, tok = policy
    engine = get_engine("hf", model, tok, seed=0)
    cfg = RolloutConfig(mode="trajectory", max_turns=3, stop=["</action>"], max_concurrent_episodes=3)
    sampler = TaskSampler("agent_rl/ChooseItem-v0", TaskSamplerConfig(kind="seed"), seed=0)
    state = {"turns": 0}

    async def go():
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        pool = LocalEnvPool()
        try:
            orch = RolloutOrchestrator(pool, engine, get_prompt("generic"), cfg, max_new_tokens=6, seed=0,
                                       on_turn=lambda gen: state.__setitem__("turns", state["turns"] + 1))
            algo = AlgoConfig(name="tgrl", warmup_steps=0)
            if stream:
                await orch.open_stream(seed_key=1)
                temps = [(1.0, False)] * 4
                job = asyncio.ensure_future(asyncio.gather(
                    *(orch.play_group(GroupSpec(t, temps)) for t in sampler.sample(4))))
            else:
                job = asyncio.ensure_future(orch.collect(sampler.sample, 4, algo, step=1))
            while not when(state) and not job.done():
                await asyncio.sleep(0.005)
            finished = job.done()
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await job
            if stream:
                await orch.close_stream()
            await _settle(engine)
            alive = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            return finished, alive, errors, len(pool.manager.sessions), engine.cached_tokens
        finally:
            await pool.aclose()

    return asyncio.run(go())


POINTS = {  # when to cancel
    "at_once": lambda s: True,
    "during_resets": lambda s: s.setdefault("ticks", 0) >= 2 or s.__setitem__("ticks", s["ticks"] + 1),
    "after_first_turn": lambda s: s["turns"] >= 1,
    "mid_rollout": lambda s: s["turns"] >= 5,
}


@pytest.mark.parametrize("stream", [False, True], ids=["collect", "stream"])
@pytest.mark.parametrize("point", list(POINTS))
def test_a_cancelled_rollout_leaves_nothing_behind(policy, point, stream):
    finished, alive, errors, sessions, cached = _run_and_cancel(policy, POINTS[point], stream=stream)
    assert not finished  # the cancel hit a running rollout
    assert alive == []
    assert errors == [], [e.get("message") for e in errors]
    assert sessions == 0
    assert cached == 0


def test_gather_all_cancels_and_awaits_the_rest_and_raises_the_first_error_as_it_is():
    from agent_rl.aio import gather_all

    async def main():
        finished: list[str] = []

        async def slow(name: str):
            try:
                await asyncio.sleep(10)
            finally:
                finished.append(name)  # its clean-up ran before gather_all returned

        async def fail():
            await asyncio.sleep(0.01)
            raise KeyError("boom")

        assert await gather_all(asyncio.sleep(0, "a"), asyncio.sleep(0.01, "b")) == ["a", "b"]  # in order
        with pytest.raises(KeyError, match="boom"):  # the error itself, not an ExceptionGroup
            await gather_all(slow("x"), fail(), slow("y"))
        assert sorted(finished) == ["x", "y"]
        finished.clear()
        outer = asyncio.ensure_future(gather_all(slow("p"), slow("q")))
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert sorted(finished) == ["p", "q"]
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
