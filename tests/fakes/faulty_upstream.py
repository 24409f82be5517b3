"""A faulty SGLang upstream: a real aiohttp app that relays to a real verifier unless its mode says otherwise.

A proxy route points at `{url}/{mode}`; the first path segment picks the behaviour, the rest is the
upstream path. Every request is recorded (`FakeUpstream.seen`). The modes (`MODES`):
- `stall`: says nothing on any path for STALL_S (the proxy gives up first);
- `stallgen`: like `stall`, on `/generate` only;
- `notjson`: `/generate` answers an HTML error page labelled application/json;
- `flaky`: like `notjson`, once a `/generate` call carries more than FLAKY_AT input ids;
- `badshape`: `/generate` answers valid JSON of the wrong shape;
- `badshape-topn`: like `badshape`, and claims no draft-support extension, as a stock SGLang server;
- `drop`: the chat stream sends HELLO_CHUNKS, then the socket closes between events;
- `dropmid`: the chat stream sends HELLO_CHUNKS, then the socket closes in the middle of an event;
- `stallmid`: the chat stream sends HELLO_CHUNKS, then goes silent;
- `endless`: the chat stream sends HELLO_CHUNKS, then chunks until the client leaves (recorded as `cancelled`);
- `ratelimit`: chat answers 429 with Retry-After;
- `bigctx`: chat echoes without the verifier, and the model claims a context of BIG_CTX;
- any other mode (`relay`, `keyed`, ...): relays, tagging the answer with UPSTREAM_HEADER.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from aiohttp import web

CHAT_PATH, GENERATE_PATH = "/v1/chat/completions", "/generate"
# The answers that describe the model (SGLang's paths and their old aliases).
INFO_PATHS = ("/model_info", "/get_model_info", "/v1/tokenize", "/tokenize", "/v1/models")
CANCELLED = "cancelled"  # the path recorded when a streaming client goes away
STALL_S = 30.0  # how long a stall lasts (it is cancelled when the proxy gives up)
BIG_CTX = 32768  # the context `bigctx` claims, larger than a 4096-token draft's
FLAKY_AT = 40  # `flaky` fails every /generate with more input ids than this
RETRY_AFTER = "7"
UPSTREAM_HEADER = "X-Fake-Upstream"  # set to the mode on every relayed answer


@dataclass(frozen=True)
class Seen:
    """One request the fake received (or, with path CANCELLED, noticed its client leave)."""

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

Behaviour = Callable[[web.Request, Seen], Awaitable[web.StreamResponse]]
Edit = Callable[[dict[str, Any]], None]


def _chunk(delta: dict) -> dict:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


HELLO_CHUNKS = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hello"})]
HELLO = [_sse(c) for c in HELLO_CHUNKS]


# -- the behaviours ---------------------------------------------------------------------------------


async def relay(request: web.Request, seen: Seen, edit: Edit | None = None) -> web.Response:
    """Send the request on to the verifier and return its answer, `edit`ing a model description."""
    async with request.app[SESSION].request(request.method, request.app[VERIFIER] + seen.path,
                                            data=await request.read() or None,
                                            headers={"Content-Type": "application/json"}) as answer:
        data = await answer.read()
        status, content_type = answer.status, answer.content_type
    headers = {UPSTREAM_HEADER: seen.mode}
    if content_type != "application/json":
        return web.Response(body=data, status=status, content_type=content_type, headers=headers)
    body = json.loads(data)
    if edit is not None and seen.path in INFO_PATHS and isinstance(body, dict):
        edit(body)
    return web.json_response(body, status=status, headers=headers)


async def stall(request: web.Request, seen: Seen) -> web.StreamResponse:
    await asyncio.sleep(STALL_S)
    return await relay(request, seen)


async def html_as_json(request: web.Request, seen: Seen) -> web.StreamResponse:
    return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="application/json")


async def flaky(request: web.Request, seen: Seen) -> web.StreamResponse:
    if len(seen.body["input_ids"]) > FLAKY_AT:
        return await html_as_json(request, seen)
    return await relay(request, seen)


async def bad_shape(request: web.Request, seen: Seen) -> web.StreamResponse:
    return web.json_response({"text": "", "output_ids": [],
                              "meta_info": {"input_token_logprobs": "?", "draft_support": 7}})


def no_draft_support(info: dict[str, Any]) -> None:
    info.pop("speculoos_extensions", None)


def big_context(info: dict[str, Any]) -> None:
    for described in [info, *info.get("data", [])]:  # /v1/models holds it in each card
        described["max_model_len"] = BIG_CTX


async def rate_limited(request: web.Request, seen: Seen) -> web.StreamResponse:
    error = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": 429}}
    return web.json_response(error, status=429, headers={"Retry-After": RETRY_AFTER})


async def echo(request: web.Request, seen: Seen) -> web.StreamResponse:
    return web.json_response({
        "id": "chatcmpl-echo", "object": "chat.completion", "created": 1, "model": seen.body.get("model"),
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "echo"}, "logprobs": None,
                     "finish_reason": "stop"}]})


async def _stream(request: web.Request, seen: Seen, chunks: list[bytes], *, hang_up: bool = False,
                  endless: bool = False) -> web.StreamResponse:
    """An SSE answer: `chunks`, then close the socket, send chunks `endless`ly, or go silent."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(chunk)
    try:
        if hang_up:
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()  # flushes what was written, then FIN
        while endless:
            await asyncio.sleep(0.05)
            await response.write(_sse(_chunk({"content": " more"})))
        await asyncio.sleep(STALL_S)  # silent; cancelled when the peer disconnects
    except (asyncio.CancelledError, ConnectionError):
        request.app[SEEN].append(replace(seen, path=CANCELLED, headers={}, body=None))
        raise
    return response


