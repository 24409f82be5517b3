"""The server section: where the proxy listens, how much it accepts, and which browser pages may call it."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from proxy.config.section import Section

MIB = 1024 * 1024
DEFAULT_HOST = "127.0.0.1"  # loopback only: the proxy carries API keys, exposing it must be a choice


class ServerConfig(Section):
    """Where the proxy listens, how much it accepts, and which browser pages may call it.

    Any page open in a browser on this machine can send requests to a loopback port, spending the
    routes' keys (CSRF) or, by rebinding its own name to our address, reading the answers. So every
    path but the live page (which has a stricter rule of its own) answers only when:
    - the Host header names a loopback address (localhost, 127.0.0.1, [::1]; any port), the address
      `host` names, or one of `allowed_hosts`. Bound to 0.0.0.0 or :: the proxy serves a network on
      purpose, under names it cannot know: any Host is accepted there until `allowed_hosts` lists the
      names its clients use (IP addresses are then accepted too: a rebinding page always uses a name);
    - the Origin header is absent (not a browser), the proxy's own origin, or one of
      `allowed_origins` (`scheme://host[:port]`; "null" for sandboxed pages and files; "*" for any).
      A listed origin also gets CORS answers, preflights included.
    Anything else is a 403 with an OpenAI error body.
    """

    host: str = Field(default=DEFAULT_HOST, min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * MIB, gt=0)
    live: bool = False  # GET /speculoos/live: shows prompts and outputs, so off unless asked for
    allowed_hosts: tuple[str, ...] = ()  # Host names (no port) accepted besides loopback and `host`; "*": any
    allowed_origins: tuple[str, ...] = ()  # browser origins that may call the API

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        """Bare names or addresses, compared case-insensitively."""
        for name in names:
            if not name or any(c in name for c in "/@ \t") or (":" in name and not name.startswith("[")):
                raise ValueError(f"must be host names without scheme or port, like proxy.lan or [::1] (got {name!r})")
        return tuple(name.lower().strip("[]") for name in names)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        """Origins as browsers send them: scheme, host and port only."""
        normal = []
        for origin in origins:
            key = origin if origin in ("*", "null") else normal_origin(origin)
            if key is None:
                raise ValueError(f"must be scheme://host[:port], null or * (got {origin!r})")
            normal.append(key)
        return tuple(normal)


def normal_origin(origin: str) -> str | None:
    """An http(s) origin as `scheme://host[:port]`, lower case, the scheme's default port left out; None if not one."""
    try:
        parts = urlsplit(origin.strip().rstrip("/"))
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or parts.path or parts.query \
            or parts.fragment or parts.username is not None:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = 80 if parts.scheme.lower() == "http" else 443
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port not in (None, default) else "")
