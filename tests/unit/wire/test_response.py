"""Server-sent events: compact JSON, written as json.dumps wrote it (numpy numbers, enum and int keys)."""

from __future__ import annotations

import json

import numpy as np

from proxy.drafting.base import Source
from proxy.wire.response import sse_event


def test_an_event_is_one_data_line_of_compact_json() -> None:
    event = sse_event({"choices": [{"delta": {"content": "héllo \"x\"\n"}, "index": 0}], "usage": None})
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n") and event.count(b"\n") == 2
    assert json.loads(event[len(b"data: "):]) == {"choices": [{"delta": {"content": "héllo \"x\"\n"}, "index": 0}],
                                                  "usage": None}
    assert b", " not in event and b": " not in event[len(b"data: "):]


def test_numpy_numbers_and_keys_that_are_not_plain_str_are_written_as_json_writes_them() -> None:
    obj = {"logprob": np.float64(-0.25), "token": np.int64(7), "by_k": {1: 49.9, 32: 283.7},
           "drafts": {Source.LOOKUP: {"rounds": 2}}}  # the proxy's report keys its figures by Source
    assert json.loads(sse_event(obj)[len(b"data: "):]) == json.loads(json.dumps(obj, default=int))
