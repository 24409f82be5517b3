"""Choosing K: the rule (a pure function of measurements), and the per-request policies that apply it.

K = 0 means plain decoding (passthrough for a new request). The rule (Leviathan et al. 2023, §3.1):
    expected tokens per round  E(α, K) = (1 − α^(K+1)) / (1 − α)      (K + 1 when α = 1)
    round time                 T(K)    = K · draft_time_per_token + verify_time(K)
    speculative rate           E / T   versus   the plain rate 1 / plain_time_per_token
with hysteresis so a decision does not flap near the break-even point. A request decides with its
own evidence (proxy.control.evidence: code editing and open chat differ wildly on one route) and the
route's costs; it never writes the route's decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from proxy.config.schema import FallbackConfig
from proxy.control.costs import RouteCosts, survival
from proxy.control.evidence import RequestEvidence
from proxy.control.lookup import MIN_PLAIN_CHUNK, LookupOdds
from proxy.decode.decision import Decision, Measure, Plain, Read, Speculate, model_k
from proxy.decode.events import Event, PlainEvent, RoundEvent

NO_DRAFT_K = 0  # the choice not to draft: a request starting passes through, one under way decodes plainly
MIN_ROUNDS_BEFORE_SWITCH = 2  # a request (a probe especially) measures a few rounds before it may switch
# A request that switched to plain decoding goes back to drafting only on a clear gain: it goes back
# when its text turned predictable, and the stretch after such a turn is less so (regression to the mean).
RESUME_MARGIN = 0.2
# A model draft is given up for the rest of a request once even an optimistic reading of this many
# drafted or read tokens of its own (each position's survival at its upper bound) predicts a loss.
MIN_TOKENS_TO_GIVE_UP = 32
# ... and once this many of its model rounds, timed end to end, ran slower than plain decoding: what the rule
# predicts leaves out what it cannot see (on shared cores, a draft-ahead slowing the verification it overlaps).
MIN_ROUNDS_TO_JUDGE = 8
NOT_MEASURED = "not measured yet: speculating with the configured k"
READING = "reading the target's first tokens before the first round"
MEASURING = "measuring the plain rate before deciding"


@dataclass(frozen=True)
class Choice:
    """What the rule chose (a route's mode, or a request's) and why."""

    k: int  # 0 = plain decoding
    reason: str
    predicted_rate: float | None = None  # tokens/s expected for the chosen mode
    plain_rate: float | None = None

    def decision(self) -> Decision:
        """The round's decision this choice makes."""
        return Speculate(self.k, self.reason) if self.k > 0 else Plain(self.reason)


def choose_k(costs: RouteCosts, settings: FallbackConfig, configured_k: int, *, alpha: float | None,
             alpha_rounds: int, speculating: bool, pipelined: bool | None = None, context: int | None = None,
             curve: Sequence[float] | None = None, resume_margin: float | None = None) -> Choice:
    """The K that maximises predicted tokens/s, or 0 when plain decoding is faster.

    Acceptance is the survival curve when given (P(the first j drafts all accepted)), else α per position.
    """
    rates = {k: costs.speculative_rate(k, alpha, curve=None if curve is None else curve[:k], pipelined=pipelined,
                                       context=context)
             for k in range(settings.k_min, settings.k_max + 1)}
    known = {k: r for k, r in rates.items() if r is not None}
    plain = costs.plain_rate
    if alpha is not None and alpha_rounds >= MIN_ROUNDS_BEFORE_SWITCH and alpha < settings.min_acceptance:
        return Choice(NO_DRAFT_K, f"α {alpha:.2f} below min_acceptance {settings.min_acceptance}", plain, plain)
    if not known:
        return Choice(configured_k, NOT_MEASURED)
    best_k = max(known, key=lambda k: known[k])
    if plain is None:
        return Choice(best_k, "passthrough rate not measured yet", known[best_k])
    margin = (1.0 - settings.hysteresis) if speculating else 1.0 + (resume_margin or settings.hysteresis)
    if known[best_k] < plain * margin:
        return Choice(NO_DRAFT_K, f"speculation predicted {known[best_k]:.1f} tok/s at k={best_k}"
                        f" vs {plain:.1f} tok/s plain", plain, plain)
    return Choice(best_k, f"k={best_k} predicted {known[best_k]:.1f} tok/s vs {plain:.1f} plain",
                    known[best_k], plain)


