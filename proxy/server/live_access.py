"""Who may read the live view, and whose requests each reader sees.

The page and its stream answer only on a loopback address or on the address `server.host` names, and
only to a Host header naming that address (a page elsewhere that rebinds its own name to ours gets a 404).
Then each reader sees one tenant's requests, tenants being told apart as the drafts' history tells them
(proxy/server/guard.py: a digest of the API key): a reader sends its key as a client does
(`Authorization: Bearer`), and a reader without a key sees the requests sent without one. Every tenant's
requests need the admin token in TOKEN_HEADER: `server.live_token`, or one generated at start-up and
printed once on stdout as the page's URL with `#token=` (a fragment never leaves the browser, so no
request line holds it). A wrong token is a 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Mapping

from proxy.config.server import ServerConfig
from proxy.errors import ForbiddenError
from proxy.observability.live import EVERY_TENANT
from proxy.wire.keys import tenant

TOKEN_HEADER = "X-Speculoos-Live-Token"
TOKEN_BYTES = 32  # of randomness in a generated token (43 URL-safe characters)
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def admin_token(server: ServerConfig) -> tuple[str, bool]:
    """The token of every tenant's view: the configured one, else a new one; and whether it was generated."""
    configured = server.live_token_value()
    return (configured, False) if configured is not None else (secrets.token_urlsafe(TOKEN_BYTES), True)


def reader(headers: Mapping[str, str], token: str) -> str | None:
    """Whose requests a reader sees: every tenant's (EVERY_TENANT) with the admin token, else its own key's."""
    given = headers.get(TOKEN_HEADER)
    if given is None:
        return tenant(headers)
    # Compared as bytes in constant time: a header may hold any character, and timing must not leak a prefix.
    if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8", "surrogateescape")):
        raise ForbiddenError(f"wrong {TOKEN_HEADER}: the proxy printed the live page's URL with its token at start-up")
    return EVERY_TENANT


def page_address(bind_host: str) -> str:
    """The host part of the page's URL: the bound address, or loopback when every address is bound."""
    if bind_host in WILDCARD_HOSTS:
        return "[::1]" if bind_host == "::" else "127.0.0.1"
    address = _ip(bind_host)
    return f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else bind_host


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone index is not part of the address
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket reports IPv4 peers this way
    return address


def serves_live(local_address: str | None, host_name: str | None, bind_host: str) -> bool:
    """Whether a connection to `local_address`, naming `host_name` in its Host header, may see the live view."""
    local = _ip(local_address or "")
    if local is None or not host_name:
        return False
    bound = _ip(bind_host)
    if not (local.is_loopback or (bind_host not in WILDCARD_HOSTS and bound == local)):
        return False
    named = _ip(host_name)
    if named is not None:
        return named == local
    return (host_name.lower() == "localhost" and local.is_loopback) or host_name.lower() == bind_host.lower()
