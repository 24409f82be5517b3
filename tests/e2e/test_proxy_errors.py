"""The proxy under bad input and failing upstreams, end to end: real processes, raw HTTP and the openai SDK."""

# The `faults` proxy (conftest.py; `max_body_bytes: 1024`, no catch-all route, so an unknown model is a 404) has one
# route per situation, picked by the request's model name: `smol` serves from a SmolLM2 verifier of this module's
# own, `doomed` from a second one that one test kills while it streams, `down` from nothing listening, and most
# others from the faulty upstream (`fake`, see tests.fakes.faulty_upstream), which relays to the verifier unless
# the mode in its URL says otherwise, and records every request it gets.

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

from tests import support as http
from tests.e2e.proxy_harness import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    ERROR_KEYS,
    FIRST_BYTE_S,
    IDLE_S,
    MESSAGES,
    MODE_HEADER,
    SPECULATE,
    assert_ends_in_band,
    assert_openai_error,
    assert_served,
    assert_still_serving,
    chat_body,
    read_first_chunk_then_hang_up,
    sdk,
    streaming,
)
from tests.e2e.servers import Process
from tests.fakes.faulty_upstream import CANCELLED, FLAKY_AT, GENERATE_PATH, HELLO_CHUNKS, FakeUpstream
from tests.fakes.stale_relay import StaleRelay

# -- bad input --------------------------------------------------------------------------------------


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _chat(**fields: Any) -> bytes:
    return _json(chat_body("smol", **fields))


BAD_INPUT = [
    # (id, path, raw body, status, message substring, param)
    ("malformed JSON", CHAT_PATH, b'{"model": "smol", "messages": [', 400, "not valid JSON", None),
    ("empty body", CHAT_PATH, b"", 400, "not valid JSON", None),
    ("not UTF-8", CHAT_PATH, b'{"model": "\xff\xfe"}', 400, "not valid JSON", None),
    ("body a list", CHAT_PATH, _json([chat_body("smol")]), 400, "must be a JSON object", None),
    ("body a string", COMPLETIONS_PATH, _json("hello"), 400, "must be a JSON object", None),
    ("model missing", CHAT_PATH, _json({"messages": MESSAGES}), 400, "'model'", "model"),
    ("messages not a list", CHAT_PATH, _chat(messages="hi"), 400, "'messages'", "messages"),
    ("max_tokens a string", CHAT_PATH, _chat(max_tokens="x"), 400, "'max_tokens'", "max_tokens"),
    ("negative max_tokens", CHAT_PATH, _chat(max_tokens=-5), 400, "at least 1", "max_tokens"),
    ("temperature a string", CHAT_PATH, _chat(temperature="hot"), 400, "'temperature'", "temperature"),
    ("stream a string", CHAT_PATH, _chat(stream="yes"), 400, "'stream'", "stream"),
    ("stream_options without stream", CHAT_PATH, _chat(stream_options={"include_usage": True}), 400,
     "'stream_options'", "stream_options"),
    ("prompt an object", COMPLETIONS_PATH, _json({"model": "smol", "prompt": {"text": "hi"}}), 400, "'prompt'",
     "prompt"),
    ("max_tokens beyond the context", CHAT_PATH, _chat(max_tokens=5000), 400, "context", "max_tokens"),
    ("unknown model", CHAT_PATH, _json(chat_body("gpt-4o")), 404, "gpt-4o", "model"),
    ("unknown model, completions", COMPLETIONS_PATH, _json({"model": "nope", "prompt": "hi"}), 404, "nope", "model"),
    ("unknown model on a passthrough path", "/tokenize", _json({"model": "nope", "prompt": "hi"}), 404, "nope",
     "model"),
    ("oversized body", CHAT_PATH, _chat(messages=[{"role": "user", "content": "x" * 2000}]), 413, None, None),
    ("oversized body on a passthrough path", "/tokenize", _json({"model": "smol", "prompt": "x" * 2000}), 413,
     None, None),
]


@pytest.mark.parametrize("path, raw, status, message, param",
                         [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUT])
def test_bad_input_gets_an_openai_error(faults: Process, path: str, raw: bytes, status: int, message: str | None,
                                        param: str | None) -> None:
    reply = http.request("POST", faults.url + path, raw, {"Content-Type": "application/json"}, timeout=60)
    error = assert_openai_error(reply, status, error_type="invalid_request_error", message=message, param=param)
    if status == 404:
        assert error["code"] == "model_not_found"
    if "context" in (message or ""):
        assert error["code"] == "context_length_exceeded"
    assert_still_serving(faults, passthrough=False)


BAD_CONTROL = [
    # (id, headers, body fields): the per-request speculation control, spelled wrong
    ("header value unknown", {"X-Speculoos": "sometimes"}, {}),
    ("header k out of range", {"X-Speculoos": "k=99"}, {}),
    ("header k not a number", {"X-Speculoos": "k=four"}, {}),
    ("field not an object", {}, {"speculoos": "on"}),
    ("field mode unknown", {}, {"speculoos": {"mode": "fast"}}),
    ("field key unknown", {}, {"speculoos": {"mode": "on", "draft": "x"}}),
    ("field k zero", {}, {"speculoos": {"k": 0}}),
    ("field pipeline not a boolean", {}, {"speculoos": {"pipeline": "off"}}),
]


