"""The proxy under bad input and failing upstreams, end to end: real processes, raw HTTP and the openai SDK.

One proxy process (`faults`, `max_body_bytes: 1024`, no catch-all route, so an unknown model is a
404) has one route per situation; the request's model name picks it. Upstreams:
- `smol`, `gemma`: a SmolLM2 verifier of this module's own; `gemma` drafts with Gemma (another
  vocabulary), so it must refuse to speculate;
- `doomed`: a second verifier, killed by one test while it streams;
- `down`, `keyed-down`: nothing listening;
- everything else: a fake upstream, a real aiohttp app on a loopback port run by its own event
  loop in a thread. The route URL's first path segment names its behaviour (`/stall`, `/notjson`,
  `/drop`, ... see `fake_handler`); by default it relays to the verifier, and it records every
  request it gets (`FakeUpstream.seen`).
Passthrough transparency is checked against the session's plain `smol_proxy` (a catch-all route).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest
import yaml
from aiohttp import web

from tests import support as http
from tests.e2e.servers import GEMMA, SMOL, Process, free_port, start_proxy, start_server

CLIENT_KEY = "sk-secret-123"
ROUTE_KEY_ENV = "SPECULOOS_TEST_ROUTE_KEY"
ROUTE_KEY = "sk-route-7f3a9c2e-never-logged"
FIRST_BYTE_S = 1.0  # the stall route's timeouts.first_byte
STALLGEN_FIRST_BYTE_S = 2.0  # the stallgen route's (its start-up tokenizer check must fit in it)
IDLE_S = 1.0  # the stallmid route's timeouts.idle
STALL_S = 30.0  # how long the fake stalls (it is cancelled when the proxy gives up)
BIG_CTX = 32768  # the context the `bigctx` fake claims, larger than the draft's 4096
MAX_BODY = 1024
# One thread per model: on a small, shared machine llama.cpp's thread pool spins at its barriers
# when another process holds the other core, and a 2-token request then takes seconds, not 0.1 s.
THREADS = 1
MODE_HEADER = "x-speculoos-mode"
SPECULATE = {"X-Speculoos": "on"}  # speculate whatever the route's controller would decide
PASS = {"X-Speculoos": "off"}
MESSAGES = [{"role": "user", "content": "Say hello."}]
ERROR_KEYS = {"message", "type", "param", "code"}
CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"


# -- a fake upstream --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request the fake upstream received (or, with path "cancelled", noticed its client leave)."""

    mode: str
    path: str  # after the mode prefix
    headers: dict[str, list[str]]  # lower-case name -> every value, in order
    body: Any  # decoded JSON, or None

    @property
    def authorization(self) -> list[str]:
        return self.headers.get("authorization", [])


SEEN = web.AppKey("seen", list)
VERIFIER = web.AppKey("verifier", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM_HEADER = "X-Fake-Upstream"  # set on every relayed answer
FLAKY_AT = 40  # the `flaky` fake fails every /generate with more input ids than this
RETRY_AFTER = "7"


def _chunk(delta: dict) -> dict:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}


DROP_CHUNKS = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hello"})]


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _headers(request: web.Request) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    return headers


async def _record(request: web.Request) -> tuple[str, str, bytes, Any]:
    mode, tail = request.match_info["mode"], "/" + request.match_info["tail"]
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    request.app[SEEN].append(Seen(mode, tail, _headers(request), body))
    return mode, tail, raw, body


async def _relay(request: web.Request, tail: str, raw: bytes) -> tuple[int, str, Any]:
    """Send the request on to the real verifier; returns its status, content type and body (JSON or bytes)."""
    async with request.app[SESSION].request(request.method, request.app[VERIFIER] + tail, data=raw or None,
                                            headers={"Content-Type": "application/json"}) as answer:
        data = await answer.read()
        body = json.loads(data) if answer.content_type == "application/json" else data
        return answer.status, answer.content_type, body


