"""The support a top-N answer folds in is the same whether the draft's rows are searched in full or read as one-hot."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.sampling.processors import SamplerOrder, SamplingParams, one_hot, processed_probs, truncate_to_top
from proxy.targets import topn
from proxy.targets.base import PositionLogprobs, Verification

VOCAB = 151_936
VLLM = SamplerOrder.TEMPERATURE_THEN_TRUNCATE


def answer(rng: np.random.Generator, draft_tokens: list[int], n: int = 20) -> Verification:
    """Top-n raw log-probs at each draft position and the bonus, the drafts among them where they happen to be."""
    positions = []
    for row in range(len(draft_tokens) + 1):
        top = rng.choice(VOCAB, n, replace=False)
        logprobs = np.sort(rng.normal(-3.0, 1.0, n))[::-1]
        token = draft_tokens[row] if row < len(draft_tokens) else None
        positions.append(PositionLogprobs(token, None if token is None else -4.0, top, logprobs))
    return Verification(tuple(positions), int(positions[-1].top_ids[0]), 0)


def searched_support(probs: np.ndarray, tokens: tuple[int, ...]) -> list[np.ndarray]:
    """The draft's support as the full search found it."""
    return [np.flatnonzero(row) for row in probs]


def one_hot_draft(rng: np.random.Generator, k: int) -> tuple[tuple[int, ...], np.ndarray]:
    tokens = tuple(int(t) for t in rng.integers(0, VOCAB, k))
    return tokens, one_hot(tokens, VOCAB)


def sampled_draft(rng: np.random.Generator, k: int) -> tuple[tuple[int, ...], np.ndarray]:
    logits = rng.normal(0.0, 3.0, size=(k, VOCAB))
    probs = np.stack([truncate_to_top(row, 8) for row in processed_probs(logits, SamplingParams(0.8), VLLM)])
    return tuple(int(rng.choice(VOCAB, p=row)) for row in probs), probs


@pytest.mark.parametrize("make_draft", [one_hot_draft, sampled_draft])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=20),
                                    SamplingParams(temperature=1.0)])
def test_the_fast_support_folds_exactly_as_the_search(make_draft, params: SamplingParams,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    tokens, probs = make_draft(rng, 6)
    verification = answer(rng, list(tokens))
    fast, fast_bound = topn.support_from_top_n(verification, tokens, probs, params, VLLM)
    monkeypatch.setattr(topn, "draft_support_ids", searched_support)
    slow, slow_bound = topn.support_from_top_n(verification, tokens, probs, params, VLLM)
    assert fast_bound == slow_bound
    for name in ("ids", "draft_probs", "target_probs", "outside_mass", "outside_tokens"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)
