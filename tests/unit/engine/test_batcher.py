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


class RecordingEngine:
    """Answers each step with its sequence id as the logit row, records every shared decode."""

    def __init__(self, fail: bool = False) -> None:
        self.decodes: list[list[int]] = []
        self.fail = fail
        self.gate = threading.Event()
        self.gate.set()

    def check(self, tokens: Sequence[int], first_logit_row: int) -> None:
        if not tokens:
            raise BadRequestError("no input tokens")

    def evaluate_steps(self, steps: Sequence[Step]) -> list[Evaluation]:
        self.gate.wait(5)
        self.decodes.append([s.seq for s in steps])
        if self.fail:
            raise RuntimeError("llama_decode returned -1")
        return [Evaluation(np.array([[float(s.seq)]]), 0) for s in steps]

    def close(self) -> None:
        pass


@pytest.fixture
def engine() -> RecordingEngine:
    return RecordingEngine()


async def test_steps_queued_during_a_decode_share_the_next_one(engine: RecordingEngine) -> None:
    batcher = StepBatcher(EngineRunner(engine))  # type: ignore[arg-type]
    engine.gate.clear()
    first = asyncio.create_task(batcher.evaluate(0, [1], 0))
    await asyncio.sleep(0.01)  # the first decode is running (held at the gate)
    rest = [asyncio.create_task(batcher.evaluate(seq, [1], 0)) for seq in (1, 2, 3)]
    await asyncio.sleep(0.01)
    engine.gate.set()
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
    engine.gate.clear()
    running = asyncio.create_task(batcher.evaluate(0, [1], 0))
    await asyncio.sleep(0.01)  # a decode holds the engine; the next steps queue
    gone = asyncio.create_task(batcher.evaluate(1, [1], 0))
    await asyncio.sleep(0.01)
    gone.cancel()  # its client hung up; sequence 1 goes to another request
    successor = asyncio.create_task(batcher.evaluate(1, [1, 2], 1))
    await asyncio.sleep(0.01)
    engine.gate.set()
    await running
    assert (await successor).logits[0, 0] == 1.0
    assert engine.decodes == [[0], [1]]  # the departed step never reached the engine
