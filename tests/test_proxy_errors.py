"""The proxy under bad input and failing upstreams, end to end: real processes, raw HTTP and the openai SDK.

One proxy process (`faults`) serves one route per situation, chosen by the request's model name
(no catch-all, so an unknown model is a 404; `max_body_bytes: 1024`). Its upstreams:
- the real SmolLM2 verifier (`smol`, and `gemma`: a Gemma draft with a different vocabulary);
- a dedicated verifier that one test kills mid-stream (`doomed`);
- nothing at all (`down`, `keyed-down`);
- a fake upstream: a real aiohttp app on a loopback port, run by its own event loop in a thread.
  The first path segment of the route's URL picks its behaviour (`/stall`, `/notjson`, ...);
  by default it relays to the real verifier and records what it was sent.
Passthrough transparency is checked against the plain `smol_proxy` (a catch-all route).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest
import yaml
from aiohttp import web

from tests import support as http
from tests.conftest import GEMMA, SMOL, Process, free_port, start_proxy, start_server

CLIENT_KEY = "sk-secret-123"
ROUTE_KEY_ENV = "SPECULOOS_TEST_ROUTE_KEY"
ROUTE_KEY = "sk-route-7f3a9c2e-never-logged"
FIRST_BYTE_S = 1.0  # the stall route's timeouts.first_byte
STALL_S = 30.0  # how long the fake stalls (it is cancelled when the proxy gives up)
BIG_CTX = 32768  # the context the `bigctx` fake claims, larger than the draft's 4096
MAX_BODY = 1024
# One thread per model: on a small, shared machine llama.cpp's thread pool spins at its barriers
# when another process holds the other core, and a 2-token request then takes seconds, not 0.1 s.
THREADS = 1
MODE_HEADER = "x-speculoos-mode"
MESSAGES = [{"role": "user", "content": "Say hello."}]
ERROR_KEYS = {"message", "type", "param", "code"}
CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"


# -- a fake upstream --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request the fake upstream received."""

    mode: str
    path: str  # after the mode prefix
    authorization: list[str]  # every Authorization header, in order
    body: Any  # decoded JSON, or None


SEEN = web.AppKey("seen", list)
VERIFIER = web.AppKey("verifier", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def _chunk(delta: dict) -> dict:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}


DROP_CHUNKS = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hello"})]


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _record(request: web.Request) -> tuple[str, str, bytes]:
    mode, tail = request.match_info["mode"], "/" + request.match_info["tail"]
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    request.app[SEEN].append(Seen(mode, tail, request.headers.getall("Authorization", []), body))
    return mode, tail, raw


async def _relay(request: web.Request, tail: str, raw: bytes) -> tuple[int, str, Any]:
    """Send the request on to the real verifier; returns its status, content type and body (JSON or bytes)."""
    async with request.app[SESSION].request(request.method, request.app[VERIFIER] + tail, data=raw or None,
                                            headers={"Content-Type": "application/json"}) as answer:
        data = await answer.read()
        body = json.loads(data) if answer.content_type == "application/json" else data
        return answer.status, answer.content_type, body


