"""Lookup drafts: how much of a path is worth verifying, and how much to decode plainly after a miss.

A lookup path comes with the index's own estimate of each token (the share of earlier
occurrences that continued that way), which says nothing when a path was seen once. What decides
instead is survival: how often a lookup path's j-th token was right, measured on this request's
paths (verified ones, and declined ones checked against what the target then produced) with the
route's measurements of both as the prior (a neutral one until it has any), each kept apart by
how long a tail of the context the path's source matched (a path found after one matching token
is right far less often than one found after eight). Verifying L tokens then emits
1 + Σ_{j<L} c_j tokens on average, c_j = estimate_j · survival_j, in verify_time(L): measured by
K, so on a CPU, where it grows with K, a path is cut where its next token stops paying, and on a
GPU, where it is flat, it is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from proxy.config.section import MAX_K
from proxy.control.acceptance import MATCH_CLASSES, UNMEASURED_ALPHA, match_class, right_prefix, survival
from proxy.control.costs import RouteCosts
from proxy.decode.events import Event, PlainEvent, RoundEvent
from proxy.drafting.base import Source

MIN_PLAIN_CHUNK, MAX_PLAIN_CHUNK = 4, 16  # plain tokens decoded after a lookup miss before looking again
PRIOR_WEIGHT = 2.0  # paths' worth of the route's survival behind a request's own counts


def lookup_length(costs: RouteCosts, odds: Sequence[float], competing_rate: float | None) -> int:
    """The prefix with the best predicted tokens/s (odds[j]: path right up to j); 0 if it loses to competing_rate."""
    if costs.verified_sizes() < 2:
        return len(odds)  # one measured K cannot tell how cost grows with K: verify it all, which measures it
    best_length, best_rate = len(odds), None
    expected = 1.0 + np.cumsum(odds)
    for length in range(1, len(odds) + 1):
        seconds = costs.verify_time(length)
        assert seconds is not None  # two sizes are measured
        rate = expected[length - 1] / seconds
        # Ties go to the longer prefix: it emits more per round, and verifying it measures a new K.
        if best_rate is None or rate >= best_rate * (1.0 - 1e-9):
            best_length, best_rate = length, rate
    if best_rate is not None and competing_rate is not None and best_rate < competing_rate:
        return 0
    return best_length


def plain_chunk_size(hits: int, lookups: int) -> int:
    """Tokens to decode plainly after a miss: short when lookups usually pay (a path's first token was right,
    verified or declined), long when they rarely do. A request's first miss gets the shortest chunk: it is
    usually the reply's opening words, before a copy of the prompt starts."""
    hit_rate = (hits + 1) / (lookups + 1)
    return int(min(MAX_PLAIN_CHUNK, max(MIN_PLAIN_CHUNK, round(MIN_PLAIN_CHUNK / hit_rate))))


class LookupOdds:
    """One request's lookup paths: their survival by position and match class, hits and misses, and the worthwhile
    length."""

    def __init__(self, costs: RouteCosts) -> None:
        self._costs = costs
        self.tried, self.right = np.zeros((MATCH_CLASSES, MAX_K)), np.zeros((MATCH_CLASSES, MAX_K))
        self.lookups = self.hits = 0

    def observe(self, event: Event) -> None:
        """Verified lookup rounds, and declined paths against what the target produced instead."""
        if isinstance(event, RoundEvent) and event.source != Source.MODEL:
            if (outcome := event.path_checked) is not None:  # the path after the model's lead was compared
                self.lookups += 1
                self._count(event.match, *outcome)
        elif isinstance(event, RoundEvent):
            self._count(event.match, *right_prefix(event.declined, event.emitted))
        elif isinstance(event, PlainEvent) and event.lookup_missed:
            self.lookups += 1
            self._count(event.match, *right_prefix(event.declined, event.tokens))

    def _count(self, match: int, compared: int, right: int) -> None:
        """A path of that match tried at positions 0..compared-1; the first `right` were right."""
        cls = match_class(match)
        self.tried[cls, :compared] += 1
        self.right[cls, :right] += 1
        self.hits += right > 0

    def survival(self, n: int, match: int, *, predicted: bool = False) -> np.ndarray:
        """P(a path of that match is right up to position j), j < n: this request's counts with the route's as the
        prior, both of the path's match class (a client's prediction: certainty where the route has measured none).

        Each position is counted over the paths that reached it, so a deep position that no path has
        reached yet would keep its optimistic prior behind a shallow one that failed; being right up to
        j needs being right up to j − 1, so the curve never rises.
        """
        cls = match_class(match)
        return np.minimum.accumulate((self.right[cls, :n] + PRIOR_WEIGHT * self._prior(cls, n, predicted))
                                     / (self.tried[cls, :n] + PRIOR_WEIGHT))

    def _prior(self, cls: int, n: int, predicted: bool) -> np.ndarray:
        """The route's survival of paths of that match class; where it has measured none, a neutral one for a lookup
        path and certainty for a client's prediction (the client's own statement of the output)."""
        measured = [e.value for e in self._costs.lookup_survival[cls][:n]]
        if not predicted and all(value is None for value in measured):
            # The model draft's α per position, not certainty: a first path taken as sure is verified as far as
            # certainty would pay, which on a CPU costs several plain steps when it is wrong (as a fresh route's
            # first path usually was). A declined path is still checked against what the target writes next, so
            # the request and the route learn from it at no cost.
            return np.array(survival(UNMEASURED_ALPHA, [], n))
        return np.array([1.0 if value is None else value for value in measured])  # capped by the measured before

    def length(self, estimates: Sequence[float], match: int, competing_rate: float | None, *,
               predicted: bool = False) -> int:
        """How many tokens of a path to verify (0: none), from its estimates, its match and the survival so far."""
        odds = np.minimum(1.0, np.asarray(estimates, dtype=float)
                          * self.survival(len(estimates), match, predicted=predicted))
        return lookup_length(self._costs, odds.tolist(), competing_rate)

    def chunk(self) -> int:
        """Plain tokens to decode after a miss."""
        return plain_chunk_size(self.hits, self.lookups)
