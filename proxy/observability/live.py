"""The live view's feed: each recent request's tokens by origin and its rounds, fanned out to open pages.

Where an emitted token came from (a speculative round emits its accepted drafts, then one target token):
- accepted: a draft token the target accepted;
- recovered: the target's token in place of the first rejected draft (a sample of the residual);
- bonus: the target's token after every draft was accepted (or when nothing was drafted);
- plain: decoded by the target alone, after the generation stopped speculating;
- passthrough: text of a request forwarded untouched (one piece per streamed chunk).
Each page reads as one reader: a tenant (a digest of an API key, "" for requests without one) sees only that
tenant's requests; EVERY_TENANT (the admin token's reader) sees them all. Each page reads through a bounded
queue. A page that falls behind loses events for itself only: once its queue overflows, it gets a fresh
snapshot instead of what it missed.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.decode.events import Event, PlainEvent, RoundEvent, SwitchEvent

ACCEPTED, RECOVERED, BONUS, PLAIN, PASSTHROUGH = "accepted", "recovered", "bonus", "plain", "passthrough"
RECENT_REQUESTS = 20  # requests a page shows, and a new page is sent
QUEUE_EVENTS = 512  # events waiting for one page before it is marked behind
MAX_TOKENS_KEPT = 4096  # per request: a longer generation is shown up to here (its counts go on)
MAX_ROUNDS_KEPT = 1024  # per request, likewise
PROMPT_CHARS = 300  # how much of the prompt a page shows
TENANT_CHARS = 8  # of a tenant's digest, shown to tell tenants apart on the admin's page
EVERY_TENANT = None  # the reader who sees every tenant's requests


def round_origins(drafted: int, accepted: int, emitted: int) -> list[str]:
    """The origin of each token a round emitted (the round may be cut short at max_tokens)."""
    last = BONUS if accepted >= drafted else RECOVERED
    return [ACCEPTED if i < accepted else last for i in range(emitted)]


def prompt_preview(body: dict[str, Any]) -> str:
    """The end of the prompt: the last message's text, or the completion prompt."""
    text: Any = body.get("prompt")
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        text = messages[-1].get("content")
        if isinstance(text, list):  # content parts: keep the text ones
            text = " ".join(p.get("text", "") for p in text if isinstance(p, dict) and isinstance(p.get("text"), str))
    if isinstance(text, list) and text and isinstance(text[0], str):
        text = text[0]
    if not isinstance(text, str):
        return ""
    return text if len(text) <= PROMPT_CHARS else "…" + text[-PROMPT_CHARS:]


@dataclass(eq=False)  # identity: each page is its own
class Subscription:
    """One open page: whose requests it sees, its bounded queue, and whether it has missed events since its last
    snapshot."""

    reader: str | None  # a tenant, or EVERY_TENANT
    queue: asyncio.Queue[str | None]
    behind: bool = False


@dataclass
class Trace:
    """What a page knows of one request."""

    id: str
    route: str
    kind: str
    prompt: str
    tenant: str  # whose request: a digest of its API key, "" without one
    started: float  # wall clock, seconds
    mode: str | None = None
    tokens: list[tuple[str, str, int | None]] = field(default_factory=list)  # (text, origin, round)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    token_count: int = 0
    first_batch: int = 0  # tokens that came with the first batch (excluded from the decoding rate)
    first_token_at: float | None = None
    last_token_at: float | None = None
    switched: str | None = None  # why the generation stopped speculating
    outcome: dict[str, Any] | None = None

    def rate(self) -> float | None:
        """Tokens per second after the first batch, as the route measures its plain rate (prefill excluded)."""
        if self.first_token_at is None or self.last_token_at is None or self.last_token_at <= self.first_token_at:
            return None
        return (self.token_count - self.first_batch) / (self.last_token_at - self.first_token_at)

    def as_dict(self) -> dict[str, Any]:
        """The page's view of the request."""
        return {"id": self.id, "route": self.route, "kind": self.kind, "prompt": self.prompt,
                "tenant": self.tenant[:TENANT_CHARS], "started": self.started,
                "mode": self.mode, "tokens": self.tokens, "rounds": self.rounds, "token_count": self.token_count,
                "rate": self.rate(), "switched": self.switched, "outcome": self.outcome}


def shown_to(reader: str | None, trace: Trace) -> bool:
    """Whether a page of `reader` is shown `trace`: its own tenant's requests, or every one to EVERY_TENANT."""
    return reader is EVERY_TENANT or reader == trace.tenant