async def _drop_after(request: web.Request, chunks: list[bytes]) -> web.StreamResponse:
    """Start an SSE answer, send `chunks`, then close the socket without ending the chunked body."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(chunk)
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # flushes what was written, then FIN: no terminating chunk
    await asyncio.sleep(STALL_S)  # cancelled by the disconnect
    return response


async def fake_handler(request: web.Request) -> web.StreamResponse:
    """Every path: behave as the mode says, else relay to the verifier."""
    mode, tail, raw = await _record(request)
    if mode == "stall":
        await asyncio.sleep(STALL_S)
    if tail == "/v1/chat/completions" and mode == "drop":
        return await _drop_after(request, [_sse(c) for c in DROP_CHUNKS])
    if tail == "/v1/chat/completions" and mode == "dropmid":  # dies in the middle of the third event
        return await _drop_after(request, [_sse(c) for c in DROP_CHUNKS] + [_sse(_chunk({"content": " wor"}))[:25]])
    if tail == "/v1/chat/completions" and mode == "bigctx":
        body = json.loads(raw)
        return web.json_response({"id": "chatcmpl-echo", "object": "chat.completion", "created": 1,
                                  "model": body.get("model"), "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                        "total_tokens": 2},
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "echo"},
                                               "logprobs": None, "finish_reason": "stop"}]})
    if tail == "/generate" and mode == "notjson":
        return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="application/json")
    if tail == "/generate" and mode.startswith("badshape"):
        return web.json_response({"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": "?",
                                                                              "draft_support": 7}})
    status, content_type, body = await _relay(request, tail, raw)
    if isinstance(body, bytes):
        return web.Response(body=body, status=status, content_type=content_type)
    if tail in ("/get_model_info", "/tokenize") and isinstance(body, dict):
        if mode.endswith("-topn"):  # a stock SGLang server: no draft-support extension
            body.pop("speculoos_extensions", None)
        if mode == "bigctx":
            body["max_model_len"] = BIG_CTX
    return web.json_response(body, status=status)


def fake_app(verifier_url: str) -> web.Application:
    app = web.Application()
    app[SEEN] = []
    app[VERIFIER] = verifier_url

    async def session(app: web.Application) -> Iterator[None]:
        app[SESSION] = aiohttp.ClientSession()
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{mode}/{tail:.*}", fake_handler)
    return app


class FakeUpstream:
    """An aiohttp app on a loopback port, served by its own event loop in a background thread."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-upstream", daemon=True)

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the fake upstream did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def seen(self, mode: str) -> list[Seen]:
        """What the fake received for routes using `mode`."""
        return [s for s in list(self.app[SEEN]) if s.mode == mode]

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self.app, handler_cancellation=True, shutdown_timeout=1, access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()


# -- the processes ----------------------------------------------------------------------------------


def _route(name: str, url: str, *, draft: str | None = None, **extra: Any) -> dict[str, Any]:
    route: dict[str, Any] = {"name": name, "match": {"model": name}, "upstream": {"url": url, "protocol": "sglang"}}
    if draft:
        route["draft"] = {"model": draft, "threads": THREADS, "ctx": 4096}
    for key, value in extra.items():
        route[key] = {**route.get(key, {}), **value}
    return route


def start_smol_verifier(log_dir: Path, name: str) -> Process:
    """A SmolLM2 verifier of this module's own, on one thread."""
    port = free_port()
    return start_server(["verifier", "--model", SMOL, "--port", str(port), "--threads", str(THREADS), "--ctx", "4096"],
                        port, log_dir / f"verifier-{name}-{port}.log", "/health")


@pytest.fixture(scope="module")
def verifier(model_paths: dict[str, Path], log_dir: Path) -> Iterator[Process]:
    """The SmolLM2 verifier behind the `faults` proxy."""
    process = start_smol_verifier(log_dir, "faults")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def doomed_verifier(model_paths: dict[str, Path], log_dir: Path) -> Iterator[Process]:
    """A verifier that one test kills."""
    process = start_smol_verifier(log_dir, "doomed")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def fake(verifier: Process) -> Iterator[FakeUpstream]:
    with FakeUpstream(fake_app(verifier.url)) as server:
        yield server


