"""VLLMTarget against fake vLLMs: one replaying answers captured from a real one (data/), one of a toy model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.targets.upstream import Timeouts, Upstream, UpstreamStatusError
from proxy.targets.vllm import VLLMTarget
from proxy.targets.vllm_answers import parse_verification
from proxy.targets.vllm_probe import VLLMInfo
from proxy.targets.vllm_sampling import GREEDY_NEUTRAL, NEUTRAL_PENALTIES
from proxy.wire.request import CHAT, COMPLETION
from tests.fakes.toy_model import ToyModel
from tests.fakes.vllm import SEEN, replay_vllm_app, toy_vllm_app

DATA = Path(__file__).parent / "data"
VERIFY = json.loads((DATA / "vllm_verify_smollm2.json").read_text())
ENDPOINTS = json.loads((DATA / "vllm_endpoints_smollm2.json").read_text())
NO_RENDER = "this vLLM has no /v1/completions/render"


# The replaying fake vLLM (tests/fakes/vllm.py) on a loopback port, and the client talking to it.


@asynccontextmanager
async def fake_vllm(verify_answer: dict[str, Any] | None = None) -> AsyncIterator[tuple[VLLMTarget, list]]:
    app = replay_vllm_app(ENDPOINTS, verify_answer or VERIFY["response"])
    server = TestServer(app)
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), Timeouts(connect=2, first_byte=5, idle=5))
    try:
        yield VLLMTarget(upstream), app[SEEN]
    finally:
        await upstream.close()
        await server.close()


async def test_verify_sends_one_completions_request_and_parses_it() -> None:
    async with fake_vllm() as (target, seen):
        verification = await target.verify([504, 3575, 282, 4649, 314], [7042, 28, 4528], 2)
    assert [p.argmax for p in verification.positions] == [7042, 30, 284, 314]
    # Every field vLLM could fill from generation_config is named at its neutral value.
    assert seen == [("GET /v1/models", None), ("POST /v1/completions", {**VERIFY["request"], **GREEDY_NEUTRAL})]


async def test_verify_names_a_configured_model_without_asking() -> None:
    async with fake_vllm() as (target, seen):
        target.model = "my-model"
        await target.verify([504, 3575, 282, 4649, 314], [7042, 28, 4528], 2)
    assert [path for path, _ in seen] == ["POST /v1/completions"]
    assert seen[0][1]["model"] == "my-model"


async def test_verify_refuses_top_n_zero() -> None:
    async with fake_vllm() as (target, _):
        with pytest.raises(ValueError, match="top_n"):
            await target.verify([1], [2], 0)


async def test_probe_reads_version_model_context_and_the_logprobs_cap() -> None:
    async with fake_vllm() as (target, seen):
        info = await target.probe()
    assert info == VLLMInfo(version="0.32.0", model="smollm2-135m", max_model_len=8192, max_logprobs=20,
                            defaults_source=NO_RENDER)
    assert target.exactness_problem(SamplingParams(), 20) is not None  # top-N only: no exact residual draws
    assert target.order is SamplerOrder.TEMPERATURE_THEN_TRUNCATE
    assert ("POST /v1/completions", ENDPOINTS["POST /v1/completions over the cap"]["request"]) in seen
    assert target.round_cost() is not None  # no /metrics to show a prefix cache: rounds re-prefill


async def test_chat_prompt_ids_use_the_servers_template() -> None:
    messages = ENDPOINTS["POST /tokenize chat"]["request"]["messages"]
    async with fake_vllm() as (target, seen):
        ids, context = await target.prompt_ids({"model": "smollm2-135m", "messages": messages}, CHAT)
    assert (ids, context) == (ENDPOINTS["POST /tokenize chat"]["body"]["tokens"], 8192)
    assert seen[-1] == ("POST /tokenize", ENDPOINTS["POST /tokenize chat"]["request"])


async def test_chat_template_settings_are_passed_on() -> None:
    body = {"messages": [{"role": "assistant", "content": "Par"}], "add_generation_prompt": False,
            "continue_final_message": True, "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0}
    async with fake_vllm() as (target, seen):
        await target.prompt_ids(body, CHAT)
    sent = seen[-1][1]
    flags = (sent["add_generation_prompt"], sent["continue_final_message"], sent["add_special_tokens"])
    assert flags == (False, True, False)
    assert sent["chat_template_kwargs"] == {"enable_thinking": False} and "temperature" not in sent


@pytest.mark.parametrize(("body", "expected_ids", "tokenize_request"), [
    ({"prompt": "The capital of France is"}, [504, 3575, 282, 4649, 314],
     ENDPOINTS["POST /tokenize prompt"]["request"]),
    ({"prompt": [5, 6, 7]}, [5, 6, 7], None),  # token ids are used verbatim; the context size comes from /v1/models
])
async def test_completion_prompt_ids(body: dict, expected_ids: list[int], tokenize_request: dict | None) -> None:
    async with fake_vllm() as (target, seen):
        assert await target.prompt_ids(body, COMPLETION) == (expected_ids, 8192)
    tokenized = [sent for path, sent in seen if path == "POST /tokenize"]
    assert tokenized == ([tokenize_request] if tokenize_request else [])


@pytest.mark.parametrize("penalty", [1.0, 1.3])
async def test_generate_asks_vllm_to_sample_and_returns_its_token_ids(penalty: float) -> None:
    # A repetition penalty counts the prompt's ids as the output's: a plain continuation names the request's own.
    captured = ENDPOINTS["POST /v1/completions generate"]
    async with fake_vllm() as (target, seen):
        target.model = "smollm2-135m"
        params = SamplingParams(0.7, top_p=0.9, repetition_penalty=penalty)
        tokens = await target.generate([504, 3575, 282, 4649, 314], 8, params, seed=1)
    assert tokens == captured["body"]["choices"][0]["token_ids"]
    assert seen == [("POST /v1/completions",
                     {**captured["request"], **NEUTRAL_PENALTIES, "repetition_penalty": penalty})]


async def test_upstream_errors_pass_through_verify() -> None:
    async with fake_vllm() as (target, _):
        with pytest.raises(UpstreamStatusError, match="max allowed: 20") as caught:
            await target.verify([1], [2], 21)
    assert caught.value.status == 400


async def test_a_garbled_answer_is_an_upstream_error() -> None:
    async with fake_vllm({"choices": [{"text": "hi"}]}) as (target, _):
        with pytest.raises(UpstreamUnavailableError, match="malformed verification answer"):
            await target.verify([1], [2], 2)


# The toy-model fake vLLM answers in the shapes captured from a real one.


def shape(value: Any) -> Any:
    """A JSON value's structure: key names (token keys collapsed by style), element shapes, scalar types."""
    if isinstance(value, dict):
        styles = {"<id>" if key.isdigit() else "<token_id:id>" if key.startswith("token_id:") else None
                  for key in value}
        if value and len(styles) == 1 and None not in styles:
            return {styles.pop(): sorted({json.dumps(shape(v), sort_keys=True) for v in value.values()})}
        return {key: shape(v) for key, v in value.items()}
    if isinstance(value, list):
        return sorted({json.dumps(shape(v), sort_keys=True) for v in value})
    return type(value).__name__


