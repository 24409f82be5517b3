"""The live feed: token origins, UTF-8 pieces, bounded per-page queues, and what a page is sent."""

from __future__ import annotations

import json

import pytest

from proxy.decode.events import PlainEvent, RoundEvent, SwitchEvent
from proxy.observability import live
from proxy.observability.live import (
    ACCEPTED,
    BONUS,
    EVERY_TENANT,
    PLAIN,
    RECOVERED,
    LiveFeed,
    RoundTracker,
    TokenText,
    prompt_preview,
    round_origins,
)

BYTES = {1: b"a", 2: b"\xc3", 3: b"\xa9", 4: b" b", 5: b"\xff", 6: b""}  # 2 + 3 is "é" split across tokens


@pytest.mark.parametrize(("drafted", "accepted", "emitted", "origins"), [
    (4, 4, 5, [ACCEPTED] * 4 + [BONUS]),
    (4, 2, 3, [ACCEPTED, ACCEPTED, RECOVERED]),
    (4, 0, 1, [RECOVERED]),
    (0, 0, 1, [BONUS]),  # nothing drafted: the target's token is all the round adds
    (4, 4, 2, [ACCEPTED, ACCEPTED]),  # cut at max_tokens
    (3, 1, 1, [ACCEPTED]),
])
def test_round_origins(drafted: int, accepted: int, emitted: int, origins: list[str]) -> None:
    assert round_origins(drafted, accepted, emitted) == origins


@pytest.mark.parametrize(("tokens", "texts"), [
    ([1, 2, 3, 4], ["a", "", "é", " b"]),  # the character shows on the token that completes it
    ([5, 1], ["\ufffd", "a"]),  # an invalid byte is replaced, not held
    ([6, 1], ["", "a"]),  # a special token renders as nothing
])
def test_token_text_never_splits_a_character(tokens: list[int], texts: list[str]) -> None:
    text = TokenText(BYTES.__getitem__)
    assert [text(t) for t in tokens] == texts


@pytest.mark.parametrize(("body", "preview"), [
    ({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "Hi"}]}, "Hi"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "image_url"}]}]}, "A"),
    ({"prompt": "def f():"}, "def f():"),
    ({"prompt": ["one", "two"]}, "one"),
    ({"prompt": [1, 2, 3]}, ""),
    ({"prompt": "x" * 400}, "…" + "x" * live.PROMPT_CHARS),
    ({}, ""),
])
def test_prompt_preview(body: dict, preview: str) -> None:
    assert prompt_preview(body) == preview


def _messages(subscription: live.Subscription) -> list[dict]:
    out = []
    while not subscription.queue.empty():
        out.append(json.loads(subscription.queue.get_nowait()))
    return out


async def test_a_page_that_falls_behind_loses_events_for_itself_and_gets_a_snapshot() -> None:
    feed = LiveFeed(queue_events=3)
    slow, fast = feed.subscribe(EVERY_TENANT), feed.subscribe(EVERY_TENANT)
    trace = feed.begin("r1", "route", "chat", {"prompt": "p"}, tenant="")
    for _ in range(10):
        feed.add_tokens(trace, [("a", PLAIN)], None)
        _messages(fast)  # this page keeps up
    assert slow.queue.qsize() == 3 and slow.behind
    assert not fast.behind
    snapshot = feed.catch_up(slow)
    assert slow.queue.empty() and not slow.behind
    assert snapshot["type"] == "snapshot"
    assert [len(r["tokens"]) for r in snapshot["requests"]] == [10]
    feed.add_tokens(trace, [("b", PLAIN)], None)
    assert [m["type"] for m in _messages(slow)] == ["tokens"]  # back to events after its snapshot


TENANTS = {"ra": "digest-a", "rb": "digest-b", "rn": ""}  # request id -> its tenant ("" for no key)


