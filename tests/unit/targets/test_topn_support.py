"""The round's support folded at once equals the per-position fold over dense draft rows (the reference below)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proxy.sampling.draft_rows import DraftRows
from proxy.sampling.processors import SamplerOrder, SamplingParams, one_hot, processed_probs, truncate_to_top
from proxy.sampling.rejection import KnownSupport
from proxy.targets import topn
from proxy.targets.base import PositionLogprobs, Verification

VOCAB = 151_936
HUGE_VOCAB = 2**40  # a row over it would need 8 TiB: a fold that works here never allocates over the vocabulary
VLLM = SamplerOrder.TEMPERATURE_THEN_TRUNCATE


def reference(verification: Verification, draft_tokens: tuple[int, ...], dense: np.ndarray, params: SamplingParams,
              order: SamplerOrder) -> tuple[KnownSupport, float]:
    """The fold as it was: one position at a time, a dict of the known ids, the draft's dense rows searched."""
    k = len(draft_tokens)
    rows, worst = [], 0.0
    for position, scored in enumerate(verification.positions):
        known = dict(zip(scored.top_ids.tolist(), scored.top_logprobs.tolist()))
        if scored.token_id is not None and scored.token_logprob is not None:
            known.setdefault(scored.token_id, scored.token_logprob)
        draft_ids = np.flatnonzero(dense[position]) if position < k else np.array([], dtype=np.int64)
        ids = np.array(sorted(set(known) | set(draft_ids.tolist())), dtype=np.int64)
        logprobs = np.array([known.get(i, -math.inf) for i in ids.tolist()])
        rows.append((ids, processed_probs(logprobs, params, order), dense[position, ids] if position < k else None))
        if not params.greedy and topn.exactness_problem(params, len(scored.top_ids), order) is not None:
            worst = max(worst, topn.unknown_mass_bound(logprobs[np.isfinite(logprobs)], params.temperature))
    ids, target, draft = zip(*rows)
    return KnownSupport.from_rows(ids, target, draft[:k], np.zeros(k + 1), np.full(k + 1, -1)), worst


def answer(rng: np.random.Generator, draft_tokens: tuple[int, ...], vocab: int = VOCAB, n: int = 20) -> Verification:
    """Top-n raw log-probs at each draft position and the bonus; some drafts among them, some ranked below, ties."""
    positions = []
    for row in range(len(draft_tokens) + 1):
        token = draft_tokens[row] if row < len(draft_tokens) else None
        top = rng.choice(vocab, n, replace=False) if vocab < 2**32 else rng.integers(0, vocab, n)
        if token is not None and rng.random() < 0.5:
            top[rng.integers(n)] = token  # the draft token ranked: its top entry's log-prob wins over the scored one
        logprobs = np.sort(np.round(rng.normal(-3.0, 1.0, n), 1))[::-1]  # rounded: argmax ties happen
        positions.append(PositionLogprobs(token, None if token is None else -4.0, np.unique(top)[:n],
                                          logprobs[: np.unique(top)[:n].size]))
    return Verification(tuple(positions), int(positions[-1].top_ids[0]), 0)


def one_hot_draft(rng: np.random.Generator, k: int) -> tuple[tuple[int, ...], np.ndarray]:
    tokens = tuple(int(t) for t in rng.integers(0, VOCAB, k))
    return tokens, one_hot(tokens, VOCAB)


def sampled_draft(rng: np.random.Generator, k: int) -> tuple[tuple[int, ...], np.ndarray]:
    logits = rng.normal(0.0, 3.0, size=(k, VOCAB))
    probs = np.array([truncate_to_top(row, 8) for row in processed_probs(logits, SamplingParams(0.8), VLLM)])
    probs = probs.reshape(k, VOCAB)
    return tuple(int(rng.choice(VOCAB, p=row)) for row in probs), probs


PARAMS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=20), SamplingParams(temperature=1.0),
          SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05), SamplingParams(temperature=1.3, top_k=5)]


@pytest.mark.parametrize("order", list(SamplerOrder))
@pytest.mark.parametrize("make_draft", [one_hot_draft, sampled_draft])
@pytest.mark.parametrize("params", PARAMS)
def test_the_round_folds_as_the_reference(make_draft, params: SamplingParams, order: SamplerOrder) -> None:
    rng = np.random.default_rng(11)
    for k in (0, 1, 6):
        tokens, dense = make_draft(rng, k)
        verification = answer(rng, tokens)
        expected, expected_bound = reference(verification, tokens, dense, params, order)
        for probs in (DraftRows.from_dense(dense), dense):  # the Draft's sparse rows, or a dense matrix given
            support, bound = topn.support_from_top_n(verification, tokens, probs, params, order)
            assert bound == expected_bound
            for name in ("ids", "draft_probs", "target_probs", "outside_mass", "outside_tokens"):
                np.testing.assert_array_equal(getattr(support, name), getattr(expected, name), err_msg=name)


def test_a_lookup_round_folds_without_a_pass_over_the_vocabulary() -> None:
    rng = np.random.default_rng(5)
    tokens = tuple(int(t) for t in rng.integers(0, HUGE_VOCAB, 8))
    verification = answer(rng, tokens, vocab=HUGE_VOCAB)
    for params in PARAMS:
        support, _ = topn.support_from_top_n(verification, tokens, DraftRows.one_hot(tokens, HUGE_VOCAB), params,
                                             SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE)
        for position, token in enumerate(tokens):  # each draft token is known, with the draft's whole mass
            column = np.flatnonzero(support.ids[position] == token)
            assert column.size == 1 and support.draft_probs[position, column[0]] == 1.0
        assert np.allclose(support.target_probs.sum(axis=1), 1.0)
