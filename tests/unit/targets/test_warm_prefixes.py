"""proxy/targets/warm_prefixes.py: which contexts extend a sequence the server computed lately."""

from __future__ import annotations

import pytest

from proxy.targets.warm_prefixes import WarmPrefixes

SEEN = [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(("context", "gap", "covered"), [
    (SEEN, 0, True),  # the same sequence
    (SEEN + [7, 8], 2, True),  # a round later: accepted drafts and a bonus
    (SEEN + [7, 8, 9], 2, False),  # too far past it: its tail would be recomputed K + 1 times
    ([1, 2, 3, 9, 5, 6, 7], 4, False),  # differs inside it
    (SEEN[:4], 4, False),  # shorter than anything remembered
])
def test_covers(context: list[int], gap: int, covered: bool) -> None:
    warm = WarmPrefixes()
    warm.add(SEEN)
    assert warm.covers(context, gap) is covered


def test_the_oldest_memory_goes_first() -> None:
    warm = WarmPrefixes(remembered=2)
    for sequence in ([1, 2], [3, 4, 5], [6, 7, 8, 9]):
        warm.add(sequence)
    assert [warm.covers(s, 0) for s in ([1, 2], [3, 4, 5], [6, 7, 8, 9])] == [False, True, True]