def measured_loss(rate: float | None, plain: float | None, settings: FallbackConfig) -> Choice | None:
    """Plain decoding when model rounds, timed as they ran, gave fewer tokens/s (rate) than plain decoding (less
    the hysteresis), else None."""
    if rate is None or plain is None or rate >= plain * (1.0 - settings.hysteresis):
        return None
    return Choice(NO_DRAFT_K, f"drafting ran at {rate:.1f} tok/s vs {plain:.1f} tok/s plain", plain, plain)


def upper_bound(successes: int, trials: int, z: float = 2.0) -> float:
    """The Wilson score interval's upper end for a success rate: optimistic by z standard errors, sane at 0 and 1."""
    p, zz = successes / trials, z * z / trials
    return min(1.0, (p + zz / 2 + z * np.sqrt(p * (1 - p) / trials + zz / (4 * trials))) / (1 + zz))


class PinnedPolicy:
    """The client pinned K, or forced speculation at the route's K: every round drafts that many, lookup paths in full.

    Forcing measures what drafting does (α, tokens per round) whatever it costs on this hardware, so
    nothing the costs say shortens a draft or skips a round.
    """

    def __init__(self, k: int, reason: str | None = None) -> None:
        self._decision = Choice(k, reason or f"k={k} pinned by the client").decision()

    def decide(self) -> Decision:
        """The pinned K."""
        return self._decision

    def observe(self, event: Event) -> None:
        """Nothing to learn."""

    def lookup_length(self, probs: Sequence[float], match: int, decision: Decision, *, predicted: bool = False) -> int:
        """Every token of the path (capped at the pinned K by the plan)."""
        return len(probs)

    def plain_chunk(self) -> int:
        """The shortest chunk: look again soon."""
        return MIN_PLAIN_CHUNK

    def model_may_pay(self) -> bool:
        """The client asked for drafts: always."""
        return True


