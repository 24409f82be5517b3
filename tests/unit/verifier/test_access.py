"""The verifier's key check: `Authorization: Bearer <key>`, nothing else."""

from __future__ import annotations

import pytest

from proxy.verifier.access import has_key

KEY = "sk-verifier"


@pytest.mark.parametrize(("headers", "accepted"), [
    ({"Authorization": f"Bearer {KEY}"}, True),
    ({"Authorization": f"bearer  {KEY} "}, True),  # the scheme is case-insensitive (RFC 9110 §11.1)
    ({}, False),
    ({"Authorization": ""}, False),
    ({"Authorization": KEY}, False),  # no scheme
    ({"Authorization": f"Basic {KEY}"}, False),
    ({"Authorization": f"Bearer {KEY}x"}, False),
    ({"Authorization": f"Bearer {KEY[:-1]}"}, False),
    ({"Authorization": "Bearer \udcff"}, False),  # an undecodable byte, as aiohttp keeps it
])
def test_only_the_bearer_key_is_accepted(headers: dict[str, str], accepted: bool) -> None:
    assert has_key(headers, KEY) is accepted
