"""A request's speculation figures: the decoding rate beside the route's plain rate leaves the prefill out."""

import pytest

from proxy.decode.events import PlainEvent, RoundEvent
from proxy.observability.request_stats import RequestStats


def _round(index: int, emitted: int, seconds: float, *, prefill: bool | None = None) -> RoundEvent:
    return RoundEvent(request_id="r", route="route", index=index, k=4, drafted=(1,) * 4, accepted=3,
                      emitted=(1,) * emitted, draft_seconds=0.0, verify_seconds=seconds, prefill=prefill)


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


def test_tokens_the_model_led_a_prediction_with_count_as_the_models():
    stats = RequestStats()
    # Drafted: 3 tokens of the model's edit, then 9 of the prediction; the target took the edit and 5 of the copy.
    stats(RoundEvent(request_id="r", route="route", index=1, k=12, drafted=(1,) * 12, accepted=8, emitted=(1,) * 9,
                     draft_seconds=0.0, verify_seconds=0.1, source="prediction", led=3, checked=True))
    stats(RoundEvent(request_id="r", route="route", index=2, k=12, drafted=(1,) * 4, accepted=1, emitted=(1,) * 2,
                     draft_seconds=0.0, verify_seconds=0.1, source="prediction", led=2))  # edit cut
    assert stats.by_source == {"prediction": [2, 11, 5], "model": [0, 5, 4]}
    assert stats.round_trace == [(12, 8, "prediction", 4), (4, 1, "prediction", 2)]  # the model's steps: + the check
    assert (stats.rounds, stats.drafted, stats.accepted) == (2, 16, 9)
