"""Prediction drafts in the round loop: greedy identity with a right, half right and wrong prediction (the seeded
chi-square of prediction rounds at temperature 1 is in tests/e2e/rounds/test_round_statistics.py)."""

from __future__ import annotations

import pytest

from proxy.drafting.base import Source
from proxy.drafting.prediction import PredictionDrafter
from tests.fakes.drafter import ScriptedDrafter
from tests.unit.decode.harness import PROMPT, Served, rounds, run

NOTHING = ScriptedDrafter(lambda context, k: [])  # the route's own drafter finds nothing: prediction or plain


def predicted(tokens: list[int]) -> PredictionDrafter:
    return PredictionDrafter(NOTHING, tokens, prompt_length=len(PROMPT))


@pytest.mark.parametrize("share_right", [1.0, 0.5, 0.0], ids=["right", "half right", "wrong"])
async def test_greedy_output_is_the_targets_whatever_the_prediction(served: Served, share_right: float) -> None:
    expected = served.model.greedy(PROMPT, 40)
    right = int(len(expected) * share_right)
    guess = expected[:right] + [(t + 5) % served.model.vocab or 1 for t in expected[right:]]
    batches, events = await run(served, predicted(guess), 40, k=4, lookup_k=16)
    assert sum(batches, []) == expected
    drafted = [e for e in rounds(events) if e.source == Source.PREDICTION]
    # Each round's last token is the target's own (a bonus token, or the one replacing a rejected draft).
    assert sum(e.accepted for e in drafted) >= right - len(drafted)
    assert share_right or not any(e.accepted for e in drafted)

