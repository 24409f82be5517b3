"""Client requests at the edges, through the running proxy: what a client sends never makes a 5xx, the output stops
where the target stops, and a vLLM route verifies against the model the client named.

The proxy runs in-process with toy drafters in front of the fake SGLang and the fake vLLM of a toy
model (tests/fakes/); the fuzz posts seeded bodies to it through aiohttp's client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config.load import parse_config
from proxy.server.app import create_app
from tests.fakes.drafter import ScriptedDrafter
from tests.fakes.sglang import fake_sglang_app
from tests.fakes.toy_model import END, ToyModel, ToyVocabulary
from tests.fakes.vllm import ADAPTER, SEEN, toy_vllm_app
from tests.unit.wire.test_fields import APIS, SAMPLE

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
MODE = "X-Speculoos-Mode"
MAX_TOKENS = 24


class FimEnds(ToyVocabulary):
    """A draft vocabulary in which llama.cpp would also end generations at a FIM-like token the target goes on past."""

    def __init__(self, fim: int) -> None:
        self.llama_only_ends = frozenset({fim})

    def is_end_of_generation(self, token: int) -> bool:
        return token == END or token in self.llama_only_ends


def greedy_drafter(model: ToyModel, vocabulary: ToyVocabulary) -> ScriptedDrafter:
    """A draft that proposes the target's greedy continuation (every round accepted)."""
    drafter = ScriptedDrafter(lambda context, k: model.greedy(context, k))
    drafter.vocabulary = vocabulary
    return drafter


def toy_continuation(model: ToyModel) -> list[int]:
    """The fake SGLang's greedy answer to MESSAGES (its chat template, as the proxy's tokenize call renders it)."""
    from tests.fakes.sglang import render
    return model.greedy(render(MESSAGES, False, None), MAX_TOKENS)


async def start_proxy(tmp_path: Path, fim: int | None = None) -> AsyncIterator[tuple[TestServer, web.Application]]:
    """The proxy with routes `toy-lora` (fake vLLM) and everything else (fake SGLang)."""
    model = ToyModel()
    upstreams = [TestServer(fake_sglang_app(model)), TestServer(toy_vllm_app(model, adapters=(ADAPTER,)))]
    for server in upstreams:
        await server.start_server()
    for name in ("sglang.gguf", "vllm.gguf"):
        (tmp_path / name).write_bytes(b"")  # a draft path must exist; the loader below never reads it
    config = parse_config({"routes": [
        {"name": "lora", "match": {"model": ADAPTER}, "speculation": {"k": 4},
         "upstream": {"url": str(upstreams[1].make_url("")), "protocol": "vllm"},
         "draft": {"model": str(tmp_path / "vllm.gguf")}},
        {"name": "toy", "match": {"model": "*"}, "upstream": {"url": str(upstreams[0].make_url(""))},
         "draft": {"model": str(tmp_path / "sglang.gguf")}, "speculation": {"k": 4}},
    ]})
    vocabulary = ToyVocabulary() if fim is None else FimEnds(fim)
    server = TestServer(create_app(config, load_drafter=lambda options: greedy_drafter(model, vocabulary)))
    await server.start_server()
    yield server, upstreams[1].app
    await server.close()
    for upstream in upstreams:
        await upstream.close()


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[TestServer]:
    async for server, _ in start_proxy(tmp_path):
        yield server


async def post(server: TestServer, path: str, data: bytes | dict, headers: dict[str, str] | None = None
               ) -> tuple[int, dict[str, str], bytes]:
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    async with aiohttp.ClientSession() as session, session.post(
            server.make_url(path), data=body, headers={"Content-Type": "application/json", **(headers or {})}) as reply:
        return reply.status, dict(reply.headers), await reply.read()


def assert_bad_request(status: int, raw: bytes, needle: str) -> None:
    assert status == 400, raw[:300]
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"} and needle in error["message"], error


# -- bodies no parser should choke on ----------------------------------------------------------------

DEEP = 100_000
EDGES = [
    # (id, path, raw body, what the 400 says)
    ("nested 100,000 deep", CHAT_PATH, b"[" * DEEP + b"]" * DEEP, "nested too deeply"),
    ("objects nested 100,000 deep", COMPLETIONS_PATH, b'{"a":' * DEEP + b"1" + b"}" * DEEP, "nested too deeply"),
    ("5,000-digit max_tokens", CHAT_PATH,
     b'{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}",
     "number too long"),
    ("5,000-digit seed", COMPLETIONS_PATH, b'{"model": "toy", "prompt": "a", "seed": -' + b"1" * 5000 + b"}",
     "number too long"),
    ("prompt ids past the vocabulary", COMPLETIONS_PATH,
     json.dumps({"model": "toy", "prompt": [1, 2, 10**6], "temperature": 0}).encode(), "outside the vocabulary"),
    ("a negative prompt id", COMPLETIONS_PATH,
     json.dumps({"model": "toy", "prompt": [[1, -3]], "temperature": 0}).encode(), "outside the vocabulary"),
    ("a 5,000-digit k header", CHAT_PATH, json.dumps({"model": "toy", "messages": MESSAGES}).encode(), "k must be"),
]