@pytest.mark.parametrize(("reader", "sees"), [
    ("digest-a", ["ra"]),
    ("digest-b", ["rb"]),
    ("", ["rn"]),  # a reader without a key: the keyless requests
    ("digest-c", []),
    (EVERY_TENANT, ["ra", "rb", "rn"]),
])
async def test_a_page_is_sent_only_its_readers_tenants_requests(reader: str | None, sees: list[str]) -> None:
    feed = LiveFeed()
    page = feed.subscribe(reader)
    for request_id, tenant in TENANTS.items():
        trace = feed.begin(request_id, "route", "chat", {"prompt": f"prompt {request_id}"}, tenant=tenant)
        feed.set_mode(trace, "passthrough")
        feed.add_tokens(trace, [("a", PLAIN)], None)
        feed.switch(trace, "why")
        feed.end(trace, {"status": 200})
    shown = _messages(page)
    assert sorted({m.get("id") or m["request"]["id"] for m in shown}) == sees
    assert len(shown) == 5 * len(sees)  # begin, mode, tokens, switch, end
    assert [r["id"] for r in feed.snapshot(reader)["requests"]] == sees
    assert [r["id"] for r in feed.catch_up(page)["requests"]] == sees  # a page that fell behind, likewise


async def test_a_page_that_goes_away_frees_its_queue() -> None:
    feed = LiveFeed()
    subscription = feed.subscribe(EVERY_TENANT)
    assert feed.subscribers == 1
    feed.unsubscribe(subscription)
    feed.unsubscribe(subscription)  # twice is harmless (a disconnect and a shutdown)
    assert feed.subscribers == 0
    feed.begin("r1", "route", "chat", {}, tenant="")
    assert subscription.queue.empty()


async def test_close_ends_every_stream_even_a_full_one() -> None:
    feed = LiveFeed(queue_events=1)
    subscription = feed.subscribe(EVERY_TENANT)
    feed.begin("r1", "route", "chat", {}, tenant="")
    feed.close()
    assert subscription.queue.get_nowait() is None


async def test_only_the_recent_requests_are_kept() -> None:
    feed = LiveFeed(recent=3)
    for i in range(5):
        feed.begin(f"r{i}", "route", "chat", {}, tenant="")
    assert [r["id"] for r in feed.snapshot(EVERY_TENANT)["requests"]] == ["r2", "r3", "r4"]
    assert feed.get("r0") is None


async def test_tokens_kept_per_request_are_bounded_but_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "MAX_TOKENS_KEPT", 5)
    feed = LiveFeed()
    trace = feed.begin("r1", "route", "chat", {}, tenant="")
    for _ in range(4):
        feed.add_tokens(trace, [("a", PLAIN), ("b", PLAIN)], None)
    assert len(trace.tokens) == 5 and trace.token_count == 8


async def test_round_tracker_shows_a_generation_round_by_round() -> None:
    clock = iter([100.0, 101.0, 102.0, 103.0, 104.0, 105.0]).__next__
    feed = LiveFeed(clock=clock)
    page = feed.subscribe(EVERY_TENANT)
    trace = feed.begin("r1", "route", "chat", {"prompt": "p"}, tenant="")  # t = 100
    track = RoundTracker(feed, trace, BYTES.__getitem__)
    track(RoundEvent(request_id="r1", route="route", index=0, k=3, drafted=(1, 2, 1), accepted=2, emitted=(1, 2, 3),
                     draft_seconds=0.010, verify_seconds=0.030))  # t = 101
    track(RoundEvent(request_id="r1", route="route", index=1, k=2, drafted=(4, 4), accepted=2, emitted=(4, 4, 1),
                     draft_seconds=0.005, verify_seconds=0.020))  # t = 102
    track(SwitchEvent("r1", "route", "K = 0 pays better"))
    track(PlainEvent("r1", "route", (4, 1), 0.01))  # t = 103
    feed.end(trace, {"mode": "speculative", "status": 200})  # t = 104
    assert [(text, origin, index) for text, origin, index in trace.tokens] == [
        ("a", ACCEPTED, 0), ("", ACCEPTED, 0), ("é", RECOVERED, 0),
        (" b", ACCEPTED, 1), (" b", ACCEPTED, 1), ("a", BONUS, 1),
        (" b", PLAIN, None), ("a", PLAIN, None)]
    assert trace.rounds[0] == {"index": 0, "k": 3, "drafted": 3, "accepted": 2, "emitted": 3,
                               "draft_ms": 10.0, "verify_ms": 30.0, "source": "model", "candidates": 1,
                               "drafted_ahead": False}
    assert trace.rate() == pytest.approx(5 / 2)  # the first batch (3 tokens at t = 101) is not counted
    assert trace.switched == "K = 0 pays better"
    assert trace.outcome == {"mode": "speculative", "status": 200, "ms": 4000.0}
    types = [m["type"] for m in _messages(page)]
    assert types == ["begin", "tokens", "tokens", "switch", "tokens", "end"]