async def drop(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await _stream(request, seen, HELLO, hang_up=True)


async def drop_mid_event(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await _stream(request, seen, [*HELLO, _sse(_chunk({"content": " wor"}))[:25]], hang_up=True)


async def silent(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await _stream(request, seen, HELLO)


async def endless(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await _stream(request, seen, HELLO, endless=True)


def on(path: str, behaviour: Behaviour, *, info: Edit | None = None) -> Behaviour:
    """`behaviour` on `path`; every other path relays, `info` editing the model's description."""

    async def handle(request: web.Request, seen: Seen) -> web.StreamResponse:
        if seen.path == path:
            return await behaviour(request, seen)
        return await relay(request, seen, info)

    return handle


MODES: dict[str, Behaviour] = {
    "stall": stall,
    "stallgen": on(GENERATE_PATH, stall),
    "notjson": on(GENERATE_PATH, html_as_json),
    "flaky": on(GENERATE_PATH, flaky),
    "badshape": on(GENERATE_PATH, bad_shape),
    "badshape-topn": on(GENERATE_PATH, bad_shape, info=no_draft_support),
    "drop": on(CHAT_PATH, drop),
    "dropmid": on(CHAT_PATH, drop_mid_event),
    "stallmid": on(CHAT_PATH, silent),
    "endless": on(CHAT_PATH, endless),
    "ratelimit": on(CHAT_PATH, rate_limited),
    "bigctx": on(CHAT_PATH, echo, info=big_context),
}


# -- the app and its server -------------------------------------------------------------------------


async def _handle(request: web.Request) -> web.StreamResponse:
    """Record the request, then behave as its mode says."""
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    seen = Seen(request.match_info["mode"], "/" + request.match_info["tail"], headers, body)
    request.app[SEEN].append(seen)
    return await MODES.get(seen.mode, relay)(request, seen)


def create_app(verifier_url: str) -> web.Application:
    """The faulty upstream in front of the verifier at `verifier_url`."""
    app = web.Application()
    app[SEEN] = []
    app[VERIFIER] = verifier_url

    async def session(app: web.Application) -> AsyncIterator[None]:
        app[SESSION] = aiohttp.ClientSession()
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{mode}/{tail:.*}", _handle)
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

    def seen(self, mode: str, path: str | None = None) -> list[Seen]:
        """What the fake received for routes using `mode` (on `path`, if given)."""
        return [s for s in list(self.app[SEEN]) if s.mode == mode and path in (None, s.path)]

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
