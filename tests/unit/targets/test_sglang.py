"""SGLangTarget against a fake stock SGLang of a toy model (tests/fakes/sglang.py): scoring and plain decoding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from proxy.drafting.base import Draft
from proxy.sampling.processors import SamplingParams, one_hot
from proxy.sampling.rejection import verify_on_support
from proxy.targets.base import ScorePlan
from proxy.targets.upstream import UpstreamStatusError
from tests.fakes.sglang import MIDDLE, OLDEST, SEEN, SGLANG_ORDER, Release, fake_sglang_app
from tests.fakes.toy_model import END, VOCAB, ToyModel
from tests.unit.targets.serving import serving

PROMPT = [3, 5, 7, 11]
TOP_N = 5
GREEDY = SamplingParams(temperature=0.0)
RELEASES = {"0.5.23": Release(), "0.5.4": MIDDLE, "0.4.9": OLDEST}  # OLDEST: the null entry only at start 0


def drafts(model: ToyModel, k: int, wrong_at: int | None = None) -> list[int]:
    """The toy model's greedy continuation of PROMPT, another token at `wrong_at`."""
    tokens = model.greedy(PROMPT, k)
    if wrong_at is not None:
        tokens[wrong_at] = (tokens[wrong_at] + 1) % VOCAB or 1
    return tokens


def two_candidates(tokens: list[int]) -> Draft:
    """A draft that drew each token from it and the next id (70/30), so both are asked about."""
    probs = np.zeros((len(tokens), VOCAB))
    for position, token in enumerate(tokens):
        probs[position, token], probs[position, (token + 1) % VOCAB] = 0.7, 0.3
    return Draft(tuple(tokens), probs)


# Scoring with top-N log-probs, whichever alignment the server uses.


@pytest.mark.parametrize("release", RELEASES.values(), ids=RELEASES.keys())
@pytest.mark.parametrize("wrong_at", [None, 0, 2, 3])
async def test_greedy_rounds_accept_what_the_toy_model_would_say(release: Release, wrong_at: int | None) -> None:
    model = ToyModel()
    tokens = drafts(model, 4, wrong_at)
    async with serving(fake_sglang_app(model, release=release)) as target:
        scores = await target.score(PROMPT, Draft(tuple(tokens), one_hot(tokens, VOCAB)), ScorePlan(GREEDY, TOP_N, 1))
    result = verify_on_support(tokens, scores.support, np.random.default_rng(0))
    accepted = 4 if wrong_at is None else wrong_at
    assert result.accepted == accepted
    assert list(result.emitted) == model.greedy(PROMPT, accepted + 1)
    assert scores.tv_bound == 0.0


@pytest.mark.parametrize("release", RELEASES.values(), ids=RELEASES.keys())
@pytest.mark.parametrize("params", [
    GREEDY,
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=0.5, top_k=4, min_p=0.2),
    SamplingParams(temperature=1.3, top_k=2),
])
async def test_the_support_is_the_top_n_and_the_draft_with_the_toy_models_probabilities(
        release: Release, params: SamplingParams) -> None:
    model = ToyModel()
    draft = two_candidates(drafts(model, 3, wrong_at=1))
    async with serving(fake_sglang_app(model, release=release)) as target:
        assert target.exactness_problem(params, TOP_N) is None
        scores = await target.score(PROMPT, draft, ScorePlan(params, TOP_N, 1))
    support = scores.support
    for position in range(len(draft) + 1):
        context = PROMPT + list(draft.tokens[:position])
        logprobs = model.log_softmax(context)
        top = np.lexsort((np.arange(VOCAB), -logprobs))[:TOP_N].tolist()
        asked = draft.probs.row_ids(position).tolist()
        ids = support.ids[position][support.ids[position] >= 0]
        assert ids.tolist() == sorted(set(top) | set(asked))
        probs = model.probs(context, params, SGLANG_ORDER)
        assert support.target_probs[position, : len(ids)] == pytest.approx(probs[ids], abs=1e-12)
        assert probs[ids].sum() == pytest.approx(1.0)  # nothing of the target lies outside the known ids
        if position < len(draft):
            assert support.draft_probs[position, : len(ids)].tolist() == draft.probs.dense()[position, ids].tolist()
    assert support.outside_mass.tolist() == [0.0] * (len(draft) + 1)
    assert scores.tv_bound == 0.0


