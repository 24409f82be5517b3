"""The core gate: a draft model and its target take turns, many calls of one side at once, neither starving."""

from __future__ import annotations

import asyncio
import threading

import pytest

from proxy.engine.gate import DRAFT, TARGET, CoreGate, Side
from proxy.engine.runner import EngineRunner


class Journal:
    """Calls that hold the gate until released, and what was inside it at each entry."""

    def __init__(self, gate: CoreGate) -> None:
        self.gate = gate
        self.entered: list[str] = []
        self.inside: set[str] = set()
        self.overlaps: list[set[str]] = []  # the calls inside when a call of the other side entered
        self.releases: dict[str, asyncio.Event] = {}

    def call(self, name: str, side: Side) -> asyncio.Task[None]:
        self.releases[name] = asyncio.Event()

        async def run() -> None:
            async with self.gate.turn(side):
                if any(other[0] != name[0] for other in self.inside):
                    self.overlaps.append(set(self.inside))
                self.entered.append(name)
                self.inside.add(name)
                await self.releases[name].wait()
                self.inside.discard(name)

        return asyncio.create_task(run())

    async def release(self, *names: str) -> None:
        for name in names:
            self.releases[name].set()
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_sides_calls_share_the_gate_and_the_other_side_waits() -> None:
    journal = Journal(CoreGate())
    tasks = [journal.call("t1", TARGET), journal.call("t2", TARGET)]
    await settle()
    tasks.append(journal.call("d1", DRAFT))
    await settle()
    assert journal.entered == ["t1", "t2"]  # both target calls at once; the draft waits
    await journal.release("t1")
    assert journal.entered == ["t1", "t2"]  # ... until the last target call leaves
    await journal.release("t2")
    assert journal.entered == ["t1", "t2", "d1"]
    await journal.release("d1")
    await asyncio.gather(*tasks)
    assert journal.overlaps == [] and journal.gate.holder is None and journal.gate.turns == 1


async def test_a_waiting_side_goes_before_newcomers_of_the_side_that_holds() -> None:
    journal = Journal(CoreGate())
    tasks = [journal.call("t1", TARGET)]
    await settle()
    tasks += [journal.call("d1", DRAFT), journal.call("d2", DRAFT)]
    await settle()
    tasks.append(journal.call("t2", TARGET))  # the target holds the gate, but the draft waits: t2 queues behind it
    await settle()
    assert journal.entered == ["t1"]
    await journal.release("t1")
    assert journal.entered == ["t1", "d1", "d2"]  # the draft's waiting calls, in their order, together
    await journal.release("d1", "d2")
    assert journal.entered == ["t1", "d1", "d2", "t2"]
    await journal.release("t2")
    await asyncio.gather(*tasks)
    assert journal.overlaps == []


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_gets_its_turn() -> None:
    journal = Journal(CoreGate())
    tasks = [journal.call("d1", DRAFT)]
    await settle()
    leaving, staying = journal.call("t1", TARGET), journal.call("t2", TARGET)
    await settle()
    leaving.cancel()
    await journal.release("d1")
    assert journal.entered == ["d1", "t2"]
    await journal.release("t2")
    await asyncio.gather(*tasks, staying)
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert journal.gate.holder is None and journal.gate.holding == 0


async def test_a_call_admitted_as_it_is_cancelled_hands_its_turn_on() -> None:
    gate = CoreGate()
    journal = Journal(gate)
    first = journal.call("d1", DRAFT)
    await settle()
    admitted = journal.call("t1", TARGET)
    await settle()
    journal.releases["d1"].set()
    await first  # d1 left: t1 is admitted, and cancelled before it runs
    admitted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitted
    assert gate.holder is None and gate.holding == 0
    later = journal.call("d2", DRAFT)
    await journal.release("d2")
    await later


class Blocking:
    """An engine stand-in whose calls record, on the engine's thread, whether the target held the gate."""

    def __init__(self, gate: CoreGate) -> None:
        self.gate = gate
        self.seen: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()

    def work(self, name: str) -> str:
        with self.lock:
            self.seen.append((name, self.gate.holder))
        return name

    def close(self) -> None:
        pass


async def test_a_draft_engine_that_takes_turns_runs_only_in_the_drafts_turn_and_in_order() -> None:
    gate = CoreGate()
    engine = Blocking(gate)
    runner = EngineRunner(engine)  # type: ignore[arg-type]
    runner.gate = gate
    target_done = asyncio.Event()

    async def target_call() -> None:
        async with gate.turn(TARGET):
            await target_done.wait()

    target = asyncio.create_task(target_call())
    await settle()
    futures = [runner.submit(engine.work, f"step {i}") for i in range(3)]
    await asyncio.sleep(0.05)
    assert engine.seen == []  # the target's turn: the draft's calls wait
    target_done.set()
    assert await asyncio.gather(*futures) == ["step 0", "step 1", "step 2"]
    assert engine.seen == [(f"step {i}", DRAFT) for i in range(3)]
    await target
    runner.close()


async def test_without_a_gate_the_engine_runs_at_once() -> None:
    gate = CoreGate()
    engine = Blocking(gate)
    runner = EngineRunner(engine)  # type: ignore[arg-type]
    async with gate.turn(TARGET):  # a gate the runner does not know of holds nothing back
        assert await runner.run(engine.work, "step") == "step"
    assert engine.seen == [("step", TARGET)]
    runner.close()
