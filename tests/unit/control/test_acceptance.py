"""Survival curves and draft-ahead hits."""

from __future__ import annotations

import pytest

from proxy.control.acceptance import MATCH_CLASSES, draft_ahead_hit, match_class, survival


def test_survival_is_measured_where_known_and_never_rises() -> None:
    assert survival(0.5, [0.9, 0.8, None, 0.95], 6) == pytest.approx([0.9, 0.8, 0.4, 0.4, 0.2, 0.1])


@pytest.mark.parametrize(("curve", "guess_right", "expected"), [
    ([0.9, 0.8, 0.6], None, 0.6 * 0.6 / 0.8),  # the guess as likely as the last draft given those before
    ([0.9], None, 0.9 * 0.9),  # one draft: as likely as the first
    ([0.9, 0.0], None, 0.0),
    ([0.9, 0.8, 0.6], 0.5, 0.3),  # measured
])
def test_a_draft_ahead_is_used_when_every_draft_and_the_guess_were_right(curve: list[float], guess_right: float | None,
                                                                        expected: float) -> None:
    assert draft_ahead_hit(curve, guess_right) == pytest.approx(expected)


def test_lookup_paths_are_classed_by_the_power_of_two_of_their_match() -> None:
    classes = [match_class(m) for m in (0, 1, 2, 3, 4, 7, 8, 64)]
    assert classes == [0, 0, 1, 1, 2, 2, 3, 3] and max(classes) == MATCH_CLASSES - 1
