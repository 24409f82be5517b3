"""Who may call the verifier, and with what: the proxy's browser rules on the address it binds, an optional key,
and JSON bodies only.

The verifier computes for whoever reaches its port, web pages included: the Host and Origin rules
of proxy/wire/browsers.py keep pages of other sites and rebound names out (no Origin is listed here;
Host names are, with --allowed-host), and a POST body must say it is JSON, which a page's form or
preflight-free `text/plain` fetch cannot. With `--api-key`, every request but the liveness check
needs `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from aiohttp import web

from proxy.errors import UnauthorizedError, UnsupportedMediaError
from proxy.wire.browsers import Bound, refuse_foreign
from proxy.wire.errors import Handler

LISTENER = web.AppKey("listener", Bound)  # the address the verifier binds
API_KEY = web.AppKey("api_key", str)  # absent: no key is asked for
KEYLESS_PATHS = frozenset({"/health"})  # liveness probes carry no key (SGLang's /health asks none either)
JSON = "application/json"


def has_key(headers: Mapping[str, str], key: str) -> bool:
    """Whether the request's Authorization is `Bearer <key>` (compared in constant time)."""
    scheme, _, credentials = headers.get("Authorization", "").strip().partition(" ")
    sent = credentials.strip().encode("utf-8", "surrogateescape")  # a header's undecodable bytes stay bytes
    return scheme.lower() == "bearer" and hmac.compare_digest(sent, key.encode("utf-8", "surrogateescape"))


@web.middleware
async def access_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse browsers from elsewhere, a missing or wrong key, and POST bodies that are not JSON, before any work."""
    refuse_foreign(request.headers, request.app[LISTENER], api=False)  # nothing listed: no page of another site
    key = request.app.get(API_KEY)
    if key is not None and request.path not in KEYLESS_PATHS and not has_key(request.headers, key):
        raise UnauthorizedError("this verifier needs its API key: Authorization: Bearer <key> (--api-key)")
    # Unknown paths and methods keep their 404 and 405.
    if request.method == "POST" and request.match_info.http_exception is None and request.content_type != JSON:
        raise UnsupportedMediaError(f"request bodies must be sent as {JSON} (got {request.content_type})")
    return await handler(request)
