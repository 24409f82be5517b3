"""Server-sent events as OpenAI streams frame them."""

from __future__ import annotations

import json
from typing import Any

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(obj: Any) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
