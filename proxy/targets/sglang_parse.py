"""Reading SGLang's /generate answers: top-N log-probs per position, and our verifier's draft-support extension.

An answer is checked before any of it is used (checks.py); the usual answer is checked as whole arrays,
anything unusual value by value so that the first bad value is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from proxy.errors import UpstreamUnavailableError
from proxy.sampling.draft_rows import DraftRows
from proxy.sampling.rejection import KnownSupport
from proxy.targets import checks
from proxy.targets.base import PositionLogprobs, Verification

_INT = {int}
_FLOAT = {float}
_NUMBER = {int, float}


def parse_top(entries: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Parse [[logprob, id, text], ...] into id and logprob arrays (every id >= 0, every log-prob finite and <= 0)."""
    if not isinstance(entries, list) or not entries:
        raise UpstreamUnavailableError("upstream returned no top logprobs")
    raw_ids, raw_logprobs = [e[1] for e in entries], [e[0] for e in entries]
    # The usual answer, checked as whole arrays: plain ints and floats only (a bool is neither), in range.
    if set(map(type, raw_ids)) == _INT and set(map(type, raw_logprobs)) <= _NUMBER:
        try:
            ids, logprobs = np.array(raw_ids, dtype=np.int64), np.array(raw_logprobs, dtype=np.float64)
        except OverflowError:  # a number no int64 or float holds: the checks below name it
            pass
        else:
            if (ids.min() >= 0 and ids.max() <= checks.MAX_TOKEN_ID and np.isfinite(logprobs).all()
                    and logprobs.max() <= checks.MAX_LOGPROB):
                return ids, logprobs
    # Anything else, value by value: the first bad one is named.
    ids = np.array(checks.token_ids(raw_ids, None, what), dtype=np.int64)
    logprobs = np.array([checks.logprob(value, what) for value in raw_logprobs], dtype=np.float64)
    return ids, logprobs


def ending(meta: Any, token: int) -> tuple[int, bool] | None:
    """(token, whether the server ended there) for an answer that generated it last: `finish_reason` "stop" that
    matched the id, or "length" where it would have gone on; None for anything else (a stop string, an abort)."""
    finish = meta.get("finish_reason") if isinstance(meta, dict) else None
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind == "length":
        return token, False
    if kind == "stop" and finish.get("matched") == token:
        return token, True
    return None


def _draft_rows(actual: list, tops: list, k: int, last_context_token: int | None) -> tuple[list, list]:
    """The entries scoring d_1..d_K, whichever alignment the server used."""
    first = actual[0] if actual else None
    if len(actual) == k + 1 and first[0] is None and last_context_token in (None, int(first[1])):
        return actual[1:], tops[1:]  # current SGLang: the last context token's null entry first
    if len(actual) == k and (k == 0 or first[0] is not None):
        return actual, tops  # older SGLang: no null entry unless the start is 0
    raise UpstreamUnavailableError(f"upstream scored {len(actual)} input positions for {k} drafts")


def parse_verification(answer: Any, draft_tokens: Sequence[int], last_context_token: int | None = None, *,
                       top_n: int | None = None, vocab_size: int | None = None) -> Verification:
    """Turn a /generate answer into per-position logprobs; raise on anything malformed or out of range
    (rows `top_n` wide when given, ids below `vocab_size` when given)."""
    width = None if top_n is None else min(top_n, vocab_size or top_n)
    try:
        meta = answer["meta_info"]
        actual, tops = _draft_rows(meta["input_token_logprobs"], meta["input_top_logprobs"], len(draft_tokens),
                                   last_context_token)
        bonus_rows = meta["output_top_logprobs"]
        fast = _usual_positions(draft_tokens, actual, tops, bonus_rows, width, vocab_size)
        if fast is not None:
            checks.count(answer["output_ids"], 1, "the answer", "output ids")
            bonus = checks.token_id(answer["output_ids"][0], vocab_size, "the bonus token")
            return Verification(fast, bonus, checks.tokens(meta.get("cached_tokens", 0), "cached_tokens"))
        positions = []
        for index, (token, entry, top) in enumerate(zip(draft_tokens, actual, tops, strict=True)):
            what = f"draft position {index + 1}"
            if checks.token_id(entry[1], None, what) != token:
                raise UpstreamUnavailableError("upstream scored a different token than the draft")
            ids, logprobs = parse_top(top, what)
            scored = (token, checks.logprob(entry[0], what))
            checks.top_position(ids, logprobs, width=width, vocab_size=vocab_size, what=what, scored=scored)
            positions.append(PositionLogprobs(token, scored[1], ids, logprobs))
        checks.count(meta["output_top_logprobs"], 1, "the bonus position", "rows")
        ids, logprobs = parse_top(meta["output_top_logprobs"][0], "the bonus position")
        checks.top_position(ids, logprobs, width=width, vocab_size=vocab_size, what="the bonus position")
        positions.append(PositionLogprobs(None, None, ids, logprobs))
        checks.count(answer["output_ids"], 1, "the answer", "output ids")
        bonus = checks.token_id(answer["output_ids"][0], vocab_size, "the bonus token")
        return Verification(tuple(positions), bonus, checks.tokens(meta.get("cached_tokens", 0), "cached_tokens"))
    except checks.MALFORMED as exc:
        raise UpstreamUnavailableError(f"upstream sent a malformed verification answer ({type(exc).__name__})") from exc


