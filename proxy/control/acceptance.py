"""How far a round's drafts survive: survival curves, read chunks as rounds, and draft-ahead hits (pure)."""

from __future__ import annotations

from collections.abc import Sequence

UNMEASURED_ALPHA = 0.5  # a neutral prior before any round was seen
# Lookup paths by the tail of the context their source matched: 1, 2-3, 4-7, 8 or more tokens. A path found after
# one matching token is right far less often than one found after eight, so each class has a survival of its own.
MATCH_CLASSES = 4


def match_class(match: int) -> int:
    """The class of a path whose source matched `match` tokens of the context's tail (0, not known, counts as 1)."""
    return min(max(match, 1).bit_length() - 1, MATCH_CLASSES - 1)


def survival(alpha: float, measured: Sequence[float | None], k: int) -> list[float]:
    """P(the first j + 1 drafts are all accepted), j < k: measured where known, else one more α per position.

    Acceptances within a round are correlated (a round copying a stretch accepts it all), so the
    measured curve predicts tokens per round and hits better than α^j does.
    """
    curve, last = [], 1.0
    for j in range(k):
        value = measured[j] if j < len(measured) else None
        last = min(last, value) if value is not None else last * alpha
        curve.append(last)
    return curve


def right_prefix(path: Sequence[int], said: Sequence[int]) -> tuple[int, int]:
    """(positions compared, how many of them matched before the first difference)."""
    compared = min(len(path), len(said))
    return compared, next((i for i in range(compared) if path[i] != said[i]), compared)


def read_windows(agreed: Sequence[bool], k: int) -> tuple[list[int], list[int]]:
    """A read chunk as the greedy rounds the draft would have made, one starting at each token: per position j < k,
    how many of them reach j (j tokens remain in the chunk) and how many accept every draft up to j."""
    reached, survived = [0] * k, [0] * k
    run = 0  # drafts that would have been accepted in a row from this start on
    for start in range(len(agreed) - 1, -1, -1):
        run = run + 1 if agreed[start] else 0
        for position in range(min(len(agreed) - start, k)):
            reached[position] += 1
            survived[position] += position < run
    return reached, survived


def draft_ahead_hit(curve: Sequence[float], guess_right: float | None) -> float:
    """P(a round's draft-ahead is used): the previous round accepted all its drafts and the guessed token was right.

    Until the guess is measured, it is one more draft token: as likely as the last one given those before.
    """
    k = len(curve)
    guess = guess_right
    if guess is None:
        guess = curve[-1] / curve[-2] if k > 1 and curve[-2] > 0 else curve[0]
    return curve[-1] * guess
