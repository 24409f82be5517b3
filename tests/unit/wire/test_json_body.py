"""Request bodies as JSON: a large one is parsed in a worker thread, without the cyclic collector."""

from __future__ import annotations

import gc
import json
import threading

from proxy.wire.json_body import LARGE_BODY_BYTES, parse_body


def junk(lists: int) -> bytes:
    return b'{"input": [' + b",".join([b"[]"] * lists) + b"]}"


async def test_a_large_body_is_parsed_off_the_event_loop() -> None:
    def where(raw: bytes) -> str:
        return threading.current_thread().name

    loop_thread = threading.current_thread().name
    assert await parse_body(b"{}", where) == loop_thread  # a small one: not worth a thread
    assert await parse_body(junk(LARGE_BODY_BYTES // 3), where) != loop_thread


async def test_a_large_body_is_parsed_without_the_cyclic_collector() -> None:
    collections: list[int] = []
    parsing = threading.Event()

    def count(phase: str, info: dict) -> None:
        if phase == "start" and parsing.is_set():
            collections.append(info["generation"])

    def parse(raw: bytes) -> object:
        parsing.set()
        try:
            return json.loads(raw)
        finally:
            parsing.clear()

    gc.callbacks.append(count)
    try:
        await parse_body(junk(100_000), parse)  # 100,000 new lists: enough to run each generation's collection
    finally:
        gc.callbacks.remove(count)
    assert collections == [] and gc.isenabled()  # none while parsing, and the collector runs again after
