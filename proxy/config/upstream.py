"""The upstream, passthrough and timeouts sections: the LLM server a route forwards to, what besides the API it
forwards, and how long to wait for it."""

from __future__ import annotations

from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr, field_validator

from proxy.config.section import Section

OWN_PREFIX = "/speculoos/"  # the proxy's own pages


class UpstreamConfig(Section):
    """The LLM server requests are forwarded to and drafts are verified by."""

    url: str
    protocol: Literal["sglang", "vllm", "openai"] = "sglang"
    api_key: SecretStr | None = Field(default=None, min_length=1)
    # A client's own key (Authorization, api-key or x-api-key) replaces api_key only where this says so: a
    # placeholder key some clients must send ("sk-dummy", "EMPTY") would otherwise replace the route's.
    forward_client_key: bool = False
    model: str | None = Field(default=None, min_length=1)
    # Connections open to it at once (a stream holds one to its end); requests beyond wait up to timeouts.pool.
    connections: int = Field(default=100, ge=1)

    @property
    def shown_url(self) -> str:
        """scheme://host:port of the URL, and "/…" for any path: the path may hold an interpolated secret."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host  # an IPv6 address
        if parts.port is not None:
            netloc += f":{parts.port}"
        return f"{parts.scheme.lower()}://{netloc}" + ("/…" if parts.path.strip("/") else "")

    def api_key_value(self) -> str | None:
        """The key to send as `Authorization: Bearer` when the client sends none."""
        return None if self.api_key is None else self.api_key.get_secret_value()

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        """An http(s) URL with a host and nothing after the path; trailing slashes dropped."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
        except ValueError as exc:
            raise ValueError(f"not a valid URL ({exc})") from None
        if parts.username is not None or parts.password is not None:
            # Checked first: the messages below echo the URL and must not echo a password.
            raise ValueError("must not contain credentials; use upstream.api_key")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"must start with http:// or https:// (got {url!r})")
        if not parts.hostname:
            raise ValueError(f"must name a host (got {url!r})")
        if "?" in url or "#" in url:
            raise ValueError(f"must not have a query or fragment (got {url!r})")
        if _dot_segments(unquote(parts.path)):  # a URL library would resolve them: the base path would not hold
            raise ValueError(f"must not have '.' or '..' path segments (got {url!r})")
        return url.rstrip("/")


class PassthroughConfig(Section):
    """Paths the route forwards untouched besides the OpenAI API and its protocol's read-only info paths."""

    # Globs on the decoded request path (`*` spans segments): each gets the route's key from any client.
    paths: tuple[str, ...] = ()

    @field_validator("paths")
    @classmethod
    def _absolute_paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        """Absolute paths without query, dot segments, or the proxy's own prefix."""
        for path in paths:
            if not path.startswith("/") or "?" in path or "#" in path or _dot_segments(path):
                raise ValueError(f"must be absolute paths without query or '.' and '..' segments (got {path!r})")
            if path.startswith(OWN_PREFIX) or path == OWN_PREFIX.rstrip("/"):
                raise ValueError(f"{OWN_PREFIX}* are the proxy's own paths, never forwarded (got {path!r})")
        return paths


def _dot_segments(path: str) -> bool:
    return any(segment in (".", "..") for segment in path.split("/"))


class TimeoutsConfig(Section):
    """Upstream timeouts in seconds."""

    connect: float = Field(default=5.0, gt=0)
    first_byte: float = Field(default=120.0, gt=0)
    idle: float = Field(default=60.0, gt=0)  # longest silence inside a streaming body
    pool: float = Field(default=30.0, gt=0)  # longest wait for a free connection when upstream.connections are busy
