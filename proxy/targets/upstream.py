"""One pooled HTTP client per upstream: timeouts on silence, and aiohttp errors translated to ours."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from proxy.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError


@dataclass(frozen=True)
class Timeouts:
    """Seconds: to connect, to the first response byte, and of silence between body bytes."""

    connect: float = 5.0
    first_byte: float = 120.0
    idle: float = 60.0


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status; its status and message are passed on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = "invalid_request_error" if status < 500 else "upstream_error"


def _error_message(status: int, text: str) -> str:
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return f"upstream returned HTTP {status}: {text[:200]}"
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else None
    return f"upstream: {message}" if message else f"upstream returned HTTP {status}: {text[:200]}"


class Upstream:
    """A base URL, its credentials and one aiohttp ClientSession."""

    def __init__(self, base_url: str, timeouts: Timeouts, *, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts
        self._api_key = api_key
        # total=None: a long stream is healthy while bytes flow; silence is what times out.
        timeout = aiohttp.ClientTimeout(total=None, connect=timeouts.connect, sock_read=timeouts.idle)
        # auto_decompress=False: passthrough forwards bodies byte for byte with their encoding.
        self.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    def auth_headers(self, client_headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """The client's Authorization if it sent one, else the route's key."""
        for name, value in (client_headers or {}).items():
            if name.lower() == "authorization":  # header names are case-insensitive (RFC 9110)
                return {name: value}
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def open(self, method: str, path: str, *, headers: Mapping[str, str], data: Any = None,
                   params: Any = None) -> aiohttp.ClientResponse:
        """Send a request and wait for the response head, within the first-byte timeout."""
        try:
            async with asyncio.timeout(self.timeouts.first_byte):
                return await self.session.request(method, self.base_url + path, headers=headers,
                                                  data=data, params=params, allow_redirects=False)
        except TimeoutError as exc:
            raise UpstreamTimeoutError(f"upstream sent nothing within {self.timeouts.first_byte:g} s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailableError(f"upstream unreachable: {type(exc).__name__}: {exc}") from exc

    async def post_json(self, path: str, body: Any, *, client_headers: Mapping[str, str] | None = None) -> Any:
        """POST JSON and return the decoded JSON answer, or raise one of our errors."""
        return await self._json("POST", path, json.dumps(body), client_headers)

    async def get_json(self, path: str) -> Any:
        """GET JSON (probes at start-up)."""
        return await self._json("GET", path, None, None)

    async def _json(self, method: str, path: str, data: str | None, client_headers: Mapping[str, str] | None) -> Any:
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity",
                   **self.auth_headers(client_headers)}
        response = await self.open(method, path, headers=headers, data=data)
        async with response:
            text = await read_body(response)
        if response.status != 200:
            raise UpstreamStatusError(response.status, _error_message(response.status, text.decode(errors="replace")))
        try:
            return json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UpstreamUnavailableError(f"upstream sent invalid JSON for {path}") from exc

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.session.close()


async def read_body(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, with idle timeouts and disconnects translated."""
    try:
        return await response.read()
    except TimeoutError as exc:
        raise UpstreamTimeoutError("upstream went silent while sending its answer") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailableError(f"upstream connection failed: {type(exc).__name__}") from exc


async def iter_body(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body as it arrives, with idle timeouts and disconnects translated."""
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    except TimeoutError as exc:
        raise UpstreamTimeoutError("upstream went silent mid-stream") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailableError(f"upstream connection dropped mid-stream: {type(exc).__name__}") from exc

