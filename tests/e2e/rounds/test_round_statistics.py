"""Seeded chi-square tests of the round loop over many requests through a fake upstream (its real HTTP): the tokens
of rounds drafted ahead, of prediction rounds and of rounds the model led into the prediction follow the target's
distribution, and a draft that claims a wrong distribution fails the same test. Thousands of requests: beside the
end-to-end tier rather than in the unit tier."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from proxy.decode import ahead
from proxy.drafting import prediction
from proxy.drafting.base import Draft, DraftPlan, Source
from proxy.sampling.processors import SamplingParams, one_hot
from tests.fakes.drafter import ToyDrafter
from tests.fakes.toy_model import ToyModel
from tests.unit.decode.harness import PROMPT, EmittedTokens, Served, run
from tests.unit.decode.test_ahead import near_draft
from tests.unit.decode.test_prediction_rounds import predicted

CHI_PARAMS = SamplingParams(temperature=1.0, top_k=5)
SIGNIFICANCE = 1e-3


def assert_follows_the_target(pvalue: float, tokens: int, what: str) -> None:
    """Enough tokens counted, and nothing the chi-square can tell from the target's distribution."""
    print(f"chi-square p = {pvalue:.4f} over {tokens} tokens of {what}")
    assert tokens >= 1000
    assert pvalue >= SIGNIFICANCE


def assert_caught(pvalue: float, tokens: int) -> None:
    """A negative control: the same test tells the wrong distribution apart, far beyond its significance."""
    print(f"negative control: chi-square p = {pvalue:.2e} over {tokens} tokens")
    assert pvalue < SIGNIFICANCE**2


# Seeded chi-square of the tokens that rounds drafted ahead emitted. Given its context, each such
# token must follow the target's distribution for that context, whatever led to the hit; so each
# one adds its context's target distribution to the expected counts.

AHEAD_TOKENS = 6
AHEAD_REQUESTS = 1500


async def pre_drafted_pvalue(served: Served) -> tuple[float, int]:
    """The chi-square p-value of the tokens emitted by pre-drafted rounds over seeded requests, and their count."""
    drafter = near_draft(served.model)
    tokens = EmittedTokens(served, CHI_PARAMS)
    for seed in range(AHEAD_REQUESTS):
        batches, events = await run(served, drafter, AHEAD_TOKENS, k=1, params=CHI_PARAMS, seed=seed, pipeline=True)
        tokens.add(batches, events, lambda event: event.drafted_ahead)
    return tokens.pvalue()


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_tokens_of_pre_drafted_rounds_follow_the_target_distribution(served: Served) -> None:
    assert_follows_the_target(*await pre_drafted_pvalue(served), "pre-drafted rounds")


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_pre_drafted_tokens_with_the_wrong_distribution_fail_the_same_test(served: Served,
                                                                                 monkeypatch) -> None:
    """Negative control: hits whose draft claims a distribution it was not drawn from (uniform) are caught."""
    pre_drafted = ahead.DraftAhead.draft

    async def wrong_rows(self):
        draft = await pre_drafted(self)
        return None if draft is None else replace(draft, probs=np.full(draft.probs.shape, 1.0 / draft.probs.shape[1]))

    monkeypatch.setattr(ahead.DraftAhead, "draft", wrong_rows)
    assert_caught(*await pre_drafted_pvalue(served))


# Seeded chi-square of the tokens prediction rounds emitted at temperature 1.

PREDICTION_TOKENS = 8
PREDICTION_REQUESTS = 800


async def prediction_pvalue(served: Served) -> tuple[float, int]:
    """The chi-square p-value of the tokens emitted by prediction rounds over seeded requests, and their count."""
    guess = served.model.greedy(PROMPT, PREDICTION_TOKENS)  # the likeliest path: often right, often not at T = 1
    tokens = EmittedTokens(served, CHI_PARAMS)
    for seed in range(PREDICTION_REQUESTS):
        batches, events = await run(served, predicted(guess), PREDICTION_TOKENS, k=4, params=CHI_PARAMS, seed=seed,
                                    lookup_k=8)
        tokens.add(batches, events, lambda event: event.source == Source.PREDICTION)
    return tokens.pvalue()


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_tokens_of_prediction_rounds_follow_the_target_distribution(served: Served) -> None:
    assert_follows_the_target(*await prediction_pvalue(served), "prediction rounds")


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_prediction_drafts_with_the_wrong_distribution_fail_the_same_test(served: Served, monkeypatch) -> None:
    """Negative control: a prediction draft that claims the uniform distribution instead of its one-hot is caught."""
    propose = prediction.PredictionDrafter.propose

    async def uniform(self, context, plan):
        draft = await propose(self, context, plan)
        if draft.source != Source.PREDICTION or not draft.tokens:
            return draft
        return replace(draft, probs=np.full(draft.probs.shape, 1.0 / draft.probs.shape[1]))

    monkeypatch.setattr(prediction.PredictionDrafter, "propose", uniform)
    assert_caught(*await prediction_pvalue(served))


# Seeded chi-square of the tokens of rounds the model leads into a deterministic path, as it leads an edit back into
# the prediction: drafted tokens sampled from the model (their rows its distribution), then one-hot rows.

LED_TOKENS = 8
LED_REQUESTS = 500


class LeadingDrafter(ToyDrafter):
    """Samples k tokens from its model, then goes on with the target's greedy continuation after them (unless the
    model drew the end): the shape of a round the model leads into the prediction."""

    def __init__(self, model: ToyModel, path: ToyModel) -> None:
        super().__init__(model)
        self.path = path

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        draft = await super().propose(context, plan)
        if not draft.tokens or self.vocabulary.is_end_of_generation(draft.tokens[-1]):
            return draft
        path = self.path.greedy([*context, *draft.tokens], 3)
        return replace(draft, tokens=draft.tokens + tuple(path), source=Source.PREDICTION, led=len(draft),
                       probs=np.concatenate([draft.probs.dense(), one_hot(path, self.model.vocab)]))


async def led_pvalue(served: Served, drafter: LeadingDrafter | None = None) -> tuple[float, int]:
    """The chi-square p-value of the tokens of rounds the model led, over seeded requests, and their count."""
    drafter = drafter or LeadingDrafter(near_draft(served.model).model, served.model)  # a leak shows everywhere
    tokens = EmittedTokens(served, CHI_PARAMS)
    for seed in range(LED_REQUESTS):
        batches, events = await run(served, drafter, LED_TOKENS, k=2, params=CHI_PARAMS, seed=seed)
        tokens.add(batches, events, lambda event: event.led > 0)  # every round but one the model's draft ended
    return tokens.pvalue()


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_tokens_of_rounds_the_model_led_follow_the_target_distribution(served: Served) -> None:
    assert_follows_the_target(*await led_pvalue(served), "rounds the model led")


@pytest.mark.parametrize("protocol", ["vllm"])
async def test_led_rounds_whose_model_rows_are_wrong_fail_the_same_test(served: Served) -> None:
    """Negative control: led rounds whose sampled tokens claim the uniform distribution, not the one they were drawn
    from, are caught."""

    class Uniform(LeadingDrafter):
        async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
            draft = await super().propose(context, plan)
            probs = draft.probs.dense()
            probs[:draft.led] = 1.0 / probs.shape[1]
            return replace(draft, probs=probs)

    assert_caught(*await led_pvalue(served, Uniform(near_draft(served.model).model, served.model)))
