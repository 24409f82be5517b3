"""LogprobRecorder: a request's target recording the raw log-probs it scored and decoded, looked up per emitted token.

The route's target is a real VLLMTarget in front of the toy fake vLLM (tests/fakes/vllm.py), whose
log-probs are the toy model's own: each looked-up entry must be the model's log-softmax there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from proxy.drafting.base import Draft
from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplingParams, one_hot
from proxy.targets.base import ScorePlan
from proxy.targets.recording import LogprobRecorder
from proxy.targets.upstream import Timeouts, Upstream
from proxy.targets.vllm import VLLMTarget
from proxy.wire.logprobs import TokenLogprobs
from tests.fakes.toy_model import VOCAB, ToyModel
from tests.fakes.vllm import toy_vllm_app

PROMPT = [3, 5, 7, 11]
TOP_N = 4
GREEDY = SamplingParams(temperature=0.0)


@asynccontextmanager
async def recorder(model: ToyModel) -> AsyncIterator[LogprobRecorder]:
    server = TestServer(toy_vllm_app(model))
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), Timeouts(connect=2, first_byte=5, idle=5))
    try:
        yield LogprobRecorder(VLLMTarget(upstream), PROMPT, TOP_N)
    finally:
        await upstream.close()
        await server.close()


def expected(model: ToyModel, completion: list[int]) -> TokenLogprobs:
    """The toy model's raw log-prob of the completion's last token, and its top-N."""
    logprobs = model.log_softmax(PROMPT + completion[:-1])
    top = np.lexsort((np.arange(VOCAB), -logprobs))[:TOP_N]
    return TokenLogprobs(completion[-1], float(logprobs[completion[-1]]),
                         tuple((int(t), float(logprobs[t])) for t in top))


def assert_entry(got: TokenLogprobs, want: TokenLogprobs) -> None:
    assert (got.token, [t for t, _ in got.top]) == (want.token, [t for t, _ in want.top])
    assert got.logprob == pytest.approx(want.logprob)
    assert [lp for _, lp in got.top] == pytest.approx([lp for _, lp in want.top])


def draft(tokens: list[int]) -> Draft:
    return Draft(tuple(tokens), one_hot(tokens, VOCAB))


async def test_scored_and_decoded_tokens_are_looked_up_by_position() -> None:
    model = ToyModel()
    async with recorder(model) as target:
        drafted = model.greedy(PROMPT, 3)
        await target.score(list(PROMPT), draft(drafted), ScorePlan(GREEDY, TOP_N, seed=1))
        second_best = np.argsort(-model.log_softmax(PROMPT + drafted[:1]), kind="stable")[:2]
        rejected = int(next(t for t in second_best if t != drafted[1]))
        completion = [drafted[0], rejected]  # a draft accepted, then a token the round could emit instead
        for length in (1, 2):
            assert_entry(target.lookup(completion[:length]), expected(model, completion[:length]))
        decoded = await target.generate(PROMPT + completion, 3, GREEDY, seed=1)
        completion += decoded
        for length in range(3, len(completion) + 1):
            assert_entry(target.lookup(completion[:length]), expected(model, completion[:length]))


async def test_a_candidate_path_is_told_apart_by_its_prefix() -> None:
    model = ToyModel()
    async with recorder(model) as target:
        first, second = [2, 4, 6], [2, 9, 6]  # two candidates: their third positions follow different tokens
        for path in (first, second):
            await target.score(list(PROMPT), draft(path), ScorePlan(GREEDY, TOP_N, seed=1))
        for length in (1, 2, 3):
            assert_entry(target.lookup(first[:length]), expected(model, first[:length]))


async def test_a_later_scoring_supersedes_and_a_token_without_a_log_prob_is_an_error() -> None:
    model = ToyModel()
    async with recorder(model) as target:
        await target.score(list(PROMPT), draft([2]), ScorePlan(GREEDY, TOP_N, seed=1))
        outside = int(np.argsort(model.log_softmax(PROMPT))[0])  # the least likely: neither scored nor in the top-N
        with pytest.raises(UpstreamUnavailableError, match="no log-prob for emitted token"):
            target.lookup([outside])
        with pytest.raises(UpstreamUnavailableError, match="no log-probs were recorded"):
            target.lookup([2, 3, 4])
