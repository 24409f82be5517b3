"""The verifier's draft-support answer at temperature 0 equals the general one on one-hot rows."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs
from proxy.verifier.generate import greedy_support, support_answer

VOCAB = 50
GREEDY = SamplingParams(temperature=0.0)


def general(logits: np.ndarray, support: list[list[int]]) -> dict[str, list]:
    """The answer built from full processed rows, as sampled requests get it."""
    probs = processed_probs(logits, GREEDY, SamplerOrder.TRUNCATE_THEN_TEMPERATURE)
    return support_answer(probs, support, np.random.default_rng(0))


@pytest.mark.parametrize("seed", range(20))
def test_greedy_support_equals_the_general_answer(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    logits = rng.integers(-3, 3, size=(k, VOCAB)).astype(np.float32)  # small integers: ties for the top
    logits[rng.random((k, VOCAB)) < 0.2] = -np.inf
    tops = np.argmax(logits, axis=-1)
    # Supports that hold the top, miss it, or repeat an id.
    support = [sorted({int(top)} | {int(i) for i in rng.integers(0, VOCAB, 2)}) if rng.random() < 0.5
               else [int(i) for i in rng.integers(0, VOCAB, 3)] for top in tops]
    assert greedy_support(logits, support) == general(logits, support)


def test_a_missed_top_is_the_outside_draw() -> None:
    logits = np.zeros((2, VOCAB), np.float32)
    logits[0, 7] = logits[1, 3] = 1.0
    answer = greedy_support(logits, [[7, 8], [4]])
    assert answer == {"target_probs": [[1.0, 0.0], [0.0]], "outside_mass": [0.0, 1.0], "outside_tokens": [None, 3]}


def test_a_row_without_a_finite_logit_is_refused() -> None:
    logits = np.full((1, VOCAB), -np.inf, np.float32)
    with pytest.raises(ValueError, match="finite"):
        greedy_support(logits, [[1]])
    with pytest.raises(ValueError, match="finite"):
        general(logits, [[1]])
