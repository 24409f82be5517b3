"""Suffix lookup: continuations of the context's tail found in the request itself and in recent outputs.

SuffixDecoding (Oliaro et al. 2024, arXiv:2411.04975; Arctic Inference) keeps suffix trees and
walks the most frequent continuation of the longest match. Here the "tree" is walked directly on
token arrays with numpy: the occurrences of the context's tail (each with its match length) are a
node, the tokens after them are its children, and the walk follows the most frequent child
(ties: the most recent occurrence), estimating each token's probability as the fraction of the
node's occurrences that continue with it. A path stops when that running probability falls below
`min_prob`, or at `factor` × the match length: long matches earn long drafts, weak ones short.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEPARATOR = -1  # between documents in a corpus: no match or continuation crosses it
MAX_MATCH = 64  # longest tail compared; longer matches say nothing more
NODES_TRIED = 4  # distinct match lengths walked per lookup, longest first
# A node's continuations are counted in Python up to this many occurrences: numpy's fixed cost per call (tens of µs)
# is more than a dictionary's whole count below it, and most nodes have a handful.
RANKED_IN_PYTHON = 128


@dataclass(frozen=True)
class Continuation:
    """A proposed path: its tokens and, for each, the estimated probability that the path is right up to it."""

    tokens: tuple[int, ...]
    probs: tuple[float, ...]  # non-increasing, in (0, 1]
    match_length: int = 0
    anchor: int = -1  # the corpus position of the latest occurrence it continues

    @property
    def score(self) -> float:
        """Expected number of its tokens the target accepts, were the estimates right."""
        return float(sum(self.probs))


@dataclass(frozen=True)
class LookupSettings:
    """How far a suffix lookup goes."""

    max_tokens: int = 32
    min_prob: float = 0.1
    factor: float = 1.0  # draft at most factor × match length tokens
    min_match: int = 1
    candidates: int = 1  # paths returned: the best, then branches off it


def match_lengths(corpus: np.ndarray, query: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions p where corpus[..p] ends with the query's tail (with a token after p), and each match's length."""
    if query.size == 0 or corpus.size < 2:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    ends = np.flatnonzero(corpus[:-1] == query[-1])
    ends = ends[corpus[ends + 1] != SEPARATOR]
    lengths = np.ones(ends.size, dtype=np.int64)
    backwards = query[::-1]  # backwards[b]: the query's token b before its last
    span = min(limit, query.size)
    alive, back, block = np.arange(ends.size), 1, 1
    # Compared a block of positions back at a time, the blocks doubling: most occurrences fail within a token or
    # two, and a long copy's few survivors are followed in a handful of steps instead of one step per token.
    while alive.size and back < span:
        stop = min(back + block, span)
        before = ends[alive, None] - np.arange(back, stop)  # [alive, stop - back]
        same = (before >= 0) & (corpus[np.maximum(before, 0)] == backwards[back:stop])
        run = np.where(same.all(axis=1), stop - back, same.argmin(axis=1))  # leading matches in the block
        lengths[alive] += run
        alive, back, block = alive[run == stop - back], stop, 2 * block
    return ends, lengths


