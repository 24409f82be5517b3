"""Pearson's chi-square goodness of fit, from scipy's special functions (scipy.stats takes a second to import)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import chdtrc


def p_value(observed: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray) -> float:
    """The p-value of counts against expected weights scaled to the same total (scipy.stats.chisquare's test)."""
    counts = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(weights, dtype=np.float64) * counts.sum() / np.sum(weights)
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return float(chdtrc(counts.size - 1, statistic))
