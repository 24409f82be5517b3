"""Server-sent events as OpenAI streams frame them."""

from __future__ import annotations

from typing import Any

import orjson

# What json.dumps wrote too: numpy's numbers as numbers, and keys that are not plain str (enums, ints) as strings.
_AS_JSON_DOES = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(obj: Any) -> bytes:
    """One server-sent event (orjson: a token's chunk is encoded while the next token decodes, on the same cores)."""
    return b"data: " + orjson.dumps(obj, option=_AS_JSON_DOES) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
