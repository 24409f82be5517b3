"""The server section: where the proxy listens, how much it accepts, and which browser pages may call it."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from proxy.config.section import Section

MIB = 1024 * 1024
GIB = 1024 * MIB
DEFAULT_HOST = "127.0.0.1"  # loopback only: the proxy carries API keys, exposing it must be a choice
MIN_LIVE_TOKEN_CHARS = 16


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
      A listed origin also gets CORS answers, preflights included;
    - outside the OpenAI API (the info paths forwarded, /metrics, /speculoos/status), a request a
      page of another site sent (`Sec-Fetch-Site: cross-site` or `same-site`: an `<img src>` sends
      no Origin) carries a listed Origin.
    Anything else is a 403 with an OpenAI error body. `host` is the address `speculoos serve --host`
    binds when given: the rules judge by the address actually served.
    """

    host: str = Field(default=DEFAULT_HOST, min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * MIB, gt=0)
    max_in_flight: int = Field(default=256, ge=1)  # requests held at once; more are a 503 with Retry-After
    # What the JSON bodies of the requests in flight may take once parsed (estimated before parsing, at most 5 times
    # the text plus 64 bytes a value); a request past it is a 503 with Retry-After, a body past it alone a 413.
    max_parsed_bytes: int = Field(default=GIB, gt=0)
    # What one body may take once parsed, a 413 past it: some million values (OpenAI caps an embeddings request at
    # 300,000 token ids) or the largest body as text.
    max_body_parsed_bytes: int = Field(default=64 * MIB, gt=0)
    live: bool = False  # GET /speculoos/live: shows prompts and outputs, so off unless asked for
    # The live page's view of every tenant (each API key sees its own requests without it); generated when unset.
    live_token: SecretStr | None = None
    allowed_hosts: tuple[str, ...] = ()  # Host names (no port) accepted besides loopback and `host`; "*": any
    allowed_origins: tuple[str, ...] = ()  # browser origins that may call the API

    @field_validator("live_token", mode="before")
    @classmethod
    def _strong_token(cls, token: object) -> object:
        """A token a browser can send in a header and nobody guesses; the message never echoes it."""
        text = token.get_secret_value() if isinstance(token, SecretStr) else token
        if text is None:
            return None
        if not isinstance(text, str) or not all("!" <= c <= "~" for c in text):
            raise ValueError("must be visible ASCII characters (no spaces)")
        if len(text) < MIN_LIVE_TOKEN_CHARS:
            raise ValueError(f"must have at least {MIN_LIVE_TOKEN_CHARS} characters "
                             "(python3 -c 'import secrets; print(secrets.token_urlsafe())' makes one)")
        return token

    def live_token_value(self) -> str | None:
        """The configured admin token of the live page, if any."""
        return None if self.live_token is None else self.live_token.get_secret_value()

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        """Bare names or addresses, compared case-insensitively."""
        return host_names(names)

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


def host_names(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Host names as the rules compare them (lower case, no brackets); ValueError for one with a scheme or port."""
    for name in names:
        if not name or any(c in name for c in "/@ \t") or (":" in name and not name.startswith("[")):
            raise ValueError(f"must be host names without scheme or port, like proxy.lan or [::1] (got {name!r})")
    return tuple(name.lower().strip("[]") for name in names)


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
