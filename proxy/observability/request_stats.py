"""One request's speculation figures, gathered from its events: the response's `speculoos` object and its log line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.decode.events import Event, PlainEvent, ReadEvent, RoundEvent, SwitchEvent
from proxy.drafting.base import Source


@dataclass
class RequestStats:
    """What a generation's rounds did."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    # (drafted, accepted) per model round; (drafted, accepted, source, the model's steps) per lookup or prediction
    round_trace: list[tuple] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    max_tv_bound: float = 0.0  # bounded sampling: the largest per-token total-variation bound seen
    switched_to_plain: bool = False  # the generation was continued by plain decoding mid-stream
    plain_tokens: int = 0
    plain_seconds: float = 0.0
    prefill_tokens: int = 0  # emitted by the round or plain chunk that paid the prompt's prefill
    prefill_seconds: float = 0.0
    lookup_misses: int = 0  # plain chunks decoded because no lookup path was worth verifying
    ahead_started: int = 0  # rounds during whose verification the next round was drafted ahead
    ahead_hits: int = 0  # rounds whose draft was drafted ahead and used
    read_tokens: int = 0  # plain tokens the draft read (greedy requests), and how many it would have drafted itself
    read_agreed: int = 0
    # source -> [rounds, drafted, accepted]; tokens the model led a path with count as the model's
    by_source: dict[str, list[int]] = field(default_factory=dict)
    plain_rate: Callable[[], float | None] = lambda: None  # the route's measured plain tokens/s

    def __call__(self, event: Event) -> None:
        """Add one event of this request."""
        if isinstance(event, RoundEvent):
            self._add_round(event)
        elif isinstance(event, PlainEvent):
            self.plain_tokens += len(event.tokens)
            self.plain_seconds += event.seconds
            self.lookup_misses += event.lookup_missed
            if event.prefill:
                self._add_prefill(len(event.tokens), event.seconds)
        elif isinstance(event, ReadEvent):
            self.read_tokens += len(event.tokens)
            self.read_agreed += sum(event.agreed)
        elif isinstance(event, SwitchEvent):
            self.switched_to_plain = True

    def _add_round(self, event: RoundEvent) -> None:
        drafted, led = len(event.drafted), event.led
        self._add_source(event.source, 1, drafted - led, max(event.accepted - led, 0))
        if led:
            self._add_source(Source.MODEL, 0, led, event.model_accepted)
        self.rounds += 1
        self.ahead_started += event.ahead_hit is not None
        self.ahead_hits += event.drafted_ahead
        self.round_trace.append((drafted, event.accepted) if event.source == Source.MODEL
                                else (drafted, event.accepted, event.source, event.draft_steps))
        self.drafted += drafted
        self.accepted += event.accepted
        self.emitted += len(event.emitted)
        self.draft_seconds += event.draft_seconds
        self.verify_seconds += event.verify_seconds
        self.max_tv_bound = max(self.max_tv_bound, event.tv_bound)
        if not event.warm:
            self._add_prefill(len(event.emitted), event.draft_seconds + event.verify_seconds)
        while len(self.accepted_per_position) < event.accepted:
            self.accepted_per_position.append(0)
        for position in range(event.accepted):
            self.accepted_per_position[position] += 1

    def _add_source(self, source: str, rounds: int, drafted: int, accepted: int) -> None:
        counts = self.by_source.setdefault(source, [0, 0, 0])
        counts[0], counts[1], counts[2] = counts[0] + rounds, counts[1] + drafted, counts[2] + accepted

    def _add_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds

    @property
    def acceptance_rate(self) -> float | None:
        """α: accepted draft tokens ÷ drafted tokens."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        """τ: tokens emitted per round."""
        return self.emitted / self.rounds if self.rounds else None

    def speed(self) -> dict[str, float | None]:
        """This generation's decoding rate beside the route's plain rate, both without the prompt's prefill.

        The step that paid the prefill is left out: the plain rate is a decoding rate, and a short
        answer would otherwise look slow by as much as its prompt was long (None until a later step).
        """
        seconds = self.draft_seconds + self.verify_seconds + self.plain_seconds - self.prefill_seconds
        tokens = self.emitted + self.plain_tokens - self.prefill_tokens
        rate = tokens / seconds if tokens and seconds > 0 else None
        plain = self.plain_rate()
        return {"tokens_per_second": _round(rate, 2), "plain_tokens_per_second": _round(plain, 2),
                "vs_plain": _round(rate / plain, 3) if rate and plain else None}

    def prediction_counts(self) -> tuple[int, int]:
        """Prediction tokens drafted and accepted so far."""
        _, drafted, accepted = self.by_source.get(Source.PREDICTION, (0, 0, 0))
        return drafted, accepted

    def as_dict(self) -> dict[str, float | int | bool | list | dict | None]:
        """The JSON extension object."""
        alpha, tau = self.acceptance_rate, self.tokens_per_round
        return {
            "drafts": {name: {"rounds": r, "drafted": d, "accepted": a, "alpha": _round(a / d if d else None, 4)}
                       for name, (r, d, a) in self.by_source.items()},
            "lookup_misses": self.lookup_misses, **self.speed(),
            "draft_ahead": {"started": self.ahead_started, "hits": self.ahead_hits},
            "draft_read": {"tokens": self.read_tokens, "agreed": self.read_agreed},
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "alpha": round(alpha, 4) if alpha is not None else None,
            "tokens_per_round": round(tau, 3) if tau is not None else None,
            "draft_ms": round(self.draft_seconds * 1000, 1), "verify_ms": round(self.verify_seconds * 1000, 1),
            "max_tv_bound": round(self.max_tv_bound, 6),
            "switched_to_plain": self.switched_to_plain, "plain_tokens": self.plain_tokens,
            "round_trace": [list(r) for r in self.round_trace],
        }


def _round(value: float | None, digits: int) -> float | None:
    """A figure for JSON, rounded (None stays None)."""
    return None if value is None else round(value, digits)
