"""Which llama.cpp sequence a request uses: leases over the engine's sequences, by longest shared prefix.

A request takes a free sequence and keeps it until it releases it, so a live request's cache is
never evicted by another while sequences remain. The free sequence sharing the longest prefix with
its context is the one to start from. If that sequence holds more than the shared prefix (another
conversation's cache, worth keeping for its next turn), the request takes the least recently used
free sequence instead, with the shared prefix copied into it (a fork: no decoding) when it is long
enough to be worth a copy.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.engine.prefix import common_prefix_length
from proxy.errors import OverloadedError

# A copy moves a whole cache stream; below this many shared tokens, evaluating them again is cheaper.
MIN_COPIED_TOKENS = 16


@dataclass(frozen=True)
class Lease:
    """A sequence handed to a request, and where its cache should start from."""

    seq: int
    copy_from: int | None  # copy this sequence's first `shared` tokens into `seq` before use
    shared: int  # tokens of the context the sequence will hold once the copy (if any) is made


class SequenceLeases:
    """Leases of sequence ids 0..n-1; `held(seq)` says which tokens a sequence's cache holds."""

    def __init__(self, n_seq: int, held: Callable[[int], Sequence[int]]) -> None:
        self._held = held
        self._busy = [False] * n_seq
        self._clock = itertools.count()
        self._last_used = [next(self._clock) for _ in range(n_seq)]

    def __len__(self) -> int:
        """How many sequences there are."""
        return len(self._busy)

    @property
    def free(self) -> int:
        """How many sequences are not leased."""
        return self._busy.count(False)

    def acquire(self, context: Sequence[int]) -> Lease | None:
        """Lease a free sequence for context (see the module docstring); None when all are leased."""
        free = [seq for seq, busy in enumerate(self._busy) if not busy]
        if not free:
            return None
        # held() may lag a decode running on the engine thread: the choice can be slightly stale, never
        # wrong, since the engine reuses only what a sequence really holds when it evaluates.
        shared = {seq: common_prefix_length(self._held(seq), context) for seq in free}
        best = max(free, key=lambda s: (shared[s], -self._last_used[s]))
        oldest = min(free, key=lambda s: self._last_used[s])
        if shared[best] == 0 or len(self._held(best)) <= shared[best] or best == oldest:
            lease = Lease(best, None, shared[best])
        elif shared[best] >= MIN_COPIED_TOKENS:
            lease = Lease(oldest, best, shared[best])
        else:
            lease = Lease(oldest, None, shared[oldest])
        self._busy[lease.seq] = True
        return lease

    def release(self, seq: int) -> None:
        """Give a sequence back; its cache stays for whoever shares its prefix next."""
        if not self._busy[seq]:
            raise ValueError(f"sequence {seq} is not leased")
        self._busy[seq] = False
        self._last_used[seq] = next(self._clock)


class SequencePool:
    """Leases that wait: an async caller blocks until a sequence is free, in a queue of bounded length."""

    def __init__(self, leases: SequenceLeases, *, max_waiting: int | None = None) -> None:
        self.leases = leases
        self.max_waiting = max_waiting  # None: no bound
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """How many callers wait for a sequence."""
        return len(self._waiters)

    async def acquire(self, context: Sequence[int]) -> Lease:
        """Lease a sequence for context, waiting (first come, first served) while all are leased.

        Raises OverloadedError, without waiting, when all are leased and `max_waiting` callers already wait.
        """
        lease = self.leases.acquire(context)
        if lease is None and self.max_waiting is not None and len(self._waiters) >= self.max_waiting:
            raise OverloadedError(f"all {len(self.leases)} sequences are busy and the queue of {self.max_waiting} "
                                  "waiting requests is full; retry later")
        while lease is None:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # Woken by a release, then cancelled before resuming: pass the release on, or it is lost.
                if waiter.done() and not waiter.cancelled():
                    self._wake_next()
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            lease = self.leases.acquire(context)
        return lease

    def release(self, seq: int) -> None:
        """Give a sequence back and wake the longest waiter."""
        self.leases.release(seq)
        self._wake_next()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
