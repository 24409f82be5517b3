"""Plain decoding: the target decodes a chunk of a generation itself (the round loop says when and how much)."""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy.decode.events import PlainEvent
from proxy.decode.session import Session
from proxy.targets.base import Target
from proxy.targets.stopping import until_end

PLAIN_CHUNK = 8  # tokens per plain chunk after a switch


async def plain_chunk(session: Session, target: Target, context: list[int], n: int, is_end: Callable[[int], bool], *,
                      lookup_missed: bool = False, declined: tuple[int, ...] = (),
                      draft_busy: bool = False) -> tuple[int, ...]:
    """Up to n tokens decoded by the target after context, published as a PlainEvent, up to the first end of
    generation."""
    started = time.perf_counter()
    tokens = await target.generate(context, n, session.params, session.target_seed(), session.client_headers,
                                   model=session.model)
    session.publish(PlainEvent(session.request_id, session.route, tuple(tokens), time.perf_counter() - started,
                               lookup_missed, declined, prefill=session.at_prompt(context),
                               draft_busy=draft_busy))
    return until_end(tokens, is_end)

