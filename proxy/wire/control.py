"""The client's say over speculation: the X-Speculoos header and the `speculoos` body field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.config.section import MAX_K
from proxy.errors import BadRequestError

CONTROL_HEADER = "X-Speculoos"  # "off", "on" (skip the controller), or "k=N" (pin K)
# body: {"mode": "off" | "on" | "auto", "k": N, "pipeline": bool}; removed before forwarding
CONTROL_FIELD = "speculoos"


@dataclass(frozen=True)
class RequestControl:
    """What the client asked of speculation for this one request."""

    off: bool = False
    forced: bool = False  # speculate even where the controller would pass through
    pinned_k: int | None = None
    pipeline: bool | None = None  # draft-ahead on or off for this request (None: as the route says)


def _pinned(value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_K:
        raise BadRequestError(f"{source}: k must be an integer in 1..{MAX_K}", param=CONTROL_FIELD)
    return value


def request_control(headers: Mapping[str, str], body: dict) -> RequestControl:
    """Read the X-Speculoos header and the `speculoos` body field."""
    header = headers.get(CONTROL_HEADER, "").strip().lower()
    field = body.get(CONTROL_FIELD, {})
    if (not isinstance(field, dict) or set(field) - {"mode", "k", "pipeline"}
            or field.get("mode", "auto") not in ("on", "off", "auto")
            or not isinstance(field.get("pipeline", True), bool)):
        raise BadRequestError("'speculoos' must be an object with 'mode' (on, off, auto), 'k' and/or 'pipeline'"
                              " (true or false)", param=CONTROL_FIELD)
    pipeline = field.get("pipeline")
    if header.startswith("k="):
        value = header[2:]
        # Short ASCII digits only: int() refuses some characters isdigit() accepts (superscripts), and long numbers.
        number = int(value) if value.isascii() and value.isdigit() and len(value) <= 9 else value
        return RequestControl(forced=True, pinned_k=_pinned(number, CONTROL_HEADER), pipeline=pipeline)
    if header not in ("", "on", "off", "auto"):
        raise BadRequestError(f"{CONTROL_HEADER} must be off, on, auto or k=N", param=CONTROL_HEADER)
    off = header == "off" or field.get("mode") == "off"
    pinned = _pinned(field["k"], CONTROL_FIELD) if "k" in field else None
    return RequestControl(off=off, forced=header == "on" or field.get("mode") == "on" or pinned is not None,
                          pinned_k=pinned, pipeline=pipeline)
