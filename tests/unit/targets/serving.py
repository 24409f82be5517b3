"""Helpers of the target client tests: a fake on a loopback port with a client talking to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.targets.sglang import SGLangTarget
from proxy.targets.upstream import Timeouts, Upstream
from tests.fakes.sglang import CONTEXT_SIZE
from tests.fakes.toy_model import END, VOCAB

Client = TypeVar("Client")


@asynccontextmanager
async def serving(app: web.Application,
                  client: Callable[[Upstream], Client] = SGLangTarget) -> AsyncIterator[Client]:  # type: ignore[assignment]
    """The app on a loopback port and a client (an SGLangTarget unless named) talking to it, not probed yet."""
    server = TestServer(app)
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), Timeouts(1.0, 5.0, 5.0))
    try:
        yield client(upstream)
    finally:
        await upstream.close()
        await server.close()


def verifier_info_app() -> web.Application:
    """Only our verifier's /model_info (proxy/verifier/info.py), which announces the draft-support extension."""

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": "toy.gguf", "is_generation": True, "vocab_size": VOCAB,
                                  "bos_token_id": -1, "eos_token_id": END, "max_model_len": CONTEXT_SIZE,
                                  "speculoos_extensions": ["draft_support_ids"]})

    app = web.Application()
    app.router.add_get("/model_info", model_info)
    return app