async def test_an_inexact_round_is_bounded_and_renormalised() -> None:
    model, params = ToyModel(), SamplingParams(temperature=0.8)
    draft = two_candidates(drafts(model, 2))
    async with serving(fake_sglang_app(model)) as target:
        assert target.exactness_problem(params, TOP_N) is not None
        scores = await target.score(PROMPT, draft, ScorePlan(params, TOP_N, 1))
    ids = scores.support.ids[0][scores.support.ids[0] >= 0]
    assert scores.support.target_probs[0].sum() == pytest.approx(1.0)
    assert model.probs(PROMPT, params, SGLANG_ORDER)[ids].sum() < 1.0  # the target has mass beyond the top N
    assert 0.0 < scores.tv_bound < 1.0


@pytest.mark.parametrize("release", [Release(), OLDEST], ids=["null first", "null at 0 only"])
@pytest.mark.parametrize(("context", "k", "params"), [
    (PROMPT, 3, GREEDY),
    (PROMPT, 3, SamplingParams(temperature=0.7, top_k=3)),  # raw log-probs either way: tempering is ours
    (PROMPT, 0, GREEDY),  # no drafts: only the bonus position
    ([7], 2, GREEDY),  # a one-token context starts the log-probs at 0, where both alignments agree
])
async def test_a_round_sends_one_generate_request(release: Release, context: list[int], k: int,
                                                  params: SamplingParams) -> None:
    model = ToyModel()
    tokens = model.greedy(context, k)
    app = fake_sglang_app(model, release=release)
    async with serving(app) as target:
        scores = await target.score(context, Draft(tuple(tokens), one_hot(tokens, VOCAB)), ScorePlan(params, TOP_N, 1))
    expected = {"input_ids": context + tokens, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": len(context) - 1, "top_logprobs_num": TOP_N,
                "return_text_in_logprobs": False}
    assert app[SEEN] == [("POST /generate", expected)]
    assert len(scores.support.ids) == k + 1


# Plain decoding.


@pytest.mark.parametrize(("params", "seed", "n", "sampling_params"), [
    (GREEDY, 7, 5,
     {"max_new_tokens": 5, "temperature": 0.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "sampling_seed": 7}),
    (SamplingParams(0.7, top_k=0, top_p=0.9), 3, 8,
     {"max_new_tokens": 8, "temperature": 0.7, "top_k": -1, "top_p": 0.9, "min_p": 0.0, "sampling_seed": 3}),
    (SamplingParams(1.0, top_k=5, min_p=0.1), 2**62, 4,
     {"max_new_tokens": 4, "temperature": 1.0, "top_k": 5, "top_p": 1.0, "min_p": 0.1, "sampling_seed": 2**62}),
])
async def test_generate_maps_the_sampling_params(params: SamplingParams, seed: int, n: int,
                                                 sampling_params: dict[str, Any]) -> None:
    app = fake_sglang_app(ToyModel())
    async with serving(app) as target:
        tokens = await target.generate(PROMPT, n, params, seed)
    assert len(tokens) == n
    assert app[SEEN] == [("POST /generate", {"input_ids": PROMPT, "sampling_params": sampling_params})]


@pytest.mark.parametrize(("end_after", "n", "length"), [(None, 12, 12), (len(PROMPT) + 3, 12, 4)])
async def test_greedy_generate_is_the_toy_models_continuation(end_after: int | None, n: int, length: int) -> None:
    model = ToyModel(end_after=end_after)
    async with serving(fake_sglang_app(model)) as target:
        tokens = await target.generate(PROMPT, n, GREEDY, seed=1)
    assert tokens == model.greedy(PROMPT, n) and len(tokens) == length
    assert (tokens[-1] == END) == (end_after is not None)  # the end token is returned, then nothing


@pytest.mark.parametrize("deterministic", [True, False])
async def test_seeds_reproduce_only_with_deterministic_inference(deterministic: bool) -> None:
    params = SamplingParams(temperature=1.0)
    async with serving(fake_sglang_app(ToyModel(), release=Release(deterministic=deterministic))) as target:
        first, again, other = [await target.generate(PROMPT, 20, params, seed) for seed in (42, 42, 43)]
    assert first != other
    assert (first == again) == deterministic