class LiveFeed:
    """The recent requests, and the pages reading about them."""

    def __init__(self, recent: int = RECENT_REQUESTS, queue_events: int = QUEUE_EVENTS,
                 clock: Callable[[], float] = time.time) -> None:
        self._recent = recent
        self._queue_events = queue_events
        self._clock = clock
        self._traces: OrderedDict[str, Trace] = OrderedDict()
        self._subscriptions: set[Subscription] = set()

    @property
    def subscribers(self) -> int:
        """How many pages are open."""
        return len(self._subscriptions)

    def subscribe(self, reader: str | None) -> Subscription:
        """A new page's queue; the page sees `reader`'s requests (every tenant's for EVERY_TENANT)."""
        subscription = Subscription(reader, asyncio.Queue(self._queue_events))
        self._subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """A page went away: forget its queue."""
        self._subscriptions.discard(subscription)

    def close(self) -> None:
        """Tell every page's stream to end (at shutdown)."""
        for subscription in self._subscriptions:
            while not subscription.queue.empty():
                subscription.queue.get_nowait()
            subscription.queue.put_nowait(None)

    def snapshot(self, reader: str | None) -> dict[str, Any]:
        """Everything a page of `reader` needs to start over."""
        return {"type": "snapshot", "now": self._clock(), "recent": self._recent,
                "requests": [t.as_dict() for t in self._traces.values() if shown_to(reader, t)]}

    def catch_up(self, subscription: Subscription) -> dict[str, Any]:
        """A page that fell behind: empty its queue; the snapshot returned replaces what it missed."""
        while not subscription.queue.empty():
            subscription.queue.get_nowait()
        subscription.behind = False
        return self.snapshot(subscription.reader)

    def _send(self, trace: Trace, message: dict[str, Any]) -> None:
        """`message` about `trace`, to the pages that see it."""
        readers = [s for s in self._subscriptions if shown_to(s.reader, trace)]
        if not readers:
            return
        data = json.dumps(message, separators=(",", ":"))  # encoded once for every page
        for subscription in readers:
            if subscription.behind:
                continue  # its snapshot will cover this
            try:
                subscription.queue.put_nowait(data)
            except asyncio.QueueFull:
                subscription.behind = True  # never wait for a page: generation must not slow down

    def get(self, request_id: str) -> Trace | None:
        """A recent request's trace."""
        return self._traces.get(request_id)

    def begin(self, request_id: str, route: str, kind: str, body: dict[str, Any], *, tenant: str) -> Trace:
        """A new generation request of `tenant` (the oldest one shown makes room)."""
        trace = Trace(request_id, route, kind, prompt_preview(body), tenant, self._clock())
        self._traces[request_id] = trace
        while len(self._traces) > self._recent:
            self._traces.popitem(last=False)
        self._send(trace, {"type": "begin", "request": trace.as_dict()})
        return trace

    def set_mode(self, trace: Trace, mode: str) -> None:
        """The request is served speculatively or passes through."""
        trace.mode = mode
        self._send(trace, {"type": "mode", "id": trace.id, "mode": mode})

    def add_tokens(self, trace: Trace, pieces: Iterable[tuple[str, str]], round_info: dict[str, Any] | None) -> None:
        """Tokens (text, origin) emitted together, and the round that emitted them if any."""
        now = self._clock()
        index = None if round_info is None else round_info["index"]
        new = [(text, origin, index) for text, origin in pieces]
        if trace.first_token_at is None and new:
            trace.first_token_at, trace.first_batch = now, len(new)
        if new:
            trace.last_token_at = now
        trace.token_count += len(new)
        kept = new[: max(0, MAX_TOKENS_KEPT - len(trace.tokens))]
        trace.tokens.extend(kept)
        if round_info is not None and len(trace.rounds) < MAX_ROUNDS_KEPT:
            trace.rounds.append(round_info)
        self._send(trace, {"type": "tokens", "id": trace.id, "tokens": kept, "round": round_info,
                           "token_count": trace.token_count, "rate": trace.rate()})

    def switch(self, trace: Trace, reason: str) -> None:
        """The generation continues by plain decoding."""
        trace.switched = reason
        self._send(trace, {"type": "switch", "id": trace.id, "reason": reason})

    def end(self, trace: Trace, outcome: dict[str, Any]) -> None:
        """The request is over (served, failed or abandoned by its client)."""
        trace.outcome = {**outcome, "ms": round((self._clock() - trace.started) * 1000, 1)}
        if outcome.get("mode"):
            trace.mode = outcome["mode"]
        self._send(trace, {"type": "end", "id": trace.id, "mode": trace.mode, "outcome": trace.outcome,
                           "rate": trace.rate()})


class TokenText:
    """Token ids to the text each adds, never splitting a UTF-8 character (its bytes show on the token that ends it)."""

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> str:
        return self._decoder.decode(self._token_bytes(token))


class RoundTracker:
    """A subscriber of one generation's events that shows them on the live feed."""

    def __init__(self, feed: LiveFeed, trace: Trace, token_bytes: Callable[[int], bytes]) -> None:
        self._feed = feed
        self._trace = trace
        self._text = TokenText(token_bytes)

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundEvent):
            origins = round_origins(len(event.drafted), event.accepted, len(event.emitted))
            info = {"index": event.index, "k": event.k, "drafted": len(event.drafted), "accepted": event.accepted,
                    "emitted": len(event.emitted), "draft_ms": round(event.draft_seconds * 1000, 2),
                    "verify_ms": round(event.verify_seconds * 1000, 2), "source": event.source,
                    "candidates": event.candidates, "drafted_ahead": event.drafted_ahead}
            self._feed.add_tokens(self._trace, [(self._text(t), o) for t, o in zip(event.emitted, origins)], info)
        elif isinstance(event, PlainEvent):
            self._feed.add_tokens(self._trace, [(self._text(t), PLAIN) for t in event.tokens], None)
        elif isinstance(event, SwitchEvent):
            self._feed.switch(self._trace, event.reason)
