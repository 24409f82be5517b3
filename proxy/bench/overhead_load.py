"""`bench overhead`'s load: the fake target and the clients, in a process of their own.

In the proxy's process they would hold the GIL whenever the proxy's thread let go of it (every socket write,
every call into llama.cpp), and the proxy's event loop would wait for the bench's own Python: the loop lag
measured would be theirs. The process takes commands over a pipe: run the clients of one configuration, or stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
from aiohttp import web

from proxy.bench.client import BenchError
from proxy.bench.overhead_target import FakeState, fake_target_app

if TYPE_CHECKING:
    from proxy.bench.overhead_run import Configuration

SAMPLED_TOP_K = 20  # sampled requests send top_k within the route's top-20: exact on a stock SGLang
TIMEOUT_S = 600.0
SEED = 1234
STOP = "stop"


def request_body(prompt: str, configuration: Configuration, seed: int) -> dict[str, Any]:
    """A streamed completion with the configuration's temperature."""
    body: dict[str, Any] = {"model": configuration.route, "prompt": prompt,
                            "max_tokens": configuration.max_tokens, "temperature": configuration.temperature,
                            "stream": True, "stream_options": {"include_usage": True}, "seed": seed}
    if configuration.temperature > 0:
        body["top_k"] = SAMPLED_TOP_K
    if configuration.pinned:
        body["speculoos"] = {"k": configuration.k}
    return body


async def _send(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str | None]:
    """One request: (completion tokens, error or None); a passthrough is an error here."""
    async with session.post(url + "/v1/completions", json=body) as reply:
        if reply.status != 200:
            return 0, f"HTTP {reply.status}: {(await reply.text())[:200]}"
        if reply.headers.get("X-Speculoos-Mode") != "speculative":
            return 0, "the proxy passed the request through"
        tokens = 0
        async for line in reply.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if "error" in chunk:
                    return tokens, str(chunk["error"])[:200]
        return tokens, None


async def _clients(url: str, prompt: str, configuration: Configuration, streams: int,
                   requests: int) -> tuple[int, list[str]]:
    """`streams` clients, each sending `requests` requests one after another."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        async def client(index: int) -> list[tuple[int, str | None]]:
            return [await _send(session, url, request_body(prompt, configuration, SEED + index * requests + n))
                    for n in range(requests)]
        results = await asyncio.gather(*(client(i) for i in range(streams)))
    flat = [result for per_client in results for result in per_client]
    return sum(tokens for tokens, _ in flat), [error for _, error in flat if error]


async def _serve(conn: Connection, gguf: str, acceptance: float, context_length: int, step_seconds: float) -> None:
    from proxy.engine.vocabulary import LlamaVocabulary  # llama.cpp in this process's own copy

    vocabulary = LlamaVocabulary.from_gguf(gguf)
    state = FakeState(acceptance, vocabulary.n_vocab, np.random.default_rng(SEED),
                      lambda text, special: vocabulary.tokenize(text, add_special=special), context_length,
                      step_seconds)
    runner = web.AppRunner(fake_target_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    conn.send(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        while (command := await asyncio.to_thread(conn.recv)) != STOP:
            conn.send(await _clients(*command))
    finally:
        await runner.cleanup()


def _main(conn: Connection, *args: Any) -> None:
    try:
        asyncio.run(_serve(conn, *args))
    except Exception as exc:  # the parent reads it as the answer it waits for
        conn.send(BenchError(f"the bench's load process failed: {type(exc).__name__}: {exc}"))


class Load:
    """The load process, seen from the bench: the fake's URL, and clients run on command."""

    def __init__(self, conn: Connection, url: str) -> None:
        self._conn, self.url = conn, url

    async def clients(self, url: str, prompt: str, configuration: Configuration, streams: int,
                      requests: int) -> tuple[int, list[str]]:
        """Run `streams` clients of `requests` requests each against `url`: (completion tokens, errors)."""
        self._conn.send((url, prompt, configuration, streams, requests))
        return await _receive(self._conn)


async def _receive(conn: Connection) -> Any:
    """The load process's next answer; its failure as a BenchError."""
    try:
        answer = await asyncio.to_thread(conn.recv)
    except EOFError:
        raise BenchError("the bench's load process ended") from None
    if isinstance(answer, BenchError):
        raise answer
    return answer


@contextlib.asynccontextmanager
async def started(gguf: str, acceptance: float, context_length: int, step_seconds: float) -> AsyncIterator[Load]:
    """The load process with its fake target serving (stopped on the way out)."""
    ours, theirs = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_main, args=(theirs, gguf, acceptance, context_length, step_seconds), name="speculoos-bench-load",
        daemon=True)
    process.start()
    theirs.close()  # the process holds its end: once it ends, a read here meets the end of the pipe
    try:
        yield Load(ours, await _receive(ours))
        ours.send(STOP)
        await asyncio.to_thread(process.join, 30)
    finally:
        if process.is_alive():
            process.kill()
