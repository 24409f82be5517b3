"""A request that would pass through untouched is judged by the server, not by the proxy's own validation; one that
may speculate is still validated by the proxy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.server.test_request_edges import CHAT_PATH, MESSAGES, MODE, post, start_proxy

FIELDS_THE_PROXY_REFUSES = [
    pytest.param({"temperature": 2.5}, "'temperature' must be between", id="temperature 2.5"),
    pytest.param({"n": 0}, "'n' must be at least 1", id="n 0"),
    pytest.param({"stop": ["a", "b", "c", "d", "e"]}, "at most 4", id="5 stop strings"),
]


@pytest.mark.parametrize(("fields", "refusal"), FIELDS_THE_PROXY_REFUSES)
@pytest.mark.parametrize("off", [True, False], ids=["off", "auto"])
async def test_only_a_request_that_may_speculate_is_validated_by_the_proxy(tmp_path: Path, fields: dict[str, Any],
                                                                          refusal: str, off: bool) -> None:
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": 4, **fields}
    async for server, _ in start_proxy(tmp_path):
        status, headers, raw = await post(server, CHAT_PATH, body, {"X-Speculoos": "off"} if off else None)
        if off:  # forwarded as it came: the fake server's own answer
            assert headers.get(MODE) == "passthrough" and status == 200, raw[:300]
        else:
            assert status == 400 and refusal in json.loads(raw)["error"]["message"], raw[:300]
