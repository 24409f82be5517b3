"""The cyclic garbage collector tuned for a server whose heap is mostly what start-up built.

Start-up leaves tens of thousands of long-lived objects (the tokenizer's vocabulary, the app, the routes). Every
full collection walks them all again, holding the event loop: 132 ms once in a 25-second run of 64 streams. And a
round keeps containers of the context's tokens alive across the young generation's collections, which then walk
every token in them: at 64 streams, 161 young collections took 0.48 s of the proxy's CPU in the same run. Frozen
after start-up, the start-up heap is out of the collector's sight; collected every YOUNG_THRESHOLD net allocations
instead of Python's 700, the round's containers have mostly been freed by the time the young generation is walked.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 10_000  # net allocations between the young generation's collections (Python's default: 700)


@contextmanager
def settled() -> Iterator[None]:
    """Freeze what exists now (its garbage freed first) and collect the young generation less often; undone after."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
