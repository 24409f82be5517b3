"""Route-shared measurements: α, draft time per token, verification time by K, and the plain rate.

Costs are measured: verification time as a function of K is flat on a GPU and steep on a CPU,
and the plain rate comes from real passthrough requests and plain chunks decoded while the draft
model was idle (reading along, on shared cores, slows the target). Every request on the
route feeds them; none of them decides anything. Only a bench assumes them (assumed_costs.py), to
record on this machine the rounds a route would make on other hardware. What the measurements
predict (verification by K, round time, rate) is computed by proxy/control/cost_model.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from proxy.config.section import MAX_K
from proxy.control import cost_model
from proxy.control.acceptance import (
    MATCH_CLASSES,
    UNMEASURED_ALPHA,
    draft_ahead_hit,
    match_class,
    read_windows,
    right_prefix,
    survival,
)
from proxy.control.cost_model import MeasuredVerify, at_context, fit_context_slope
from proxy.decode.events import Event, PlainEvent, ReadEvent, RoundEvent
from proxy.drafting.base import Source

RECENT_VERIFICATIONS = 256  # the window the context slope is fitted over
MIN_PLAIN_TOKENS = 4  # shorter passthrough answers say little about the decoding rate


@dataclass
class Ewma:
    """An exponentially weighted moving average that starts as the plain mean of its first observations."""

    weight: float
    value: float | None = None
    samples: int = 0

    def add(self, x: float) -> None:
        """Fold in one observation."""
        self.samples += 1
        # Until 1 / weight observations, each weighs as much as the others: a noisy first one does not set the
        # estimate for the next twenty.
        share = max(self.weight, 1.0 / self.samples)
        self.value = x if self.value is None else (1.0 - share) * self.value + share * x


@dataclass(frozen=True)
class Calibration:
    """Costs timed at start-up, before any request, as a request's plain chunks and rounds time them; no acceptance."""

    context: int  # tokens before the timed verifications
    plain_seconds_per_token: float | None  # the target decoding alone, its prefill left out
    verify_seconds: tuple[tuple[int, float], ...]  # (K, seconds) of each timed verification
    draft_seconds_per_token: float | None  # the model drafting (None: the route has no model draft)
    draft_read_seconds_per_token: float | None = None  # the model reading context it has not seen, per token