TOY_PROMPT = [3, 5, 7, 11, 2, 4, 6, 8]


@pytest.mark.parametrize(("method", "path", "body", "captured"), [
    ("POST", "/v1/completions", {**VERIFY["request"], "model": "toy", "prompt": TOY_PROMPT}, VERIFY["response"]),
    ("POST", "/v1/completions", {**ENDPOINTS["POST /v1/completions generate"]["request"], "model": "toy",
                                 "prompt": TOY_PROMPT[:5]}, ENDPOINTS["POST /v1/completions generate"]["body"]),
    ("POST", "/tokenize", {**ENDPOINTS["POST /tokenize chat"]["request"], "model": "toy"},
     ENDPOINTS["POST /tokenize chat"]["body"]),
    ("POST", "/tokenize", {**ENDPOINTS["POST /tokenize prompt"]["request"], "model": "toy"},
     ENDPOINTS["POST /tokenize prompt"]["body"]),
    ("GET", "/v1/models", None, ENDPOINTS["GET /v1/models"]["body"]),
    ("GET", "/version", None, ENDPOINTS["GET /version"]["body"]),
], ids=["verify", "generate", "tokenize chat", "tokenize prompt", "models", "version"])
async def test_the_toy_fake_answers_in_the_captured_shape(method: str, path: str, body: dict | None,
                                                          captured: dict) -> None:
    async with TestClient(TestServer(toy_vllm_app(ToyModel()))) as client:
        response = await client.request(method, path, json=body)
        assert response.status == 200
        assert shape(await response.json()) == shape(captured)


async def test_the_toy_fake_refuses_too_many_logprobs_as_vllm_does() -> None:
    over = ENDPOINTS["POST /v1/completions over the cap"]
    async with TestClient(TestServer(toy_vllm_app(ToyModel()))) as client:
        response = await client.post("/v1/completions", json={**over["request"], "model": "toy"})
        assert (response.status, await response.json()) == (over["status"], over["body"])


async def test_the_toy_fake_scores_what_the_toy_model_says() -> None:
    model, context, drafts = ToyModel(), TOY_PROMPT[:5], TOY_PROMPT[5:]
    async with TestClient(TestServer(toy_vllm_app(model))) as client:
        response = await client.post("/v1/completions", json={**VERIFY["request"], "model": "toy",
                                                              "prompt": context + drafts})
        verification = parse_verification(await response.json(), len(context), drafts, VERIFY["top_n"])
    for position, scored in enumerate(verification.positions[:-1]):
        logprobs = model.log_softmax(context + drafts[:position])
        assert scored.token_logprob == pytest.approx(logprobs[drafts[position]])
        assert scored.top_ids.tolist() == np.argsort(-logprobs, kind="stable")[:VERIFY["top_n"]].tolist()
    assert verification.bonus_token == model.greedy(context + drafts, 1)[0]


async def test_probe_against_the_toy_fake() -> None:
    server = TestServer(toy_vllm_app(ToyModel()))
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), Timeouts(connect=2, first_byte=5, idle=5))
    try:
        info = await VLLMTarget(upstream).probe()
    finally:
        await upstream.close()
        await server.close()
    assert info == VLLMInfo(version="0.32.0", model="toy", max_model_len=4096, max_logprobs=20,
                            defaults_source=NO_RENDER)