def _walk(corpus: np.ndarray, ends: np.ndarray, cap: int, min_prob: float, prefix: Continuation | None = None,
          *, branches_wanted: bool = False) -> tuple[Continuation, list[tuple[float, int, int, np.ndarray]]]:
    """Follow the most frequent continuation from a node; also, if wanted, the runner-up at each step
    (prob, depth, token, ends)."""
    tokens = list(prefix.tokens) if prefix else []
    probs = list(prefix.probs) if prefix else []
    prob = probs[-1] if probs else 1.0
    branches: list[tuple[float, int, int, np.ndarray]] = []
    positions = ends + 1
    while len(tokens) < cap and positions.size:
        positions = positions[positions < corpus.size]
        if positions.size == 1:  # one occurrence: the path copies what follows it, its probability unchanged
            copied = corpus[positions[0]:positions[0] + cap - len(tokens)]
            separated = np.flatnonzero(copied == SEPARATOR)
            copied = copied[: separated[0]] if separated.size else copied
            if prob < min_prob or not copied.size:
                break
            tokens += copied.tolist()
            probs += [prob] * copied.size
            break
        if run := _agreed_run(corpus, positions, cap - len(tokens)):  # a stretch all occurrences copy alike
            if prob < min_prob:
                break
            tokens += corpus[positions[0]:positions[0] + run].tolist()
            probs += [prob] * run
            positions = positions + run
            continue
        following = corpus[positions]
        positions, following = positions[following != SEPARATOR], following[following != SEPARATOR]
        if not following.size:
            break
        if (following == following[0]).all():  # one continuation for every occurrence: no count, no branch
            if prob < min_prob:
                break
            tokens.append(int(following[0]))
            probs.append(prob)
            positions = positions + 1
            continue
        (best, count), *others = _ranked(following, positions)
        if branches_wanted and others:
            second, second_count = others[0]
            branches.append((prob * second_count / following.size, len(tokens), second, positions[following == second]))
        prob *= count / following.size
        if prob < min_prob:
            break
        tokens.append(best)
        probs.append(prob)
        positions = positions[following == best] + 1
    anchoring = (prefix.match_length, prefix.anchor) if prefix else ()
    return Continuation(tuple(tokens), tuple(probs), *anchoring), branches


def _ranked(following: np.ndarray, positions: np.ndarray) -> list[tuple[int, int]]:
    """The two leading continuations and their counts: the most frequent first, ties to the most recent."""
    if following.size > RANKED_IN_PYTHON:
        values, inverse, counts = np.unique(following, return_inverse=True, return_counts=True)
        latest = np.full(values.size, -1, dtype=np.int64)
        np.maximum.at(latest, inverse, positions)
        order = np.lexsort((-latest, -counts))[:2]
        return list(zip(values[order].tolist(), counts[order].tolist()))
    counts: dict[int, int] = {}
    latest_of: dict[int, int] = {}
    for token, position in zip(following.tolist(), positions.tolist()):
        counts[token] = counts.get(token, 0) + 1
        latest_of[token] = position  # positions ascend: the last one seen is the latest
    return sorted(counts.items(), key=lambda item: (-item[1], -latest_of[item[0]]))[:2]


def _agreed_run(corpus: np.ndarray, positions: np.ndarray, limit: int) -> int:
    """How many tokens, up to `limit`, every occurrence continues with alike, none at the corpus's end or at a
    separator: taken at once rather than one step a token."""
    span = min(limit, corpus.size - int(positions.max())) if positions.size else 0
    if span <= 0:
        return 0
    ahead = corpus[positions[:, None] + np.arange(span)]  # [occurrences, span]
    agreed = (ahead == ahead[0]).all(axis=0) & (ahead[0] != SEPARATOR)
    return span if agreed.all() else int(agreed.argmin())


def _best_node(corpus: np.ndarray, ends: np.ndarray, lengths: np.ndarray,
               settings: LookupSettings) -> tuple[Continuation, list] | None:
    """The best-scoring walk from the nodes of the NODES_TRIED longest match lengths, with its branches."""
    best: tuple[Continuation, list] | None = None
    for length in np.flatnonzero(np.bincount(lengths))[::-1][:NODES_TRIED]:  # the distinct lengths, longest first
        cap = min(settings.max_tokens, int(settings.factor * length))
        if best is not None and best[0].score >= cap:
            break  # a shorter match drafts at most `cap` tokens, none surer than 1: it cannot score higher
        node = ends[lengths >= length]
        path, branches = _walk(corpus, node, cap, settings.min_prob, branches_wanted=settings.candidates > 1)
        path = Continuation(path.tokens, path.probs, int(length), int(node.max()))
        if path.tokens and (best is None or path.score > best[0].score):
            best = (path, branches)
    return best


