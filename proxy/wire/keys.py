"""Where a client's API key travels: `Authorization` (Bearer), or the `api-key` and `x-api-key` headers some
gateways take instead (Azure OpenAI, Anthropic-style gateways)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

KEY_HEADERS = ("authorization", "api-key", "x-api-key")  # lower case: header names are case-insensitive
ANONYMOUS = ""  # the tenant of requests without a key


def key_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The key headers among `headers`, with their names as sent."""
    return {name: value for name, value in headers.items() if name.lower() in KEY_HEADERS and value.strip()}


def without_keys(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` less every key header."""
    return {name: value for name, value in headers.items() if name.lower() not in KEY_HEADERS}


def client_key(headers: Mapping[str, str]) -> str | None:
    """The client's key: Authorization's credentials (a Bearer scheme dropped), else api-key, else x-api-key."""
    found = {name.lower(): value.strip() for name, value in key_headers(headers).items()}
    for name in KEY_HEADERS:
        if value := found.get(name):
            scheme, _, credentials = value.partition(" ")
            return credentials.strip() if name == "authorization" and scheme.lower() == "bearer" else value
    return None


def tenant(headers: Mapping[str, str]) -> str:
    """Whose outputs a request may draft from: a digest of the client's key in any header a key travels in (never
    the key), or ANONYMOUS."""
    key = client_key(headers)
    if key is None:
        return ANONYMOUS
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]
