"""`bench overhead`'s accounting: the proxy thread's CPU time split by stage, and the figures made from it.

Each stage's time is exclusive (a stage entered inside another pauses the outer one), so the stages and
"other" add up to the thread's total. Coroutines are timed step by step: only while their own code runs,
never while another task has the thread. Patches are installed only while the bench runs.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# The stages, in the order a round meets them; "other" is the rest of the proxy thread's time.
DRAFT = "draft"
UPSTREAM = "upstream_call"
PARSE = "parse"
SUPPORT = "support"
SAMPLING = "sampling"
EVENTS = "events"
TEXT = "text"
EMIT = "emit"
STAGES = (DRAFT, UPSTREAM, PARSE, SUPPORT, SAMPLING, EVENTS, TEXT, EMIT)
OTHER = "other"
OTHER_MEANS = ("the HTTP server and client's parsing and socket callbacks (in the event loop, outside any "
               "coroutine step), request set-up (body parsing, admission, the prompt's tokenize call, the session), "
               "the round loop's own bookkeeping, logs, and this bench's loop monitor")


@dataclass
class StageClock:
    """Exclusive thread CPU time per stage, for one thread (calls from any other thread are not counted)."""

    thread: int = 0
    totals: dict[str, float] = field(default_factory=dict)
    _stack: list[str] = field(default_factory=list)
    _mark: float = 0.0

    def counts(self) -> bool:
        """Whether the calling thread is the one measured."""
        return threading.get_ident() == self.thread

    def enter(self, stage: str) -> None:
        """Charge the time so far to the stage running, and start `stage`."""
        now = time.thread_time()
        if self._stack:
            self.totals[self._stack[-1]] = self.totals.get(self._stack[-1], 0.0) + now - self._mark
        self._stack.append(stage)
        self._mark = now

    def leave(self) -> None:
        """Charge the time since the last mark to the innermost stage, and end it."""
        now = time.thread_time()
        stage = self._stack.pop()
        self.totals[stage] = self.totals.get(stage, 0.0) + now - self._mark
        self._mark = now

    def reset(self) -> None:
        """Forget the totals (between configurations)."""
        self.totals = {}


class _Stepped:
    """An awaitable that runs a coroutine and charges each of its steps to one stage."""

    def __init__(self, clock: StageClock, stage: str, coroutine: Awaitable[Any]) -> None:
        self._clock, self._stage, self._coroutine = clock, stage, coroutine

    def __await__(self) -> Generator[Any, Any, Any]:
        inner = self._coroutine.__await__()
        value: Any = None
        thrown: BaseException | None = None
        while True:
            self._clock.enter(self._stage)
            try:
                yielded = inner.send(value) if thrown is None else inner.throw(thrown)
            except StopIteration as stop:
                return stop.value
            finally:
                self._clock.leave()
            try:
                value, thrown = (yield yielded), None
            except GeneratorExit:
                inner.close()
                raise
            except BaseException as exc:  # cancellation included: handed to the coroutine, as `await` would
                value, thrown = None, exc


def timed(clock: StageClock, stage: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` charging its exclusive time to `stage` when called on the measured thread."""
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not clock.counts():
            return function(*args, **kwargs)
        clock.enter(stage)
        try:
            return function(*args, **kwargs)
        finally:
            clock.leave()
    return call


def timed_async(clock: StageClock, stage: str, function: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """A coroutine function charging its steps to `stage` when they run on the measured thread."""
    @functools.wraps(function)
    async def call(*args: Any, **kwargs: Any) -> Any:
        if not clock.counts():
            return await function(*args, **kwargs)
        return await _Stepped(clock, stage, function(*args, **kwargs))
    return call


@contextlib.contextmanager
def patched(clock: StageClock, targets: Sequence[tuple[object, str, str, bool]]) -> Iterator[None]:
    """Wrap each (owner, attribute, stage, is_async) for the duration; the originals are put back after."""
    saved = [(owner, name, vars(owner)[name]) for owner, name, _, _ in targets]  # own attributes only
    try:
        for (owner, name, stage, is_async), (_, _, original) in zip(targets, saved, strict=True):
            wrap = timed_async if is_async else timed
            setattr(owner, name, wrap(clock, stage, original))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def proxy_stages() -> list[tuple[object, str, str, bool]]:
    """The proxy's functions each stage is made of (imported here: nothing is patched at import time)."""
    from proxy.decode import events, verify
    from proxy.drafting import llama, lookup
    from proxy.targets import sglang
    from proxy.wire import emit, textstream

    return [
        (lookup.LookupDrafter, "propose", DRAFT, True), (lookup.SuffixDrafter, "propose", DRAFT, True),
        (llama.LlamaDrafter, "propose", DRAFT, True),
        (sglang.SGLangTarget, "_score_top_n", UPSTREAM, True),
        (sglang, "parse_verification", PARSE, False), (sglang, "support_from_top_n", SUPPORT, False),
        (verify, "verify_on_support", SAMPLING, False),
        (verify, "verify_candidates", SAMPLING, False), (events.Publisher, "__call__", EVENTS, False),
        (textstream.TextStream, "push", TEXT, False), (textstream.TextStream, "close", TEXT, False),
        (emit.ResponseShape, "chunk", EMIT, False), (emit, "_write_chunk", EMIT, True),
    ]


# -- figures: pure functions of numbers -------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def window_costs(samples: Sequence[tuple[float, int]], least_rounds: int) -> list[float]:
    """CPU seconds per round in consecutive windows of at least `least_rounds` rounds, from (cpu seconds, rounds
    so far) samples in time order; a last window with too few rounds is dropped."""
    costs: list[float] = []
    if not samples:
        return costs
    start_cpu, start_rounds = samples[0]
    for cpu, rounds in samples[1:]:
        if rounds - start_rounds >= least_rounds:
            costs.append((cpu - start_cpu) / (rounds - start_rounds))
            start_cpu, start_rounds = cpu, rounds
    return costs


def stage_split(totals: dict[str, float], cpu_seconds: float) -> dict[str, float]:
    """Every stage's seconds (0 where unused) and "other": what the thread spent outside them."""
    split = {stage: totals.get(stage, 0.0) for stage in STAGES}
    split[OTHER] = max(cpu_seconds - sum(split.values()), 0.0)
    return split


def per_round_ms(split: dict[str, float], rounds: int) -> dict[str, float | None]:
    """Each stage's milliseconds per round (None without rounds)."""
    return {stage: (seconds * 1000 / rounds if rounds else None) for stage, seconds in split.items()}
