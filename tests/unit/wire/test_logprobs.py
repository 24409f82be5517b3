"""What a request asks for in log-probs, and each emitted token's entry in OpenAI's chat and legacy shapes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.wire.emit import write_generation
from proxy.wire.logprobs import LogprobsWriter, TokenLogprobs, requested_logprobs
from proxy.wire.request import CHAT, COMPLETION, parse_generation_request
from proxy.wire.textstream import TextStream
from tests.fakes.toy_model import ToyVocabulary
from tests.support import sse_events

TEXTS = {1: b"Hello", 2: b",", 3: b" world", 4: b"\xe2\x82", 5: b""}  # 4: half of a UTF-8 character; 5: special
ENTRIES = {  # by completion length: the target's log-prob of the token emitted there, and the top-3
    1: TokenLogprobs(1, -0.1, ((1, -0.1), (3, -2.5), (2, -3.0))),
    2: TokenLogprobs(2, -3.0, ((1, -0.5), (3, -1.5), (2, -3.0))),
    3: TokenLogprobs(4, -7.0, ((3, -0.2), (1, -2.0), (2, -2.5))),  # sampled outside the top-3
    4: TokenLogprobs(5, -float("inf"), ((3, -0.2), (1, -2.0), (2, -2.5))),
}


@pytest.mark.parametrize(("kind", "body", "expected"), [
    (CHAT, {"logprobs": True, "top_logprobs": 3}, 3),
    (CHAT, {"logprobs": True}, 0),
    (CHAT, {"logprobs": True, "top_logprobs": None}, 0),
    (CHAT, {"logprobs": False, "top_logprobs": 3}, None),  # the upstream's 400 to give
    (CHAT, {"top_logprobs": 3}, None),
    (CHAT, {"logprobs": 1}, None),  # not a boolean
    (CHAT, {"logprobs": True, "top_logprobs": 21}, None),  # above OpenAI's bound
    (CHAT, {"logprobs": True, "top_logprobs": True}, None),
    (CHAT, {}, None),
    (COMPLETION, {"logprobs": 2}, 2),
    (COMPLETION, {"logprobs": 0}, 0),  # the sampled token's own
    (COMPLETION, {"logprobs": None}, None),
    (COMPLETION, {"logprobs": True}, None),
    (COMPLETION, {"logprobs": -1}, None),
])
def test_what_a_request_asks_for(kind: str, body: dict[str, Any], expected: int | None) -> None:
    assert requested_logprobs(body, kind) == expected


def writer(kind: str, n: int) -> LogprobsWriter:
    def lookup(completion: Sequence[int]) -> TokenLogprobs:
        entry = ENTRIES[len(completion)]
        assert entry.token == completion[-1]
        return entry

    return LogprobsWriter(kind, n, TEXTS.__getitem__, lookup)


def test_chat_entries_carry_text_bytes_and_the_top_n() -> None:
    logprobs = writer(CHAT, 2)
    logprobs.add([1, 2])
    assert logprobs.take() == {"refusal": None, "content": [
        {"token": "Hello", "logprob": -0.1, "bytes": list(b"Hello"), "top_logprobs": [
            {"token": "Hello", "logprob": -0.1, "bytes": list(b"Hello")},
            {"token": " world", "logprob": -2.5, "bytes": list(b" world")}]},
        {"token": ",", "logprob": -3.0, "bytes": [44], "top_logprobs": [
            {"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello")},
            {"token": " world", "logprob": -1.5, "bytes": list(b" world")}]},
    ]}
    assert logprobs.take() is None  # nothing pending


def test_chat_bytes_are_the_tokens_own_and_minus_infinity_is_clamped() -> None:
    logprobs = writer(CHAT, 0)
    logprobs.add([1, 2, 4, 5])
    content = logprobs.take()["content"]  # type: ignore[index]
    assert [entry["top_logprobs"] for entry in content] == [[], [], [], []]
    assert content[2] == {"token": "\ufffd", "logprob": -7.0, "bytes": [0xE2, 0x82], "top_logprobs": []}
    assert content[3]["logprob"] == -9999.0


def test_legacy_shape_adds_the_sampled_token_and_offsets_run_across_chunks() -> None:
    logprobs = writer(COMPLETION, 2)
    logprobs.add([1, 2])
    first = logprobs.take()
    logprobs.add([4])
    second = logprobs.take()
    assert first == {"tokens": ["Hello", ","], "token_logprobs": [-0.1, -3.0],
                     "top_logprobs": [{"Hello": -0.1, " world": -2.5}, {"Hello": -0.5, " world": -1.5, ",": -3.0}],
                     "text_offset": [0, 5]}
    assert second == {"tokens": ["\ufffd"], "token_logprobs": [-7.0],
                      "top_logprobs": [{" world": -0.2, "Hello": -2.0, "\ufffd": -7.0}], "text_offset": [6]}


def test_legacy_logprobs_zero_gives_the_sampled_token_alone() -> None:
    logprobs = writer(COMPLETION, 0)
    logprobs.add([1])
    assert logprobs.take()["top_logprobs"] == [{"Hello": -0.1}]  # type: ignore[index]


def fixed_lookup(completion: Sequence[int]) -> TokenLogprobs:
    """Every token's log-prob is minus its index in the completion, the top-2 the ids 1 and 2."""
    return TokenLogprobs(completion[-1], -float(len(completion)), ((1, -0.5), (2, -1.5)))


