"""Sequence leases: longest shared prefix first, least recently used otherwise, never a leased one, and a
copy instead of an eviction when the best match holds another conversation."""

from __future__ import annotations

import asyncio

import pytest

from proxy.engine.sequences import MIN_COPIED_TOKENS, Lease, SequenceLeases, SequencePool
from proxy.errors import OverloadedError

LONG = list(range(100, 100 + MIN_COPIED_TOKENS))


def leases(*held: list[int]) -> SequenceLeases:
    table = [list(h) for h in held]
    return SequenceLeases(len(table), lambda seq: table[seq])


@pytest.mark.parametrize(("held", "context", "expected"), [
    ([[], [1, 2, 3], [1, 2, 9]], [1, 2, 3, 4], Lease(1, None, 3)),  # a continuation of what it holds
    ([[], [1, 2, 3], [1, 2, 9]], [1, 2, 9, 9], Lease(2, None, 3)),
    ([[5], [6], [7]], [1, 2], Lease(0, None, 0)),  # nothing shared: the least recently used (never used: lowest id)
    # sharing a prefix with another conversation: copy it into the least recently used one, keep the original
    ([[], LONG + [1, 2]], LONG + [7], Lease(0, 1, len(LONG))),
    ([LONG + [1, 2], []], LONG + [7], Lease(0, None, len(LONG))),  # unless the original is the least recently used
    ([[], [1, 2, 3, 4, 5]], [1, 2, 7], Lease(0, None, 0)),  # a short shared prefix is not worth a copy
])
def test_acquire_prefers_the_longest_shared_prefix(held: list[list[int]], context: list[int], expected: Lease) -> None:
    assert leases(*held).acquire(context) == expected


def test_a_leased_sequence_is_never_handed_out_and_lru_decides_ties() -> None:
    table = leases([1, 2, 3], [], [])
    assert table.acquire([1, 2, 3]) == Lease(0, None, 3)
    assert table.acquire([1, 2, 3]).seq in (1, 2)  # 0 is leased, whatever it holds
    other = table.acquire([9]).seq
    assert table.free == 0 and table.acquire([1]) is None
    table.release(other)
    table.release(0)
    assert table.acquire([7]).seq == other  # released first: least recently used
    with pytest.raises(ValueError, match="not leased"):
        table.release(0)


async def test_the_pool_waits_for_a_release_first_come_first_served() -> None:
    pool = SequencePool(leases([], []))
    first, second = (await pool.acquire([1])).seq, (await pool.acquire([2])).seq
    order: list[str] = []

    async def wait(name: str) -> int:
        seq = (await pool.acquire([3])).seq
        order.append(name)
        return seq

    waiting = [asyncio.create_task(wait("a")), asyncio.create_task(wait("b"))]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in waiting)
    pool.release(second)
    assert await waiting[0] == second and not waiting[1].done()
    pool.release(first)
    assert await waiting[1] == first and order == ["a", "b"]


async def test_a_cancelled_waiter_does_not_swallow_a_release() -> None:
    pool = SequencePool(leases([]))
    seq = (await pool.acquire([1])).seq
    gone = asyncio.create_task(pool.acquire([2]))
    await asyncio.sleep(0.01)
    gone.cancel()
    later = asyncio.create_task(pool.acquire([3]))
    await asyncio.sleep(0.01)
    pool.release(seq)
    assert (await asyncio.wait_for(later, 1.0)).seq == seq


async def test_a_waiter_cancelled_after_its_wake_up_passes_the_release_on() -> None:
    pool = SequencePool(leases([]))
    seq = (await pool.acquire([1])).seq
    woken, next_in_line = asyncio.create_task(pool.acquire([2])), asyncio.create_task(pool.acquire([3]))
    await asyncio.sleep(0.01)
    pool.release(seq)  # wakes `woken`, which leaves before it runs again
    woken.cancel()
    assert (await asyncio.wait_for(next_in_line, 1.0)).seq == seq
    assert woken.cancelled()


@pytest.mark.parametrize(("max_waiting", "admitted"), [(0, 0), (1, 1), (3, 3), (None, 5)])
async def test_a_full_queue_refuses_at_once_with_retry_after(max_waiting: int | None, admitted: int) -> None:
    pool = SequencePool(leases([]), max_waiting=max_waiting)
    seq = (await pool.acquire([1])).seq
    waiting = [asyncio.create_task(pool.acquire([2])) for _ in range(5)]
    await asyncio.sleep(0.01)
    refused = [task for task in waiting if task.done()]
    assert pool.waiting == admitted and len(refused) == 5 - admitted
    for task in refused:
        with pytest.raises(OverloadedError, match="queue of .* waiting requests is full") as caught:
            task.result()
        assert caught.value.status == 503 and caught.value.headers() == {"Retry-After": "1"}
    pool.release(seq)
    if admitted:  # the first in line gets the sequence
        assert (await asyncio.wait_for(waiting[0], 1.0)).seq == seq
        assert pool.waiting == admitted - 1
    for task in waiting:
        task.cancel()
