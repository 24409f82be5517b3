"""A draft's support ids: the one-hot shortcut gives exactly what a full np.flatnonzero search gives."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.sampling.processors import (
    SamplerOrder,
    SamplingParams,
    draft_support_ids,
    one_hot,
    processed_probs,
    truncate_to_top,
)

QWEN_VOCAB = 151_936


def searched(probs: np.ndarray) -> list[list[int]]:
    """The support as a full search finds it."""
    return [np.flatnonzero(row).tolist() for row in probs]


def found(probs: np.ndarray, tokens: list[int]) -> list[list[int]]:
    return [ids.tolist() for ids in draft_support_ids(probs, tokens)]


def test_one_hot_rows_give_their_tokens() -> None:
    tokens = [0, 7, 7, 151_935, 42]
    probs = one_hot(tokens, QWEN_VOCAB)
    assert found(probs, tokens) == searched(probs) == [[t] for t in tokens]
    assert all(ids.dtype == np.flatnonzero(probs[0]).dtype for ids in draft_support_ids(probs, tokens))


@pytest.mark.parametrize("order", list(SamplerOrder))
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=20),
                                    SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=1.3)])
def test_sampled_rows_give_what_a_search_gives(order: SamplerOrder, params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(0.0, 3.0, size=(4, 5_000))
    probs = np.stack([truncate_to_top(row, 10) for row in processed_probs(logits, params, order)])
    tokens = [int(rng.choice(row.size, p=row)) for row in probs]
    assert found(probs, tokens) == searched(probs)


def test_rows_that_only_look_one_hot_are_searched() -> None:
    probs = one_hot([3, 5, 8, 2], 16)
    probs[0, 9] = 1e-300  # 1.0 at the token and a sliver elsewhere: two ids
    probs[1, 6] = -0.0  # a negative zero is no support
    probs[2, 8] = 0.5  # not 1.0 at the token
    assert found(probs, [3, 5, 8, 9]) == searched(probs) == [[3, 9], [5], [8], [2]]  # the last drew elsewhere


def test_rows_past_the_tokens_and_other_dtypes_are_searched() -> None:
    probs = one_hot([1, 2, 3], 8)
    assert found(probs, [1]) == searched(probs)
    assert found(probs.astype(np.float32), [1, 2, 3]) == searched(probs)
    assert found(probs[:0], []) == []