async def _sse_then(request: web.Request, chunks: list[bytes], *, then: str) -> web.StreamResponse:
    """Start an SSE answer, send `chunks`, then `drop` the socket (no terminating chunk), go `silent`,
    or keep sending chunks `forever` (recording when the client goes away)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(chunk)
    try:
        if then == "drop":
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()  # flushes what was written, then FIN
        while then == "forever":
            await asyncio.sleep(0.05)
            await response.write(_sse(_chunk({"content": " more"})))
        await asyncio.sleep(STALL_S)  # silent; cancelled when the peer disconnects
    except (asyncio.CancelledError, ConnectionError):
        request.app[SEEN].append(Seen(request.match_info["mode"], "cancelled", {}, None))
        raise
    return response


async def fake_handler(request: web.Request) -> web.StreamResponse:
    """Every path: behave as the mode says, else relay to the verifier."""
    mode, tail, raw, body = await _record(request)
    if mode == "stall" or (mode == "stallgen" and tail == "/generate"):
        await asyncio.sleep(STALL_S)
    if tail == CHAT_PATH:
        two = [_sse(c) for c in DROP_CHUNKS]
        if mode == "drop":
            return await _sse_then(request, two, then="drop")
        if mode == "dropmid":  # dies in the middle of the third event
            return await _sse_then(request, two + [_sse(_chunk({"content": " wor"}))[:25]], then="drop")
        if mode == "stallmid":
            return await _sse_then(request, two, then="silent")
        if mode == "endless":
            return await _sse_then(request, two, then="forever")
        if mode == "ratelimit":
            error = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": 429}}
            return web.json_response(error, status=429, headers={"Retry-After": RETRY_AFTER})
        if mode == "bigctx":
            return web.json_response({"id": "chatcmpl-echo", "object": "chat.completion", "created": 1,
                                      "model": body.get("model"), "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                            "total_tokens": 2},
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "echo"},
                                                   "logprobs": None, "finish_reason": "stop"}]})
    if tail == "/generate":
        if mode == "notjson" or (mode == "flaky" and len(body["input_ids"]) > FLAKY_AT):
            return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="application/json")
        if mode.startswith("badshape"):
            return web.json_response({"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": "?",
                                                                                  "draft_support": 7}})
    status, content_type, answer = await _relay(request, tail, raw)
    headers = {UPSTREAM_HEADER: mode}
    if isinstance(answer, bytes):
        return web.Response(body=answer, status=status, content_type=content_type, headers=headers)
    if tail in ("/get_model_info", "/tokenize") and isinstance(answer, dict):
        if mode.endswith("-topn"):  # a stock SGLang server: no draft-support extension
            answer.pop("speculoos_extensions", None)
        if mode == "bigctx":
            answer["max_model_len"] = BIG_CTX
    return web.json_response(answer, status=status, headers=headers)


def fake_app(verifier_url: str) -> web.Application:
    app = web.Application()
    app[SEEN] = []
    app[VERIFIER] = verifier_url

    async def session(app: web.Application) -> AsyncIterator[None]:
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
        _route("stallgen", f"{fake.url}/stallgen", draft=SMOL, timeouts={"first_byte": STALLGEN_FIRST_BYTE_S}),
        _route("stallmid", f"{fake.url}/stallmid", timeouts={"idle": IDLE_S}),
        _route("flaky", f"{fake.url}/flaky", draft=SMOL),
        _route("relay", f"{fake.url}/relay", draft=SMOL),
        _route("endless", f"{fake.url}/endless"),
        _route("ratelimit", f"{fake.url}/ratelimit"),
        _route("notjson", f"{fake.url}/notjson", draft=SMOL),
        _route("badshape", f"{fake.url}/badshape", draft=SMOL),
        _route("badshape-topn", f"{fake.url}/badshape-topn", draft=SMOL),
        _route("drop", f"{fake.url}/drop"),
        _route("dropmid", f"{fake.url}/dropmid"),
        _route("keyed", f"{fake.url}/keyed", **key),
        _route("keyed-spec", f"{fake.url}/keyed-spec", draft=SMOL, **key),
        _route("public-name", f"{fake.url}/bigctx", draft=SMOL, upstream={"model": "internal-name"}),
    ]
    process = _start_proxy(log_dir / "faults.yaml", routes)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def pure_python_proxy(fake: FakeUpstream, log_dir: Path) -> Iterator[Process]:
    """A proxy on aiohttp's pure-Python HTTP parser (used where its C extension is not available),
    which keeps header names as the client spelled them."""
    key = {"upstream": {"api_key": "${env.%s}" % ROUTE_KEY_ENV}}
    routes = [_route("keyed", f"{fake.url}/keyed", **key),
              _route("keyed-spec", f"{fake.url}/keyed-spec", draft=SMOL, **key)]
    process = _start_proxy(log_dir / "pure-python.yaml", routes, AIOHTTP_NO_EXTENSIONS="1")
    yield process
    process.stop()


def _start_proxy(path: Path, routes: list[dict[str, Any]], **environ: str) -> Process:
    path.write_text(yaml.safe_dump({"server": {"max_body_bytes": MAX_BODY}, "routes": routes}, sort_keys=False))
    with pytest.MonkeyPatch.context() as env:
        for name, value in {ROUTE_KEY_ENV: ROUTE_KEY, **environ}.items():
            env.setenv(name, value)
        return start_proxy(path, path.parent)


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
    reply = http.post_json(proxy.url + COMPLETIONS_PATH, tiny, headers=SPECULATE, timeout=120)
    assert reply.status == 200, reply.body[:500]
    assert reply.headers[MODE_HEADER] == "speculative"
    assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
    if passthrough:
        reply = http.post_json(proxy.url + COMPLETIONS_PATH, tiny, headers=PASS, timeout=120)
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


BAD_CONTROL = [
    # (id, headers, body fields): the per-request speculation control, spelled wrong
    ("header value unknown", {"X-Speculoos": "sometimes"}, {}),
    ("header k out of range", {"X-Speculoos": "k=99"}, {}),
    ("header k not a number", {"X-Speculoos": "k=four"}, {}),
    ("field not an object", {}, {"speculoos": "on"}),
    ("field mode unknown", {}, {"speculoos": {"mode": "fast"}}),
    ("field key unknown", {}, {"speculoos": {"mode": "on", "draft": "x"}}),
    ("field k zero", {}, {"speculoos": {"k": 0}}),
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
    assert any(s.path == "/generate" for s in fake.seen(model)), "the request was speculative"
    assert_still_serving(faults, passthrough=False)


def test_speculative_fault_after_the_first_round(faults: Process, fake: FakeUpstream) -> None:
    """/generate breaks once the sequence passes FLAKY_AT ids: in-band for a stream, a 502 for JSON."""
    body = {"model": "flaky", "prompt": "1, 2, 3,", "max_tokens": 200, "temperature": 0}
    reply = http.post_json(faults.url + COMPLETIONS_PATH, {**body, "stream": True}, headers=SPECULATE, timeout=60)
    assert reply.status == 200 and reply.headers[MODE_HEADER] == "speculative"
    events = reply.events()
    assert events[-1] == "[DONE]"
    assert set(events[-2]) == {"error"} and events[-2]["error"]["type"] == "upstream_error"
    chunks = events[:-2]
    assert chunks and all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks)
    assert max(len(s.body["input_ids"]) for s in fake.seen("flaky") if s.path == "/generate") > FLAKY_AT
    reply = http.post_json(faults.url + COMPLETIONS_PATH, body, headers=SPECULATE, timeout=60)
    assert_openai_error(reply, 502, error_type="upstream_error")
    assert_still_serving(faults, passthrough=False)


def test_passthrough_stream_that_goes_silent_ends_in_band(faults: Process) -> None:
    """The upstream stops sending mid-stream: after timeouts.idle, an error event and [DONE]."""
    started = time.monotonic()
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("stallmid", stream=True), timeout=30)
    elapsed = time.monotonic() - started
    assert reply.status == 200
    events = reply.events()
    assert events[:2] == DROP_CHUNKS
    assert events[2:3] and set(events[2]) == {"error"} and events[2]["error"]["type"] == "timeout"
    assert events[3:] == ["[DONE]"]
    assert IDLE_S * 0.9 <= elapsed < IDLE_S + 4.0, elapsed


@contextmanager
def streaming(proxy: Process, path: str, body: dict, headers: dict[str, str] | None = None) -> Iterator[HTTPResponse]:
    """POST `body` and hand over the response unread, to read as it arrives; hang up on exit."""
    parts = urlsplit(proxy.url)
    connection = HTTPConnection(parts.hostname, parts.port, timeout=120)
    response = None
    try:
        connection.request("POST", path, body=json.dumps(body),
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        yield response
    finally:
        if response is not None:
            response.close()
        connection.close()


def _read_first_chunk_then_hang_up(proxy: Process, path: str, body: dict, headers: dict[str, str]) -> None:
    with streaming(proxy, path, body, headers) as response:
        assert response.status == 200
        assert response.readline().startswith(b"data: {")


def test_client_disconnect_stops_the_speculative_rounds(faults: Process, fake: FakeUpstream) -> None:
    body = {"model": "relay", "prompt": "1, 2, 3,", "max_tokens": 1500, "temperature": 0, "stream": True}
    _read_first_chunk_then_hang_up(faults, COMPLETIONS_PATH, body, SPECULATE)
    time.sleep(1.0)
    rounds = len([s for s in fake.seen("relay") if s.path == "/generate"])
    time.sleep(1.5)
    assert len([s for s in fake.seen("relay") if s.path == "/generate"]) == rounds
    assert rounds < 50  # a 1500-token generation would have gone on for hundreds of rounds
    assert_still_serving(faults, passthrough=False)


def test_client_disconnect_closes_the_passthrough_upstream(faults: Process, fake: FakeUpstream) -> None:
    _read_first_chunk_then_hang_up(faults, CHAT_PATH, chat_body("endless", stream=True), {})
    deadline = time.monotonic() + 5
    while not any(s.path == "cancelled" for s in fake.seen("endless")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(s.path == "cancelled" for s in fake.seen("endless")), "the upstream stream was left running"


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
    reply = http.post_json(faults.url + COMPLETIONS_PATH, {**body, "stream": False, "max_tokens": 4},
                           headers=SPECULATE, timeout=30)
    assert_openai_error(reply, 502, error_type="upstream_error")
    assert_still_serving(faults)


# -- secrets ----------------------------------------------------------------------------------------


def test_client_key_is_forwarded_but_never_logged(faults: Process, fake: FakeUpstream) -> None:
    auth = {"Authorization": f"Bearer {CLIENT_KEY}", **SPECULATE}
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
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("keyed-spec"), headers=SPECULATE, timeout=60)
    assert reply.status == 200 and reply.headers[MODE_HEADER] == "speculative", reply.body[:300]
    assert {tuple(s.authorization) for s in fake.seen("keyed-spec")[count:] if s.path == "/generate"} == {
        (f"Bearer {ROUTE_KEY}",)}
    assert_openai_error(http.post_json(faults.url + CHAT_PATH, chat_body("keyed-down"), timeout=30), 502)
    assert ROUTE_KEY not in faults.log()
    assert ROUTE_KEY not in reply.body.decode()


@pytest.mark.parametrize("header", ["authorization", "AUTHORIZATION"])
@pytest.mark.parametrize("model", ["keyed", "keyed-spec"], ids=["passthrough", "speculative"])
@pytest.mark.parametrize("proxy_name", ["faults", "pure_python_proxy"], ids=["c-parser", "pure-python-parser"])
def test_client_key_in_any_header_case_replaces_the_route_key(request: pytest.FixtureRequest, fake: FakeUpstream,
                                                               proxy_name: str, header: str, model: str) -> None:
    """HTTP header names are case-insensitive (RFC 9110 §5.1); HTTP/2 and Node clients send them lowercase."""
    proxy: Process = request.getfixturevalue(proxy_name)
    count = len(fake.seen(model))
    headers = {header: f"Bearer {CLIENT_KEY}", **SPECULATE}
    reply = http.post_json(proxy.url + CHAT_PATH, chat_body(model), headers=headers, timeout=60)
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
    ("client opted out", {}, PASS),
    ("parameters only the upstream can honour", {"presence_penalty": 0.5}, SPECULATE),
    ("prompt + max_tokens exceed the draft's context", {"max_tokens": 5000}, SPECULATE),
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


def test_upstream_error_status_passes_through(faults: Process) -> None:
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("ratelimit"), timeout=30)
    error = assert_openai_error(reply, 429, error_type="rate_limit_error", message="slow down")
    assert error["code"] == 429
    assert reply.headers["retry-after"] == RETRY_AFTER
    assert reply.headers[MODE_HEADER] == "passthrough"


def test_headers_pass_through_both_ways_except_hop_by_hop(faults: Process, fake: FakeUpstream) -> None:
    sent = {"X-Request-Id": "req-42", "OpenAI-Organization": "org-7", "User-Agent": "speculoos-test/1",
            "Proxy-Authorization": "Basic cHJveHk6cHc=", "TE": "trailers"}
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("keyed", temperature=0.7), headers=sent, timeout=60)
    assert reply.status == 200, reply.body[:300]
    assert reply.headers[MODE_HEADER] == "passthrough"
    assert reply.headers[UPSTREAM_HEADER.lower()] == "keyed"  # the upstream's own header came back
    seen = [s for s in fake.seen("keyed") if s.path == CHAT_PATH][-1].headers
    for name in ("X-Request-Id", "OpenAI-Organization", "User-Agent"):
        assert seen.get(name.lower()) == [sent[name]], name
    assert "proxy-authorization" not in seen and "te" not in seen



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
    ("head", "HEAD", "/health", None),
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
