"""Request bodies as JSON: a 400 that says why not, and large bodies parsed in a worker thread with the cyclic
garbage collector paused, so one client's megabytes hold neither the event loop nor the CPU for long."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from proxy.errors import BadRequestError

LARGE_BODY_BYTES = 256 << 10  # parsed in a worker thread: the event loop serves other requests meanwhile


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, or a 400 that says why not."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from exc
    except ValueError as exc:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise BadRequestError(f"the request body holds a number too long to read: {exc}") from exc
    except RecursionError as exc:  # arrays or objects nested deeper than the parser's recursion limit
        raise BadRequestError("the request body is nested too deeply") from exc


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or a 400 that says why not."""
    return await parse_body(await request.read())


async def parse_body(raw: bytes, parse: Callable[[bytes], Any] = parse_json) -> Any:
    """parse(raw), off the event loop and with the cyclic collector paused for a large body."""
    if len(raw) < LARGE_BODY_BYTES:
        return parse(raw)
    return await asyncio.to_thread(_parse_uncollected, parse, raw)


class _CollectorPause:
    """Pauses of the cyclic garbage collector that may overlap across threads: it runs again after the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._was_enabled:
                    gc.enable()


_COLLECTOR_PAUSE = _CollectorPause()


def _parse_uncollected(parse: Callable[[bytes], Any], raw: bytes) -> Any:
    # Parsing makes no cycles, but each container it makes counts towards the collector's thresholds: on a million
    # of them the full collections it triggers over the growing heap cost five times the parse, with the GIL held.
    with _COLLECTOR_PAUSE.held():
        return parse(raw)