@pytest.fixture(scope="module")
def faults(verifier: Process, doomed_verifier: Process, fake: FakeUpstream, log_dir: Path) -> Iterator[Process]:
    """The proxy with one route per situation (see the module docstring)."""
    nothing = f"http://127.0.0.1:{free_port()}"
    key = {"upstream": {"api_key": "${env.%s}" % ROUTE_KEY_ENV}}
    routes = [
        _route("smol", verifier.url, draft=SMOL),
        _route("gemma", verifier.url, draft=GEMMA),
        _route("doomed", doomed_verifier.url, draft=SMOL),
        _route("down", nothing),
        _route("keyed-down", nothing, **key),
        _route("stall", f"{fake.url}/stall", timeouts={"first_byte": FIRST_BYTE_S}),
        _route("notjson", f"{fake.url}/notjson", draft=SMOL),
        _route("badshape", f"{fake.url}/badshape", draft=SMOL),
        _route("badshape-topn", f"{fake.url}/badshape-topn", draft=SMOL),
        _route("drop", f"{fake.url}/drop"),
        _route("dropmid", f"{fake.url}/dropmid"),
        _route("keyed", f"{fake.url}/keyed", **key),
        _route("keyed-spec", f"{fake.url}/keyed-spec", draft=SMOL, **key),
        _route("public-name", f"{fake.url}/bigctx", draft=SMOL, upstream={"model": "internal-name"}),
    ]
    path = log_dir / "faults.yaml"
    path.write_text(yaml.safe_dump({"server": {"max_body_bytes": MAX_BODY}, "routes": routes}, sort_keys=False))
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ROUTE_KEY_ENV, ROUTE_KEY)
        process = start_proxy(path, log_dir)
    yield process
    process.stop()


# -- helpers ----------------------------------------------------------------------------------------


def chat_body(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "max_tokens": 2, "temperature": 0, **fields}


