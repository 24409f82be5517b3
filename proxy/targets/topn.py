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

import numpy as np

from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplerOrder, SamplingParams, draft_support_ids, processed_probs
from proxy.sampling.rejection import KnownSupport
from proxy.targets.base import Verification


def exactness_problem(params: SamplingParams, top_n: int, order: SamplerOrder) -> str | None:
    """Why top-N logprobs cannot give the exact target distribution for these parameters (None: they can)."""
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


def support_from_top_n(verification: Verification, draft_tokens: tuple[int, ...], draft_probs: np.ndarray,
                       params: SamplingParams, order: SamplerOrder) -> tuple[KnownSupport, float]:
    """Fold a top-N answer and the draft into a KnownSupport; also return the largest per-position error bound."""
    k = len(draft_tokens)
    if len(verification.positions) != k + 1:  # any other count would pair rows with the wrong draft positions
        raise UpstreamUnavailableError(f"upstream answer rejected: {len(verification.positions)} positions scored "
                                       f"for {k} drafts and the bonus")
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # ids, target probs, draft probs per position
    worst = 0.0
    draft_support = draft_support_ids(draft_probs[:k], draft_tokens)
    for position, scored in enumerate(verification.positions):
        known = dict(zip(scored.top_ids.tolist(), scored.top_logprobs.tolist()))
        if scored.token_id is not None and scored.token_logprob is not None:
            known.setdefault(scored.token_id, scored.token_logprob)
        draft_ids = draft_support[position] if position < k else np.array([], dtype=np.int64)
        # ascending: argmax ties -> lower id
        ids = np.array(sorted(set(known) | set(draft_ids.tolist())), dtype=np.int64)
        logprobs = np.array([known.get(i, -math.inf) for i in ids.tolist()])
        rows.append((ids, processed_probs(logprobs, params, order),
                     draft_probs[position, ids] if position < k else None))
        if not params.greedy and exactness_problem(params, len(scored.top_ids), order) is not None:
            worst = max(worst, unknown_mass_bound(logprobs[np.isfinite(logprobs)], params.temperature))
    ids, target, draft = zip(*rows)
    support = KnownSupport.from_rows(ids, target, draft[:k], np.zeros(k + 1), np.full(k + 1, -1))
    return support, worst