@pytest.mark.parametrize(("path", "raw", "needle"), [pytest.param(*case[1:], id=case[0]) for case in EDGES])
async def test_edge_bodies_are_bad_requests(proxy: TestServer, path: str, raw: bytes, needle: str) -> None:
    headers = {"X-Speculoos": "k=" + "9" * 5000} if needle == "k must be" else None
    status, _, reply = await post(proxy, path, raw, headers)
    assert_bad_request(status, reply, needle)


async def test_deep_json_on_another_path_is_forwarded(proxy: TestServer) -> None:
    status, headers, _ = await post(proxy, "/v1/embeddings", b"[" * DEEP + b"]" * DEEP)
    assert status < 500 and headers[MODE] == "passthrough"  # the fake SGLang has no such path: its 404 or 405


# -- the stop set is the target's ------------------------------------------------------------------


async def test_output_goes_on_past_a_token_only_the_draft_ends_at(tmp_path: Path) -> None:
    continuation = toy_continuation(ToyModel())
    fim = next(t for t in continuation[2:] if t != END)  # a token the target writes mid-answer
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
    async for server, _ in start_proxy(tmp_path, fim=fim):
        status, headers, raw = await post(server, CHAT_PATH, body, {"X-Speculoos": "on"})
        assert status == 200 and headers[MODE] == "speculative", raw[:300]
        _, _, plain = await post(server, CHAT_PATH, body, {"X-Speculoos": "off"})
    speculative = json.loads(raw)["choices"][0]["message"]["content"]
    assert speculative == json.loads(plain)["choices"][0]["message"]["content"]
    assert json.loads(raw)["usage"]["completion_tokens"] > continuation.index(fim) + 1


# -- a vLLM route verifies against the model the client named ------------------------------------


async def test_a_lora_adapter_is_verified_as_itself(tmp_path: Path) -> None:
    async for server, vllm in start_proxy(tmp_path):
        started = len(vllm[SEEN])  # start-up probes and calibration ask for the served base model
        for path, body in [(CHAT_PATH, {"messages": MESSAGES}), (COMPLETIONS_PATH, {"prompt": "once upon a time"})]:
            status, headers, raw = await post(server, path, {"model": ADAPTER, "max_tokens": 12, "temperature": 0,
                                                             **body}, {"X-Speculoos": "on"})
            assert status == 200 and headers[MODE] == "speculative", raw[:300]
        generation = [body for call, body in vllm[SEEN][started:] if call in ("POST /v1/completions", "POST /tokenize")]
    assert generation and {body.get("model") for body in generation} == {ADAPTER}


# -- fuzz: no body a client sends makes the proxy answer 5xx -------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
FIELD_NAMES = sorted({*APIS["chat"], *APIS["completion"], "speculoos"})
# A valid greedy body (so that most examples reach admission and generation) with a few fields set to anything:
# a sample value from the field table, or arbitrary JSON.
base_bodies = st.fixed_dictionaries({
    "model": st.sampled_from(["toy", ADAPTER, "other"]), "messages": st.just(MESSAGES),
    "prompt": st.sampled_from(["once", [1, 2, 3], [[4, 5]], [30], [-1], ["x"]]),
    "max_tokens": st.integers(1, 12), "temperature": st.sampled_from([0, 0.7]), "stream": st.booleans()})
extra_fields = st.dictionaries(st.sampled_from(FIELD_NAMES), st.sampled_from(list(SAMPLE.values())) | json_values,
                               max_size=3)
bodies = st.builds(lambda base, extra: {**base, **extra}, base_bodies, extra_fields)
controls = st.sampled_from(["", "on", "off", "k=3", "k=99", "k=²", "k=" + "9" * 5000, "bogus"])


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[asyncio.AbstractEventLoop, TestServer]]:
    """The proxy on a loop of its own, which each example drives to completion."""
    loop = asyncio.new_event_loop()
    servers = start_proxy(tmp_path_factory.mktemp("fuzz"))
    server, _ = loop.run_until_complete(servers.__anext__())
    yield loop, server
    loop.run_until_complete(servers.aclose())
    loop.close()


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                                     HealthCheck.data_too_large])
@given(body=bodies, path=st.sampled_from([CHAT_PATH, COMPLETIONS_PATH]), control=controls)
def test_no_request_body_makes_a_5xx(fuzzed: tuple[asyncio.AbstractEventLoop, TestServer], body: dict[str, Any],
                                      path: str, control: str) -> None:
    loop, server = fuzzed
    status, headers, raw = loop.run_until_complete(post(server, path, body, {"X-Speculoos": control}))
    if headers.get(MODE) == "passthrough":
        return  # the upstream's own answer, as it is (the fake's to a body it cannot read may be a 500)
    assert status < 500, (status, raw[:500])
    if status >= 400:
        assert "error" in json.loads(raw)


def test_the_fuzz_reaches_both_modes(fuzzed: tuple[asyncio.AbstractEventLoop, TestServer]) -> None:
    """The fuzz proves something only if valid bodies are served, speculatively and passed through."""
    loop, server = fuzzed
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    modes: Sequence[str] = [
        loop.run_until_complete(post(server, CHAT_PATH, {**body, **extra}, {"X-Speculoos": "on"}))[1][MODE]
        for extra in ({}, {"ignore_eos": True})]
    assert list(modes) == ["speculative", "passthrough"]
