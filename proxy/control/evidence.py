"""One request's own evidence about its model draft: rounds made and read, acceptance per position, rounds timed."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.control.costs import read_windows, survival
from proxy.decode.events import Event, PlainEvent, ReadEvent, RoundEvent
from proxy.drafting.base import Source

PRIOR_ROUNDS = 2  # the route's survival curve counts as this many of a request's own rounds


class RequestEvidence:
    """Counts from one request's events; `scale` multiplies the timed seconds (see proxy.control.cost_scale).

    A greedy request's plain chunks that its draft read count too: a chunk of n tokens is n rounds the
    draft would have made, one starting at each token, measured for free while the target decoded.
    """

    def __init__(self, k_max: int, scale: float = 1.0) -> None:
        self._scale = scale
        self.measured_plain = False  # a plain chunk after the prefill, with the draft idle, was decoded
        self.rounds = self.drafted = self.accepted = 0  # drafted and accepted: the model draft's
        self.reads = 0  # plain chunks the draft read
        self.timed_rounds, self.timed_tokens, self.timed_seconds = 0, 0, 0.0  # the model's warm rounds, as they ran
        self.timed_ceiling = 0  # ... and the tokens they would have emitted accepting every draft
        self.context: int | None = None  # tokens so far, once an event said
        self.reached = [0] * k_max  # per position: the model's rounds that drafted it
        self.survived = [0] * k_max  # ... and accepted it and every draft before it

    @property
    def own_rounds(self) -> int:
        """Rounds of this request's own, made or read."""
        return self.rounds + self.reads

    def observe(self, event: Event) -> None:
        """Count one of the request's events (the model's acceptance apart from lookups')."""
        if isinstance(event, PlainEvent):
            self.measured_plain |= not (event.prefill or event.draft_busy)
            if self.context is not None:
                self.context += len(event.tokens)
        elif isinstance(event, ReadEvent):
            self._read(event.agreed)
        elif isinstance(event, RoundEvent):
            self._round(event)

    def _round(self, event: RoundEvent) -> None:
        self.context = event.context + len(event.emitted)
        self.rounds += 1
        if event.source == Source.MODEL and event.warm:  # a prefill's round says nothing of drafting's speed
            self.timed_rounds += 1
            self.timed_tokens += len(event.emitted)
            self.timed_seconds += (event.draft_seconds + event.verify_seconds) * self._scale
            self.timed_ceiling += len(event.drafted) + 1
        sampled = event.model_drafted  # the model's acceptance, also where it led a path
        self.drafted += sampled
        self.accepted += event.model_accepted
        for position in range(min(sampled, len(self.reached))):
            self.reached[position] += 1
            self.survived[position] += position < event.accepted

    def _read(self, agreed: Sequence[bool]) -> None:
        """A plain chunk the draft read: the rounds it would have made, one starting at each token."""
        self.reads += 1
        self.drafted += len(agreed)
        self.accepted += sum(agreed)
        reached, survived = read_windows(agreed, len(self.reached))
        self.reached = [a + b for a, b in zip(self.reached, reached, strict=True)]
        self.survived = [a + b for a, b in zip(self.survived, survived, strict=True)]

    def survival(self, route: Sequence[float]) -> list[float]:
        """This request's survival curve so far, with the route's (`route`) as the prior."""
        own = [(survived + PRIOR_ROUNDS * prior) / (reached + PRIOR_ROUNDS)
               for survived, reached, prior in zip(self.survived, self.reached, route, strict=True)]
        return survival(route[-1], own, len(self.reached))
