"""Prompt-lookup proposals as a table."""

from __future__ import annotations

import pytest

from proxy.drafting.lookup import lookup


@pytest.mark.parametrize(("context", "k", "expected"), [
    ([1, 2, 3, 4, 1, 2], 2, [3, 4]),  # tail (1, 2) seen before: what followed it
    ([1, 2, 3, 4, 1, 2], 5, [3, 4, 1, 2]),  # the continuation runs to the end of the context
    ([5, 1, 2, 9, 1, 2, 7, 1, 2], 1, [7]),  # the latest earlier match wins
    ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 1, [9]),  # the longest tail n-gram wins over a later shorter match
    ([1, 2, 3], 3, []),  # nothing repeats
    ([7], 3, []),  # too short to match
    ([4, 4, 4, 4], 2, [4]),  # overlapping matches
])
def test_lookup(context: list[int], k: int, expected: list[int]) -> None:
    assert lookup(context, k, max_ngram=3) == expected


def test_min_ngram_refuses_short_matches() -> None:
    assert lookup([1, 5, 2, 1], 2, max_ngram=3, min_ngram=2) == []
    assert lookup([1, 5, 2, 1], 2, max_ngram=3, min_ngram=1) == [5, 2]
