"""Suffix lookup's fast paths (matches compared in blocks, walks that copy, shorter matches skipped once they cannot
win) find exactly what the plain walk finds."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.drafting import suffix
from proxy.drafting.suffix import SEPARATOR, Continuation, LookupSettings


def reference_match_lengths(corpus: np.ndarray, query: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """One position back at a time, as the lookup first did."""
    if query.size == 0 or corpus.size < 2:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    ends = np.flatnonzero(corpus[:-1] == query[-1])
    ends = ends[corpus[ends + 1] != SEPARATOR]
    lengths = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for back in range(1, min(limit, query.size)):
        before = ends - back
        alive &= before >= 0
        alive[alive] &= corpus[before[alive]] == query[-1 - back]
        if not alive.any():
            break
        lengths += alive
    return ends, lengths


def reference_ranked(following: np.ndarray, positions: np.ndarray) -> list[tuple[int, int]]:
    """The two leading continuations with np.unique, as the walk first counted them."""
    values, inverse, counts = np.unique(following, return_inverse=True, return_counts=True)
    latest = np.full(values.size, -1, dtype=np.int64)
    np.maximum.at(latest, inverse, positions)
    order = np.lexsort((-latest, -counts))[:2]
    return [(int(values[i]), int(counts[i])) for i in order]


def reference_walk(corpus: np.ndarray, ends: np.ndarray, cap: int, min_prob: float, prefix: Continuation | None = None,
                   *, branches_wanted: bool = False) -> tuple[Continuation, list]:
    """Every step counted with np.unique, as the lookup first did."""
    tokens = list(prefix.tokens) if prefix else []
    probs = list(prefix.probs) if prefix else []
    prob = probs[-1] if probs else 1.0
    branches = []
    positions = ends + 1
    while len(tokens) < cap and positions.size:
        positions = positions[positions < corpus.size]
        following = corpus[positions]
        positions, following = positions[following != SEPARATOR], following[following != SEPARATOR]
        if not following.size:
            break
        (best, count), *others = reference_ranked(following, positions)
        if branches_wanted and others:
            second, second_count = others[0]
            branches.append((float(prob * second_count / following.size), len(tokens), second,
                             positions[following == second]))
        prob *= float(count / following.size)
        if prob < min_prob:
            break
        tokens.append(best)
        probs.append(prob)
        positions = positions[following == best] + 1
    anchoring = (prefix.match_length, prefix.anchor) if prefix else ()
    return Continuation(tuple(tokens), tuple(probs), *anchoring), branches


@pytest.mark.parametrize("occurrences", [1, 3, suffix.RANKED_IN_PYTHON, suffix.RANKED_IN_PYTHON + 1, 1000])
def test_continuations_are_ranked_as_the_reference_ranks_them(occurrences: int) -> None:
    rng = np.random.default_rng(occurrences)
    for _ in range(50):
        following = rng.integers(0, rng.integers(1, 6), occurrences)  # few distinct tokens: equal counts are common
        positions = np.sort(rng.choice(10 * occurrences, occurrences, replace=False))
        assert suffix._ranked(following, positions) == reference_ranked(following, positions)


def reference_best_node(corpus: np.ndarray, ends: np.ndarray, lengths: np.ndarray,
                        settings: LookupSettings) -> tuple[Continuation, list] | None:
    """Every one of the NODES_TRIED longest match lengths walked, as the lookup first did."""
    best = None
    for length in np.unique(lengths)[::-1][:suffix.NODES_TRIED]:
        node = ends[lengths >= length]
        path, branches = suffix._walk(corpus, node, min(settings.max_tokens, int(settings.factor * length)),
                                      settings.min_prob, branches_wanted=settings.candidates > 1)
        path = Continuation(path.tokens, path.probs, int(length), int(node.max()))
        if path.tokens and (best is None or path.score > best[0].score):
            best = (path, branches)
    return best


def corpus_of(rng: np.random.Generator, alphabet: int, size: int) -> np.ndarray:
    """Random tokens with copied stretches (long matches) and a few separators."""
    tokens = list(rng.integers(0, alphabet, size))
    for _ in range(6):
        start, length = int(rng.integers(0, size)), int(rng.integers(2, 90))
        tokens += tokens[start:start + length]
        if rng.random() < 0.3:
            tokens.append(SEPARATOR)
    return np.array(tokens, dtype=np.int64)


@pytest.mark.parametrize("alphabet", [2, 5, 50, 5000])
def test_matches_are_the_reference_matches(alphabet: int) -> None:
    rng = np.random.default_rng(alphabet)
    for _ in range(40):
        corpus = corpus_of(rng, alphabet, int(rng.integers(1, 400)))
        query = corpus[: int(rng.integers(0, corpus.size + 1))]
        query = query[query != SEPARATOR]
        for limit in (1, 2, 7, 64):
            found, expected = suffix.match_lengths(corpus, query, limit), reference_match_lengths(corpus, query, limit)
            np.testing.assert_array_equal(found[0], expected[0])
            np.testing.assert_array_equal(found[1], expected[1])


@pytest.mark.parametrize("alphabet", [2, 5, 50, 5000])
def test_lookups_are_the_reference_lookups(alphabet: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(100 + alphabet)
    cases = []
    for _ in range(40):
        corpus = corpus_of(rng, alphabet, int(rng.integers(2, 400)))
        query = corpus[corpus != SEPARATOR][: int(rng.integers(1, corpus.size + 1))]
        settings = LookupSettings(max_tokens=int(rng.integers(1, 33)), min_prob=float(rng.choice([0.0, 0.1, 0.5])),
                                  factor=float(rng.choice([0.5, 1.0, 32.0])), candidates=int(rng.integers(1, 4)))
        cases.append((corpus, query, settings, suffix.continuations(corpus, query, settings)))
    monkeypatch.setattr(suffix, "match_lengths", reference_match_lengths)
    monkeypatch.setattr(suffix, "_walk", reference_walk)
    monkeypatch.setattr(suffix, "_best_node", reference_best_node)
    for corpus, query, settings, found in cases:
        assert found == suffix.continuations(corpus, query, settings)


def test_a_copy_is_walked_without_counting_continuations(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    text = rng.integers(0, 10_000, 300)
    corpus = np.concatenate([text, text[:120]])  # the output copies the start of the prompt
    counted = []
    ranked = suffix._ranked
    monkeypatch.setattr(suffix, "_ranked", lambda following, positions: counted.append(following.size) or
                        ranked(following, positions))
    (path,) = suffix.continuations(corpus, corpus, LookupSettings(max_tokens=32, factor=32.0))
    assert path.tokens == tuple(text[120:152].tolist()) and path.probs == (1.0,) * 32
    assert not counted  # no step counted the tokens that follow: each had one continuation
