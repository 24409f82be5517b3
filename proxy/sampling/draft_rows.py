"""A draft's distributions held sparsely: per position, the ids it could have drawn and their probabilities.

A draft samples each token from a few candidates (its top ones; a lookup's single token), so its
[k, vocab] matrix is almost all zeros. Building that matrix costs a pass over the vocabulary per
position (151,936 float64 for Qwen) and nothing in a round needs it: the target is asked about the
candidates, and the sampler works on the ids it knows (`KnownSupport`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from proxy.sampling.processors import TOP_K_OFF, SamplerOrder, SamplingParams, processed_probs

_NO_IDS = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class DraftRows:
    """k rows of a [k, vocab] distribution matrix: each row's nonzero ids, ascending, and their probabilities."""

    ids: tuple[np.ndarray, ...]  # k rows of [m_i] int64, ascending
    probs: tuple[np.ndarray, ...]  # k rows of [m_i] float64, each > 0
    vocab_size: int

    @classmethod
    def one_hot(cls, tokens: Sequence[int], vocab_size: int) -> DraftRows:
        """A deterministic draft: probability 1 at each token (a lookup path, a prediction)."""
        tokens = tuple(int(t) for t in tokens)
        if tokens and (min(tokens) < 0 or max(tokens) >= vocab_size):
            raise ValueError(f"token ids must be in [0, {vocab_size}), got {list(tokens)}")
        one = np.ones(1)
        return cls(tuple(np.array([t], dtype=np.int64) for t in tokens), (one,) * len(tokens), vocab_size)

    @classmethod
    def from_rows(cls, ids: Sequence[np.ndarray], probs: Sequence[np.ndarray], vocab_size: int) -> DraftRows:
        """Rows given sparsely (ids ascending, each with positive probability)."""
        return cls(tuple(np.asarray(row, dtype=np.int64) for row in ids),
                   tuple(np.asarray(row, dtype=np.float64) for row in probs), vocab_size)

    @classmethod
    def from_dense(cls, probs: np.ndarray) -> DraftRows:  # probs: [k, vocab]
        """Rows of a dense matrix: each row's nonzero entries, as np.flatnonzero finds them."""
        dense = np.asarray(probs, dtype=np.float64)
        if dense.ndim != 2:
            raise ValueError(f"draft probs must be [k, vocab], got shape {dense.shape}")
        ids = tuple(np.flatnonzero(row).astype(np.int64) for row in dense)
        return cls(ids, tuple(row[i] for row, i in zip(dense, ids, strict=True)), dense.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        """(k, vocab), as the dense matrix's."""
        return len(self.ids), self.vocab_size

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows: slice) -> DraftRows:
        """The rows in a slice (as dense[rows])."""
        return DraftRows(self.ids[rows], self.probs[rows], self.vocab_size)

    def __add__(self, other: DraftRows) -> DraftRows:
        """These rows, then the other's (as np.concatenate of the dense matrices)."""
        return DraftRows(self.ids + other.ids, self.probs + other.probs, self.vocab_size)

    def row_ids(self, position: int) -> np.ndarray:
        """The ids a row has mass on (none past the last row)."""
        return self.ids[position] if position < len(self.ids) else _NO_IDS

    def at(self, position: int, ids: np.ndarray) -> np.ndarray:
        """The row's probabilities of `ids` (0 where it has none): dense[position, ids]."""
        row_ids, row_probs = self.ids[position], self.probs[position]
        if row_ids.size == 0:
            return np.zeros(len(ids))
        where = np.minimum(np.searchsorted(row_ids, ids), row_ids.size - 1)  # ascending ids: a binary search each
        return np.where(row_ids[where] == ids, row_probs[where], 0.0)

    def dense(self) -> np.ndarray:
        """The [k, vocab] matrix (for references and tests: a round never needs it)."""
        matrix = np.zeros((len(self.ids), self.vocab_size))
        for position, (ids, probs) in enumerate(zip(self.ids, self.probs, strict=True)):
            matrix[position, ids] = probs
        return matrix


def truncated_row(probs: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:  # probs: [vocab]
    """truncate_to_top's row held sparsely: the `size` most likely ids, ascending, and their renormalised
    probabilities (every nonzero entry when there are no more than `size`)."""
    row = np.asarray(probs, dtype=np.float64)
    nonzero = np.flatnonzero(row)
    if nonzero.size <= size:
        return nonzero.astype(np.int64), row[nonzero]
    keep = np.sort(np.argpartition(-row, size - 1)[:size]).astype(np.int64)
    kept = row[keep]
    return keep, kept / kept.sum()


def draft_row(logits: np.ndarray, params: SamplingParams, order: SamplerOrder,
              size: int) -> tuple[np.ndarray, np.ndarray]:  # logits: [vocab]
    """The distribution a draft samples one token from: the backend's processing of its logits, cut to the `size`
    most likely ids and renormalised, held sparsely (truncated_row of processed_probs, as ids and probabilities).

    Without top_p only the top `size` (or top_k) logits can survive the cut, and the processing of those alone is
    the same distribution (each filter keeps the same ids, and the cut renormalises): one pass over the vocabulary
    picks them, instead of a softmax and a sort of it. top_p is judged on the whole softmax, so it takes the long
    way. Any distribution would keep the round exact, as long as it is the one the token is drawn from.
    """
    row = np.asarray(logits)
    if params.greedy:  # one-hot at the argmax (lowest id on ties), as processed_probs has it
        return np.array([int(np.argmax(row))], dtype=np.int64), np.ones(1)
    wanted = max(size, params.top_k if params.top_k not in TOP_K_OFF else 0)
    if params.top_p < 1.0 or wanted >= row.size:
        return truncated_row(processed_probs(row, params, order), size)
    top = np.sort(np.argpartition(row, row.size - wanted)[row.size - wanted:]).astype(np.int64)
    ids, probs = truncated_row(processed_probs(row[top], params, order), size)
    return top[ids], probs
