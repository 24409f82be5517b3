"""A proxy with the live view, for the live page's tests: a scripted drafter in front of the fake SGLang of a toy
model, and a route that passes through to a small fake OpenAI server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.engine.llama import EngineOptions
from proxy.server.app import create_app
from tests.fakes.drafter import ScriptedDrafter
from tests.fakes.sglang import fake_sglang_app
from tests.fakes.toy_model import END, VOCAB, ToyModel

PIECES = ["Hel", "lo", " there"]
WRONG_AT = 2  # the scripted draft's third token is wrong: two accepted, then a correction
QUESTION, ANSWER = "question from ", "answer for "  # the fake OpenAI server answers "question from x": "answer for x"
TOKEN_ENV = "SPECULOOS_TEST_LIVE_TOKEN"


def answer_pieces(body: dict[str, Any]) -> list[str]:
    """What the fake OpenAI server answers: PIECES, or one piece naming who asked."""
    content = body["messages"][-1]["content"]
    return [ANSWER + content[len(QUESTION):]] if content.startswith(QUESTION) else PIECES


def openai_app() -> web.Application:
    """A server that streams its answer as chat chunks, or answers it whole."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces = answer_pieces(body)
        if not body.get("stream"):
            return web.json_response({"choices": [{"index": 0,
                                                   "message": {"role": "assistant", "content": "".join(pieces)},
                                                   "finish_reason": "stop"}], "usage": {"completion_tokens": 3}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def scripted_drafter(model: ToyModel) -> ScriptedDrafter:
    def script(context: Sequence[int], k: int) -> list[int]:
        tokens = model.greedy(context, k)
        if len(tokens) > WRONG_AT and len(context) < 12:  # wrong in the first round only
            tokens[WRONG_AT] = (tokens[WRONG_AT] + 1) % VOCAB or 1
        return [t for t in tokens if t != END] or tokens
    return ScriptedDrafter(script)


async def proxy(tmp_path: Path, *, enabled: bool, host: str = "127.0.0.1", bind: str = "127.0.0.1",
                token: str | None = None) -> AsyncIterator[TestServer]:
    """The proxy, its live view `enabled` (and its admin token set in the config from the environment, if given)."""
    model = ToyModel()
    upstreams = [TestServer(fake_sglang_app(model)), TestServer(openai_app())]
    for server in upstreams:
        await server.start_server()
    gguf = tmp_path / "toy.gguf"
    gguf.write_bytes(b"")  # a draft path must exist; the loader below never reads it
    section: dict[str, Any] = {"live": enabled, "host": host}
    if token is not None:
        section["live_token"] = "${env." + TOKEN_ENV + "}"
    config = parse_config({"server": section, "routes": [
        {"name": "toy", "match": {"model": "toy"}, "upstream": {"url": str(upstreams[0].make_url(""))},
         "draft": {"model": str(gguf)}, "speculation": {"k": 4}},
        {"name": "plain", "upstream": {"url": str(upstreams[1].make_url("")), "protocol": "openai"}},
    ]}, environ={} if token is None else {TOKEN_ENV: token})

    def load(options: EngineOptions) -> ScriptedDrafter:
        return scripted_drafter(model)

    server = TestServer(create_app(config, load_drafter=load), host=bind)
    await server.start_server()
    yield server
    await server.close()
    for upstream in upstreams:
        await upstream.close()


async def read_event(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The next SSE event's JSON."""
    while True:
        line = await asyncio.wait_for(response.content.readline(), 10)
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            return json.loads(line[len(b"data: "):])


async def ask(session: aiohttp.ClientSession, server: TestServer, content: str, key: str | None,
              model: str = "other") -> None:
    """One whole chat request, with `key` as its API key (none when None)."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 10, "temperature": 0}
    async with session.post(server.make_url("/v1/chat/completions"), json=body, headers=headers) as reply:
        assert reply.status == 200, await reply.text()
        await reply.read()