@pytest.mark.parametrize("headers, fields", [pytest.param(*case[1:], id=case[0]) for case in BAD_CONTROL])
def test_bad_speculation_control_gets_an_openai_error(faults: Process, headers: dict, fields: dict) -> None:
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("smol", **fields), headers=headers, timeout=60)
    error = assert_openai_error(reply, 400, error_type="invalid_request_error")
    assert "speculoos" in error["message"].lower()


SDK_BAD_INPUT = [
    # (id, create() arguments, exception, param)
    ("unknown model", {"model": "gpt-4o"}, openai.NotFoundError, "model"),
    ("negative max_tokens", {"max_tokens": -1}, openai.BadRequestError, "max_tokens"),
    ("zero max_completion_tokens", {"max_completion_tokens": 0}, openai.BadRequestError, "max_completion_tokens"),
    ("temperature a string", {"temperature": "hot"}, openai.BadRequestError, "temperature"),
    ("five stop strings", {"stop": list("abcde")}, openai.BadRequestError, "stop"),
    ("stream_options without stream", {"stream_options": {"include_usage": True}}, openai.BadRequestError,
     "stream_options"),
    ("empty messages", {"messages": []}, openai.BadRequestError, "messages"),
]


@pytest.mark.parametrize("arguments, exception, param",
                         [pytest.param(*case[1:], id=case[0]) for case in SDK_BAD_INPUT])
def test_bad_input_through_the_sdk(faults: Process, arguments: dict, exception: type[openai.APIStatusError],
                                   param: str) -> None:
    with pytest.raises(exception) as caught:
        sdk(faults).chat.completions.create(**{"model": "smol", "messages": MESSAGES, "max_tokens": 2, **arguments})
    assert caught.value.param == param
    assert caught.value.type == "invalid_request_error"
    assert isinstance(caught.value.body, dict) and set(caught.value.body) == ERROR_KEYS


# -- upstream faults --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_upstream_down_is_a_502(faults: Process, stream: bool) -> None:
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("down", stream=stream), timeout=30)
    assert_openai_error(reply, 502, error_type="upstream_error", message="unreachable")
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(faults).chat.completions.create(**chat_body("down"))
    assert caught.value.status_code == 502
    assert_still_serving(faults)


def test_upstream_stall_is_a_504_within_first_byte(faults: Process) -> None:
    started = time.monotonic()
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("stall"), timeout=30)
    elapsed = time.monotonic() - started
    assert_openai_error(reply, 504, error_type="timeout")
    assert FIRST_BYTE_S * 0.9 <= elapsed < FIRST_BYTE_S + 4.0, elapsed
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(faults).chat.completions.create(**chat_body("stall"))
    assert caught.value.status_code == 504
    assert_still_serving(faults)


FIRST_ROUND_FAULTS = [
    # (model, status, error type)
    ("notjson", 502, "upstream_error"),  # /generate answers HTML with a JSON content type
    ("badshape", 502, "upstream_error"),  # valid JSON, wrong shape (draft-support answer)
    ("badshape-topn", 502, "upstream_error"),  # valid JSON, wrong shape (stock top-N answer)
    ("stallgen", 504, "timeout"),  # /generate never answers
]


@pytest.mark.parametrize("model, status, error_type", FIRST_ROUND_FAULTS, ids=[c[0] for c in FIRST_ROUND_FAULTS])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_speculative_first_round_fault_is_an_http_error(faults: Process, fake: FakeUpstream, model: str, status: int,
                                                        error_type: str, stream: bool) -> None:
    """The first round fails before any byte is sent: a real HTTP error status, even for a stream."""
    reply = http.post_json(faults.url + CHAT_PATH, chat_body(model, max_tokens=8, stream=stream), headers=SPECULATE,
                           timeout=60)
    assert_openai_error(reply, status, error_type=error_type)
    assert fake.seen(model, GENERATE_PATH), "the request was speculative"
    assert_still_serving(faults, passthrough=False)


def test_speculative_fault_after_the_first_round(faults: Process, fake: FakeUpstream) -> None:
    """/generate breaks once the sequence passes FLAKY_AT ids: in-band for a stream, a 502 for JSON."""
    body = {"model": "flaky", "prompt": "1, 2, 3,", "max_tokens": 200, "temperature": 0}
    reply = http.post_json(faults.url + COMPLETIONS_PATH, {**body, "stream": True}, headers=SPECULATE, timeout=60)
    assert_served(reply, "speculative")
    chunks = assert_ends_in_band(reply.events(), "upstream_error")
    assert chunks and all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks)
    assert max(len(s.body["input_ids"]) for s in fake.seen("flaky", GENERATE_PATH)) > FLAKY_AT
    reply = http.post_json(faults.url + COMPLETIONS_PATH, body, headers=SPECULATE, timeout=60)
    assert_openai_error(reply, 502, error_type="upstream_error")
    assert_still_serving(faults, passthrough=False)


