"""Many requests at once, with real SmolLM2 models: sequences keep their own prefixes, outputs under
load equal outputs alone, and a request that ends (or whose client leaves) frees its sequence."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from proxy.control.policy import PinnedPolicy
from proxy.decode.ahead import DraftAhead
from proxy.decode.events import Publisher
from proxy.decode.session import RequestRandom, Session
from proxy.drafting.llama import LlamaDrafter
from proxy.engine.llama import EngineOptions, LlamaEngine, Step
from proxy.engine.sequences import MIN_COPIED_TOKENS
from proxy.sampling.processors import SamplerOrder, SamplingParams
from tests import support as http
from tests.e2e import greedy
from tests.e2e.proxy_harness import streaming
from tests.e2e.servers import SMOL, THREADS, Process, start_proxy, write_routes

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a quiet village,",
           "The three primary colours are"]
SPLIT_NOISE = 0.5  # the most llama.cpp's batch split moves a logit (measured on Qwen2.5 Q4_K_M; SmolLM2 less)
FREED_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def engine(model_paths: dict[str, Path]) -> Iterator[LlamaEngine]:
    engine = LlamaEngine(EngineOptions(model_paths[SMOL], n_ctx=512, n_threads=int(THREADS), n_seq=3))
    yield engine
    engine.close()


def ids(engine: LlamaEngine, text: str) -> list[int]:
    return engine.vocabulary.tokenize(text)


def test_each_sequence_keeps_its_own_prefix(engine: LlamaEngine) -> None:
    a, b = ids(engine, PROMPTS[0] * 3), ids(engine, PROMPTS[1] * 3)
    first = engine.evaluate(0, a, len(a) - 1)
    assert first.cached_tokens == 0
    engine.evaluate(1, b, len(b) - 1)  # another request, in another sequence
    token = int(np.argmax(first.logits[0]))
    again = engine.evaluate(0, a + [token], len(a))
    assert again.cached_tokens == len(a)  # nothing of `a` was evicted by `b`
    assert engine.held(0) == a + [token] and engine.held(1) == b


def test_an_evaluation_says_how_long_it_read_what_was_not_cached(engine: LlamaEngine) -> None:
    context = ids(engine, PROMPTS[3] * 4)
    first = engine.evaluate(0, context, len(context) - 1)
    token = int(np.argmax(first.logits[0]))
    after = engine.evaluate(0, [*context, token], len(context))
    assert first.reading_seconds > 0.0  # everything before the returned row was read first
    assert after.reading_seconds == 0.0  # only the returned row was new


async def test_a_drafts_speed_leaves_out_reading_the_context(model_paths: dict[str, Path]) -> None:
    drafter = LlamaDrafter.load(EngineOptions(model_paths[SMOL], n_ctx=512, n_threads=int(THREADS), n_seq=1))
    try:
        context = drafter.vocabulary.tokenize(" ".join(PROMPTS) * 8)  # unread: the first step reads it all
        policy = PinnedPolicy(2)
        session = Session(request_id="req", route="route", prompt_ids=context, max_tokens=32,
                          params=SamplingParams(temperature=0.0), order=SamplerOrder.TRUNCATE_THEN_TEMPERATURE,
                          top_n=5, policy=policy, random=RequestRandom.from_seed(1), publish=Publisher())
        assert drafter.reserve("req", context)
        started = time.perf_counter()
        draft = await drafter.propose(context, session.draft_plan(2, 2, policy.decide()))
        wall = time.perf_counter() - started
        # Reading ~200 tokens costs several single-token steps: counted as drafting, it would make up most of
        # the wall time per token.
        assert draft.seconds_per_token is not None and 0.0 < draft.seconds_per_token < wall / len(draft) / 2
        drafter.release("req")
    finally:
        drafter.close()


def test_a_plain_step_reads_the_row_evaluate_returns(engine: LlamaEngine) -> None:
    context = ids(engine, PROMPTS[0])
    engine.evaluate(0, context, len(context) - 1)
    engine.evaluate(1, context, len(context) - 1)
    token = ids(engine, " Paris")[-1]
    stepped = engine.next_row(0, [*context, token]).copy()  # the one new token, decoded alone
    expected = engine.evaluate(1, [*context, token], len(context)).logits[0]
    np.testing.assert_array_equal(stepped, expected)
    assert engine.held(0) == [*context, token]
    # A context the sequence does not hold all but the last of is evaluated as evaluate would.
    other = ids(engine, PROMPTS[3])
    np.testing.assert_array_equal(engine.next_row(0, other), engine.evaluate(1, other, len(other) - 1).logits[0])


def test_a_fork_continues_exactly_like_its_source(engine: LlamaEngine) -> None:
    a = ids(engine, PROMPTS[2])
    engine.evaluate(0, a, len(a) - 1)
    engine.fork(0, 2, len(a))
    assert engine.held(2) == a
    token = ids(engine, " the")[-1]
    source = engine.evaluate(0, a + [token], len(a))
    forked = engine.evaluate(2, a + [token], len(a))
    assert forked.cached_tokens == len(a)
    np.testing.assert_array_equal(forked.logits, source.logits)


def test_a_shared_decode_keeps_each_sequence_apart(engine: LlamaEngine) -> None:
    contexts = [ids(engine, p) for p in PROMPTS[:3]]
    alone = [engine.evaluate(seq, c, len(c) - 1).logits[0] for seq, c in enumerate(contexts)]
    for seq in range(3):
        engine.evaluate(seq, contexts[seq][:1], 0)  # drop the rest: the shared decode evaluates it anew
    shared = engine.evaluate_steps([Step(seq, c, len(c) - 1) for seq, c in enumerate(contexts)])
    for seq in range(3):
        # Attending over another sequence's cells would move logits by whole units, not split noise.
        assert np.abs(shared[seq].logits[0] - alone[seq]).max() < SPLIT_NOISE
        assert np.abs(alone[seq] - alone[(seq + 1) % 3]).max() > 10 * SPLIT_NOISE  # the check can tell them apart


async def test_a_missed_draft_ahead_leaves_nothing_in_the_requests_sequence(model_paths: dict[str, Path]) -> None:
    drafter = LlamaDrafter.load(EngineOptions(model_paths[SMOL], n_ctx=512, n_threads=int(THREADS), n_seq=1))
    try:
        context = drafter.vocabulary.tokenize(PROMPTS[1])
        policy = PinnedPolicy(4)
        session = Session(request_id="req", route="route", prompt_ids=context, max_tokens=32,
                          params=SamplingParams(temperature=0.0), order=SamplerOrder.TRUNCATE_THEN_TEMPERATURE,
                          top_n=5, policy=policy, random=RequestRandom.from_seed(1), publish=Publisher())
        decision = policy.decide()
        assert drafter.reserve("req", context)
        draft = await drafter.propose(context, session.draft_plan(4, 4, decision))
        pre_draft = DraftAhead(drafter, [*context, *draft.tokens], session.draft_plan(1, 1, decision),
                               session.draft_plan(4, 4, decision))
        assert not await pre_draft.guessed(-1)  # the target said something else: a miss
        recovered = [*context, draft.tokens[0], (draft.tokens[1] + 1) % drafter.vocabulary.n_vocab]
        again = await drafter.propose(recovered, session.draft_plan(4, 4, decision))
        held = drafter._engine.held(0)
        assert held == [*recovered, *again.tokens[:-1]]  # the accepted prefix and the new draft only
        drafter.release("req")
    finally:
        drafter.close()


# -- the verifier --------------------------------------------------------------------------------------


def generate(verifier: Process, input_ids: list[int]) -> dict[str, Any]:
    reply = http.post_json(verifier.url + "/generate", {"input_ids": input_ids,
                                                       "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    assert reply.status == 200, reply.body[:300]
    return reply.json()


def tokenize(server: Process, text: str) -> list[int]:
    return http.post_json(server.url + "/tokenize", {"prompt": text}).json()["tokens"]


def sequences_in_use(server: Process, path: str) -> int:
    answer = http.get(server.url + path).json()
    return (answer["sequences"] if "sequences" in answer else answer["routes"][0]["draft_sequences"])["in_use"]


def wait_until_free(server: Process, path: str) -> None:
    deadline = time.monotonic() + FREED_WITHIN_S
    while sequences_in_use(server, path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sequences_in_use(server, path) == 0


def test_interleaved_requests_keep_their_prefixes_and_report_it(smol_verifier: Process) -> None:
    a, b = tokenize(smol_verifier, PROMPTS[0] * 4), tokenize(smol_verifier, PROMPTS[3] * 4)
    first_a = generate(smol_verifier, a)
    generate(smol_verifier, b)
    shares_a = a[:-2] + b[:3]  # another request starting like `a`: its prefix is copied, `a` kept
    assert len(a) - 2 >= MIN_COPIED_TOKENS
    assert generate(smol_verifier, shares_a)["meta_info"]["cached_tokens"] == len(a) - 2
    again = generate(smol_verifier, a + first_a["output_ids"])
    assert again["meta_info"]["cached_tokens"] == len(a)


async def chat(session: aiohttp.ClientSession, url: str, prompt: str, headers: dict[str, str] | None = None,
               max_tokens: int = 24) -> tuple[str, str | None, dict | None]:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as reply:
        answer = await reply.json()
        assert reply.status == 200, answer
        return answer["choices"][0]["message"]["content"], reply.headers.get("X-Speculoos-Mode"), answer.get(
            "speculoos")


async def alone_then_together(url: str, headers: dict[str, str] | None = None) -> tuple[list, list]:
    async with aiohttp.ClientSession() as session:
        alone = [await chat(session, url, p, headers) for p in PROMPTS]
        together = await asyncio.gather(*(chat(session, url, p, headers) for p in PROMPTS))
    return alone, list(together)


async def test_concurrent_plain_generations_equal_each_served_alone(smol_verifier: Process) -> None:
    alone, together = await alone_then_together(smol_verifier.url)
    assert [t[0] for t in together] == [a[0] for a in alone]
    wait_until_free(smol_verifier, "/health")


def test_a_stream_whose_client_leaves_frees_its_sequence(smol_verifier: Process) -> None:
    body = {"model": "m", "prompt": PROMPTS[1], "max_tokens": 200, "temperature": 0, "stream": True}
    with streaming(smol_verifier, "/v1/completions", body) as response:
        assert response.readline().startswith(b"data: {")
        assert sequences_in_use(smol_verifier, "/health") == 1
    wait_until_free(smol_verifier, "/health")


# -- the proxy -----------------------------------------------------------------------------------------


async def test_concurrent_speculative_requests_equal_each_served_alone(smol_proxy: Process,
                                                                      smol_verifier: Process) -> None:
    alone, together = await alone_then_together(smol_proxy.url, {"X-Speculoos": "k=4"})
    assert all(mode == "speculative" for _, mode, _ in alone + together)
    for prompt, (expected, _, _), (actual, _, _) in zip(PROMPTS, alone, together, strict=True):
        if actual != expected:
            # Rounds of requests in flight together share the verifier's batches, so their rows are split otherwise
            # than alone: only a top-two gap that batch shape measurably moves may break the other way.
            ids = greedy.tokenize(smol_verifier.url, {"messages": [{"role": "user", "content": prompt}]})
            text = greedy.tokenize(smol_verifier.url, {"prompt": expected, "add_special_tokens": False})
            tolerance = greedy.near_tie_tolerance(smol_verifier.url, ids + text)
            where = greedy.find_divergence(smol_verifier.url, ids, expected, actual)
            assert where.is_near_tie(tolerance), f"{prompt!r}: {where}, tolerance {tolerance:.4f}"
    wait_until_free(smol_proxy, "/speculoos/status")


@pytest.fixture(scope="module")
def one_sequence_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    process = start_proxy(write_routes(log_dir / "one-sequence.yaml", smol_verifier.url, SMOL, parallel=1), log_dir)
    yield process
    process.stop()


def test_a_request_finding_every_draft_sequence_in_use_passes_through(one_sequence_proxy: Process) -> None:
    body = {"model": "m", "prompt": PROMPTS[2], "max_tokens": 200, "temperature": 0, "stream": True}
    with streaming(one_sequence_proxy, "/v1/completions", body, {"X-Speculoos": "k=4"}) as response:
        assert response.getheader("X-Speculoos-Mode") == "speculative"
        assert response.readline().startswith(b"data: {")
        assert sequences_in_use(one_sequence_proxy, "/speculoos/status") == 1
        second = http.post_json(one_sequence_proxy.url + "/v1/completions",
                                {"model": "m", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0},
                                {"X-Speculoos": "k=4"})
        assert second.status == 200 and second.headers["x-speculoos-mode"] == "passthrough"
    wait_until_free(one_sequence_proxy, "/speculoos/status")  # the client left: its rounds stopped
    third = http.post_json(one_sequence_proxy.url + "/v1/completions",
                           {"model": "m", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0},
                           {"X-Speculoos": "k=4"})
    assert third.headers["x-speculoos-mode"] == "speculative"