def continuations(corpus: np.ndarray, query: np.ndarray, settings: LookupSettings) -> list[Continuation]:
    """The best-scoring path after the query's tail in the corpus, then up to candidates − 1 branches off it."""
    ends, lengths = match_lengths(corpus, query, MAX_MATCH)
    keep = lengths >= settings.min_match
    ends, lengths = ends[keep], lengths[keep]
    best = _best_node(corpus, ends, lengths, settings)
    if best is None:
        return []
    path, branches = best
    found = [path]
    for prob, depth, token, positions in sorted(branches, key=lambda b: -b[0])[: settings.candidates - 1]:
        if prob < settings.min_prob or depth >= len(path.tokens):
            continue
        stem = Continuation((*path.tokens[:depth], token), (*path.probs[:depth], prob), path.match_length, path.anchor)
        cap = min(settings.max_tokens, max(int(settings.factor * path.match_length), depth + 1))
        found.append(_walk(corpus, positions, cap, settings.min_prob, stem)[0])
    return found


class OutputHistory:
    """Recent outputs as one corpus, bounded in tokens, least recently used dropped first.

    The corpus keeps the order the outputs came in: using one changes only which is dropped first, so the
    lookups that follow read the corpus already built (rebuilding it costs a pass over every output).
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._outputs: dict[int, np.ndarray] = {}  # in the order they came
        self._use_order: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._next_key = 0
        self._tokens = 0
        self._corpus: np.ndarray | None = None
        self._starts: np.ndarray = np.empty(0, dtype=np.int64)
        self._keys: list[int] = []

    @property
    def tokens(self) -> int:
        """Tokens held."""
        return self._tokens

    def add(self, output: Sequence[int]) -> None:
        """Remember an output (too-short ones teach nothing)."""
        if len(output) < 2:
            return
        key, self._next_key = self._next_key, self._next_key + 1
        self._outputs[key] = np.asarray(output[-self.max_tokens:], dtype=np.int64)
        self._use_order[key] = None
        self._tokens += self._outputs[key].size
        while self._tokens > self.max_tokens:
            self.drop_oldest()
        self._corpus = None

    def drop_oldest(self) -> int:
        """Forget the least recently used output; the tokens freed."""
        if not self._use_order:
            return 0
        key, _ = self._use_order.popitem(last=False)
        freed = self._outputs.pop(key).size
        self._tokens -= freed
        self._corpus = None
        return freed

    def corpus(self) -> np.ndarray:
        """Every output, separated, in the order they came (so later positions are more recent)."""
        if self._corpus is None:
            parts, starts, at = [], [], 0
            for output in self._outputs.values():
                starts.append(at)
                parts += [output, np.array([SEPARATOR])]
                at += output.size + 1
            self._corpus = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
            self._starts, self._keys = np.array(starts, dtype=np.int64), list(self._outputs)
        return self._corpus

    def touch(self, position: int) -> None:
        """Mark the output holding a position of the current corpus as used (it is dropped last)."""
        if self._corpus is None or not self._keys:
            return
        key = self._keys[int(np.searchsorted(self._starts, position, side="right")) - 1]
        if key in self._use_order:
            self._use_order.move_to_end(key)


class ScopedHistory:
    """Recent outputs kept apart by scope (one per tenant, or one for the whole route), bounded in tokens
    together: the least recently used scope loses its oldest outputs first."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._scopes: OrderedDict[str, OutputHistory] = OrderedDict()

    @property
    def tokens(self) -> int:
        """Tokens held, every scope together."""
        return sum(history.tokens for history in self._scopes.values())

    def get(self, scope: str) -> OutputHistory | None:
        """The scope's outputs (None: it has none); reading it counts as using it."""
        history = self._scopes.get(scope)
        if history is not None:
            self._scopes.move_to_end(scope)
        return history

    def add(self, scope: str, output: Sequence[int]) -> None:
        """Remember an output in its scope, making room in the least recently used scopes."""
        history = self._scopes.get(scope) or OutputHistory(self.max_tokens)
        history.add(output)
        if not history.tokens:
            return
        self._scopes[scope] = history
        self._scopes.move_to_end(scope)
        excess = self.tokens - self.max_tokens
        while excess > 0:  # the scope just used is last, and alone it is within the bound
            oldest_scope, oldest = next(iter(self._scopes.items()))
            excess -= oldest.drop_oldest()
            if not oldest.tokens:
                del self._scopes[oldest_scope]