def assert_openai_error(reply: http.Reply, status: int, *, error_type: str | None = None,
                        message: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The reply is `status` with an OpenAI error body; returns the error object."""
    assert reply.status == status, reply.body[:500]
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == ERROR_KEYS
    assert isinstance(error["message"], str) and error["message"]
    if error_type is not None:
        assert error["type"] == error_type
    if message is not None:
        assert message in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def assert_still_serving(proxy: Process, *, passthrough: bool = True) -> None:
    """The proxy lists its models and answers a small speculative (and a passthrough) request."""
    models = http.get(proxy.url + "/v1/models", timeout=30)
    assert models.status == 200 and models.json()["object"] == "list"
    tiny = {"model": "smol", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    reply = http.post_json(proxy.url + COMPLETIONS_PATH, tiny, timeout=120)
    assert reply.status == 200, reply.body[:500]
    assert reply.headers[MODE_HEADER] == "speculative"
    assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
    if passthrough:
        reply = http.post_json(proxy.url + COMPLETIONS_PATH, tiny, headers={"X-Speculoos": "off"}, timeout=120)
        assert reply.status == 200, reply.body[:500]
        assert reply.headers[MODE_HEADER] == "passthrough"


def sdk(proxy: Process, **options: Any) -> openai.OpenAI:
    """The openai client pointed at the proxy, without retries (a retried 5xx would hide timings)."""
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0, timeout=60, **options)


def log_events(process: Process) -> list[dict[str, Any]]:
    """The process's JSON log lines."""
    events = []
    for line in process.log().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


# -- bad input --------------------------------------------------------------------------------------

def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


BAD_INPUT = [
    # (id, path, raw body, status, message substring, param)
    ("malformed JSON", CHAT_PATH, b'{"model": "smol", "messages": [', 400, "not valid JSON", None),
    ("empty body", CHAT_PATH, b"", 400, "not valid JSON", None),
    ("not UTF-8", CHAT_PATH, b'{"model": "\xff\xfe"}', 400, "not valid JSON", None),
    ("body a list", CHAT_PATH, _json([chat_body("smol")]), 400, "must be a JSON object", None),
    ("body a string", COMPLETIONS_PATH, _json("hello"), 400, "must be a JSON object", None),
    ("model missing", CHAT_PATH, _json({"messages": MESSAGES}), 400, "'model'", "model"),
    ("messages not a list", CHAT_PATH, _json(chat_body("smol", messages="hi")), 400, "'messages'", "messages"),
    ("max_tokens a string", CHAT_PATH, _json(chat_body("smol", max_tokens="x")), 400, "'max_tokens'", "max_tokens"),
    ("negative max_tokens", CHAT_PATH, _json(chat_body("smol", max_tokens=-5)), 400, "at least 1", "max_tokens"),
    ("temperature a string", CHAT_PATH, _json(chat_body("smol", temperature="hot")), 400, "'temperature'",
     "temperature"),
    ("stream a string", CHAT_PATH, _json(chat_body("smol", stream="yes")), 400, "'stream'", "stream"),
    ("stream_options without stream", CHAT_PATH, _json(chat_body("smol", stream_options={"include_usage": True})),
     400, "'stream_options'", "stream_options"),
    ("prompt an object", COMPLETIONS_PATH, _json({"model": "smol", "prompt": {"text": "hi"}}), 400, "'prompt'",
     "prompt"),
    ("max_tokens beyond the context", CHAT_PATH, _json(chat_body("smol", max_tokens=5000)), 400, "context",
     "max_tokens"),
    ("unknown model", CHAT_PATH, _json(chat_body("gpt-4o")), 404, "gpt-4o", "model"),
    ("unknown model, completions", COMPLETIONS_PATH, _json({"model": "nope", "prompt": "hi"}), 404, "nope", "model"),
    ("unknown model on a passthrough path", "/tokenize", _json({"model": "nope", "prompt": "hi"}), 404, "nope",
     "model"),
    ("oversized body", CHAT_PATH, _json(chat_body("smol", messages=[{"role": "user", "content": "x" * 2000}])),
     413, None, None),
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


def test_models_lists_every_route(faults: Process) -> None:
    reply = http.get(faults.url + "/v1/models")
    assert reply.status == 200
    body = reply.json()
    assert body["object"] == "list"
    assert {m["id"] for m in body["data"]} >= {"smol", "gemma", "down", "stall", "public-name"}
    for model in body["data"]:
        assert model["object"] == "model"
        assert isinstance(model["created"], int) and isinstance(model["owned_by"], str)
    assert [m.id for m in sdk(faults).models.list()] == [m["id"] for m in body["data"]]


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


@pytest.mark.parametrize("model", ["notjson", "badshape", "badshape-topn"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_garbage_from_generate_is_a_502(faults: Process, fake: FakeUpstream, model: str, stream: bool) -> None:
    """The first round fails before any byte is sent: a real HTTP 502, even for a stream."""
    reply = http.post_json(faults.url + CHAT_PATH, chat_body(model, max_tokens=8, stream=stream), timeout=60)
    assert_openai_error(reply, 502, error_type="upstream_error")
    assert any(s.path == "/generate" for s in fake.seen(model)), "the request was speculative"
    assert_still_serving(faults, passthrough=False)


DROP_CASES = ["drop", "dropmid"]


@pytest.mark.parametrize("model", DROP_CASES, ids=["between-events", "mid-event"])
def test_passthrough_stream_dropped_mid_body(faults: Process, model: str) -> None:
    """Chunks the client already has stay; then an in-band error event and [DONE], as vLLM does."""
    reply = http.post_json(faults.url + CHAT_PATH, chat_body(model, temperature=0.7, stream=True, max_tokens=50),
                           timeout=30)
    assert reply.status == 200
    assert reply.headers[MODE_HEADER] == "passthrough"
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[:2] == DROP_CHUNKS
    assert events[-1] == "[DONE]"
    assert set(events[-2]) == {"error"} and set(events[-2]["error"]) == ERROR_KEYS
    assert events[-2]["error"]["type"] == "upstream_error"
    assert len(events) == 4
    assert_still_serving(faults)


@pytest.mark.parametrize("model", DROP_CASES, ids=["between-events", "mid-event"])
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
    parts = urlsplit(faults.url)
    connection = HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        connection.request("POST", COMPLETIONS_PATH, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader(MODE_HEADER) == "speculative"
        before = b""
        while b'"text":"' not in before.replace(b'"text":""', b""):  # wait for the first real text
            line = response.readline()
            assert line, "the stream ended before the verifier was killed"
            before += line
        doomed_verifier.popen.kill()
        doomed_verifier.popen.wait(10)
        rest = response.read()
    finally:
        connection.close()
    events = http.sse_events(before + rest)
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert set(error) == {"error"} and set(error["error"]) == ERROR_KEYS
    assert error["error"]["type"] == "upstream_error"
    chunks = events[:-2]
    assert chunks and all(c["object"] == "text_completion" for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks)
    # The dead route now fails fast and cleanly; the others still work.
    reply = http.post_json(faults.url + COMPLETIONS_PATH, {**body, "stream": False, "max_tokens": 4}, timeout=30)
    assert_openai_error(reply, 502, error_type="upstream_error")
    assert_still_serving(faults)


# -- secrets ----------------------------------------------------------------------------------------


def test_client_key_is_forwarded_but_never_logged(faults: Process, fake: FakeUpstream) -> None:
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    for model, fields in [("smol", {}), ("smol", {"temperature": 0.7}), ("down", {}), ("notjson", {}),
                          ("keyed", {}), ("keyed-spec", {}), ("gpt-4o", {})]:
        http.post_json(faults.url + CHAT_PATH, chat_body(model, **fields), headers=auth, timeout=60)
    http.post_json(faults.url + CHAT_PATH, chat_body("smol", max_tokens="x"), headers=auth, timeout=60)
    http.request("POST", faults.url + CHAT_PATH, b"{", {**auth, "Content-Type": "application/json"}, timeout=60)
    # The client's key reached the upstream, replacing the route's.
    assert [s.authorization for s in fake.seen("keyed") if s.path == CHAT_PATH][-1:] == [[f"Bearer {CLIENT_KEY}"]]
    log = faults.log()
    assert "request" in log  # the proxy did log these requests
    assert CLIENT_KEY not in log


def test_route_key_is_sent_but_never_logged(faults: Process, fake: FakeUpstream) -> None:
    count = len(fake.seen("keyed-spec"))
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("keyed"), timeout=60)
    assert reply.status == 200, reply.body[:300]
    assert reply.headers[MODE_HEADER] == "passthrough"
    assert fake.seen("keyed")[-1].authorization == [f"Bearer {ROUTE_KEY}"]
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("keyed-spec"), timeout=60)
    assert reply.status == 200 and reply.headers[MODE_HEADER] == "speculative", reply.body[:300]
    assert {tuple(s.authorization) for s in fake.seen("keyed-spec")[count:] if s.path == "/generate"} == {
        (f"Bearer {ROUTE_KEY}",)}
    assert_openai_error(http.post_json(faults.url + CHAT_PATH, chat_body("keyed-down"), timeout=30), 502)
    assert ROUTE_KEY not in faults.log()
    assert ROUTE_KEY not in reply.body.decode()


@pytest.mark.parametrize("header", ["authorization", "AUTHORIZATION"])
@pytest.mark.parametrize("model", ["keyed", "keyed-spec"], ids=["passthrough", "speculative"])
def test_client_key_in_any_header_case_replaces_the_route_key(faults: Process, fake: FakeUpstream, header: str,
                                                               model: str) -> None:
    """HTTP header names are case-insensitive (RFC 9110 §5.1); HTTP/2 and Node clients send them lowercase."""
    count = len(fake.seen(model))
    reply = http.post_json(faults.url + CHAT_PATH, chat_body(model), headers={header: f"Bearer {CLIENT_KEY}"},
                           timeout=60)
    assert reply.status == 200, reply.body[:300]
    upstream_calls = [s for s in fake.seen(model)[count:] if s.path in (CHAT_PATH, "/tokenize", "/generate")]
    assert upstream_calls
    for call in upstream_calls:
        assert call.authorization == [f"Bearer {CLIENT_KEY}"], call.path


# -- tokenizer mismatch -----------------------------------------------------------------------------


def test_tokenizer_mismatch_passes_through_with_the_verifiers_own_output(faults: Process, verifier: Process) -> None:
    body = {"model": "gemma", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12,
            "temperature": 0}
    direct = http.post_json(verifier.url + CHAT_PATH, body, timeout=120)
    assert direct.status == 200
    for _ in range(2):
        reply = http.post_json(faults.url + CHAT_PATH, body, timeout=120)
        assert reply.status == 200
        assert reply.headers[MODE_HEADER] == "passthrough"
        assert reply.json()["choices"] == direct.json()["choices"]
        assert reply.json()["usage"] == direct.json()["usage"]
    events = [e for e in log_events(faults) if e.get("route") == "gemma"]
    warnings = [e for e in events if e.get("level") == "warning"]
    assert len(warnings) == 1, warnings  # said once, at start-up, not per request
    assert warnings[0].get("compatible") is False and "vocabulary" in warnings[0]["reason"]
    requests = [e for e in events if e.get("event") == "request"]
    assert len(requests) >= 2
    assert all(e["mode"] == "passthrough" and e["reason"].startswith("tokenizer mismatch") for e in requests)


# -- model renaming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("why, fields, headers", [
    ("client opted out", {}, {"X-Speculoos": "off"}),
    ("parameters only the upstream can honour", {"presence_penalty": 0.5}, {}),
    ("prompt + max_tokens exceed the draft's context", {"max_tokens": 5000}, {}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_every_passthrough_renames_the_model(faults: Process, fake: FakeUpstream, why: str, fields: dict,
                                             headers: dict) -> None:
    """A route with `upstream.model` sends that name upstream whatever made the request pass through."""
    count = len(fake.seen("bigctx"))
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("public-name", **fields), headers=headers, timeout=60)
    assert reply.status == 200, reply.body[:300]
    assert reply.headers[MODE_HEADER] == "passthrough"
    forwarded = [s for s in fake.seen("bigctx")[count:] if s.path == CHAT_PATH]
    assert len(forwarded) == 1
    assert forwarded[0].body["model"] == "internal-name"


# -- passthrough transparency -----------------------------------------------------------------------

TRANSPARENT = [
    # (id, method, path, JSON body or None)
    ("health", "GET", "/health", None),
    ("health with a query", "GET", "/health?verbose=1", None),
    ("tokenize a prompt", "POST", "/tokenize", {"prompt": "Hello, world! 🙂"}),
    ("tokenize messages", "POST", "/tokenize", {"messages": MESSAGES}),
    ("tokenize a bad body", "POST", "/tokenize", {"prompt": 5}),
    ("detokenize", "POST", "/detokenize", {"tokens": [1, 2, 3]}),
    ("model info", "GET", "/get_model_info", None),
    ("unknown path", "GET", "/no/such/path", None),
    ("unknown path, POST", "POST", "/v2/whatever", {"x": 1}),
    ("wrong method", "DELETE", "/health", None),
]


@pytest.mark.parametrize("method, path, body", [pytest.param(*case[1:], id=case[0]) for case in TRANSPARENT])
def test_other_paths_pass_through_untouched(smol_proxy: Process, smol_verifier: Process, method: str, path: str,
                                            body: Any) -> None:
    raw = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    direct = http.request(method, smol_verifier.url + path, raw, headers, timeout=60)
    proxied = http.request(method, smol_proxy.url + path, raw, headers, timeout=60)
    assert proxied.status == direct.status
    assert proxied.body == direct.body
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    assert proxied.headers.get("content-length") == direct.headers.get("content-length")
    assert proxied.headers[MODE_HEADER] == "passthrough"
    assert "transfer-encoding" not in proxied.headers or "content-length" not in proxied.headers


def test_models_through_a_catch_all_route_lists_the_upstreams_models(smol_proxy: Process,
                                                                     smol_verifier: Process) -> None:
    direct = http.get(smol_verifier.url + "/v1/models").json()
    proxied = http.get(smol_proxy.url + "/v1/models")
    assert proxied.status == 200
    body = proxied.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [m["id"] for m in direct["data"]]
    for model in body["data"]:
        assert {"id", "object", "created", "owned_by"} <= set(model) and model["object"] == "model"
    assert [m.id for m in sdk(smol_proxy).models.list()] == [m["id"] for m in body["data"]]