@dataclass
class RouteCosts:
    """What a route has measured so far, as EWMAs."""

    weight: float  # the EWMA weight of a new observation
    k_max: int  # positions tracked for α per position
    pipelined: bool = False  # the route's requests draft ahead while a round is verified
    scale: float = 1.0  # speculation's timed costs are multiplied by it (proxy.control.cost_scale)
    assumed = False  # costs are measured on the hardware the rounds run on
    alpha: Ewma = field(init=False)  # the model draft's
    lookup_alpha: Ewma = field(init=False)  # lookup drafts'
    lookup_survival: list[list[Ewma]] = field(init=False)  # per match class, per position j: a path was right to j
    alpha_per_position: list[Ewma] = field(init=False)  # the model draft's survival: position j and all before
    guess_right: Ewma = field(init=False)  # after a round accepted everything, a draft-ahead guessed the next token
    draft_per_token: Ewma = field(init=False)
    draft_read_per_token: Ewma = field(init=False)  # the model reading unseen context (timed at start-up)
    verify_by_k: dict[int, Ewma] = field(init=False)
    context_by_k: dict[int, Ewma] = field(init=False)  # the context lengths those verifications saw
    plain_per_token: Ewma = field(init=False)  # target-only decoding with the draft model idle, as in passthrough
    plain_reading_per_token: Ewma = field(init=False)  # ... while the draft model read along
    # Warm model rounds as they ran (the target's wait for the draft, then verification), which shows what the
    # parts above leave out: where the two share cores, the model's reading and drafting slow the target.
    model_round_seconds: Ewma = field(init=False)
    model_round_tokens: Ewma = field(init=False)
    model_round_ceiling: Ewma = field(init=False)  # ... and the tokens they would have emitted accepting every draft
    recent: deque[tuple[int, int, float]] = field(init=False)  # (k, context, seconds) of recent verifications
    _slope: float | None = field(init=False)  # context_slope as last fitted (None: the window changed since)
    # verify_time's answers without a context, for the measured times they came from: a decision asks for every K
    _verify: tuple[tuple[tuple[int, float], ...], MeasuredVerify] = field(init=False)

    def __post_init__(self) -> None:
        self.alpha = Ewma(self.weight)
        self.lookup_alpha = Ewma(self.weight)
        self.lookup_survival = [[Ewma(self.weight) for _ in range(MAX_K)] for _ in range(MATCH_CLASSES)]
        self.alpha_per_position = [Ewma(self.weight) for _ in range(self.k_max)]
        self.guess_right = Ewma(self.weight)
        self.draft_per_token = Ewma(self.weight)
        self.draft_read_per_token = Ewma(self.weight)
        self.verify_by_k = {}
        self.context_by_k = {}
        self.plain_per_token = Ewma(self.weight)
        self.plain_reading_per_token = Ewma(self.weight)
        self.model_round_seconds = Ewma(self.weight)
        self.model_round_tokens = Ewma(self.weight)
        self.model_round_ceiling = Ewma(self.weight)
        self.recent = deque(maxlen=RECENT_VERIFICATIONS)
        self._slope = 0.0
        self._verify = ((), MeasuredVerify({}))

    def observe(self, event: Event) -> None:
        """Fold in a speculative generation's round or plain chunk."""
        if isinstance(event, RoundEvent):
            if event.ahead_hit is not None and event.accepted == len(event.drafted):
                self.guess_right.add(1.0 if event.ahead_hit else 0.0)
            self.record_round(event)
            if event.source == Source.MODEL and event.warm:
                self.model_round_seconds.add((event.draft_seconds + event.verify_seconds) * self.scale)
                self.model_round_tokens.add(len(event.emitted))
                self.model_round_ceiling.add(len(event.drafted) + 1)
        elif isinstance(event, PlainEvent):
            if event.lookup_missed:  # the path declined, checked against what the target produced instead
                self._record_path(event.match, *right_prefix(event.declined, event.tokens))
            if not event.prefill:
                self.record_plain(len(event.tokens), event.seconds, draft_busy=event.draft_busy)
        elif isinstance(event, ReadEvent):
            self.record_read(event.agreed)

    def record_round(self, event: RoundEvent) -> None:
        """One round's acceptance, and its costs unless they include a prefill or several candidates.

        α and the draft's time per token describe the model draft (what K is chosen for); lookup
        rounds have their own α, and every round measures verification time by K.
        """
        k, accepted = len(event.drafted), event.accepted
        if event.source != Source.MODEL:
            if (outcome := event.path_outcome) is not None:  # counted from where the path starts
                compared, right = outcome
                self.lookup_alpha.add(right / compared)
            if (checked := event.path_checked) is not None:  # ... and past the cut, where the round's token tells
                self._record_path(event.match, *checked)
        elif k > 0:
            self._record_path(event.match, *right_prefix(event.declined, event.emitted))  # a lookup path declined
            self.alpha.add(accepted / k)
            for position in range(min(k, len(self.alpha_per_position))):
                self.alpha_per_position[position].add(1.0 if position < accepted else 0.0)
        if event.warm and event.candidates == 1:
            self._record_costs(event)

    def _record_costs(self, event: RoundEvent) -> None:
        """A round's draft time per token and verification time by K. The draft's speed is what drafting itself
        took where the drafter timed it apart: a round drafted ahead only waited for the end of its draft, and a
        model that first read context it had not seen was not drafting."""
        k = len(event.drafted)
        if k > 0 and event.source == Source.MODEL:
            drafting = event.drafting_seconds_per_token
            self.draft_per_token.add(self.scale * (drafting if drafting is not None else event.draft_seconds / k))
        verify_seconds = event.verify_seconds * self.scale
        self.verify_by_k.setdefault(k, Ewma(self.weight)).add(verify_seconds)
        self.context_by_k.setdefault(k, Ewma(self.weight)).add(event.context)
        self.recent.append((k, event.context, verify_seconds))
        self._slope = None  # refitted when next asked for: a route's own decision never moves times along context

    @property
    def context_slope(self) -> float:
        """Seconds a verification gains per token of context, fitted over the recent verifications."""
        if self._slope is None:
            self._slope = fit_context_slope(self.recent)
        return self._slope

    def seed(self, calibration: Calibration) -> None:
        """Start-up timings, folded in as a request's would be (each weighs as one observation); α stays unmeasured."""
        for k, seconds in calibration.verify_seconds:
            self.verify_by_k.setdefault(k, Ewma(self.weight)).add(seconds * self.scale)
            self.context_by_k.setdefault(k, Ewma(self.weight)).add(calibration.context)
        if calibration.draft_seconds_per_token is not None:
            self.draft_per_token.add(calibration.draft_seconds_per_token * self.scale)
        if calibration.draft_read_seconds_per_token is not None:
            self.draft_read_per_token.add(calibration.draft_read_seconds_per_token * self.scale)
        if calibration.plain_seconds_per_token is not None:
            self.plain_per_token.add(calibration.plain_seconds_per_token)

    def record_read(self, agreed: Sequence[bool]) -> None:
        """A plain chunk a greedy request's draft read, weighed as one round: its survival and α at its longest K."""
        reached, survived = read_windows(agreed, len(self.alpha_per_position))
        fractions = [s / r for s, r in zip(survived, reached, strict=True) if r]
        if not fractions:
            return
        for estimate, fraction in zip(self.alpha_per_position, fractions, strict=False):
            estimate.add(fraction)
        self.alpha.add(float(np.mean(fractions)))  # a round's accepted / K averages its survival over positions

    def record_plain(self, tokens: int, seconds: float, *, draft_busy: bool = False) -> None:
        """Target-only decoding: a passthrough answer or a plain chunk, with the draft model idle or reading along.

        The two are kept apart: on shared cores the draft's reading slows the target (that is the cost
        of reading), and speculation must beat what plain decoding gets alone.
        """
        if tokens >= MIN_PLAIN_TOKENS and seconds > 0:
            (self.plain_reading_per_token if draft_busy else self.plain_per_token).add(seconds / tokens)

    def _record_path(self, match: int, compared: int, right: int) -> None:
        """A lookup path of that match compared at its first `compared` positions, the first `right` of them right."""
        curve = self.lookup_survival[match_class(match)]
        for position in range(min(compared, len(curve))):
            curve[position].add(1.0 if position < right else 0.0)

    def verified_sizes(self) -> int:
        """How many different K have a measured verification time."""
        return sum(e.value is not None for e in self.verify_by_k.values())

    def verify_time(self, k: int, context: int | None = None) -> float | None:
        """Predicted verification time for k drafts (after `context` tokens, when given)."""
        measured = tuple((kk, e.value) for kk, e in self.verify_by_k.items() if e.value is not None)
        if measured != self._verify[0]:  # the same times give the same answers: fit beyond them once, not per K
            self._verify = (measured, MeasuredVerify(dict(measured)))
        base = self._verify[1](k)
        if base is None or context is None:
            return base
        seen = self.context_by_k.get(k)
        typical = seen.value if seen and seen.value is not None else np.mean(
            [e.value for e in self.context_by_k.values() if e.value is not None])
        return at_context(base, self.context_slope, context, float(typical))

    def survival(self, k: int, alpha: float | None = None) -> list[float]:
        """The model draft's survival curve for k drafts: the route's measured one, or α per position if α is given."""
        if alpha is not None:
            return survival(alpha, [], k)
        alpha = self.alpha.value if self.alpha.value is not None else UNMEASURED_ALPHA
        return survival(alpha, [e.value for e in self.alpha_per_position], k)

    def hit_rate(self, curve: Sequence[float]) -> float:
        """P(a round's draft-ahead is used): the previous round accepted all k drafts and the guess was right."""
        return draft_ahead_hit(curve, self.guess_right.value)

    def speculative_rate(self, k: int, alpha: float | None = None, *, curve: Sequence[float] | None = None,
                         pipelined: bool | None = None, context: int | None = None) -> float | None:
        """Predicted tokens/s with k drafts per round.

        Acceptance is the given survival curve, else α per position if α is given, else the route's
        measured curve; pipelining is as the route does unless given.
        """
        if self.draft_per_token.value is None:  # before verify_time: no rate either way, and no fit to make
            return None
        verify = self.verify_time(k, context)
        if verify is None:
            return None
        curve = list(curve)[:k] if curve is not None else self.survival(k, alpha)
        pipelined = self.pipelined if pipelined is None else pipelined
        return cost_model.speculative_rate(curve, k, self.draft_per_token.value, verify,
                                           hit=self.hit_rate(curve) if pipelined else 0.0, pipelined=pipelined)

    @property
    def plain_rate(self) -> float | None:
        """Measured target-only tokens/s with the draft model idle: what passthrough gets."""
        value = self.plain_per_token.value
        return 1.0 / value if value else None

    def model_rounds_run(self) -> tuple[int, float | None]:
        """How many warm model rounds were timed as they ran, and the tokens/s they gave (None before any)."""
        tokens, seconds = self.model_round_tokens.value, self.model_round_seconds.value
        return self.model_round_seconds.samples, tokens / seconds if tokens is not None and seconds else None

    def model_rounds_ceiling(self) -> float | None:
        """The tokens/s the timed model rounds would have given had every draft been accepted (None before any)."""
        tokens, seconds = self.model_round_ceiling.value, self.model_round_seconds.value
        return tokens / seconds if tokens is not None and seconds else None

    def reading_slowdown(self) -> float | None:
        """The share of the plain rate lost while the draft model reads along (about 0 where each has its own
        device; None until both are measured). Read chunks are often shorter, so a call's overhead counts a
        little more in them."""
        alone, reading = self.plain_per_token.value, self.plain_reading_per_token.value
        return 1.0 - alone / reading if alone and reading else None

    def plain_rate_estimate(self) -> float | None:
        """The plain rate, or until it is measured, one token per verification of no draft (a plain step)."""
        if self.plain_rate is not None:
            return self.plain_rate
        step = self.verify_time(0)
        return 1.0 / step if step else None