async def test_a_value_sglang_refuses_reaches_the_caller_as_its_400() -> None:
    async with serving(fake_sglang_app(ToyModel())) as target:
        with pytest.raises(UpstreamStatusError, match=r"top_p must be in \(0, 1\]") as caught:
            await target.generate(PROMPT, 4, SamplingParams(temperature=0.7, top_p=0.0), seed=1)
    assert caught.value.status == 400


# The fake's answers themselves: SGLang's log-prob alignments and radix-cache accounting.


@pytest.mark.parametrize(("release", "start", "first_scored", "null_first"), [
    (Release(), len(PROMPT) - 1, len(PROMPT) - 1, True),  # the last context token's null entry, then the drafts
    (Release(), 0, 0, True),
    (Release(), None, len(PROMPT) + 1, True),  # the default: the last input token only
    (OLDEST, len(PROMPT) - 1, len(PROMPT), False),  # one entry per draft, no null entry
    (OLDEST, 0, 0, True),  # the older path padded a start of 0 only
])
async def test_the_fake_aligns_input_logprobs_as_sglang(release: Release, start: int | None, first_scored: int,
                                                        null_first: bool) -> None:
    model, ids = ToyModel(), PROMPT + [13, 1]
    async with serving(fake_sglang_app(model, release=release)) as target:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, "return_logprob": True,
                "top_logprobs_num": 2, **({} if start is None else {"logprob_start_len": start})}
        meta = (await target.upstream.post_json("/generate", body))["meta_info"]
    actual, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert len(actual) == len(tops) == len(ids) - first_scored
    assert (actual[0] == [None, ids[first_scored], None] and tops[0] is None) == null_first
    for j, (logprob, token, _) in enumerate(actual[1:] if null_first else actual, start=first_scored + null_first):
        assert (token, logprob) == (ids[j], pytest.approx(model.log_softmax(ids[:j])[ids[j]]))


async def test_the_fake_caches_prefixes_as_sglangs_radix_cache() -> None:
    requests = [  # (input ids, logprob_start_len or None for no logprobs, cached tokens reported)
        (PROMPT + [13, 1], 3, 0),  # cold
        (PROMPT + [13, 1], 3, 3),  # capped at logprob_start_len
        (PROMPT + [13, 1], None, 5),  # capped at input_len - 1
        (PROMPT + [9], 2, 2),
        ([2, 4], None, 0),
    ]
    async with serving(fake_sglang_app(ToyModel())) as target:
        for ids, start, cached in requests:
            logprobs = {} if start is None else {"return_logprob": True, "logprob_start_len": start}
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}, **logprobs}
            assert (await target.upstream.post_json("/generate", body))["meta_info"]["cached_tokens"] == cached


async def test_plain_decoding_with_log_probs_gives_each_tokens_raw_log_prob_and_the_top_n() -> None:
    model, context = ToyModel(), [3, 5, 7]
    async with serving(fake_sglang_app(model)) as target:
        await target.probe()
        tokens, positions = await target.generate_logprobs(list(context), 4, SamplingParams(temperature=0.0), 1, 3)
    assert tokens == model.greedy(context, 4)[: len(tokens)]
    for token, scored in zip(tokens, positions, strict=True):
        logprobs = model.log_softmax(context)
        assert scored.token_id == token and scored.token_logprob == pytest.approx(logprobs[token])
        assert scored.top_ids.tolist() == np.argsort(-logprobs, kind="stable")[:3].tolist()
        context.append(token)


@pytest.mark.parametrize(("exact_support", "params", "problem"), [
    (False, SamplingParams(temperature=0.0), None),
    (False, SamplingParams(temperature=1.0), None),
    (False, SamplingParams(temperature=0.7, top_k=5), "after temperature"),  # SGLang's log-probs are tempered
    (True, SamplingParams(temperature=0.7, top_k=5), None),  # our verifier's are raw, and top_k keeps its draws in
    (True, SamplingParams(temperature=0.7), "beyond the route's top-N"),  # its draws span the whole vocabulary
])
async def test_which_log_probs_a_route_can_answer(exact_support: bool, params: SamplingParams,
                                                  problem: str | None) -> None:
    async with serving(fake_sglang_app(ToyModel())) as target:
        target.info = type("Info", (), {"exact_support": exact_support})()  # type: ignore[assignment]
        got = target.logprobs_problem(params, 2, 20)
    assert got == problem if problem is None else (got is not None and problem in got)