def _usual_positions(draft_tokens: Sequence[int], actual: list, tops: list, bonus_rows: Any, width: int | None,
                     vocab_size: int | None) -> tuple[PositionLogprobs, ...] | None:
    """The positions of an answer in the usual shape, every row checked at once as one [K + 1, width] array; None
    where anything is unusual (then it is read value by value, and the first bad value named)."""
    k = len(draft_tokens)
    if not (width and type(bonus_rows) is list and len(bonus_rows) == 1 and len(actual) == len(tops) == k):
        return None
    rows = [*tops, bonus_rows[0]]
    if not all(type(row) is list and len(row) == width for row in rows):
        return None
    scored = [entry[0] for entry in actual]
    if (any(type(entry) is not list or len(entry) < 2 or type(entry[1]) is not int for entry in actual)
            or [entry[1] for entry in actual] != list(draft_tokens) or set(map(type, scored)) - _FLOAT):
        return None
    entries = [entry for row in rows for entry in row]
    if any(type(entry) is not list or len(entry) < 2 for entry in entries):
        return None
    raw_ids, raw_logprobs = [e[1] for e in entries], [e[0] for e in entries]
    if set(map(type, raw_ids)) != _INT or set(map(type, raw_logprobs)) - _NUMBER:
        return None
    try:
        ids = np.array(raw_ids, dtype=np.int64).reshape(k + 1, width)
        logprobs = np.array(raw_logprobs, dtype=np.float64).reshape(k + 1, width)
    except OverflowError:
        return None
    scored_logprobs = np.array(scored, dtype=np.float64)
    every_logprob = np.concatenate([logprobs.ravel(), scored_logprobs])
    bound = vocab_size if vocab_size is not None else checks.MAX_TOKEN_ID + 1
    if not (ids.min() >= 0 and ids.max() < bound and np.isfinite(every_logprob).all()
            and every_logprob.max() <= checks.MAX_LOGPROB):
        return None
    ordered = np.sort(ids, axis=1)
    if (ordered[:, 1:] == ordered[:, :-1]).any():  # a token named twice in a row
        return None
    mass = np.exp(logprobs).sum(axis=1)
    tokens = np.array(draft_tokens, dtype=np.int64)
    outside = ~(ids[:k] == tokens[:, None]).any(axis=1)  # a scored draft token ranked below the top N: its mass too
    if outside.any() and not (tokens[outside].min() >= 0 and tokens[outside].max() < bound):
        return None
    mass[:k] += np.where(outside, np.exp(scored_logprobs), 0.0)
    if (mass > 1.0 + checks.PROBABILITY_EPS).any():
        return None
    positions = [PositionLogprobs(token, logprob, ids[i], logprobs[i])
                 for i, (token, logprob) in enumerate(zip(draft_tokens, scored, strict=True))]
    return (*positions, PositionLogprobs(None, None, ids[k], logprobs[k]))


def parse_support(answer: Any, draft_tokens: Sequence[int], support_ids: list[list[int]],
                  draft_probs: DraftRows | np.ndarray, *, vocab_size: int | None = None) -> KnownSupport:
    """Turn a /generate answer with `draft_support` into the sampler's KnownSupport; raise on anything malformed
    or out of range (ids below `vocab_size` when given)."""
    try:
        extension = answer["meta_info"]["draft_support"]
        checks.count(answer["output_ids"], 1, "the answer", "output ids")
        bonus = checks.token_id(answer["output_ids"][0], vocab_size, "the bonus token")
        target = [np.asarray(row, dtype=np.float64) for row in extension["target_probs"]]
        outside_mass = [*map(float, extension["outside_mass"]), 1.0]  # the bonus row: all "outside"
        outside_tokens = [-1 if t is None else checks.token_id(t, None, "draft_support")
                          for t in extension["outside_tokens"]] + [bonus]
        if not len(target) == len(outside_mass) - 1 == len(outside_tokens) - 1 == len(draft_tokens):
            raise ValueError("draft_support has the wrong length")
        for position, ids in enumerate(support_ids):
            _check_support_row(position, ids, target[position], outside_mass[position], outside_tokens[position],
                               vocab_size)
        rows = draft_probs if isinstance(draft_probs, DraftRows) else DraftRows.from_dense(draft_probs)
        draft = [rows.at(position, np.asarray(ids, dtype=np.int64)) for position, ids in enumerate(support_ids)]
        return KnownSupport.from_rows([*support_ids, []], [*target, []], draft, np.array(outside_mass),
                                      np.array(outside_tokens))
    except checks.MALFORMED as exc:
        raise UpstreamUnavailableError(
            f"upstream sent a malformed draft_support answer ({type(exc).__name__})") from exc


def _check_support_row(position: int, ids: list[int], target: np.ndarray, outside_mass: float, outside_token: int,
                       vocab_size: int | None) -> None:
    """One draft position of the extension: a probability per support id, a full distribution with the outside
    mass, and an outside draw (where there is mass outside) that lies outside the support."""
    what = f"draft_support position {position + 1}"
    checks.probabilities(target, outside_mass, width=len(ids), what=what)
    if outside_token == -1:
        if outside_mass > 0.0:
            raise checks.fail(f"{what} has mass outside the draft's ids but no token drawn there")
        return
    checks.token_id(outside_token, vocab_size, what)
    if outside_token in ids:
        raise checks.fail(f"{what}'s outside token {outside_token} is one of the draft's ids")
