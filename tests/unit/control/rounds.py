"""Rounds as a route's costs read them, built from the few figures a test names."""

from __future__ import annotations

from proxy.decode.events import RoundEvent
from proxy.drafting.base import Source


def played(k: int, accepted: int, draft_seconds: float, verify_seconds: float, *, lookup: bool = False,
           led: int = 0, context: int = 0) -> RoundEvent:
    """A round past the prompt's prefill: k drafted (by lookups, or the model), `accepted` of them taken."""
    return RoundEvent(request_id="r", route="route", index=1, k=k, drafted=tuple(range(k)), accepted=accepted,
                      emitted=tuple(range(accepted + 1)), draft_seconds=draft_seconds, verify_seconds=verify_seconds,
                      source=Source.LOOKUP if lookup else Source.MODEL, led=led, context=context)
