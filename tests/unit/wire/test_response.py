"""Server-sent events: compact JSON, the numbers numpy computes written as plain JSON numbers."""

from __future__ import annotations

import json

import numpy as np

from proxy.wire.response import sse_event


def test_an_event_is_one_data_line_of_compact_json() -> None:
    event = sse_event({"choices": [{"delta": {"content": "héllo \"x\"\n"}, "index": 0}], "usage": None})
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n") and event.count(b"\n") == 2
    assert json.loads(event[len(b"data: "):]) == {"choices": [{"delta": {"content": "héllo \"x\"\n"}, "index": 0}],
                                                  "usage": None}
    assert b", " not in event and b": " not in event[len(b"data: "):]


def test_numpy_numbers_are_written_as_json_numbers() -> None:
    event = sse_event({"logprob": np.float64(-0.25), "token": np.int64(7), "top": [np.float32(0.5)]})
    assert json.loads(event[len(b"data: "):]) == {"logprob": -0.25, "token": 7, "top": [0.5]}
