"""A request's speculation figures: the decoding rate beside the route's plain rate leaves the prefill out."""

import pytest

from proxy.decode.events import PlainEvent, RoundEvent
from proxy.observability.request_stats import RequestStats


def _round(index: int, emitted: int, seconds: float, *, prefill: bool | None = None) -> RoundEvent:
    return RoundEvent("r", "route", index, 4, (1,) * 4, 3, (1,) * emitted, 0.0, seconds, prefill=prefill)


def test_the_step_that_paid_the_prefill_is_not_in_the_decoding_rate():
    stats = RequestStats(plain_rate=lambda: 10.0)
    stats(PlainEvent("r", "route", (1,) * 4, 2.0, prefill=True))  # a long prompt: 4 tokens in 2 s
    stats(_round(0, 5, 0.5, prefill=False))
    stats(PlainEvent("r", "route", (1,) * 5, 0.5))
    speed = stats.speed()
    assert speed["tokens_per_second"] == pytest.approx(10.0)
    assert speed["vs_plain"] == pytest.approx(1.0)


def test_a_first_round_at_the_prompt_pays_the_prefill():
    stats = RequestStats(plain_rate=lambda: 10.0)
    stats(_round(0, 5, 3.0))  # no prefill flag: a first round opened the request
    stats(_round(1, 5, 0.25))
    assert stats.speed()["vs_plain"] == pytest.approx(2.0)


def test_an_answer_within_its_first_step_has_no_decoding_rate():
    stats = RequestStats(plain_rate=lambda: 10.0)
    stats(PlainEvent("r", "route", (1,) * 3, 1.0, prefill=True))
    assert stats.speed() == {"tokens_per_second": None, "plain_tokens_per_second": 10.0, "vs_plain": None}
