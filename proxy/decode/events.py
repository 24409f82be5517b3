"""What a generation publishes as it goes: one event per round, per plain chunk, and at a switch.

Request stats, the route's cost measurements, Prometheus metrics and logs subscribe to these; the
round loop knows none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.drafting.base import Source


@dataclass(frozen=True, kw_only=True)
class RoundEvent:
    """One speculative round: what was drafted, accepted and emitted, and what it cost."""

    request_id: str
    route: str
    index: int  # 0 for a generation's first round
    k: int  # the most asked of the drafter: the model's K, or the longest lookup path allowed
    drafted: tuple[int, ...]  # the tokens the drafter proposed (possibly fewer than k)
    accepted: int  # how many of them the target accepted
    emitted: tuple[int, ...]  # what the round added to the output (accepted drafts + one target token, cut
    # at max_tokens)
    # The target's wait for the draft: the model's reading of what came before, then drafting (or a pre-draft's end)
    draft_seconds: float
    verify_seconds: float
    tv_bound: float = 0.0  # bounded sampling: this round's total-variation bound
    source: Source = Source.MODEL  # what drafted
    candidates: int = 1  # lookup paths verified together (drafted is the one followed)
    declined: tuple[int, ...] = ()  # a lookup path not verified this round (a model draft went instead)
    beyond: int | None = None  # the followed path's next token, where the policy cut the path short
    match: int = 0  # context tokens the lookup path (or the declined one) matched before it (0: none, not known)
    led: int = 0  # drafted tokens the model sampled ahead of the source's path (a prediction rejoined after an edit)
    checked: bool = False  # the model read the path in one batched step before it was verified
    drafted_ahead: bool = False  # the draft was made while the previous round was verified (a draft-ahead hit)
    # What drafting itself took per token (draft_seconds is only the wait for a pre-draft's end, and includes the
    # model's reading of context it had not seen); None: not timed apart
    drafting_seconds_per_token: float | None = None
    ahead_hit: bool | None = None  # the next round was drafted ahead during this one: used (True) or dropped
    context: int = 0  # tokens before the draft (the target evaluates them again unless it caches them)
    prefill: bool | None = None  # the round paid the prompt's prefill (None: a first round does)

    @property
    def model_drafted(self) -> int:
        """How many of the drafted tokens the model sampled."""
        return len(self.drafted) if self.source == Source.MODEL else self.led

    @property
    def model_accepted(self) -> int:
        """How many of the model's drafted tokens the target accepted."""
        return min(self.accepted, self.model_drafted)

    @property
    def path_outcome(self) -> tuple[int, int] | None:
        """A lookup or prediction path's (tokens compared, tokens right), counted from where it starts after the
        model's lead; None for a model draft, or where the target rejected the lead before the path."""
        return None if self.source == Source.MODEL else path_after_lead(len(self.drafted), self.accepted, self.led)

    @property
    def path_checked(self) -> tuple[int, int] | None:
        """path_outcome, and one position further where the policy cut a path that was then accepted whole: the
        round's own token says whether the path's next one was right, which the path's length alone never tests."""
        outcome = self.path_outcome
        if outcome is None or self.beyond is None or outcome[1] < outcome[0] or len(self.emitted) <= len(self.drafted):
            return outcome
        return outcome[0] + 1, outcome[1] + (self.emitted[len(self.drafted)] == self.beyond)

    @property
    def draft_steps(self) -> int:
        """The model's steps the draft took: one a sampled token, one for reading a path."""
        return self.model_drafted + self.checked

    @property
    def warm(self) -> bool:
        """Whether the round's costs are free of prefill (every round but a first one that opened the request)."""
        return not self.prefill if self.prefill is not None else self.index > 0


@dataclass(frozen=True)
class PlainEvent:
    """One chunk of plain decoding on the target: after a switch, or when nothing was worth drafting."""

    request_id: str
    route: str
    tokens: tuple[int, ...]
    seconds: float
    lookup_missed: bool = False  # a lookup found nothing worth verifying; speculation resumes after the chunk
    declined: tuple[int, ...] = ()  # the lookup path found but not verified, to compare with what the target said
    match: int = 0  # context tokens the declined path matched before it
    prefill: bool = False  # the chunk came straight after the prompt: its time includes the prompt's prefill
    # This request's draft model was reading when the chunk started: where it shares the target's cores it slows
    # the target, so such a chunk does not measure what plain decoding alone gets.
    draft_busy: bool = False


@dataclass(frozen=True)
class ReadEvent:
    """The draft model read tokens the target decoded plainly: what it would have drafted greedily before each."""

    request_id: str
    route: str
    tokens: tuple[int, ...]  # what the target decoded
    predicted: tuple[int, ...]  # the draft's greedy choice at each of those positions

    @property
    def agreed(self) -> tuple[bool, ...]:
        """Per position: the draft would have drafted the target's token (a greedy round would accept it)."""
        return tuple(p == t for p, t in zip(self.predicted, self.tokens, strict=True))


@dataclass(frozen=True)
class SwitchEvent:
    """The generation stops speculating and continues by plain decoding."""

    request_id: str
    route: str
    reason: str


def path_after_lead(drafted: int, accepted: int, led: int) -> tuple[int, int] | None:
    """(path tokens compared, right) of a round whose first `led` tokens the model drafted ahead of a path; None where
    the path was never compared (nothing after the lead, or the lead rejected)."""
    return (drafted - led, accepted - led) if drafted > led and accepted >= led else None


Event = RoundEvent | PlainEvent | ReadEvent | SwitchEvent
Subscriber = Callable[[Event], None]


class Publisher:
    """Hands each event to every subscriber, in order."""

    def __init__(self, subscribers: Sequence[Subscriber] = ()) -> None:
        self._subscribers = list(subscribers)

    def __call__(self, event: Event) -> None:
        for subscriber in self._subscribers:
            subscriber(event)