def test_passthrough_stream_that_goes_silent_ends_in_band(faults: Process) -> None:
    """The upstream stops sending mid-stream: after timeouts.idle, an error event and [DONE]."""
    started = time.monotonic()
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("stallmid", stream=True), timeout=30)
    elapsed = time.monotonic() - started
    assert reply.status == 200
    assert assert_ends_in_band(reply.events(), "timeout") == HELLO_CHUNKS
    assert IDLE_S * 0.9 <= elapsed < IDLE_S + 4.0, elapsed


def test_client_disconnect_stops_the_speculative_rounds(faults: Process, fake: FakeUpstream) -> None:
    body = {"model": "relay", "prompt": "1, 2, 3,", "max_tokens": 1500, "temperature": 0, "stream": True}
    read_first_chunk_then_hang_up(faults, COMPLETIONS_PATH, body, SPECULATE)
    time.sleep(1.0)
    rounds = len(fake.seen("relay", GENERATE_PATH))
    time.sleep(1.5)
    assert len(fake.seen("relay", GENERATE_PATH)) == rounds
    assert rounds < 50  # a 1500-token generation would have gone on for hundreds of rounds
    assert_still_serving(faults, passthrough=False)


def test_client_disconnect_closes_the_passthrough_upstream(faults: Process, fake: FakeUpstream) -> None:
    read_first_chunk_then_hang_up(faults, CHAT_PATH, chat_body("endless", stream=True), {})
    deadline = time.monotonic() + 5
    while not fake.seen("endless", CANCELLED) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake.seen("endless", CANCELLED), "the upstream stream was left running"


DROPS = pytest.mark.parametrize("model", ["drop", "dropmid"], ids=["between-events", "mid-event"])


@DROPS
def test_passthrough_stream_dropped_mid_body(faults: Process, model: str) -> None:
    """Chunks the client already has stay; then an in-band error event and [DONE], as vLLM does."""
    reply = http.post_json(faults.url + CHAT_PATH, chat_body(model, temperature=0.7, stream=True, max_tokens=50),
                           timeout=30)
    assert_served(reply, "passthrough")
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert assert_ends_in_band(reply.events(), "upstream_error") == HELLO_CHUNKS
    assert_still_serving(faults)


@DROPS
def test_passthrough_stream_dropped_raises_api_error_in_the_sdk(faults: Process, model: str) -> None:
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in sdk(faults).chat.completions.create(**chat_body(model, temperature=0.7, stream=True)):
            received.append(chunk)
    assert not isinstance(caught.value, openai.APIStatusError)  # in-band, after the 200
    assert [c.choices[0].delta.content for c in received] == ["", "Hello"]
    assert caught.value.type == "upstream_error"


def test_speculative_stream_whose_verifier_dies(faults: Process, doomed_verifier: Process) -> None:
    """Kill the verifier while a long speculative stream is in flight: error event, then [DONE]."""
    body = {"model": "doomed", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 1500, "temperature": 0,
            "stream": True}
    with streaming(faults, COMPLETIONS_PATH, body, SPECULATE) as response:
        assert response.status == 200
        assert response.getheader(MODE_HEADER) == "speculative"
        assert response.getheader("Content-Type").startswith("text/event-stream")
        assert response.getheader("Cache-Control") == "no-cache" and response.getheader("X-Accel-Buffering") == "no"
        before = b""
        while b'"text":"' not in before.replace(b'"text":""', b""):  # wait for the first real text
            line = response.readline()
            assert line, "the stream ended before the verifier was killed"
            before += line
        doomed_verifier.popen.kill()
        doomed_verifier.popen.wait(10)
        rest = response.read()
    chunks = assert_ends_in_band(http.sse_events(before + rest), "upstream_error")
    assert chunks and all(c["object"] == "text_completion" for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks)
    # The dead route now fails fast and cleanly; the others still work.
    reply = http.post_json(faults.url + COMPLETIONS_PATH, {**body, "stream": False, "max_tokens": 4},
                           headers=SPECULATE, timeout=30)
    assert_openai_error(reply, 502, error_type="upstream_error")
    assert_still_serving(faults)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_kept_alive_connection_the_upstream_closes_is_sent_again(faults: Process, faults_verifier: Process,
                                                                   stale: StaleRelay, stream: bool) -> None:
    """The `stale` route's relay closes each kept-alive connection when its next request arrives: a verification
    that meets one is sent again on a new connection, and the answer is the target's own."""
    body = {"model": "stale", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 24, "temperature": 0}
    expected = http.post_json(faults_verifier.url + COMPLETIONS_PATH, body, timeout=120).json()["choices"][0]["text"]
    closed = stale.closed
    reply = http.post_json(faults.url + COMPLETIONS_PATH, {**body, "stream": stream}, headers=SPECULATE, timeout=120)
    assert_served(reply, "speculative")
    if stream:
        events = reply.events()
        assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1])
        text = "".join(c["choices"][0]["text"] for c in events[:-1] if c["choices"])
    else:
        text = reply.json()["choices"][0]["text"]
    assert text == expected
    assert stale.closed > closed, "no kept-alive connection was closed under a request"
    assert_still_serving(faults, passthrough=False)