class RequestPolicy:
    """One request's K each round, from its own evidence (control.evidence) and the route's costs."""

    def __init__(self, costs: RouteCosts, settings: FallbackConfig, configured_k: int, start: Choice,
                 *, explore: bool = True, pipelined: bool | None = None, reads_along: bool = False,
                 reads_first: int = 0, max_tokens: int | None = None) -> None:
        self._costs, self._settings, self._configured_k = costs, settings, configured_k
        # Where the model takes turns with the target, its first draft reads the prompt (and what came since) first,
        # the target waiting: that is worth it only if drafting can save as much over the tokens left.
        self._reads_first, self._max_tokens, self._produced = reads_first, max_tokens, 0
        # The draft reads what the target writes, which counts as rounds. Reading is exploring: a request
        # on a lookup route that turned its model off does not read, unless it probes the model.
        self._reads_along = reads_along and explore
        self._pipelined = pipelined  # whether this request drafts ahead (None: as the route does)
        self._explore = explore  # a route in passthrough: try the configured K for the first rounds
        self._probing = explore and start.k == NO_DRAFT_K  # ... which re-times costs that may have changed
        self.current = start  # the mode the request is in: the route's when it started, then its own decisions'
        self.evidence = RequestEvidence(settings.k_max, costs.scale)
        self.lookup = LookupOdds(costs)

    def observe(self, event: Event) -> None:
        """Count this request's rounds (the model's acceptance apart) and its lookups."""
        self.evidence.observe(event)
        self.lookup.observe(event)
        self._produced += len(event.emitted if isinstance(event, RoundEvent)
                              else event.tokens if isinstance(event, PlainEvent) else ())

    def lookup_length(self, probs: Sequence[float], match: int, decision: Decision, *, predicted: bool = False) -> int:
        """The worthwhile prefix of a lookup path, against plain decoding and the model draft at the round's K."""
        competing = [r for r in (self._costs.plain_rate_estimate(), self._model_rate(decision)) if r is not None]
        return self.lookup.length(probs, match, max(competing, default=None), predicted=predicted)

    def plain_chunk(self) -> int:
        """Tokens to decode plainly after a lookup miss, from how often this request's lookups hit."""
        return self.lookup.chunk()

    def _model_rate(self, decision: Decision) -> float | None:
        """The model draft's predicted tokens/s at this request's K (None when it is off or not measured): the
        round's, once the request has evidence of its own, else its mode's (a first decision may be only to read)."""
        if self._reading_unpaid() is not None:
            return None
        k = model_k(decision) if self.evidence.own_rounds >= MIN_ROUNDS_BEFORE_SWITCH else self.current.k
        return (self._costs.speculative_rate(k, curve=self.survival()[:k], pipelined=self._pipelined,
                                             context=self.evidence.context) if k > 0 else None)

    def survival(self) -> list[float]:
        """This request's survival curve so far, with the route's as the prior."""
        return self.evidence.survival(self._costs.survival(self._settings.k_max))

    def _best_if(self, curve: Sequence[float]) -> Choice:
        """The rule at this request's costs and context, were its survival curve the given one."""
        return choose_k(self._costs, self._settings, self._configured_k, alpha=None, alpha_rounds=0, speculating=True,
                        pipelined=self._pipelined, context=self.evidence.context, curve=curve)

    def _hopeless(self) -> Choice | None:
        """Plain decoding when even accepting every draft would be slower at the measured costs, else None."""
        if self._costs.plain_rate is None:
            return None
        best = self._best_if([1.0] * self._settings.k_max)
        return replace(best, reason=f"even accepting every draft, {best.reason}") if best.k == NO_DRAFT_K else None

    def _reading_unpaid(self) -> Choice | None:
        """Plain decoding (lookup paths still tried) until the model drafts on this request, where its first draft
        would make the target wait for it to read the context for longer than drafting could save on the tokens left
        at the acceptance this request expects (the route's, or the neutral prior before any was measured); else None.

        Expected, not perfect, acceptance: the reading is paid for certain, the saving only as often as drafts are
        accepted, and where the draft is not much faster than its target every draft accepted is the one case that
        pays at all.
        """
        read_per_token, plain = self._costs.draft_read_per_token.value, self._costs.plain_rate
        if (not self._reads_first or self.evidence.drafted or self._max_tokens is None or read_per_token is None
                or plain is None):
            return None
        best = self._best_if(self.survival())
        if best.predicted_rate is None:
            return None
        unread, left = self._reads_first + self._produced, self._max_tokens - self._produced
        reading, saving = unread * read_per_token, left * (1.0 / plain - 1.0 / best.predicted_rate)
        if reading < saving:
            return None
        return Choice(NO_DRAFT_K, f"reading {unread} tokens first would hold the target {reading:.2f} s, more than"
                                  f" drafting could save on {left} tokens at the acceptance expected"
                                  f" ({max(saving, 0.0):.2f} s)", plain, plain)

    def _ruled_out(self) -> Choice | None:
        """Plain decoding where the measured costs say no draft could pay, unless this request is a probe that has
        not yet timed its round (costs measured long ago, at start-up say, may no longer hold)."""
        return None if self._probing and not self.evidence.rounds else self._hopeless()

    def _measured_loss(self) -> Choice | None:
        """Plain decoding once this request's own model rounds ran slower than plain decoding, else None.

        One round is enough when even accepting its every draft would have lost (its time, not its luck, decided);
        otherwise acceptance varies round to round, so it takes MIN_ROUNDS_TO_JUDGE.
        """
        timed = self.evidence
        if self._costs.assumed or timed.timed_rounds == 0 or timed.timed_seconds <= 0:
            return None  # assumed costs describe other hardware than the one the rounds ran on
        plain = self._costs.plain_rate
        if (lost := measured_loss(timed.timed_ceiling / timed.timed_seconds, plain, self._settings)) is not None:
            return replace(lost, reason=f"even accepting every draft, {lost.reason}")
        if timed.timed_rounds < MIN_ROUNDS_TO_JUDGE:
            return None
        return measured_loss(timed.timed_tokens / timed.timed_seconds, plain, self._settings)

    def model_may_pay(self) -> bool:
        """Whether the model draft could still beat plain decoding on this request, so its reading along is worth it.

        False on a lookup route that has turned the model off, unless this request probes it (reading
        is exploring), and once even this request's own survival curve at its upper bounds predicts a
        loss at every K (the text is not one the draft predicts, and on shared cores reading it slows
        the target), or once its model rounds, timed as they ran, were slower than plain decoding, or once the
        measured costs say that even accepting every draft could not beat it.
        """
        if not self._explore or self._measured_loss() is not None or self._ruled_out() is not None:
            return False  # not exploring (see _reads_along), its drafting lost as it ran, or it cannot pay at all
        own = self.evidence
        if self._costs.plain_rate is None or own.drafted < MIN_TOKENS_TO_GIVE_UP:
            return True
        optimistic = [upper_bound(s, r) if r else None for s, r in zip(own.survived, own.reached, strict=True)]
        alpha = upper_bound(own.accepted, own.drafted)
        return self._best_if(survival(alpha, optimistic, self._settings.k_max)).k != NO_DRAFT_K

    def decide(self) -> Decision:
        """This round's decision; it settles the request in the mode it chose, where the next one's hysteresis
        starts (so asking again gives the same answer)."""
        decision, mode = self._judge()
        self.current = mode or self.current
        return decision

    def _judge(self) -> tuple[Decision, Choice | None]:
        """This round's decision, and the mode it settles the request in (None: the mode stays)."""
        own = self.evidence
        if self._costs.plain_rate is None and not own.measured_plain:
            # A fresh route does not know what speculation competes with: plain chunks (the prefill's, then one with
            # the draft idle) measure that before the first round, so one round can tell whether any could pay.
            return Measure(MEASURING), None
        if (lost := self._measured_loss()) is not None:
            return lost.decision(), lost
        if (unpaid := self._reading_unpaid()) is not None:
            return unpaid.decision(), None
        if own.own_rounds < MIN_ROUNDS_BEFORE_SWITCH:
            return self._first_rounds(), None
        alpha = own.accepted / own.drafted if own.drafted else self._costs.alpha.value
        rounds = own.own_rounds if own.drafted else self._costs.alpha.samples
        choice = choose_k(self._costs, self._settings, self._configured_k, alpha=alpha, alpha_rounds=rounds,
                          speculating=self.current.k > 0, pipelined=self._pipelined, context=own.context,
                          resume_margin=max(RESUME_MARGIN, self._settings.hysteresis), curve=self.survival())
        return choice.decision(), choice

    def _first_rounds(self) -> Decision:
        """The decision before the request has evidence of its own: the route's mode, read or explored."""
        if (hopeless := self._ruled_out()) is not None:  # the costs are measured (at start-up, or by a round)
            return hopeless.decision()  # ... and acceptance cannot change it
        retiming = self._probing and self._hopeless() is not None  # only a round can tell whether costs changed
        if self._reads_along and not retiming and not (self.current.k > 0 and self.current.plain_rate is not None):
            # Unless the route has found that speculation beats plain decoding, reading the
            # target's first chunks tells as much as exploring rounds would, at no risk.
            return Read(READING)
        # A probe starts from a route in passthrough (k = 0): it explores at the configured k.
        return Choice(self.current.k or (self._configured_k if self._explore else 0), self.current.reason).decision()
