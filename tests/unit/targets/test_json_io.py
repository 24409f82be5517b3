"""Upstream JSON read through orjson: the same values json reads, whatever the numbers."""

from __future__ import annotations

import json

import pytest

from proxy.targets import json_io


@pytest.mark.parametrize("text", [
    b'{"ids": [1, 2, 3], "logprob": -0.5}',
    b"[1000000000000000000000000000000]",  # past 64 bits: orjson alone would read 1e30
    b"[18446744073709551615, 18446744073709551616]",
    b"[-9223372036854775808, -9223372036854775809]",  # below -2**63 too
    b"[NaN, Infinity]",  # only json reads them; the answer's checks name them
    b'{"text": "12345678901234567890123"}',
])
def test_answers_read_as_json_reads_them(text: bytes) -> None:
    read = json_io.loads(text)
    assert repr(read) == repr(json.loads(text))  # repr: NaN is not equal to itself, and 1e30 == 10**30 is False


def test_invalid_json_raises_as_json_does() -> None:
    with pytest.raises(json.JSONDecodeError):
        json_io.loads(b"{not json")
