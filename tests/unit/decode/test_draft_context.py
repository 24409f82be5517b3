"""A generation that outgrows the draft model's context: the model stops drafting and reading, the rest is decoded
plainly or drafted by lookups, and the output stays the target's."""

from __future__ import annotations

from proxy.decode.events import PlainEvent, SwitchEvent
from proxy.decode.loop import DRAFT_ROOM, OUTGROWN
from tests.unit.decode.harness import PROMPT, Served, follow, rounds, run

ROOM = 12  # context tokens past the prompt that the draft model holds beyond the room a round may need


def small_context(drafter, looks_up: bool = False):
    """The drafter with a context that holds the prompt and ROOM tokens more (plus a round's room)."""
    drafter.fits = lambda n_tokens: n_tokens <= len(PROMPT) + ROOM + DRAFT_ROOM
    drafter.looks_up = looks_up
    return drafter


async def test_a_model_draft_switches_to_plain_decoding_once_the_context_outgrows_it(served: Served) -> None:
    batches, events = await run(served, small_context(follow(served.model)), 40, k=4)
    assert sum(batches, []) == served.model.greedy(PROMPT, 40)
    assert [e.reason for e in events if isinstance(e, SwitchEvent)] == [OUTGROWN]
    assert all(e.context <= len(PROMPT) + ROOM for e in rounds(events))
    assert sum(len(e.tokens) for e in events if isinstance(e, PlainEvent)) >= 40 - ROOM - 5


async def test_a_lookup_drafter_goes_on_with_lookups_only(served: Served) -> None:
    drafter = small_context(follow(served.model), looks_up=True)
    batches, events = await run(served, drafter, 40, k=4, lookup_k=4)
    assert sum(batches, []) == served.model.greedy(PROMPT, 40)
    assert not any(isinstance(e, SwitchEvent) for e in events)
    late = [k for context, k in drafter.calls if context > len(PROMPT) + ROOM]
    assert late and all(k == 0 for k in late)  # past the room: lookup paths only, no model tokens
