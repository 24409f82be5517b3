"""Prediction drafts in the round loop: greedy identity with a right, half right and wrong prediction, and a seeded
chi-square of the tokens prediction rounds emit at temperature 1, with a negative control."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from proxy.drafting import prediction
from proxy.drafting.prediction import PREDICTION, PredictionDrafter
from proxy.sampling.processors import SamplingParams
from tests.fakes.drafter import ScriptedDrafter
from tests.unit.decode.harness import PROMPT, EmittedTokens, Served, rounds, run

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
    drafted = [e for e in rounds(events) if e.source == PREDICTION]
    # Each round's last token is the target's own (a bonus token, or the one replacing a rejected draft).
    assert sum(e.accepted for e in drafted) >= right - len(drafted)
    assert share_right or not any(e.accepted for e in drafted)


# Seeded chi-square of the tokens that prediction rounds emitted: given its context, each must follow the target's
# distribution there, whatever the prediction said; so each adds its context's target distribution to the expected
# counts.

CHI_PARAMS = SamplingParams(temperature=1.0, top_k=5)
CHI_TOKENS = 8
CHI_REQUESTS = 800
SIGNIFICANCE = 1e-3


async def prediction_pvalue(served: Served) -> tuple[float, int]:
    """The chi-square p-value of the tokens emitted by prediction rounds over seeded requests, and their count."""
    guess = served.model.greedy(PROMPT, CHI_TOKENS)  # the likeliest path: often right, often not at T = 1
    tokens = EmittedTokens(served, CHI_PARAMS)
    for seed in range(CHI_REQUESTS):
        batches, events = await run(served, predicted(guess), CHI_TOKENS, k=4, params=CHI_PARAMS, seed=seed,
                                    lookup_k=8)
        tokens.add(batches, events, lambda event: event.source == PREDICTION)
    return tokens.pvalue()


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_tokens_of_prediction_rounds_follow_the_target_distribution(served: Served) -> None:
    pvalue, tokens = await prediction_pvalue(served)
    print(f"chi-square p = {pvalue:.4f} over {tokens} tokens of prediction rounds")
    assert tokens >= 1000
    assert pvalue >= SIGNIFICANCE


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_prediction_drafts_with_the_wrong_distribution_fail_the_same_test(served: Served, monkeypatch) -> None:
    """Negative control: a prediction draft that claims the uniform distribution instead of its one-hot is caught."""
    propose = prediction.PredictionDrafter.propose

    async def uniform(self, context, plan):
        draft = await propose(self, context, plan)
        if draft.source != PREDICTION or not draft.tokens:
            return draft
        return replace(draft, probs=np.full_like(draft.probs, 1.0 / draft.probs.shape[1]))

    monkeypatch.setattr(prediction.PredictionDrafter, "propose", uniform)
    pvalue, tokens = await prediction_pvalue(served)
    print(f"negative control: chi-square p = {pvalue:.2e} over {tokens} tokens")
    assert pvalue < SIGNIFICANCE**2
