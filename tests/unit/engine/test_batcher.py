"""Continuous batching: steps queued while a decode runs share the next one; failures reach every caller."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.engine.batcher import StepBatcher
from proxy.engine.llama import Evaluation, Step
from proxy.engine.runner import EngineRunner
from proxy.errors import BadRequestError

HOLD_S = 5.0  # how long a held decode or a waiting test gives the other side before failing


class RecordingEngine:
    """Answers each step with its sequence id as the logit row, records every shared decode.

    Tests order themselves against it by events: `released` holds decodes while cleared, `decoding` is set once
    a decode has begun (on the engine's thread), and `checked` once a caller's step has been checked (on the
    event loop; `StepBatcher.evaluate` queues the step right after, before it first awaits).
    """

    def __init__(self, fail: bool = False) -> None:
        self.decodes: list[list[int]] = []
        self.fail = fail
        self.released = threading.Event()
        self.released.set()
        self.decoding = threading.Event()
        self.checked = asyncio.Event()

    def check(self, tokens: Sequence[int], first_logit_row: int) -> None:
        if not tokens:
            raise BadRequestError("no input tokens")
        self.checked.set()

    def evaluate_steps(self, steps: Sequence[Step]) -> list[Evaluation]:
        self.decoding.set()
        if not self.released.wait(HOLD_S):
            raise RuntimeError("the test never released the decode")
        self.decodes.append([s.seq for s in steps])
        if self.fail:
            raise RuntimeError("llama_decode returned -1")
        return [Evaluation(np.array([[float(s.seq)]]), 0) for s in steps]

    def close(self) -> None:
        pass


@pytest.fixture
def engine() -> RecordingEngine:
    return RecordingEngine()


async def held_decode(batcher: StepBatcher, engine: RecordingEngine, seq: int) -> asyncio.Task[Evaluation]:
    """Start a caller whose decode begins and is held until `engine.released` is set."""
    engine.released.clear()
    task = asyncio.create_task(batcher.evaluate(seq, [1], 0))
    assert await asyncio.to_thread(engine.decoding.wait, HOLD_S), "the decode never began"
    return task


async def queued(batcher: StepBatcher, engine: RecordingEngine, seq: int, tokens: Sequence[int] = (1,),
                 first_logit_row: int = 0) -> asyncio.Task[Evaluation]:
    """Start a caller and return once its step is queued."""
    engine.checked.clear()
    task = asyncio.create_task(batcher.evaluate(seq, tokens, first_logit_row))
    await asyncio.wait_for(engine.checked.wait(), HOLD_S)
    return task


async def test_steps_queued_during_a_decode_share_the_next_one(engine: RecordingEngine) -> None:
    batcher = StepBatcher(EngineRunner(engine))  # type: ignore[arg-type]
    first = await held_decode(batcher, engine, 0)
    rest = [await queued(batcher, engine, seq) for seq in (1, 2, 3)]
    engine.released.set()
    results = await asyncio.gather(first, *rest)
    assert [r.logits[0, 0] for r in results] == [0.0, 1.0, 2.0, 3.0]
    assert engine.decodes == [[0], [1, 2, 3]]


async def test_callers_in_lockstep_keep_sharing_decodes(engine: RecordingEngine) -> None:
    batcher = StepBatcher(EngineRunner(engine))  # type: ignore[arg-type]

    async def draft(seq: int) -> None:
        for _ in range(5):
            await batcher.evaluate(seq, [1], 0)

    await asyncio.gather(*(draft(seq) for seq in range(4)))
    assert engine.decodes == [[0, 1, 2, 3]] * 5


async def test_a_failed_decode_fails_its_callers_and_a_bad_step_fails_alone() -> None:
    engine = RecordingEngine(fail=True)
    batcher = StepBatcher(EngineRunner(engine))  # type: ignore[arg-type]
    results = await asyncio.gather(batcher.evaluate(0, [1], 0), batcher.evaluate(1, [1], 0), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    with pytest.raises(BadRequestError):
        await batcher.evaluate(2, [], 0)
    assert engine.decodes == [[0, 1]]  # the bad step never reached the engine


async def test_a_caller_that_left_is_dropped_and_its_sequence_serves_the_next(engine: RecordingEngine) -> None:
    batcher = StepBatcher(EngineRunner(engine))  # type: ignore[arg-type]
    running = await held_decode(batcher, engine, 0)  # a decode holds the engine; the next steps queue
    gone = await queued(batcher, engine, 1)
    gone.cancel()  # its client hung up; sequence 1 goes to another request
    successor = await queued(batcher, engine, 1, [1, 2], 1)
    engine.released.set()
    await running
    assert (await successor).logits[0, 0] == 1.0
    assert engine.decodes == [[0], [1]]  # the departed step never reached the engine
