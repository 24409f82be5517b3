"""Where a client's API key travels: Authorization, api-key or x-api-key."""

from __future__ import annotations

import hashlib

import pytest

from proxy.targets.upstream import Timeouts, Upstream
from proxy.wire.keys import ANONYMOUS, client_key, key_headers, tenant, without_keys

ROUTE = {"Authorization": "Bearer sk-route"}


@pytest.mark.parametrize(("headers", "key"), [
    ({}, None),
    ({"Content-Type": "application/json"}, None),
    ({"Authorization": "Bearer sk-a"}, "sk-a"),
    ({"authorization": "Basic dXNlcjpwdw=="}, "Basic dXNlcjpwdw=="),
    ({"api-key": "sk-a"}, "sk-a"),
    ({"X-API-Key": "sk-a"}, "sk-a"),
    ({"x-api-key": "sk-b", "Authorization": "Bearer sk-a"}, "sk-a"),  # Authorization first
    ({"Authorization": " ", "api-key": "sk-a"}, "sk-a"),  # an empty header carries no key
])
def test_the_clients_key(headers: dict[str, str], key: str | None) -> None:
    assert client_key(headers) == key


def test_key_headers_and_the_rest_part_as_sent() -> None:
    headers = {"API-Key": "sk-a", "x-api-key": "sk-b", "Accept": "*/*"}
    assert key_headers(headers) == {"API-Key": "sk-a", "x-api-key": "sk-b"}
    assert without_keys(headers) == {"Accept": "*/*"}


@pytest.mark.parametrize(("route_key", "forward", "sent", "expected"), [
    ("sk-route", False, {}, ROUTE),
    ("sk-route", False, {"Authorization": "Bearer sk-dummy"}, ROUTE),  # a placeholder never replaces the key
    ("sk-route", False, {"x-api-key": "EMPTY"}, ROUTE),
    ("sk-route", True, {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-a"}),
    ("sk-route", True, {"api-key": "sk-a"}, {"api-key": "sk-a"}),
    ("sk-route", True, {}, ROUTE),  # a forwarding route still keys a client without one
    (None, False, {"x-api-key": "sk-a"}, {"x-api-key": "sk-a"}),  # no key of its own: the client's goes on
    (None, False, {}, {}),
])
async def test_the_upstream_gets_the_routes_key_unless_the_route_forwards_the_clients(
        route_key: str | None, forward: bool, sent: dict[str, str], expected: dict[str, str]) -> None:
    upstream = Upstream("http://127.0.0.1:9", Timeouts(), api_key=route_key, forward_client_key=forward)
    try:
        assert upstream.auth_headers({"Accept": "*/*", **sent}) == expected
    finally:
        await upstream.close()


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, ANONYMOUS),
    ({"Authorization": ""}, ANONYMOUS),
    ({"Authorization": "Bearer sk-a"}, hashlib.sha256(b"sk-a").hexdigest()[:32]),
    ({"Authorization": "bearer  sk-a "}, hashlib.sha256(b"sk-a").hexdigest()[:32]),  # the same key
    ({"Authorization": "Basic dXNlcjpwdw=="}, hashlib.sha256(b"Basic dXNlcjpwdw==").hexdigest()[:32]),
    ({"api-key": "sk-a"}, hashlib.sha256(b"sk-a").hexdigest()[:32]),  # Azure OpenAI's header: the same tenant
    ({"X-Api-Key": " sk-a"}, hashlib.sha256(b"sk-a").hexdigest()[:32]),  # gateways' header, in any case
    ({"x-api-key": "sk-b", "Authorization": "Bearer sk-a"}, hashlib.sha256(b"sk-a").hexdigest()[:32]),
])
def test_the_tenant_is_a_digest_of_the_key(headers: dict[str, str], expected: str) -> None:
    assert tenant(headers) == expected
    assert "sk-a" not in tenant(headers)
