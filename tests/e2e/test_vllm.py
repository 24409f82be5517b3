"""The vLLM target, and the proxy in front of it, against a real vLLM (`pytest -m vllm`): SmolLM2-135M on a CPU."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from proxy.control.route import ALPHA_NOT_MEASURED
from proxy.sampling.processors import SamplingParams
from proxy.targets.upstream import Timeouts, Upstream, UpstreamStatusError
from proxy.targets.vllm import VLLMTarget
from proxy.wire.request import CHAT, COMPLETION
from tests import chi_square
from tests import support as http
from tests.e2e.servers import SMOL, Process
from tests.e2e.vllm_harness import (
    LOGPROB_TOLERANCE,
    MODEL,
    TOP_N,
    assert_same_position,
    chat_logprobs,
    divergence_margin,
    greedy,
    served_vllm,
    start_vllm_proxy,
)

pytestmark = pytest.mark.vllm

# The reference is vLLM itself: its own greedy generation, its own chat template. Async tests make their plain
# HTTP calls in a thread: a blocked event loop would miss vLLM closing idle keep-alive connections (after 5 s)
# and reuse a dead one.

DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default; the script does not change it
K = 4

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Write a haiku about the sea. Ünïcödé 🙂 数学"}],
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
]


@pytest.fixture(scope="session")
def vllm_url(log_dir: Path) -> Iterator[str]:
    """A vLLM serving SmolLM2-135M: SPECULOOS_VLLM_URL, or one scripts/start_vllm.sh starts and we stop."""
    if url := os.environ.get("SPECULOOS_VLLM_URL"):
        yield url.rstrip("/")
        return
    with served_vllm(log_dir) as url:
        yield url


@pytest_asyncio.fixture(params=["prefix cache", "prompt log-probs"])
async def target(vllm_url: str, request: pytest.FixtureRequest) -> AsyncIterator[VLLMTarget]:
    """A VLLMTarget with its own pooled client, probed (rounds over vLLM's prefix cache) or not (prompt log-probs)."""
    upstream = Upstream(vllm_url, Timeouts(first_byte=300))
    target = VLLMTarget(upstream)
    if request.param == "prefix cache":
        assert (await target.probe()).rounds_read_cache
    yield target
    await upstream.close()


@pytest.mark.parametrize("prompt", PROMPTS)
async def test_verify_agrees_with_vllms_own_greedy_generation(target: VLLMTarget, vllm_url: str, prompt: str) -> None:
    context, _ = await target.prompt_ids({"prompt": prompt}, COMPLETION)
    tokens, tops = await asyncio.to_thread(greedy, vllm_url, context, K + 1)
    verification = await target.verify(context, tokens[:K], TOP_N)
    assert [p.token_id for p in verification.positions] == [*tokens[:K], None]
    for position, token, top in zip(verification.positions, tokens, tops, strict=True):
        assert_same_position(position, token, top)
        if position.token_id is not None:
            assert position.token_logprob == pytest.approx(top[token], abs=LOGPROB_TOLERANCE)
    assert verification.bonus_token == tokens[K]


@pytest.mark.parametrize("prompt", PROMPTS)
async def test_a_rejected_draft_is_scored_where_it_stands(target: VLLMTarget, vllm_url: str, prompt: str) -> None:
    context, _ = await target.prompt_ids({"prompt": prompt}, COMPLETION)
    tokens, tops = await asyncio.to_thread(greedy, vllm_url, context, 2)
    wrong = next(t for t in sorted(tops[1], key=tops[1].get, reverse=True) if t != tokens[1])  # the runner-up
    after_wrong, after_tops = await asyncio.to_thread(greedy, vllm_url, context + [tokens[0], wrong], 2)
    drafts = [tokens[0], wrong, after_wrong[0]]
    verification = await target.verify(context, drafts, TOP_N)
    first, second, third, bonus = verification.positions
    assert_same_position(first, tokens[0], tops[0])
    assert_same_position(second, tokens[1], tops[1])
    assert second.token_logprob == pytest.approx(tops[1][wrong], abs=LOGPROB_TOLERANCE)
    assert_same_position(third, after_wrong[0], after_tops[0])
    assert_same_position(bonus, after_wrong[1], after_tops[1])
    assert verification.bonus_token == after_wrong[1]


async def test_a_draft_far_outside_the_top_n_is_not_in_the_top_list(target: VLLMTarget, vllm_url: str) -> None:
    context, _ = await target.prompt_ids({"prompt": PROMPTS[0]}, COMPLETION)
    unlikely = (await target.prompt_ids({"prompt": " zzz"}, COMPLETION))[0][-1]
    verification = await target.verify(context, [unlikely], TOP_N)
    scored = verification.positions[0]
    assert scored.token_id == unlikely and unlikely not in scored.top_ids.tolist()
    assert len(scored.top_ids) == TOP_N
    # Over the prefix cache a draft has a log-prob only inside the top-N; prompt log-probs score it anywhere.
    if target.round_cost() is None:
        assert scored.token_logprob is None
    else:
        assert scored.token_logprob < scored.top_logprobs[-1]


async def test_probe_finds_version_model_and_the_logprobs_cap(target: VLLMTarget, vllm_url: str) -> None:
    info = await target.probe()
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", info.version), info
    assert info.model == (await asyncio.to_thread(http.get, vllm_url + "/v1/models")).json()["data"][0]["id"]
    assert info.max_model_len > 0
    if "SPECULOOS_VLLM_URL" not in os.environ:
        assert (info.model, info.max_logprobs, info.reasoning) == (MODEL, DEFAULT_MAX_LOGPROBS, False)
    assert info.max_logprobs is not None
    # The cap is the real one: top_n at the cap is served, one more is refused.
    context, _ = await target.prompt_ids({"prompt": PROMPTS[0]}, COMPLETION)
    verification = await target.verify(context, [504], info.max_logprobs)
    assert len(verification.positions[0].top_ids) == info.max_logprobs
    with pytest.raises(UpstreamStatusError, match="max allowed") as refused:
        await target.verify(context, [504], info.max_logprobs + 1)
    assert refused.value.status == 400


@pytest.mark.parametrize("messages", CHATS)
async def test_chat_prompt_ids_are_the_ids_vllm_itself_uses(target: VLLMTarget, vllm_url: str,
                                                            messages: list[dict]) -> None:
    ids, context_size = await target.prompt_ids({"model": MODEL, "messages": messages}, CHAT)
    reply = await asyncio.to_thread(http.post_json, vllm_url + "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0, "return_token_ids": True})
    assert reply.status == 200, reply.body
    assert len(ids) == reply.json()["usage"]["prompt_tokens"]
    assert ids == reply.json()["prompt_token_ids"]
    models_reply = await asyncio.to_thread(http.get, vllm_url + "/v1/models")
    assert context_size == models_reply.json()["data"][0]["max_model_len"]


@pytest.mark.parametrize("prompt", PROMPTS)
async def test_completion_prompt_ids_are_the_ids_vllm_itself_uses(target: VLLMTarget, vllm_url: str,
                                                                  prompt: str) -> None:
    ids, _ = await target.prompt_ids({"prompt": prompt}, COMPLETION)
    reply = await asyncio.to_thread(http.post_json, vllm_url + "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "return_token_ids": True})
    assert ids == reply.json()["choices"][0]["prompt_token_ids"]


async def test_generate_is_vllms_own_decoding(target: VLLMTarget, vllm_url: str) -> None:
    context, _ = await target.prompt_ids({"prompt": PROMPTS[1]}, COMPLETION)
    greedy_tokens, _ = await asyncio.to_thread(greedy, vllm_url, context, 12)
    assert await target.generate(context, 12, SamplingParams(temperature=0), seed=0) == greedy_tokens
    sampled = SamplingParams(temperature=1.0, top_k=50, top_p=0.9)
    first = await target.generate(context, 12, sampled, seed=2**63 - 1)
    assert await target.generate(context, 12, sampled, seed=2**63 - 1) == first  # the seed decides
    assert len(first) == 12 or first[-1] == 2  # SmolLM2's EOS (<|im_end|>) ends early and is included


# End to end: the proxy (protocol vllm, SmolLM2 drafting for itself) against vLLM's own greedy output.


@pytest.fixture(scope="module")
def vllm_proxy(vllm_url: str, log_dir: Path) -> Iterator[Process]:
    """The proxy with one route whose upstream is the vLLM, SmolLM2-135M GGUF as the draft."""
    process = start_vllm_proxy(vllm_url, SMOL, log_dir, "vllm")
    yield process
    process.stop()


@pytest.mark.parametrize("messages", CHATS)
def test_greedy_through_the_proxy_is_vllms_own_greedy(vllm_proxy: Process, vllm_url: str,
                                                      messages: list[dict]) -> None:
    direct = http.post_json(vllm_url + "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0, "return_token_ids": True}).json()
    client = openai.OpenAI(base_url=vllm_proxy.url + "/v1", api_key="unused", max_retries=0)
    # X-Speculoos: on skips the controller, which would pass some requests through to measure.
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=32,
                                                           temperature=0, extra_headers={"X-Speculoos": "on"})
    assert raw.headers["x-speculoos-mode"] == "speculative", f"not speculating:\n{vllm_proxy.log()[-3000:]}"
    reply = raw.parse()
    expected, actual = direct["choices"][0]["message"]["content"], reply.choices[0].message.content
    if actual != expected:
        expected_ids = direct["choices"][0]["token_ids"]
        index, margin = divergence_margin(vllm_url, direct["prompt_token_ids"], expected_ids, actual)
        assert margin < LOGPROB_TOLERANCE, f"diverged at token {index} (margin {margin:.4f}):\n{expected!r}\n{actual!r}"
        print(f"near-tie divergence at token {index}, vLLM's top-2 margin {margin:.2e}")
    else:
        print(f"identical ({reply.usage.completion_tokens} tokens); speculoos: {reply.model_extra.get('speculoos')}")
    assert reply.choices[0].finish_reason == direct["choices"][0]["finish_reason"]


FIRST_TOKEN_PROMPT = [{"role": "user", "content": "Write one word that describes the ocean."}]
FIRST_TOKEN_REQUESTS = 300


def test_first_token_follows_vllms_distribution(vllm_proxy: Process, vllm_url: str) -> None:
    """Temperature 0.7, top_k 20 (exact from vLLM's top 20): the first token follows vLLM's own distribution.

    vLLM applies temperature, then top-k (vllm/v1/sample/sampler.py); the expected distribution is
    computed here from vLLM's raw top-20 logprobs, not by the proxy's sampler. The SmolLM2 self-pair
    rarely rejects, so unlike tests/e2e/test_proxy_sampling.py this cannot show that the
    argmax-on-rejection bug would fail here; it checks the vLLM path end to end.
    """
    from collections import Counter

    import numpy as np

    prompt_ids = http.post_json(vllm_url + "/tokenize", {"model": MODEL, "messages": FIRST_TOKEN_PROMPT,
                                                        "add_generation_prompt": True}).json()["tokens"]
    _, tops = greedy(vllm_url, prompt_ids, 1, top_n=20)
    ids = list(tops[0])
    tempered = np.exp(np.array([tops[0][i] for i in ids]) / 0.7)
    expected = dict(zip(ids, tempered / tempered.sum()))
    text_of = {i: http.post_json(vllm_url + "/detokenize", {"model": MODEL, "tokens": [i]}).json()["prompt"]
               for i in ids}
    client = openai.OpenAI(base_url=vllm_proxy.url + "/v1", api_key="unused", max_retries=0,
                           default_headers={"X-Speculoos": "on"})
    seen: Counter = Counter()
    for seed in range(FIRST_TOKEN_REQUESTS):
        reply = client.chat.completions.create(model=MODEL, messages=FIRST_TOKEN_PROMPT, max_tokens=1,
                                               temperature=0.7, seed=seed, extra_body={"top_k": 20})
        seen[reply.choices[0].message.content] += 1
    by_text: Counter = Counter()
    for token, probability in expected.items():
        by_text[text_of[token]] += probability
    assert sum(seen.values()) == FIRST_TOKEN_REQUESTS and set(seen) <= set(by_text)
    bins = [t for t, p in by_text.items() if p * FIRST_TOKEN_REQUESTS >= 5]
    observed = [seen[t] for t in bins] + [FIRST_TOKEN_REQUESTS - sum(seen[t] for t in bins)]
    wanted = [by_text[t] * FIRST_TOKEN_REQUESTS for t in bins]
    wanted.append(FIRST_TOKEN_REQUESTS - sum(wanted))
    if wanted[-1] < 1e-9:
        observed, wanted = observed[:-1], wanted[:-1]
    pvalue = chi_square.p_value(observed, wanted)
    print(f"vLLM first token: chi-square p = {pvalue:.4f}; {seen.most_common(4)}")
    assert pvalue > 1e-3


STATUS_REQUESTS = 6  # answers sent until the route has measured acceptance, at most


def test_status_shows_vllms_verification_cost_and_the_decision(vllm_proxy: Process) -> None:
    """vLLM re-prefills the context every round: /speculoos/status shows the measured cost and the choice.

    Until a request has measured acceptance, the route speculates on costs alone and says so; once measured,
    its choice follows its predicted rates. A request measures it as its draft reads what vLLM writes, and a
    reading still running when the answer ends is dropped: on slow cores a few short answers may measure nothing.
    """
    long_chat = [{"role": "user", "content": "Summarise: " + "The harbour was busy at dawn. " * 40}]
    client = openai.OpenAI(base_url=vllm_proxy.url + "/v1", api_key="unused", max_retries=0)
    for _ in range(STATUS_REQUESTS):
        client.chat.completions.create(model=MODEL, messages=long_chat, max_tokens=24, temperature=0)
        route = http.get(vllm_proxy.url + "/speculoos/status").json()["routes"][0]
        if route["alpha"] is not None:
            break
    print({k: route[k] for k in ("mode", "k", "reason", "alpha", "verify_seconds_by_k", "plain_tokens_per_second")})
    assert route["protocol"] == "vllm" and route["verify_seconds_by_k"]
    assert route["plain_tokens_per_second"] is not None
    best = max(r for r in route["predicted_tokens_per_second_by_k"].values() if r is not None)
    if route["alpha"] is None and route["mode"] == "speculative":
        assert route["reason"] == ALPHA_NOT_MEASURED and route["k"] > 0
    elif route["mode"] == "speculative":
        assert best > route["plain_tokens_per_second"]
    else:
        assert route["k"] == 0 and ("plain" in route["reason"] or "min_acceptance" in route["reason"])


LOGPROBS_CHAT = CHATS[3]  # a long answer: no end of generation within the tokens compared


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_log_probs_through_the_proxy_are_vllms_own(vllm_proxy: Process, vllm_url: str, stream: bool) -> None:
    """Greedy chat with log-probs speculates, answering vLLM's own tokens, log-probs and top 3 from its scoring."""
    _, expected = chat_logprobs(vllm_url, LOGPROBS_CHAT, stream=stream)
    mode, actual = chat_logprobs(vllm_proxy.url, LOGPROBS_CHAT, stream=stream, headers={"X-Speculoos": "on"})
    assert mode == "speculative", f"not speculating:\n{vllm_proxy.log()[-3000:]}"
    assert len(actual) == len(expected) == 16
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert got["token"] == want["token"], (index, got, want)
        assert abs(got["logprob"] - want["logprob"]) <= LOGPROB_TOLERANCE, (index, got, want)
        top_got = {entry["token"]: entry["logprob"] for entry in got["top_logprobs"]}
        top_want = {entry["token"]: entry["logprob"] for entry in want["top_logprobs"]}
        assert top_got.keys() == top_want.keys(), (index, got, want)  # vLLM lists the chosen token first
        assert all(abs(top_got[t] - top_want[t]) <= LOGPROB_TOLERANCE for t in top_want), (index, got, want)
