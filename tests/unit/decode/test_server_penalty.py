"""Decoding under the server's repetition penalty, over vLLM's prefix cache: greedy answers are the server's own
penalised text, in rounds and in plain chunks, though the drafts and the raw log-probs know no penalty; sampled
rounds follow the distribution vLLM samples from, where it answers processed log-probs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest

from proxy.control.policy import PinnedPolicy
from proxy.decode.events import Publisher
from proxy.decode.loop import speculative_tokens
from proxy.decode.session import RequestRandom, Session
from proxy.drafting.base import Draft
from proxy.sampling.draft_rows import DraftRows
from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs
from proxy.targets.base import ScorePlan
from proxy.targets.stopping import StopSet
from proxy.targets.vllm import VLLMTarget
from tests.fakes.toy_model import END, ToyModel
from tests.fakes.vllm import SEEN, penalised
from tests.fakes.vllm_scale_out import scale_out_vllm_app
from tests.unit.decode.harness import PROMPT, TOP_N, SwitchAfter, follow
from tests.unit.targets.serving import serving

MAX_TOKENS = 24
PENALTY = 1.3


def penalised_greedy(model: ToyModel, penalty: float) -> list[int]:
    """The server's own greedy tokens after PROMPT under the penalty, to the first end."""
    context = list(PROMPT)
    while len(context) - len(PROMPT) < MAX_TOKENS and context[-1:] != [END]:
        context.append(int(np.argmax(penalised(model.logits(context), context, penalty))))
    return context[len(PROMPT):]


@asynccontextmanager
async def prefix_cache_vllm(model: ToyModel, **options: bool) -> AsyncIterator[tuple[VLLMTarget, list]]:
    app = scale_out_vllm_app(model, **options)
    async with serving(app, VLLMTarget) as target:
        await target.probe()
        app[SEEN].clear()
        yield target, app[SEEN]


async def generate(model: ToyModel, target: VLLMTarget, policy: PinnedPolicy, penalty: float) -> list[int]:
    """A greedy generation drafted by the model's unpenalised greedy continuation."""
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    session = Session(request_id="req", route="route", prompt_ids=PROMPT, max_tokens=MAX_TOKENS, params=params,
                      order=target.order, top_n=TOP_N, policy=policy, random=RequestRandom.from_seed(1),
                      publish=Publisher([policy.observe]), ends=StopSet(frozenset({END}), "the draft's").is_end)
    return sum([batch async for batch in speculative_tokens(session, follow(model), target)], [])


@pytest.mark.parametrize("policy", [lambda: PinnedPolicy(4), lambda: SwitchAfter(4, rounds=1)],
                         ids=["rounds", "plain chunks"])
async def test_greedy_under_a_repetition_penalty_is_the_servers_own_text(policy) -> None:
    model = ToyModel(seed=3)
    expected = penalised_greedy(model, PENALTY)
    assert expected != penalised_greedy(model, 1.0)  # the control: the penalty changes this text
    async with prefix_cache_vllm(model) as (target, seen):
        assert target.exactness_problem(SamplingParams(0.0, repetition_penalty=PENALTY), TOP_N) is None
        assert await generate(model, target, policy(), PENALTY) == expected
    assert {body["repetition_penalty"] for path, body in seen if path == "POST /v1/completions"} == {PENALTY}


@pytest.mark.parametrize("processed", [True, False])
async def test_sampling_under_a_penalty_follows_the_distribution_vllm_samples_from(processed: bool) -> None:
    """Where vLLM answers processed log-probs, a round at T > 0 asks it to sample each prefix as the request does,
    and each position's distribution is the one vLLM samples from there (penalty, temperature, top_k); with raw
    log-probs nothing gives that distribution, and such a request is not speculated."""
    model, params = ToyModel(seed=3), SamplingParams(0.7, top_k=TOP_N, repetition_penalty=PENALTY)
    drafts = tuple(model.greedy(PROMPT, 3))
    async with prefix_cache_vllm(model, processed_logprobs=processed) as (target, seen):
        assert target.info is not None and target.info.processed_logprobs is processed
        assert (target.exactness_problem(params, TOP_N) is None) is processed
        if not processed:
            return
        scores = await target.score(PROMPT, Draft(drafts, DraftRows.from_dense(np.eye(model.vocab)[list(drafts)])),
                                    ScorePlan(params, TOP_N, seed=1))
    assert {(body["temperature"], body["top_k"], body["repetition_penalty"]) for _, body in seen} == {(0.7, TOP_N, 1.3)}
    support = scores.support
    for position in range(len(drafts) + 1):
        context = list(PROMPT) + list(drafts[:position])
        logits = penalised(model.logits(context), context, PENALTY)
        wanted = processed_probs(logits, params, SamplerOrder.TEMPERATURE_THEN_TRUNCATE)
        known = support.ids[position] >= 0
        assert support.target_probs[position][known] == pytest.approx(wanted[support.ids[position][known]])
        assert support.target_probs[position][known].sum() == pytest.approx(1.0)
    assert scores.tv_bound == 0.0  # exact: the round never switches to plain for a bound
