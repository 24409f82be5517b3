"""Server-sent events as OpenAI streams frame them."""

from __future__ import annotations

from typing import Any

import orjson

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(obj: Any) -> bytes:
    """One server-sent event (orjson: a token's chunk is encoded while the next token decodes, on the same cores)."""
    return b"data: " + orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
