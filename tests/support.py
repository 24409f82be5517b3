"""Raw HTTP for tests (http.client: no client library smoothing anything over), and SSE parsing."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    """A whole HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The SSE `data:` payloads, JSON-decoded, with `[DONE]` kept as the string."""
        return sse_events(self.body)


def request(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 300) -> Reply:
    """One HTTP request; raises OSError if nothing listens."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request(method, path or "/", body=body, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def get(url: str, timeout: float = 300) -> Reply:
    """GET."""
    return request("GET", url, timeout=timeout)


def post_json(url: str, obj: Any, headers: dict[str, str] | None = None, timeout: float = 300) -> Reply:
    """POST a JSON body."""
    return request("POST", url, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})},
                   timeout)


def sse_events(body: bytes) -> list[Any]:
    """Parse an SSE body into its data payloads."""
    events = []
    for block in body.decode().split("\n\n"):
        data = [line[len("data: "):] for line in block.splitlines() if line.startswith("data: ")]
        if data:
            payload = "\n".join(data)
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
