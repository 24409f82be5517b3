"""An upstream's answer body read with bounds: whole, within a byte cap, or as it arrives; each read silent at most
`idle` seconds, and timeouts and dropped connections turned into the proxy's upstream errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp

from proxy.errors import UpstreamTimeoutError, UpstreamUnavailableError


async def read_body(response: aiohttp.ClientResponse, idle: float, *, limit: int, path: str) -> bytes:
    """The whole body, silent at most `idle` seconds at a time and at most `limit` bytes, with timeouts and
    disconnects translated (`path` names the call in messages)."""
    if response.content_length is not None and response.content_length > limit:
        raise UpstreamUnavailableError(f"upstream answered {path} with {response.content_length} bytes, more than "
                                       f"the {limit} the proxy reads")
    parts, size = [], 0
    try:
        while True:
            async with asyncio.timeout(idle):
                part = await response.content.readany()
            if not part:
                return b"".join(parts)
            size += len(part)
            if size > limit:
                raise UpstreamUnavailableError(f"upstream answered {path} with more than the {limit} bytes the proxy "
                                               "reads")
            parts.append(part)
    except TimeoutError as exc:
        raise UpstreamTimeoutError("upstream went silent while sending its answer") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailableError(f"upstream connection failed: {type(exc).__name__}") from exc


async def iter_body(response: aiohttp.ClientResponse, idle: float) -> AsyncIterator[bytes]:
    """The body as it arrives, silent at most `idle` seconds at a time, with timeouts and disconnects translated."""
    while True:
        try:
            async with asyncio.timeout(idle):
                chunk = await response.content.readany()
        except TimeoutError as exc:
            raise UpstreamTimeoutError("upstream went silent mid-stream") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailableError(f"upstream connection dropped mid-stream: {type(exc).__name__}") from exc
        if not chunk:
            return
        yield chunk

