"""One streamed request, timed from the client's side.

Timings, all from the moment the request is sent:
    ttft   the first chunk carrying output text
    itl    (last text chunk − first text chunk) ÷ (completion tokens − 1): the mean time per token
           after the first (vLLM's benchmark calls it TPOT). Per-chunk gaps say little here: a
           speculative round sends several tokens in one chunk.
    rate   completion tokens ÷ (last byte − sent): end-to-end output tokens/s, prefill included.
A call that streams nothing (the verifier's native /generate, whose cost by K the bench measures)
is timed from sent to its whole JSON answer read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

MODE_HEADER = "X-Speculoos-Mode"
CONNECT_TIMEOUT_S = 10.0


class BenchError(Exception):
    """Something the benchmark cannot go on without: one line for the user."""


@dataclass(frozen=True)
class Reply:
    """What one streamed request produced and how long it took."""

    status: int
    text: str
    completion_tokens: int | None
    served_as: str | None  # X-Speculoos-Mode: speculative or passthrough; None from the upstream
    extension: dict[str, Any] | None  # the proxy's `speculoos` object from the usage chunk
    seconds: float
    ttft_s: float | None
    decode_s: float | None  # first text chunk to last text chunk
    error: str | None = None
    timings: dict[str, Any] | None = None  # llama-server's `timings` object from its last chunk

    @property
    def tokens_per_second(self) -> float | None:
        """End-to-end output tokens/s."""
        return self.completion_tokens / self.seconds if self.completion_tokens and self.seconds > 0 else None

    @property
    def itl_s(self) -> float | None:
        """Mean time per output token after the first."""
        if not self.completion_tokens or self.completion_tokens < 2 or not self.decode_s:
            return None
        return self.decode_s / (self.completion_tokens - 1)


def _chunk_text(event: dict[str, Any]) -> str:
    text = ""
    for choice in event.get("choices") or []:
        delta = choice.get("delta")
        text += (delta.get("content") or "") if isinstance(delta, dict) else (choice.get("text") or "")
    return text


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float, *,
                 headers: Mapping[str, str] | None = None) -> Reply:
    """POST `body` with stream=True and read the SSE stream to its end."""
    text, usage, extension, error, timings = "", None, None, None, None
    first = last = None
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=timeout_s)
    try:
        async with session.post(url, json=body, headers=headers, timeout=timeout) as response:
            served_as = response.headers.get(MODE_HEADER)
            if response.status != 200:
                detail = (await response.text())[:200]
                return Reply(response.status, "", None, served_as, None, time.perf_counter() - started,
                             None, None, f"HTTP {response.status}: {detail}")
            buffer = b""
            async for piece in response.content.iter_any():
                buffer += piece
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    data = b"\n".join(line[5:].strip() for line in block.splitlines() if line.startswith(b"data:"))
                    if not data or data == b"[DONE]":
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        error = str(event["error"].get("message", event["error"]))[:200]
                        continue
                    if chunk := _chunk_text(event):
                        last = time.perf_counter()
                        first = last if first is None else first
                        text += chunk
                    usage = event.get("usage") or usage
                    extension = event.get("speculoos") or extension
                    timings = event.get("timings") or timings
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BenchError(f"request to {url} failed: {type(exc).__name__}: {exc}") from exc
    seconds = time.perf_counter() - started
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return Reply(200, text, tokens, served_as, extension, seconds,
                 None if first is None else first - started,
                 None if first is None or last is None else last - first, error, timings)


async def get_json(session: aiohttp.ClientSession, url: str, what: str) -> Any:
    """GET a JSON document, or one clear BenchError naming `what` could not be reached."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=30, connect=CONNECT_TIMEOUT_S)) as reply:
            if reply.status != 200:
                raise BenchError(f"{what} at {url} answered HTTP {reply.status}")
            return await reply.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise BenchError(f"cannot reach {what} at {url}: {exc or type(exc).__name__}") from exc


@dataclass(frozen=True)
class Answer:
    """A JSON answer to a call that does not stream, and how long it took."""

    document: Any
    seconds: float


async def call(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float) -> Answer:
    """POST `body` and read the whole JSON answer; BenchError unless it is HTTP 200."""
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=timeout_s)
    started = time.perf_counter()
    try:
        async with session.post(url, json=body, timeout=timeout) as response:
            if response.status != 200:
                raise BenchError(f"{url} answered HTTP {response.status}: {(await response.text())[:200]}")
            document = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise BenchError(f"request to {url} failed: {type(exc).__name__}: {exc}") from exc
    return Answer(document, time.perf_counter() - started)
