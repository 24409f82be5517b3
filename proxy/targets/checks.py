"""Checks on an upstream's answer before any of it reaches the sampler, the text stream or llama.cpp.

An answer is trusted in shape only: every token id a whole number inside the vocabulary the route
speculates in, every log-prob a finite number at most 0, every probability in [0, 1], the known
probabilities of a position summing to at most 1 + PROBABILITY_EPS, and exactly the rows and widths
asked for. Anything else is an `UpstreamUnavailableError` that names what was wrong, so the round is
never accepted. (An id past the vocabulary makes llama.cpp throw through ctypes and abort the process;
a NaN makes every acceptance test pass; Python's json reads Infinity, NaN and ints no float holds.)
Parsers catch MALFORMED around their reading, so an answer of the wrong shape is refused too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

import numpy as np

from proxy.errors import UpstreamUnavailableError

# A server's float32 log-softmax and normalisation round by far less than this; a corruption that matters does not.
PROBABILITY_EPS = 1e-3
MAX_LOGPROB = math.log1p(PROBABILITY_EPS)
# Past any vocabulary and any context, and within an int64: the bound when the route's own is unknown.
MAX_TOKEN_ID = 2**31 - 1
MAX_TOKENS = 2**31 - 1
MAX_SHOWN = 40  # characters of an offending value a message shows
# What reading an answer of the wrong shape raises: a key or index missing, a wrong type, a number no float holds.
MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError)


def fail(message: str) -> UpstreamUnavailableError:
    """The error for an answer we refuse to use."""
    return UpstreamUnavailableError(f"upstream answer rejected: {message}")


def shown(value: object) -> str:
    """A value as the upstream wrote it (JSON: Infinity, NaN, true), cut to MAX_SHOWN characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _whole(value: object) -> int | None:
    """An int from the wire, or None for a bool, a NaN, an infinity or a fraction (anything else: int()'s errors,
    the caller's "malformed" error)."""
    if isinstance(value, bool) or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        return None
    return int(value)  # type: ignore[call-overload]


def token_ids(ids: Iterable[object], vocab_size: int | None, what: str) -> list[int]:
    """The ids as ints, each inside the vocabulary (0..MAX_TOKEN_ID when its size is unknown)."""
    checked = []
    for value in ids:
        token = _whole(value)
        if token is None:
            raise fail(f"{what} holds {shown(value)} where a token id belongs")
        if token < 0 or token >= (vocab_size if vocab_size is not None else MAX_TOKEN_ID + 1):
            bound = (f"0..{vocab_size - 1}" if vocab_size is not None
                     else "ids >= 0" if token < 0 else f"ids up to {MAX_TOKEN_ID}")
            raise fail(f"{what} holds token id {shown(token)}, outside the vocabulary ({bound})")
        checked.append(token)
    return checked


def generated_ids(ids: Iterable[object], vocab_size: int | None, most: int, what: str) -> list[int]:
    """A plain answer's generated ids: token ids, no more than the `most` asked for."""
    checked = token_ids(ids, vocab_size, what)
    if len(checked) > most:
        raise fail(f"{what} has {len(checked)} tokens where at most {most} were asked for")
    return checked


def token_id(token: object, vocab_size: int | None, what: str) -> int:
    """One id, inside the vocabulary."""
    return token_ids([token], vocab_size, what)[0]


def tokens(value: object, what: str, *, least: int = 0) -> int:
    """A count of tokens (a context length, cached tokens): a whole number from `least` to MAX_TOKENS."""
    number = _whole(value)
    if number is None or not least <= number <= MAX_TOKENS:
        raise fail(f"{what} is {shown(value)}, not a number of tokens")
    return number


def logprob(value: object, what: str) -> float:
    """A log-prob from the wire: a finite number of at most 0 (a probability in [0, 1])."""
    if isinstance(value, bool):
        raise fail(f"{what} holds a log-prob of {shown(value)}, not a number")
    try:
        number = float(value)  # type: ignore[arg-type]  # TypeError/ValueError: the caller's "malformed" error
    except OverflowError:  # an int no float holds
        raise fail(f"{what} holds a log-prob of {shown(value)}, not a finite number") from None
    if not math.isfinite(number):
        raise fail(f"{what} holds a log-prob of {number}, not a finite number")
    if number > MAX_LOGPROB:
        raise fail(f"{what} holds a log-prob of {number}, above 0 (a probability above 1)")
    return number


def count(rows: Sequence[object] | int, expected: int, what: str, unit: str) -> None:
    """Exactly `expected` rows (or a count of them)."""
    got = rows if isinstance(rows, int) else len(rows)
    if got != expected:
        raise fail(f"{what} has {got} {unit} where {expected} were asked for")


def top_position(ids: np.ndarray, logprobs: np.ndarray, *, width: int | None, vocab_size: int | None, what: str,
                 scored: tuple[int, float] | None = None) -> None:
    """One position of a top-N answer: `width` distinct ids in the vocabulary, their mass (and the scored token's,
    when it stands outside them) at most 1. The log-prob values themselves were checked as they were read."""
    if width is not None:
        count(int(ids.size), width, what, "top log-probs")
    bound = vocab_size if vocab_size is not None else MAX_TOKEN_ID + 1
    # An int array inside the bounds passes at once; anything else is checked id by id, to name the first bad one.
    if not (ids.dtype.kind == "i" and (ids.size == 0 or (ids.min() >= 0 and ids.max() < bound))):
        token_ids(ids.tolist(), vocab_size, what)
    if np.unique(ids).size != ids.size:
        raise fail(f"{what} names a token twice in its top log-probs")
    mass = float(np.exp(logprobs).sum())
    if scored is not None and scored[0] not in ids:
        token_id(scored[0], vocab_size, what)
        mass += math.exp(scored[1])
    if mass > 1.0 + PROBABILITY_EPS:
        raise fail(f"{what}'s probabilities sum to {mass:.6g}, more than 1")


def probabilities(row: np.ndarray, outside_mass: float, *, width: int, what: str) -> None:
    """One position of a full distribution split as probabilities on `width` ids plus the mass outside them."""
    if row.ndim != 1:
        raise fail(f"{what} holds probabilities of shape {row.shape} for {width} ids")
    if row.size != width:
        raise fail(f"{what} holds {row.size} probabilities for {width} ids")
    values = np.append(row, outside_mass)
    if not np.isfinite(values).all():
        raise fail(f"{what} holds a probability that is not a finite number")
    if (values < 0.0).any() or (values > 1.0 + PROBABILITY_EPS).any():
        raise fail(f"{what} holds a probability outside [0, 1]")
    total = float(values.sum())
    if abs(total - 1.0) > PROBABILITY_EPS:
        raise fail(f"{what}'s probabilities and outside mass sum to {total:.6g}, not 1")
