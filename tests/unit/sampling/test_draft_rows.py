"""A draft's rows held sparsely: the same distributions as the dense [k, vocab] matrix, without building it."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.sampling.draft_rows import DraftRows, draft_row, truncated_row
from proxy.sampling.processors import SamplerOrder, SamplingParams, one_hot, processed_probs, truncate_to_top

QWEN_VOCAB = 151_936
HUGE_VOCAB = 2**40  # a row over it would need 8 TiB: anything that works here never allocates over the vocabulary


def same_as_dense(rows: DraftRows, dense: np.ndarray) -> None:
    """Each sparse row is the dense row's nonzero entries, ascending, bit for bit."""
    assert rows.shape == dense.shape and len(rows) == len(dense)
    for position, row in enumerate(dense):
        np.testing.assert_array_equal(rows.ids[position], np.flatnonzero(row))
        np.testing.assert_array_equal(rows.probs[position], row[np.flatnonzero(row)])
    np.testing.assert_array_equal(rows.dense(), dense)


def test_one_hot_rows_are_the_dense_one_hot_rows() -> None:
    tokens = [0, 7, 7, QWEN_VOCAB - 1, 42]
    rows = DraftRows.one_hot(tokens, QWEN_VOCAB)
    same_as_dense(rows, one_hot(tokens, QWEN_VOCAB))
    same_as_dense(DraftRows.one_hot((), QWEN_VOCAB), one_hot((), QWEN_VOCAB))


def test_one_hot_rows_never_allocate_over_the_vocabulary() -> None:
    rows = DraftRows.one_hot([HUGE_VOCAB - 1, 3], HUGE_VOCAB)
    assert rows.shape == (2, HUGE_VOCAB)
    assert rows.at(0, np.array([2, HUGE_VOCAB - 1])).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 5\)"):
        DraftRows.one_hot([5], 5)


@pytest.mark.parametrize("order", list(SamplerOrder))
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=20),
                                    SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=1.3)])
def test_truncated_rows_are_truncate_to_top_held_sparsely(order: SamplerOrder, params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    for row in processed_probs(rng.normal(0.0, 3.0, size=(4, 5_000)), params, order):
        ids, probs = truncated_row(row, 10)
        dense = truncate_to_top(row, 10)
        np.testing.assert_array_equal(ids, np.flatnonzero(dense))
        np.testing.assert_allclose(probs, dense[ids], rtol=1e-15, atol=0)  # renormalised over 10, not the vocab
        assert probs.sum() == pytest.approx(1.0, abs=1e-12)


def test_dense_rows_convert_as_a_search_finds_them() -> None:
    dense = one_hot([3, 5, 8, 2], 16)
    dense[0, 9] = 1e-300  # a sliver beside the token: two ids
    dense[1, 6] = -0.0  # a negative zero is no support
    dense[2, 8] = 0.5
    rows = DraftRows.from_dense(dense)
    same_as_dense(rows, dense)
    assert [ids.tolist() for ids in rows.ids] == [[3, 9], [5], [8], [2]]


def test_lookups_slices_and_joins_read_as_the_dense_matrix() -> None:
    rng = np.random.default_rng(3)
    dense = np.zeros((5, 50))
    for row in dense:
        chosen = rng.choice(50, rng.integers(1, 6), replace=False)
        row[chosen] = rng.dirichlet(np.ones(chosen.size))
    rows = DraftRows.from_dense(dense)
    for position in range(5):
        ids = rng.choice(50, 12, replace=False)
        np.testing.assert_array_equal(rows.at(position, ids), dense[position, ids])
    same_as_dense(rows[:3], dense[:3])
    joined = rows[:2] + DraftRows.one_hot([4, 9], 50)
    same_as_dense(joined, np.concatenate([dense[:2], one_hot([4, 9], 50)]))
    assert rows.row_ids(5).size == 0  # past the last row (the bonus position): no draft ids


@pytest.mark.parametrize("order", list(SamplerOrder))
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=20),
                                    SamplingParams(temperature=0.7, top_k=40), SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.8, min_p=0.05), SamplingParams(temperature=1.3),
                                    SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(0.7, top_k=5)])
def test_a_draft_row_is_the_processed_row_cut_to_its_top(order: SamplerOrder, params: SamplingParams) -> None:
    rng = np.random.default_rng(17)
    for logits in rng.normal(0.0, 3.0, size=(4, QWEN_VOCAB)).astype(np.float32):
        ids, probs = draft_row(logits, params, order, 20)
        expected_ids, expected = truncated_row(processed_probs(logits, params, order), 20)
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_allclose(probs, expected, rtol=1e-12, atol=0)  # the same distribution, summed in its ids
