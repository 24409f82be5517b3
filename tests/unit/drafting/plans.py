"""A round's request to a lookup drafter, for the drafting tests."""

from __future__ import annotations

import numpy as np

from proxy.drafting.base import DraftPlan
from proxy.sampling.processors import SamplingParams


def plan(k: int = 8, worth=None, request_id: str = "r") -> DraftPlan:
    """A greedy plan for up to k tokens (model drafts and lookup paths alike), trimmed by worth if given."""
    return DraftPlan(k, SamplingParams(temperature=0.0), (), 1, np.random.default_rng(0), request_id, k, worth)
