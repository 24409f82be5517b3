"""Plain decoding's state in the verifier: the context so far, how a token is picked, and when decoding ends."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class PlainSteps:
    """One generation decoded a token a forward pass: each step's row of logits in, the next token out."""

    def __init__(self, context: list[int], choose: Callable[[np.ndarray], int], is_end: Callable[[int], bool],
                 limit: int, first_row: np.ndarray | None = None) -> None:
        self.context = context  # grows by each token picked
        self.limit = limit
        self._choose = choose  # row [vocab] -> the next token
        self._is_end = is_end
        self._first_row = first_row  # the row after `context`, when already evaluated
        self._made = 0

    def known_row(self) -> np.ndarray | None:
        """The row to pick the next token from, when it needs no evaluation (once at most)."""
        row, self._first_row = self._first_row, None
        return row

    def take(self, row: np.ndarray) -> tuple[int, bool]:
        """Pick the next token from the row after the context; (token, whether decoding goes on)."""
        token = self._choose(row)
        self.context.append(token)
        self._made += 1
        return token, self._made < self.limit and not self._is_end(token)
