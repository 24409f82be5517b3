"""Tests for proxy.sampling.processors: each backend's logits -> distribution, as tables and properties."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from proxy.sampling.processors import SamplerOrder, SamplingParams, one_hot, processed_probs

PROBS_TOLERANCE = 1e-12
QWEN_VOCAB = 151_936
LLAMA, VLLM, SGLANG = (
    SamplerOrder.TRUNCATE_THEN_TEMPERATURE,
    SamplerOrder.TEMPERATURE_THEN_TRUNCATE,
    SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE,
)
ALL_ORDERS = list(SamplerOrder)
LN2 = math.log(2.0)

# processed_probs: tables, order-dependence, and properties.


def _softmax_of(logits: list[float]) -> np.ndarray:
    weights = np.exp(np.array(logits, dtype=float))
    return weights / weights.sum()


@pytest.mark.parametrize("order", ALL_ORDERS)
@pytest.mark.parametrize(
    "logits, params, expected",
    [
        ([0.0, LN2], SamplingParams(temperature=1.0), [1 / 3, 2 / 3]),
        ([0.0, LN2], SamplingParams(temperature=0.5), [1 / 5, 4 / 5]),
        ([0.0, LN2], SamplingParams(temperature=2.0), [1 / (1 + 2**0.5), 2**0.5 / (1 + 2**0.5)]),
        ([3.0, 1.0, 2.0, 0.0], SamplingParams(top_k=2), [1 / (1 + math.e**-1), 0, 1 / (1 + math.e), 0]),
        ([3.0, 1.0, 2.0, 0.0], SamplingParams(top_k=-1), _softmax_of([3, 1, 2, 0])),
        # Mass before each token: 0, 0.6, 0.9; the token crossing 0.7 is included, the next is not.
        (np.log([0.6, 0.3, 0.1]), SamplingParams(top_p=0.7), [2 / 3, 1 / 3, 0.0]),
        # min_p boundary: prob == min_p * max survives.
        ([0.0, math.log(0.5), math.log(0.25)], SamplingParams(min_p=0.5), [2 / 3, 1 / 3, 0.0]),
        ([1.0, 3.0, 3.0, 0.0], SamplingParams(temperature=0.0, top_k=3), [0.0, 1.0, 0.0, 0.0]),
    ],
)
def test_processed_probs_table(
    order: SamplerOrder, logits: list[float], params: SamplingParams, expected: list[float]
) -> None:
    got = processed_probs(np.array(logits), params, order)
    assert got.shape == (len(expected),)
    np.testing.assert_allclose(got, expected, rtol=0, atol=PROBS_TOLERANCE)


@pytest.mark.parametrize(
    "logits, params, expected_by_order",
    [
        # Tie at the top-k boundary: llama.cpp and SGLang keep exactly k (lowest ids), vLLM keeps ties.
        (
            [1.0, 1.0, 1.0, 0.0],
            SamplingParams(top_k=2),
            {LLAMA: [0.5, 0.5, 0, 0], VLLM: [1 / 3, 1 / 3, 1 / 3, 0], SGLANG: [0.5, 0.5, 0, 0]},
        ),
        # Mass before the third token is exactly 0.5: llama.cpp and vLLM drop it (<), SGLang keeps it
        # (<=). vLLM masks its ascending sort from the bottom, so among ties the highest ids survive.
        (
            [0.0, 0.0, 0.0, 0.0],
            SamplingParams(top_p=0.5),
            {LLAMA: [0.5, 0.5, 0, 0], VLLM: [0, 0, 0.5, 0.5], SGLANG: [1 / 3, 1 / 3, 1 / 3, 0]},
        ),
        # top_p before temperature (llama.cpp) keeps 1 token; after (vLLM, SGLang) keeps 2.
        (
            [2.0, 1.0, 0.0],
            SamplingParams(temperature=2.0, top_p=0.6),
            {
                LLAMA: [1, 0, 0],
                VLLM: [1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(0.5)), 0],
                SGLANG: [1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(0.5)), 0],
            },
        ),
        # vLLM and llama.cpp renormalise after top_k before top_p; SGLang judges top_p on the full mass.
        (
            np.log([0.4, 0.35, 0.25]),
            SamplingParams(top_k=2, top_p=0.5),
            {LLAMA: [1, 0, 0], VLLM: [1, 0, 0], SGLANG: [0.4 / 0.75, 0.35 / 0.75, 0]},
        ),
    ],
)
def test_order_matters(
    logits: list[float], params: SamplingParams, expected_by_order: dict[SamplerOrder, list[float]]
) -> None:
    got = {order: processed_probs(np.array(logits), params, order) for order in ALL_ORDERS}
    for order, expected in expected_by_order.items():
        np.testing.assert_allclose(got[order], expected, atol=PROBS_TOLERANCE, err_msg=str(order))
    assert any(not np.allclose(got[a], got[b]) for a in ALL_ORDERS for b in ALL_ORDERS)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature must be finite and >= 0"),
        ({"temperature": math.inf}, "temperature must be finite and >= 0"),
        ({"temperature": math.nan}, "temperature must be finite and >= 0"),
        ({"top_k": -2}, "top_k must be >= 1, or 0 or -1 for off"),
        ({"top_p": 1.5}, r"top_p must be in \[0, 1\]"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\]"),
    ],
)
def test_sampling_params_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature, greedy", [(0.0, True), (1e-6, True), (1e-5, False), (0.7, False)])
def test_greedy_threshold(temperature: float, greedy: bool) -> None:
    assert SamplingParams(temperature=temperature).greedy is greedy


@pytest.mark.parametrize("order", ALL_ORDERS)
def test_full_qwen_vocab_rows(order: SamplerOrder) -> None:
    logits = np.random.default_rng(7).normal(0.0, 3.0, size=(17, QWEN_VOCAB)).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    probs = processed_probs(logits, params, order)
    assert probs.shape == logits.shape and probs.dtype == np.float64
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, atol=PROBS_TOLERANCE)
    assert ((probs > 0).sum(axis=-1) <= 40).all()


LOGITS = hnp.arrays(
    np.float64,
    st.tuples(st.integers(1, 3), st.integers(1, 24)),
    elements=st.integers(-12, 12).map(float),
)
PARAMS = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 1.0, 1.7]),
    top_k=st.integers(-1, 30),
    top_p=st.floats(0.0, 1.0),
    min_p=st.floats(0.0, 1.0),
)
ORDERS = st.sampled_from(ALL_ORDERS)


@settings(max_examples=200, deadline=None)
@given(logits=LOGITS, params=PARAMS, order=ORDERS)
def test_rows_are_distributions(logits: np.ndarray, params: SamplingParams, order: SamplerOrder) -> None:
    probs = processed_probs(logits, params, order)
    assert (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, atol=PROBS_TOLERANCE)
    # Every backend keeps at least one of the most likely tokens.
    top = logits == logits.max(axis=-1, keepdims=True)
    assert (np.where(top, probs, 0.0).sum(axis=-1) > 0).all()


@settings(max_examples=200, deadline=None)
@given(logits=LOGITS, params=PARAMS, order=ORDERS, ks=st.tuples(st.integers(1, 30), st.integers(1, 30)))
def test_support_shrinks_with_top_k(
    logits: np.ndarray, params: SamplingParams, order: SamplerOrder, ks: tuple[int, int]
) -> None:
    small, large = sorted(ks)
    probs_small, probs_large = (
        processed_probs(logits, SamplingParams(params.temperature, k, params.top_p, params.min_p), order)
        for k in (small, large)
    )
    assert not ((probs_small > 0) & (probs_large == 0)).any()
    if order is not VLLM:  # vLLM keeps every token tied with the k-th
        assert ((probs_small > 0).sum(axis=-1) <= small).all()


@settings(max_examples=200, deadline=None)
@given(logits=LOGITS, params=PARAMS, order=ORDERS)
def test_greedy_is_one_hot_at_np_argmax(
    logits: np.ndarray, params: SamplingParams, order: SamplerOrder
) -> None:
    greedy = SamplingParams(0.0, params.top_k, params.top_p, params.min_p)
    probs = processed_probs(logits, greedy, order)
    np.testing.assert_array_equal(probs, one_hot(np.argmax(logits, axis=-1), logits.shape[1]))


# (e) sample(): seeded reproducibility and edges.
