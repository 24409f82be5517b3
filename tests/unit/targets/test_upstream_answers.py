"""Answers the proxy reads whole (scoring, tokenizing, probing): any malformed one is one of our upstream errors.

A real aiohttp server on port 0 answers raw bytes (JSON the standard library reads with surprises:
Infinity, numbers too long, nesting too deep), a body too large, or a body that never ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from proxy.sampling.processors import SamplingParams
from proxy.targets.sglang import SGLangTarget
from proxy.targets.upstream import Timeouts, Upstream, UpstreamStatusError
from proxy.targets.vllm import VLLMTarget
from tests.fakes.toy_model import VOCAB

DEEP = b"[" * 100_000 + b"]" * 100_000  # deeper than Python's recursion limit
LONG_NUMBER = b"1" * 5000  # more digits than Python converts to an int (sys.get_int_max_str_digits)
HUGE = b"1" + b"0" * 400  # an int, but no float or int64 holds it
QUICK = Timeouts(1.0, 5.0, 5.0)

Call = Callable[[Upstream], Awaitable[Any]]


def raw_app(path: str, body: bytes, status: int = 200) -> web.Application:
    """A server that answers `body` on `path`, labelled JSON, whatever it is asked."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=body, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", path, handle)
    return app


@asynccontextmanager
async def upstream_of(app: web.Application, timeouts: Timeouts = QUICK, **options: Any) -> AsyncIterator[Upstream]:
    server = TestServer(app)
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), timeouts, **options)
    try:
        yield upstream
    finally:
        await upstream.close()
        await server.close()


def sglang_generate(upstream: Upstream) -> Awaitable[Any]:
    target = SGLangTarget(upstream)
    target.vocab_size = VOCAB
    return target.generate([1, 2], 4, SamplingParams(temperature=0.0), 1)


def vllm_generate(upstream: Upstream) -> Awaitable[Any]:
    target = VLLMTarget(upstream, "toy")
    target.vocab_size = VOCAB
    return target.generate([1, 2], 4, SamplingParams(temperature=0.0), 1)


def vllm_tokenize(upstream: Upstream) -> Awaitable[Any]:
    return VLLMTarget(upstream, "toy").prompt_ids({"prompt": "hi"}, "completion")


def vllm_context(upstream: Upstream) -> Awaitable[Any]:
    return VLLMTarget(upstream).context_size()


ANSWERS = [
    # (id, path, call, raw answer, message)
    ("Infinity as an id", "/generate", sglang_generate, b'{"output_ids": [Infinity]}',
     "a plain /generate answer holds Infinity where a token id belongs"),
    ("1e999 as an id", "/generate", sglang_generate, b'{"output_ids": [1e999]}', "holds Infinity where a token id"),
    ("NaN as an id", "/v1/completions", vllm_generate, b'{"choices": [{"token_ids": [NaN]}]}',
     "a plain completion holds NaN where a token id belongs"),
    ("a fraction as an id", "/generate", sglang_generate, b'{"output_ids": [2.5]}', "holds 2.5 where a token id"),
    ("a huge id", "/generate", sglang_generate, b'{"output_ids": [' + HUGE + b']}',
     "holds token id 1000000000000000000000000000000000000000..., outside the vocabulary"),
    ("a number too long", "/generate", sglang_generate, b'{"output_ids": [' + LONG_NUMBER + b']}',
     "upstream sent invalid JSON for /generate (a number too long to read)"),
    ("nesting too deep", "/generate", sglang_generate, b'{"output_ids": ' + DEEP + b'}',
     "upstream sent JSON nested too deeply for /generate"),
    ("not JSON", "/generate", sglang_generate, b"<html>502</html>", "upstream sent invalid JSON for /generate"),
    ("Infinity as a context length", "/tokenize", vllm_tokenize, b'{"tokens": [1], "max_model_len": Infinity}',
     "/tokenize's context length is Infinity, not a number of tokens"),
    ("a huge context length", "/v1/models", vllm_context, b'{"data": [{"id": "m", "max_model_len": ' + HUGE + b'}]}',
     "/v1/models' context length is 1000000000000000000000000000000000000000..., not a number of tokens"),
]


@pytest.mark.parametrize(("path", "call", "answer", "message"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
async def test_a_malformed_answer_is_an_upstream_error_that_says_what(path: str, call: Call, answer: bytes,
                                                                      message: str) -> None:
    async with upstream_of(raw_app(path, answer)) as upstream:
        with pytest.raises(UpstreamUnavailableError) as raised:
            await call(upstream)
    assert message in raised.value.message
    assert len(raised.value.message) < 300


@pytest.mark.parametrize("answer", [DEEP, b'{"error": {"message": ' + LONG_NUMBER + b"}}"], ids=["deep", "long number"])
async def test_an_unreadable_error_answer_is_passed_on_as_its_status(answer: bytes) -> None:
    async with upstream_of(raw_app("/generate", answer, status=500)) as upstream:
        with pytest.raises(UpstreamStatusError, match="upstream returned HTTP 500") as raised:
            await upstream.post_json("/generate", {})
    assert raised.value.status == 500


# Size and time: an answer read whole is capped in bytes, and a call has a total deadline.


def streaming_app(piece: bytes, every_s: float, content_length: int | None = None) -> web.Application:
    """Answers /generate with `piece` every `every_s` seconds, never ending (declaring `content_length` if given)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if content_length is not None:
            response.content_length = content_length
        await response.prepare(request)
        while True:
            await response.write(piece)
            await asyncio.sleep(every_s)

    app = web.Application()
    app.router.add_post("/generate", handle)
    return app


SIZES = [
    # (id, server, the cap given to the client or None for the default, message)
    ("declared too large", streaming_app(b"[", 1.0, content_length=(64 << 20) + 1), None,
     f"upstream answered /generate with {(64 << 20) + 1} bytes, more than the {64 << 20} the proxy reads"),
    ("growing past the cap", streaming_app(b"[" * 4096, 0.0), 1 << 20,
     f"upstream answered /generate with more than the {1 << 20} bytes the proxy reads"),
]


@pytest.mark.parametrize(("app", "cap", "message"), [s[1:] for s in SIZES], ids=[s[0] for s in SIZES])
async def test_an_answer_too_large_is_refused_without_reading_it_all(app: web.Application, cap: int | None,
                                                                     message: str) -> None:
    options = {} if cap is None else {"max_answer_bytes": cap}
    async with upstream_of(app, Timeouts(1.0, 5.0, idle=3.0), **options) as upstream:
        with pytest.raises(UpstreamUnavailableError) as raised:
            await asyncio.wait_for(upstream.post_json("/generate", {}), 10)
    assert raised.value.message == message


async def test_an_answer_that_trickles_forever_meets_the_calls_deadline() -> None:
    timeouts = Timeouts(1.0, 5.0, idle=0.5, total=1.0)  # a byte every 0.1 s: never silent for `idle`
    async with upstream_of(streaming_app(b" ", 0.1), timeouts) as upstream:
        with pytest.raises(UpstreamTimeoutError) as raised:
            await asyncio.wait_for(upstream.post_json("/generate", {}), 10)
    assert raised.value.message == "upstream did not finish answering /generate within 1 s"
    assert isinstance(raised.value, UpstreamError) and raised.value.status == 504
