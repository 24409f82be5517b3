"""Values handed from another thread reach the event loop in order, and a closed loop drops them quietly."""

from __future__ import annotations

import asyncio
import threading

from proxy.engine.handoff import Handoff


async def test_values_sent_from_another_thread_arrive_in_order() -> None:
    handoff, received = Handoff(), asyncio.Queue()
    loop = asyncio.get_running_loop()
    sender = threading.Thread(target=lambda: [handoff.send(loop, received.put_nowait, i) for i in range(100)])
    sender.start()
    assert [await asyncio.wait_for(received.get(), 5.0) for _ in range(100)] == list(range(100))
    sender.join()
    handoff.close()


async def test_a_closed_loop_drops_what_is_sent_and_later_values_still_arrive() -> None:
    handoff, closed, received = Handoff(), asyncio.new_event_loop(), asyncio.Queue()
    closed.close()
    handoff.send(closed, print, "nobody reads this")
    handoff.send(asyncio.get_running_loop(), received.put_nowait, "after")
    assert await asyncio.wait_for(received.get(), 5.0) == "after"
    handoff.close()
