"""From a top-N verification answer to the sampler's `KnownSupport`, and when that is exact.

Stock servers return raw logprobs for the top N tokens (plus the scored token), never the whole
vocabulary. What that allows:
- greedy: the argmax is the top-1: exact;
- `top_k` in 1..N: the whole support is known; temperature, min_p (a ratio to the max) and
  renormalised top_p are then exact too. SGLang's joint top_p is judged on the full softmax,
  not on the known ids renormalised, so it is not exact here;
- otherwise the target's mass outside the top N is unknown: not exact. In `bounded` mode we use
  the renormalised top N and report a bound on the total-variation error per token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from proxy.errors import UpstreamUnavailableError
from proxy.sampling.draft_rows import DraftRows
from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs
from proxy.sampling.rejection import KnownSupport
from proxy.targets.base import PositionLogprobs, Verification

PENALTY_NOT_IN_LOGPROBS = "the server applies repetition_penalty after the raw log-probs it answers"


def exactness_problem(params: SamplingParams, top_n: int, order: SamplerOrder) -> str | None:
    """Why top-N logprobs cannot give the exact target distribution for these parameters (None: they can)."""
    if params.repetition_penalty != 1.0:
        return PENALTY_NOT_IN_LOGPROBS
    if params.greedy:
        return None
    if not 1 <= params.top_k <= top_n:
        return f"temperature > 0 needs top_k in 1..{top_n} for an exact top-{top_n} verification"
    if order is SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE and params.top_p < 1:
        return "SGLang's joint top_p is judged on the full-vocabulary softmax, not the known ids"
    return None


BEYOND_TOP_N = "log-probs beyond the route's top-N"


def logprobs_problem(params: SamplingParams, n: int, top_n: int, *, sampled_within: bool) -> str | None:
    """Why a request's top-`n` log-probs cannot come from top-`top_n` answers (None: they can). `sampled_within`:
    every token a round can emit has its log-prob in the answer (drafts are scored; a top-N round samples among the
    known ids), else only greedy and top_k in 1..top_n keep the sampled token inside the top-N."""
    if n > top_n:
        return f"{BEYOND_TOP_N}: {n} asked for, top_logprobs is {top_n}"
    if not (sampled_within or params.greedy or 1 <= params.top_k <= top_n):
        return f"{BEYOND_TOP_N}: a token sampled outside the top {top_n} has no log-prob in the answer"
    return None


def bound_problem(params: SamplingParams) -> str | None:
    """Why even a bounded approximation is not offered (None: it is)."""
    if params.repetition_penalty != 1.0:
        return PENALTY_NOT_IN_LOGPROBS
    if params.top_p < 1 or params.min_p > 0:
        return "top_p/min_p over an unknown tail: no useful error bound"
    if params.temperature > 1:
        return "temperature > 1 lifts the unknown tail: no useful error bound"
    return None


def unknown_mass_bound(known_logprobs: np.ndarray, temperature: float) -> float:
    """Upper bound on the target's mass outside the known tokens after tempering (T <= 1).

    u = 1 − Σ exp(lp) is exact at T = 1. For T < 1 every unknown token has lp <= lp_min, so
    exp(lp / T) <= exp(lp) · exp(lp_min · (1/T − 1)): the unknown tempered mass is at most
    u · exp(lp_min · (1/T − 1)), and its share at most that over the known tempered mass.
    """
    raw_unknown = max(0.0, 1.0 - float(np.exp(known_logprobs).sum()))
    if temperature == 1.0:
        return raw_unknown
    lowest = float(known_logprobs.min())
    tempered_known = float(np.exp(known_logprobs / temperature).sum())
    return min(1.0, raw_unknown * math.exp(lowest * (1.0 / temperature - 1.0)) / tempered_known)


def support_from_top_n(verification: Verification, draft_tokens: tuple[int, ...], draft_probs: DraftRows | np.ndarray,
                       params: SamplingParams, order: SamplerOrder) -> tuple[KnownSupport, float]:
    """Fold a top-N answer and the draft into a KnownSupport; also return the largest per-position error bound.

    Per position the ids are the answer's top ids, the scored token and the draft's candidates, ascending (argmax
    ties -> lower id); an id's log-prob is the top entry's, else the scored token's, else -inf (a draft candidate
    the target did not rank). The whole round is folded at once, without a pass over the vocabulary."""
    k = len(draft_tokens)
    if len(verification.positions) != k + 1:  # any other count would pair rows with the wrong draft positions
        raise UpstreamUnavailableError(f"upstream answer rejected: {len(verification.positions)} positions scored "
                                       f"for {k} drafts and the bonus")
    rows = draft_probs[:k] if isinstance(draft_probs, DraftRows) else DraftRows.from_dense(np.asarray(draft_probs)[:k])
    ids, logprobs, draft, widths = _known(verification.positions, rows)
    if not np.isfinite(logprobs).any(axis=1).all():
        raise ValueError("every row of logits needs at least one finite value")  # as processed_probs says it
    target = np.zeros(logprobs.shape)
    if params.greedy:  # one-hot at the argmax: the first of equals, the lowest id (padding is -inf, never chosen)
        target[np.arange(k + 1), np.argmax(logprobs, axis=1)] = 1.0
    else:
        for width in np.unique(widths).tolist():  # rows of one width together: each row as it would be alone
            same = np.flatnonzero(widths == width)
            target[same, :width] = processed_probs(logprobs[same, :width], params, order)
    worst = 0.0
    if not params.greedy:
        for position, scored in enumerate(verification.positions):
            if exactness_problem(params, len(scored.top_ids), order) is not None:
                known = logprobs[position, : widths[position]]
                worst = max(worst, unknown_mass_bound(known[np.isfinite(known)], params.temperature))
    support = KnownSupport(ids, draft, target, np.zeros(k + 1), np.full(k + 1, -1, dtype=np.int64))
    return support, worst


def _known(positions: Sequence[PositionLogprobs],
           rows: DraftRows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per position, the sorted union of the top ids, the scored token and the draft's ids, padded: ids (-1 pads),
    log-probs (-inf pads and ids the target did not rank), the draft's probabilities, and each row's width."""
    k = len(rows)
    scored = [(position, p.token_id, p.token_logprob) for position, p in enumerate(positions)
              if p.token_id is not None and p.token_logprob is not None]
    top_sizes, draft_sizes = [p.top_ids.size for p in positions], [ids.size for ids in rows.ids]
    sizes = [sum(top_sizes), len(scored), sum(draft_sizes)]
    # Every entry that names an id: the top ones, the scored tokens, the draft's candidates (each of k + 1 rows).
    row = np.concatenate([np.repeat(np.arange(k + 1), top_sizes), np.array([s[0] for s in scored], dtype=np.int64),
                          np.repeat(np.arange(k), draft_sizes)])
    token = np.concatenate([*(p.top_ids for p in positions), np.array([s[1] for s in scored], dtype=np.int64),
                            *rows.ids]).astype(np.int64, copy=False)
    logprob = np.concatenate([*(p.top_logprobs for p in positions), np.array([s[2] for s in scored], dtype=float),
                              np.full(sizes[2], -np.inf)])
    drafted = np.concatenate([np.zeros(sizes[0] + sizes[1]), *rows.probs])
    rank = np.repeat(np.arange(3), sizes)  # which entry's log-prob an id takes when several name it: the first
    order = np.lexsort((rank, token, row))
    row, token, logprob, drafted = row[order], token[order], logprob[order], drafted[order]
    first = np.ones(row.size, dtype=bool)  # the first entry of each (row, id): the best-ranked one
    first[1:] = (row[1:] != row[:-1]) | (token[1:] != token[:-1])
    starts = np.flatnonzero(first)
    drafted = np.maximum.reduceat(drafted, starts)  # a draft candidate's probability, whichever entry came first
    row, token, logprob = row[starts], token[starts], logprob[starts]
    widths = np.bincount(row, minlength=k + 1)
    column = np.arange(row.size) - (np.cumsum(widths) - widths)[row]
    shape = (k + 1, max(int(widths.max()), 1))
    ids, logprobs, draft = np.full(shape, -1, dtype=np.int64), np.full(shape, -np.inf), np.zeros((k, shape[1]))
    ids[row, column], logprobs[row, column] = token, logprob
    in_draft = row < k
    draft[row[in_draft], column[in_draft]] = drafted[in_draft]
    return ids, logprobs, draft, widths
