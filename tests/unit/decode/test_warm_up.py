"""Warming up: while the draft model reads the prompt, the target decodes plainly; drafting starts once it is read."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from proxy.config.schema import FallbackConfig
from proxy.control.costs import RouteCosts
from proxy.control.policy import Choice, PinnedPolicy, RequestPolicy
from proxy.decode.decision import Decision, Plain, Speculate
from proxy.decode.events import PlainEvent, ReadEvent, SwitchEvent
from proxy.decode.loop import FIRST_CHUNK, PLAIN_CHUNK, START_CHUNK
from proxy.sampling.processors import SamplingParams
from tests.fakes.drafter import ScriptedDrafter
from tests.fakes.toy_model import END, ToyModel
from tests.unit.decode.harness import PROMPT, Served, follow, rounds, run


class SlowReader(ScriptedDrafter):
    """Follows the target; reading the prompt ends only when the test says (or when cancelled)."""

    def __init__(self, model: ToyModel, *, looks_up: bool = False) -> None:
        super().__init__(follow(model).script)
        self.model, self.looks_up = model, looks_up
        self.done_reading = asyncio.Event()
        self.reading: asyncio.Future[None] | None = None
        self.chunks_read: list[int] = []  # each read chunk's context length

    def prefill(self, request_id: str, context: Sequence[int]) -> asyncio.Future[None]:
        self.reading = asyncio.ensure_future(self.done_reading.wait())
        return self.reading

    async def _predict(self, context: Sequence[int], tokens: Sequence[int]) -> list[int]:
        self.chunks_read.append(len(context))
        return [self.model.greedy([*context, *tokens[:i]], 1)[0] for i in range(len(tokens))]

    def read(self, request_id: str, context: Sequence[int], tokens: Sequence[int]) -> asyncio.Future[list[int]]:
        return asyncio.ensure_future(self._predict(context, tokens))


class ReadAfter(PinnedPolicy):
    """Pinned k; lets the drafter finish reading the prompt once the target has decoded `chunks` plain chunks."""

    def __init__(self, k: int, drafter: SlowReader, chunks: int) -> None:
        super().__init__(k)
        self.drafter, self.chunks = drafter, chunks

    def observe(self, event) -> None:
        self.chunks -= isinstance(event, PlainEvent)
        if self.chunks == 0:
            self.drafter.done_reading.set()


def plain_events(events) -> list[PlainEvent]:
    return [e for e in events if isinstance(e, PlainEvent)]


async def test_the_target_decodes_plainly_until_the_draft_has_read_the_prompt(served: Served) -> None:
    drafter = SlowReader(served.model)
    batches, events = await run(served, drafter, 30, policy=ReadAfter(4, drafter, chunks=2), warm_up=True)
    assert sum(batches, []) == served.model.greedy(PROMPT, 30)
    chunks = plain_events(events)  # the reading ends as the second chunk comes back: the loop may start a third
    sizes = [FIRST_CHUNK] + [START_CHUNK] * (len(chunks) - 1)  # the prefill's chunk: its token comes at once
    assert len(chunks) in (2, 3) and [len(b) for b in batches[:len(chunks)]] == sizes
    assert [e.prefill for e in chunks] == [True] + [False] * (len(chunks) - 1)
    assert chunks[0].draft_busy and chunks[1].draft_busy  # decoded while the draft read the prompt
    # The draft reads the chunks, in order, then drafts after them; a greedy draft's reading says what it would
    # have drafted before each token (here: the target's own choice).
    assert drafter.chunks_read == [len(PROMPT) + sum(sizes[:i]) for i in range(len(chunks))]
    reads = [e for e in events if isinstance(e, ReadEvent)]
    assert [e.tokens for e in reads] == [e.tokens for e in chunks] and all(all(e.agreed) for e in reads)
    assert drafter.calls[0] == (len(PROMPT) + sum(sizes), 4)
    assert len(rounds(events)) >= 2 and all(e.accepted == 4 for e in rounds(events)[:-1])


async def test_a_sampled_requests_reading_says_nothing_of_its_drafts(served: Served) -> None:
    # Where chunks end depends on timing, and so what a seeded request samples: with no end token it outlasts the
    # reading whatever it samples.
    served.model.table[:, :, END] = -1e9
    drafter = SlowReader(served.model)
    _, events = await run(served, drafter, 30, policy=ReadAfter(4, drafter, chunks=2), warm_up=True,
                          params=SamplingParams(temperature=1.0))
    assert drafter.chunks_read and not any(isinstance(e, ReadEvent) for e in events)


async def test_without_warm_up_the_first_round_waits_for_the_draft(served: Served) -> None:
    drafter = SlowReader(served.model)
    batches, events = await run(served, drafter, 12, k=4)
    assert drafter.reading is None and not plain_events(events)  # the loop never asked the drafter to read
    assert sum(batches, []) == served.model.greedy(PROMPT, 12)


async def test_a_lookup_drafter_verifies_lookups_while_its_model_reads(served: Served) -> None:
    drafter = SlowReader(served.model, looks_up=True)
    batches, events = await run(served, drafter, 12, k=4, lookup_k=4, warm_up=True)
    assert sum(batches, []) == served.model.greedy(PROMPT, 12)
    assert drafter.calls and all(k == 0 for _, k in drafter.calls)  # the model is never asked for tokens
    assert rounds(events) and not plain_events(events)
    assert drafter.reading is not None and drafter.reading.cancelled()  # stopped at the end of the request


async def test_after_lookup_misses_only_a_greedy_request_or_a_drafting_model_reads_the_chunks(served: Served) -> None:
    for temperature, k, reads in [(1.0, 0, False), (0.0, 0, True), (1.0, 4, True)]:
        drafter = SlowReader(served.model, looks_up=True)
        drafter.script = lambda context, k: []  # every lookup misses, and the model drafts nothing
        drafter.done_reading.set()
        _, events = await run(served, drafter, 12, policy=PinnedPolicy(k), lookup_k=4, warm_up=True,
                              params=SamplingParams(temperature=temperature))
        assert plain_events(events) and bool(drafter.chunks_read) == reads, (temperature, k)


async def test_lookup_rounds_do_not_wait_for_the_model_to_read_the_last_chunk(served: Served) -> None:
    drafter = SlowReader(served.model, looks_up=True)
    drafter.done_reading.set()  # the prompt is read; the chunks' reading never ends while the request runs
    drafter.read = lambda request_id, context, tokens: asyncio.ensure_future(asyncio.Event().wait())
    follows = drafter.script
    drafter.script = lambda context, k: [] if len(context) == len(PROMPT) else follows(context, k)  # one miss
    batches, events = await asyncio.wait_for(run(served, drafter, 20, policy=PinnedPolicy(0), lookup_k=4,
                                                 warm_up=True), timeout=10)
    assert sum(batches, []) == served.model.greedy(PROMPT, 20)
    assert len(plain_events(events)) == 1 and rounds(events)  # the chunk's reading was still in flight
    assert all(k == 0 for _, k in drafter.calls)  # the model, off, was never asked to draft


async def test_a_client_gone_while_the_draft_reads_stops_the_reading(served: Served) -> None:
    drafter = SlowReader(served.model)
    task = asyncio.ensure_future(run(served, drafter, 200, k=4, warm_up=True))
    while len(served.bodies(scoring=False)) < 1:
        await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.wait({task})
    assert drafter.reading is not None and drafter.reading.cancelled()


def test_a_chunk_that_paid_the_prompts_prefill_does_not_measure_the_plain_rate() -> None:
    costs = RouteCosts(0.5, 4)
    costs.observe(PlainEvent("r", "route", (1, 2, 3, 4), seconds=4.0, prefill=True))
    assert costs.plain_rate is None
    costs.observe(PlainEvent("r", "route", (1, 2, 3, 4), seconds=0.4))
    assert costs.plain_rate == 10.0


class PlainThenDraft(PinnedPolicy):
    """Says K = 0 for the first `plain` decisions, then drafts k."""

    def __init__(self, k: int, plain: int) -> None:
        super().__init__(k)
        self.k, self.plain = k, plain

    def decide(self) -> Decision:
        self.plain -= 1
        return Plain("scripted") if self.plain >= 0 else Speculate(self.k, "scripted")


async def test_a_greedy_request_that_reads_along_goes_back_to_drafting(served: Served) -> None:
    drafter = SlowReader(served.model)
    drafter.done_reading.set()
    batches, events = await run(served, drafter, 40, policy=PlainThenDraft(4, plain=2), warm_up=True)
    assert sum(batches, []) == served.model.greedy(PROMPT, 40)
    assert [len(b) for b in batches[:2]] == [FIRST_CHUNK, PLAIN_CHUNK]  # the prefill's chunk is short
    assert len([e for e in events if isinstance(e, SwitchEvent)]) == 1
    assert drafter.chunks_read == [len(PROMPT), len(PROMPT) + FIRST_CHUNK]
    assert rounds(events) and drafter.calls[0] == (len(PROMPT) + FIRST_CHUNK + PLAIN_CHUNK, 4)


async def test_a_sampled_request_switches_for_good(served: Served) -> None:
    drafter = SlowReader(served.model)
    drafter.done_reading.set()
    _, events = await run(served, drafter, 40, policy=PlainThenDraft(4, plain=1), warm_up=True,
                          params=SamplingParams(temperature=1.0))
    assert not rounds(events) and not drafter.calls and not drafter.chunks_read


async def test_on_a_fresh_route_a_greedy_request_measures_plain_decoding_then_reads_two_chunks(served: Served) -> None:
    drafter = SlowReader(served.model)
    drafter.done_reading.set()
    policy = RequestPolicy(RouteCosts(0.1, 4), FallbackConfig(k_min=4, k_max=4), 4, Choice(4, "not measured"),
                           reads_along=True)
    batches, events = await run(served, drafter, 60, policy=policy, warm_up=True)
    assert sum(batches, []) == served.model.greedy(PROMPT, 60)
    chunks = plain_events(events[: events.index(rounds(events)[0])])
    # The prefill's chunk measures nothing, the next one the plain rate, with the draft idle: neither is read.
    measuring, read = chunks[:2], chunks[2:]
    assert [len(e.tokens) for e in measuring] == [FIRST_CHUNK, PLAIN_CHUNK] and not any(e.draft_busy for e in measuring)
    assert drafter.chunks_read[0] == len(PROMPT) + FIRST_CHUNK + PLAIN_CHUNK
    # Each chunk is read while the target decodes the next, so the decision may see one chunk fewer.
    assert len(read) in (2, 3) and drafter.calls[0][0] == len(PROMPT) + sum(len(e.tokens) for e in chunks)
    assert not [e for e in events if isinstance(e, SwitchEvent)]  # measuring and reading first is no switch


class GivesUpAfter(PinnedPolicy):
    """Plain decoding throughout; the model draft may pay until `chunks` plain chunks have been decoded."""

    def __init__(self, chunks: int) -> None:
        super().__init__(4)
        self.chunks = chunks

    def decide(self) -> Decision:
        return Plain("scripted")

    def observe(self, event) -> None:
        self.chunks -= isinstance(event, PlainEvent)

    def model_may_pay(self) -> bool:
        return self.chunks > 0


async def test_a_greedy_request_whose_draft_cannot_pay_stops_reading(served: Served) -> None:
    drafter = SlowReader(served.model)
    drafter.done_reading.set()
    batches, events = await run(served, drafter, 40, policy=GivesUpAfter(chunks=2), warm_up=True)
    assert sum(batches, []) == served.model.greedy(PROMPT, 40)
    # The second chunk's reading, still in flight at the switch, ends before plain decoding goes on; then no more.
    assert drafter.chunks_read == [len(PROMPT), len(PROMPT) + FIRST_CHUNK]
    assert len(plain_events(events)) > 2 and len([e for e in events if isinstance(e, ReadEvent)]) == 2
    assert len([e for e in events if isinstance(e, SwitchEvent)]) == 1 and not rounds(events)


async def test_a_request_whose_model_may_not_draft_has_it_read_nothing(served: Served) -> None:
    drafter = SlowReader(served.model, looks_up=True)
    drafter.script = lambda context, k: []  # every lookup misses
    batches, events = await run(served, drafter, 30, policy=GivesUpAfter(chunks=0), lookup_k=4, warm_up=True)
    assert sum(batches, []) == served.model.greedy(PROMPT, 30) and plain_events(events)
    assert drafter.reading is None and not drafter.chunks_read  # neither the prompt nor any chunk


async def test_a_model_rounds_draft_time_counts_its_wait_for_the_models_reading(served: Served) -> None:
    drafter = SlowReader(served.model)
    drafter.done_reading.set()
    predict = drafter._predict

    async def slow_predict(context: Sequence[int], tokens: Sequence[int]) -> list[int]:
        await asyncio.sleep(0.2)
        return await predict(context, tokens)

    drafter._predict = slow_predict
    _, events = await run(served, drafter, 40, policy=PlainThenDraft(4, plain=2), warm_up=True)
    # The target idled while the model read the last chunk: that is part of what the round cost.
    assert rounds(events)[0].draft_seconds >= 0.2