async def answer(kind: str, body: dict[str, Any], batches: list[list[int]]) -> Any:
    """A real app writing the batches as a generation of toy tokens with log-probs; its reply."""
    async def handle(request: web.Request) -> web.StreamResponse:
        parsed = parse_generation_request(await request.json(), kind)  # type: ignore[arg-type]
        vocabulary = ToyVocabulary()
        stream = TextStream(vocabulary.token_bytes, vocabulary.is_end_of_generation, max_tokens=parsed.max_tokens)

        async def tokens() -> AsyncIterator[Sequence[int]]:
            for batch in batches:
                yield batch

        logprobs = None if parsed.logprobs is None else \
            LogprobsWriter(kind, parsed.logprobs, vocabulary.token_bytes, fixed_lookup)
        response, _ = await write_generation(request, parsed, tokens(), stream, 3,
                                             shapers=[logprobs] if logprobs is not None else ())
        return response

    app = web.Application()
    app.router.add_post("/", handle)
    async with TestClient(TestServer(app)) as client:
        reply = await client.post("/", json={"model": "m", **body})
        return sse_events(await reply.read()) if body.get("stream") else await reply.json()


async def test_each_chunk_carries_its_tokens_log_probs() -> None:
    events = await answer(CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                                 "top_logprobs": 1, "stream": True, "max_tokens": 4}, [[3, 4], [5], [6, 7, 8]])
    choices = [event["choices"][0] for event in events if event != "[DONE]"]
    assert choices[0]["logprobs"] is None  # the role chunk
    per_chunk = [[entry["logprob"] for entry in choice["logprobs"]["content"]] for choice in choices[1:]]
    assert per_chunk == [[-1.0, -2.0], [-3.0], [-4.0]]  # none past max_tokens
    assert choices[1]["logprobs"]["content"][0]["top_logprobs"] == [{"token": "b ", "logprob": -0.5,
                                                                       "bytes": list(b"b ")}]


async def test_a_whole_completion_carries_every_tokens_log_probs() -> None:
    body = await answer(COMPLETION, {"prompt": "x", "logprobs": 1, "max_tokens": 3}, [[3, 4], [5, 6]])
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["d ", "e ", "f "], "token_logprobs": [-1.0, -2.0, -3.0], "text_offset": [0, 2, 4],
        "top_logprobs": [{"b ": -0.5, "d ": -1.0}, {"b ": -0.5, "e ": -2.0}, {"b ": -0.5, "f ": -3.0}]}


async def test_without_log_probs_asked_the_shape_is_unchanged() -> None:
    body = await answer(COMPLETION, {"prompt": "x", "max_tokens": 2}, [[3, 4]])
    assert body["choices"][0]["logprobs"] is None
