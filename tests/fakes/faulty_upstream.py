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
- `CORRUPTIONS` (`oov-bonus`, `nan-probs`, ...): `/generate` relays, and an answer of the kind the mode
  corrupts (a verification with more than FLAKY_AT input ids, or any plain decode) comes back edited:
  an id outside the vocabulary, NaN or infinite numbers, Infinity as an id, a number no float or int64
  holds, a position too few, a one-element row, (`cut`) half its body before the connection closes, or
  (`deep`, `longnum`) JSON Python's json cannot read: nested too deeply, a number of too many digits.
  Each corrupted answer is recorded (`CORRUPTED`);
- any other mode (`relay`, `keyed`, ...): relays, tagging the answer with UPSTREAM_HEADER.
"""

from __future__ import annotations

import asyncio
import json
import math
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
CORRUPTED = "corrupted"  # the path recorded for each answer a corrupting mode edited
OUT_OF_VOCABULARY = 1_000_000  # a token id past any test model's vocabulary
HUGE = 10**30  # an int no int64 holds
DEEP_JSON = b'{"output_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # deeper than Python's recursion limit
LONG_NUMBER_JSON = b'{"output_ids": [' + b"7" * 5000 + b"]}"  # more digits than Python converts to an int


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


# -- corrupted /generate answers ---------------------------------------------------------------------

Corruption = Callable[[dict[str, Any]], bool]  # edits a /generate answer in place; False: nothing to edit


def _top_rows(answer: dict[str, Any]) -> list[list]:
    """The top log-prob rows of a top-N answer (input positions, then the output's)."""
    meta = answer["meta_info"]
    return [row for row in [*meta.get("input_top_logprobs", []), *meta.get("output_top_logprobs", [])] if row]


def oov_bonus(answer: dict[str, Any]) -> bool:
    answer["output_ids"][0] = OUT_OF_VOCABULARY
    return True


def oov_plain(answer: dict[str, Any]) -> bool:
    if answer["output_ids"]:
        answer["output_ids"][-1] = OUT_OF_VOCABULARY
    return bool(answer["output_ids"])


def oov_top(answer: dict[str, Any]) -> bool:
    for row in _top_rows(answer):
        row[0][1] = OUT_OF_VOCABULARY
    return bool(_top_rows(answer))


def inf_bonus(answer: dict[str, Any]) -> bool:
    answer["output_ids"][0] = math.inf  # written as Infinity, which Python's json reads as a float
    return True


def huge_top(answer: dict[str, Any]) -> bool:
    for row in _top_rows(answer):
        row[0][1] = HUGE
    return bool(_top_rows(answer))


def huge_logprobs(answer: dict[str, Any]) -> bool:
    for row in _top_rows(answer):
        row[-1][0] = -(10**400)  # an int no float holds
    return bool(_top_rows(answer))


def nan_logprobs(answer: dict[str, Any]) -> bool:
    meta = answer["meta_info"]
    for entry in [*meta.get("input_token_logprobs", []), *(e for row in _top_rows(answer) for e in row)]:
        if entry[0] is not None:
            entry[0] = math.nan
    return bool(_top_rows(answer))


def inf_logprobs(answer: dict[str, Any]) -> bool:
    for row in _top_rows(answer):
        row[-1][0] = math.inf  # the least likely entry now outranks the rest
    return bool(_top_rows(answer))


def nan_probs(answer: dict[str, Any]) -> bool:
    support = answer["meta_info"]["draft_support"]
    support["target_probs"] = [[math.nan] * len(row) for row in support["target_probs"]]
    return bool(support["target_probs"])


def one_short(answer: dict[str, Any]) -> bool:
    meta = answer["meta_info"]
    rows = ([meta["draft_support"][key] for key in ("target_probs", "outside_mass", "outside_tokens")]
            if "draft_support" in meta else [meta["input_token_logprobs"], meta["input_top_logprobs"]])
    if not rows[0]:
        return False
    for row in rows:
        row.pop()
    return True


def broadcast(answer: dict[str, Any]) -> bool:
    """Every row of several entries cut to its first: a one-element row where several were asked for."""
    meta = answer["meta_info"]
    rows = meta["draft_support"]["target_probs"] if "draft_support" in meta else _top_rows(answer)
    wide = [row for row in rows if len(row) > 1]
    for row in wide:
        del row[1:]
    return bool(wide)


def _is_verification(body: dict[str, Any]) -> bool:
    return bool(body.get("return_logprob")) or "draft_support_ids" in body


async def _edited(request: web.Request, seen: Seen, corruption: Corruption, plain: bool) -> bytes | None:
    """The verifier's answer edited, when it is of the kind picked and `corruption` found something to edit."""
    body = seen.body if isinstance(seen.body, dict) else {}
    if _is_verification(body) == plain or (not plain and len(body.get("input_ids", [])) <= FLAKY_AT):
        return None
    async with request.app[SESSION].post(request.app[VERIFIER] + seen.path, json=body) as answer:
        if answer.status != 200:
            return None
        edited = await answer.json()
    if not corruption(edited):
        return None
    request.app[SEEN].append(replace(seen, path=CORRUPTED, headers={}, body=None))
    return json.dumps(edited).encode()  # NaN and Infinity written as Python's json writes (and reads) them


def corrupting(corruption: Corruption, *, plain: bool = False) -> Behaviour:
    """Relay, editing a verification answer with more than FLAKY_AT input ids (or, `plain`, any plain decode)."""

    async def handle(request: web.Request, seen: Seen) -> web.StreamResponse:
        edited = await _edited(request, seen, corruption, plain)
        if edited is None:
            return await relay(request, seen)
        return web.Response(body=edited, content_type="application/json", headers={UPSTREAM_HEADER: seen.mode})

    return handle


async def cut(request: web.Request, seen: Seen) -> web.StreamResponse:
    """Relay, sending half of a verification answer with more than FLAKY_AT input ids, then closing the connection."""
    edited = await _edited(request, seen, lambda answer: True, plain=False)
    if edited is None:
        return await relay(request, seen)
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(edited)
    await response.prepare(request)
    await response.write(edited[: len(edited) // 2])
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # flushes what was written, then FIN: the body ends mid-JSON
    return response


def unreadable(body: bytes) -> Behaviour:
    """Relay, answering a verification with more than FLAKY_AT input ids with `body` instead."""

    async def handle(request: web.Request, seen: Seen) -> web.StreamResponse:
        if await _edited(request, seen, lambda answer: True, plain=False) is None:
            return await relay(request, seen)
        return web.Response(body=body, content_type="application/json", headers={UPSTREAM_HEADER: seen.mode})

    return handle


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

# The corrupting modes; a `-topn` mode's model claims no draft-support extension, as a stock SGLang server.
CORRUPTIONS: dict[str, Behaviour] = {
    "oov-bonus": on(GENERATE_PATH, corrupting(oov_bonus)),
    "oov-plain": on(GENERATE_PATH, corrupting(oov_plain, plain=True)),
    "oov-topn": on(GENERATE_PATH, corrupting(oov_top), info=no_draft_support),
    "nan-logprobs-topn": on(GENERATE_PATH, corrupting(nan_logprobs), info=no_draft_support),
    "inf-logprobs-topn": on(GENERATE_PATH, corrupting(inf_logprobs), info=no_draft_support),
    "nan-probs": on(GENERATE_PATH, corrupting(nan_probs)),
    "short": on(GENERATE_PATH, corrupting(one_short)),
    "short-topn": on(GENERATE_PATH, corrupting(one_short), info=no_draft_support),
    "broadcast-topn": on(GENERATE_PATH, corrupting(broadcast), info=no_draft_support),
    "cut": on(GENERATE_PATH, cut),
    "inf-bonus": on(GENERATE_PATH, corrupting(inf_bonus)),
    "huge-topn": on(GENERATE_PATH, corrupting(huge_top), info=no_draft_support),
    "huge-logprobs-topn": on(GENERATE_PATH, corrupting(huge_logprobs), info=no_draft_support),
    "deep": on(GENERATE_PATH, unreadable(DEEP_JSON)),
    "longnum": on(GENERATE_PATH, unreadable(LONG_NUMBER_JSON)),
}
MODES.update(CORRUPTIONS)


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
