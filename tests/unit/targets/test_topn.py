"""Top-N verification answers: when they are exact, the folded support they give, and the error bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs
from proxy.sampling.rejection import verify_on_support
from proxy.targets.base import PositionLogprobs, Verification
from proxy.targets.topn import (
    BEYOND_TOP_N,
    bound_problem,
    exactness_problem,
    logprobs_problem,
    support_from_top_n,
    unknown_mass_bound,
)

VLLM, SGLANG = SamplerOrder.TEMPERATURE_THEN_TRUNCATE, SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE


@pytest.mark.parametrize(("params", "order", "exact"), [
    (SamplingParams(temperature=0.0), VLLM, True),
    (SamplingParams(temperature=1.0), VLLM, False),  # the tail outside the top N is unknown
    (SamplingParams(temperature=0.7, top_k=20), VLLM, True),
    (SamplingParams(temperature=0.7, top_k=21), VLLM, False),  # top_k wider than the N returned
    (SamplingParams(temperature=0.7, top_k=5, top_p=0.9), VLLM, True),  # renormalised top_p: exact
    (SamplingParams(temperature=0.7, top_k=5, top_p=0.9), SGLANG, False),  # joint top_p needs the normaliser
    (SamplingParams(temperature=1.0, top_k=5, top_p=0.9), SGLANG, False),  # at T = 1 too: the fold renormalises
])
def test_exactness_rules(params: SamplingParams, order: SamplerOrder, exact: bool) -> None:
    assert (exactness_problem(params, 20, order) is None) == exact


@pytest.mark.parametrize(("params", "bounded"), [
    (SamplingParams(temperature=1.0), True),
    (SamplingParams(temperature=0.5), True),
    (SamplingParams(temperature=1.5), False),
    (SamplingParams(temperature=1.0, top_p=0.9), False),
])
def test_bound_rules(params: SamplingParams, bounded: bool) -> None:
    assert (bound_problem(params) is None) == bounded


def top_n_answer(logits: np.ndarray, draft_tokens: list[int], n: int) -> Verification:
    """What a server returns: raw logprobs of the top n per row, plus each scored token."""
    logprobs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    positions = []
    for row, values in enumerate(logprobs):
        top = np.lexsort((np.arange(values.size), -values))[:n]
        token = draft_tokens[row] if row < len(draft_tokens) else None
        positions.append(PositionLogprobs(token, None if token is None else float(values[token]), top, values[top]))
    return Verification(tuple(positions), int(np.argmax(logits[-1])), 0)


def test_truncated_top_n_support_equals_the_full_distribution() -> None:
    rng = np.random.default_rng(7)
    vocab, k, n = 50, 3, 10
    logits = rng.normal(0, 2, size=(k + 1, vocab))
    params = SamplingParams(temperature=0.7, top_k=6)
    draft_probs = np.zeros((k, vocab))
    draft_tokens = []
    for row in range(k):
        draft_probs[row, rng.choice(vocab, 4, replace=False)] = 0.25
        draft_tokens.append(int(np.flatnonzero(draft_probs[row])[0]))
    support, bound = support_from_top_n(top_n_answer(logits, draft_tokens, n), tuple(draft_tokens),
                                        draft_probs, params, VLLM)
    assert bound == 0.0
    full = processed_probs(logits, params, VLLM)
    for row in range(k + 1):
        ids = support.ids[row][support.ids[row] >= 0]
        np.testing.assert_allclose(support.target_probs[row, : ids.size], full[row, ids], atol=1e-12)
        assert full[row].sum() - full[row, ids].sum() == pytest.approx(0.0, abs=1e-12)  # nothing outside
        if row < k:
            np.testing.assert_allclose(support.draft_probs[row, : ids.size], draft_probs[row, ids])


def test_greedy_top_n_round_accepts_while_drafts_match_the_argmax() -> None:
    logits = np.array([[0.0, 5.0, 1.0, 0.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]])
    draft_tokens = [1, 2]  # the first matches the target's argmax, the second does not (argmax 0)
    draft_probs = np.zeros((2, 4))
    draft_probs[0, 1] = draft_probs[1, 2] = 1.0
    support, _ = support_from_top_n(top_n_answer(logits, draft_tokens, 2), (1, 2), draft_probs,
                                    SamplingParams(temperature=0.0), VLLM)
    result = verify_on_support((1, 2), support, np.random.default_rng(0))
    assert result.emitted == (1, 0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), temperature=st.floats(0.2, 1.0), n=st.integers(1, 30))
def test_unknown_mass_bound_is_an_upper_bound(seed: int, temperature: float, n: int) -> None:
    rng = np.random.default_rng(seed)
    logprobs = rng.normal(0, 3, size=200)
    logprobs -= math.log(np.exp(logprobs).sum())
    top = np.sort(logprobs)[::-1]
    tempered = np.exp(top / temperature)
    true_outside = tempered[n:].sum() / tempered.sum()
    assert unknown_mass_bound(top[:n], temperature) >= true_outside - 1e-12


@pytest.mark.parametrize(("params", "n", "sampled_within", "problem"), [
    (SamplingParams(temperature=0.0), 3, False, None),  # greedy: the argmax is the top-1
    (SamplingParams(temperature=0.0), 5, True, "5 asked for, top_logprobs is 4"),
    (SamplingParams(temperature=0.7, top_k=4), 2, False, None),  # every token it can draw is in the top 4
    (SamplingParams(temperature=0.7, top_k=5), 2, False, "a token sampled outside the top 4"),
    (SamplingParams(temperature=0.7), 2, False, "a token sampled outside the top 4"),
    (SamplingParams(temperature=0.7), 2, True, None),  # a top-N round samples among the ids it knows
])
def test_log_probs_come_from_the_top_n_when_every_emitted_token_is_in_it(params: SamplingParams, n: int,
                                                                         sampled_within: bool,
                                                                         problem: str | None) -> None:
    got = logprobs_problem(params, n, 4, sampled_within=sampled_within)
    assert got == problem if problem is None else (got is not None and BEYOND_TOP_N in got and problem in got)
