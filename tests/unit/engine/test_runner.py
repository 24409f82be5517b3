"""Chained steps on the engine's thread: values in order, other callers taking turns, early stops and failures."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import pytest

from proxy.engine.gate import CoreGate
from proxy.engine.runner import EngineRunner

HOLD_S = 5.0  # how long a held step or a waiting test gives the other side before failing


class Steps:
    """Numbered steps on the engine's thread: step `hold_at` waits for `released`, `started[i]` is set as i begins."""

    def __init__(self, count: int, hold_at: int | None = None, fail_at: int | None = None) -> None:
        self.count = count
        self.hold_at = hold_at
        self.fail_at = fail_at
        self.journal: list[str] = []  # what ran on the engine's thread, in order
        self.released = threading.Event()
        self.started = [threading.Event() for _ in range(count)]

    def __call__(self) -> tuple[int, bool]:
        index = sum(entry.startswith("step") for entry in self.journal)
        self.journal.append(f"step {index}")
        self.started[index].set()
        if index == self.hold_at and not self.released.wait(HOLD_S):
            raise RuntimeError("the test never released the step")
        if index == self.fail_at:
            raise ValueError("llama_decode returned -1")
        return index, index + 1 < self.count


def runner() -> EngineRunner:
    return EngineRunner(None)  # type: ignore[arg-type]  # chain and run never touch the engine


async def started(steps: Steps, index: int) -> None:
    assert await asyncio.to_thread(steps.started[index].wait, HOLD_S), f"step {index} never began"


async def test_values_come_in_order_until_a_step_says_no_more() -> None:
    steps = Steps(5)
    assert [value async for value in runner().chain(steps)] == [0, 1, 2, 3, 4]
    assert steps.journal == [f"step {i}" for i in range(5)]


async def test_the_next_step_runs_without_waiting_for_the_caller() -> None:
    steps = Steps(3)
    async with aclosing(runner().chain(steps)) as values:
        assert await anext(values) == 0
        # The caller still holds value 0; on the old per-step calls step 1 would not start before it asked.
        await started(steps, 1)
        assert [value async for value in values] == [1, 2]


async def test_calls_queued_meanwhile_run_between_two_steps() -> None:
    engine_runner, steps = runner(), Steps(3, hold_at=0)
    values = asyncio.create_task(_collect(engine_runner, steps))
    await started(steps, 0)
    other = asyncio.create_task(engine_runner.run(steps.journal.append, "another request"))
    await asyncio.sleep(0)  # the other call is queued while step 0 still runs
    steps.released.set()
    await other
    assert await values == [0, 1, 2]
    assert steps.journal == ["step 0", "another request", "step 1", "step 2"]


async def test_two_chains_take_turns_step_by_step() -> None:
    engine_runner, journal = runner(), []
    first_began, go = threading.Event(), threading.Event()

    def steps(name: str) -> Callable[[], tuple[int, bool]]:
        done = iter(range(4))

        def step() -> tuple[int, bool]:
            index = next(done)
            if name == "a" and index == 0:  # held until the other chain has queued its first step
                first_began.set()
                go.wait(HOLD_S)
            journal.append(f"{name} {index}")
            return index, index < 3
        return step

    a = asyncio.create_task(_drain(engine_runner.chain(steps("a"))))
    assert await asyncio.to_thread(first_began.wait, HOLD_S)
    b = asyncio.create_task(_drain(engine_runner.chain(steps("b"))))
    await asyncio.sleep(0)  # b's chain queues its first step
    go.set()
    assert await asyncio.gather(a, b) == [[0, 1, 2, 3], [0, 1, 2, 3]]
    # Neither runs on alone while the other waits: each step queues behind the other's.
    assert journal == ["a 0", "b 0", "a 1", "b 1", "a 2", "b 2", "a 3", "b 3"]


async def test_a_caller_that_stops_drops_the_steps_not_started() -> None:
    engine_runner, steps = runner(), Steps(10, hold_at=1)
    async with aclosing(engine_runner.chain(steps)) as values:
        assert await anext(values) == 0
        await started(steps, 1)
    steps.released.set()  # step 1 was running when the caller left: it ends, and queues nothing that runs
    await engine_runner.run(steps.journal.append, "flushed")
    assert steps.journal == ["step 0", "step 1", "flushed"]


async def test_a_cancelled_caller_drops_the_steps_not_started() -> None:
    engine_runner, steps = runner(), Steps(10, hold_at=1)
    task = asyncio.create_task(_collect(engine_runner, steps))
    await started(steps, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    steps.released.set()
    await engine_runner.run(steps.journal.append, "flushed")
    assert steps.journal == ["step 0", "step 1", "flushed"]


async def test_a_failing_step_raises_its_error_to_the_caller_after_the_values_before_it() -> None:
    steps = Steps(5, fail_at=2)
    seen: list[int] = []
    with pytest.raises(ValueError, match="llama_decode"):
        async for value in runner().chain(steps):
            seen.append(value)
    assert seen == [0, 1]
    assert steps.journal == ["step 0", "step 1", "step 2"]


async def test_a_gated_engine_refuses_chained_steps() -> None:
    gated = runner()
    gated.gate = CoreGate()
    with pytest.raises(ValueError, match="gate"):
        await anext(gated.chain(Steps(1)))


async def _drain(values: AsyncIterator[int]) -> list[int]:
    return [value async for value in values]


async def _collect(engine_runner: EngineRunner, steps: Steps) -> list[int]:
    return [value async for value in engine_runner.chain(steps)]
