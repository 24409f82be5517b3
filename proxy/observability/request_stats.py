"""One request's speculation figures, gathered from its events: the response's `speculoos` object and its log line."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.decode.events import Event, PlainEvent, RoundEvent, SwitchEvent


@dataclass
class RequestStats:
    """What a generation's rounds did."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    round_trace: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    max_tv_bound: float = 0.0  # bounded sampling: the largest per-token total-variation bound seen
    switched_to_plain: bool = False  # the generation was continued by plain decoding mid-stream
    plain_tokens: int = 0

    def __call__(self, event: Event) -> None:
        """Add one event of this request."""
        if isinstance(event, RoundEvent):
            self._add_round(event)
        elif isinstance(event, PlainEvent):
            self.plain_tokens += len(event.tokens)
        elif isinstance(event, SwitchEvent):
            self.switched_to_plain = True

    def _add_round(self, event: RoundEvent) -> None:
        drafted = len(event.drafted)
        self.rounds += 1
        self.round_trace.append((drafted, event.accepted))
        self.drafted += drafted
        self.accepted += event.accepted
        self.emitted += len(event.emitted)
        self.draft_seconds += event.draft_seconds
        self.verify_seconds += event.verify_seconds
        self.max_tv_bound = max(self.max_tv_bound, event.tv_bound)
        while len(self.accepted_per_position) < event.accepted:
            self.accepted_per_position.append(0)
        for position in range(event.accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float | None:
        """α: accepted draft tokens ÷ drafted tokens."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        """τ: tokens emitted per round."""
        return self.emitted / self.rounds if self.rounds else None

    def as_dict(self) -> dict[str, float | int | bool | list | None]:
        """The JSON extension object."""
        alpha, tau = self.acceptance_rate, self.tokens_per_round
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "alpha": round(alpha, 4) if alpha is not None else None,
            "tokens_per_round": round(tau, 3) if tau is not None else None,
            "draft_ms": round(self.draft_seconds * 1000, 1), "verify_ms": round(self.verify_seconds * 1000, 1),
            "max_tv_bound": round(self.max_tv_bound, 6),
            "switched_to_plain": self.switched_to_plain, "plain_tokens": self.plain_tokens,
            "round_trace": [list(r) for r in self.round_trace],
        }
