"""A route's start-up calibration against the fake SGLang: the costs it seeds, and what it leaves untouched."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.drafting.base import Draft, DraftPlan
from proxy.server.app import open_resources
from proxy.server.calibrate import calibrate
from proxy.server.cli import check_report
from proxy.server.cores import with_draft_threads
from tests.fakes.drafter import ToyDrafter
from tests.fakes.sglang import fake_sglang_app
from tests.fakes.toy_model import ToyModel

DRAFT_SECONDS = 0.003  # what the toy draft says each token took


class TimedToyDrafter(ToyDrafter):
    """The toy draft, timing its tokens as the llama.cpp drafter does: each draft's tokens took the next time given."""

    def __init__(self, seconds: Iterator[float]) -> None:
        super().__init__(ToyModel(seed=3))
        self.seconds = seconds

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        return replace(await super().propose(context, plan), seconds_per_token=next(self.seconds))


def timed_toy(options: Any) -> TimedToyDrafter:
    """The draft loader: the timed toy draft, whatever file the route names."""
    return TimedToyDrafter(itertools.repeat(DRAFT_SECONDS))


@pytest.fixture
async def fake_url() -> AsyncIterator[str]:
    server = TestServer(fake_sglang_app(ToyModel()))
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


def config(url: str, tmp_path: Path, kind: str, **fallback: Any) -> Any:
    (tmp_path / "toy.gguf").write_bytes(b"")
    return parse_config({"routes": [{"name": "toy", "upstream": {"url": url},
                                     "draft": {"model": str(tmp_path / "toy.gguf"), "kind": kind, "k_max": 32},
                                     "speculation": {"k": 4}, "fallback": {"k_max": 8, **fallback}}]})


@pytest.mark.parametrize(("kind", "sizes", "draft_seconds"), [
    ("model", (1, 4, 8), DRAFT_SECONDS),  # 1, speculation.k and fallback.k_max
    ("hybrid", (1, 4, 8, 32), DRAFT_SECONDS),  # ... and the longest lookup path
    ("suffix", (1, 4, 8, 32), None),  # no model drafts
])
async def test_a_route_knows_its_costs_before_its_first_request(fake_url: str, tmp_path: Path, kind: str,
                                                                sizes: tuple[int, ...], draft_seconds: float | None
                                                                ) -> None:
    resources = await open_resources(config(fake_url, tmp_path, kind), timed_toy)
    try:
        runtime = resources.runtimes["toy"]
        calibration, costs = runtime.controller.calibration, runtime.controller.costs
        assert calibration is not None
        assert tuple(k for k, _ in calibration.verify_seconds) == sizes
        assert calibration.draft_seconds_per_token == draft_seconds == costs.draft_per_token.value
        assert costs.plain_rate == pytest.approx(1 / calibration.plain_seconds_per_token)
        assert {k: costs.verify_time(k) for k in sizes} == dict(calibration.verify_seconds)
        # Acceptance is the workload's, left for requests; the calibration's text joins no history.
        assert costs.alpha.samples == 0 and costs.lookup_alpha.samples == 0 and not costs.recent
        history = getattr(runtime.drafter, "history", None)
        assert history is None or history.tokens == 0
    finally:
        await resources.close()


async def test_calibration_can_be_turned_off(fake_url: str, tmp_path: Path) -> None:
    resources = await open_resources(config(fake_url, tmp_path, "hybrid", calibrate=False),
                                     timed_toy)
    try:
        controller = resources.runtimes["toy"].controller
        assert controller.calibration is None and controller.costs.plain_rate is None
        assert not controller.costs.verify_by_k
    finally:
        await resources.close()


async def test_check_says_where_the_draft_shares_cores_and_what_it_timed(fake_url: str, tmp_path: Path) -> None:
    resolved, drafts = with_draft_threads(config(fake_url, tmp_path, "hybrid"), 2)  # the fake is on loopback
    lines, failures = await check_report(resolved, timed_toy, drafts)
    found = dict(line.split("\t")[1:] for line in lines)
    assert failures == 0
    assert found["cores"].startswith("the draft model (") and "shares this machine's 2 cores" in found["cores"]
    assert "they take turns, the draft computing with 2 threads" in found["cores"]
    assert found["costs at start-up"].startswith("plain ") and "k=32" in found["costs at start-up"]
    assert f"draft {DRAFT_SECONDS * 1000} ms a token, " in found["costs at start-up"]
    assert found["costs at start-up"].endswith(" ms a token read")
    # The fake answers in microseconds: a draft at 3 ms a token could never pay, and the route knows it already.
    assert found["model draft"].startswith("even accepting every draft, speculation predicted")


class ScriptedTarget:
    """A target that answers at once, while each call moves a pinned clock on by its scripted duration."""

    order = ()

    def __init__(self, durations: dict[str, list[float]]) -> None:
        self.durations = durations
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def generate(self, context: Sequence[int], n: int, params: Any, seed: int) -> list[int]:
        if n > 1:  # the prefill's single token is not timed
            self.now += self.durations["plain"].pop(0) * n
        return [7] * n

    async def score(self, context: Sequence[int], draft: Draft, plan: Any) -> None:
        self.now += self.durations[f"verify {len(draft.tokens)}"].pop(0)


async def test_each_cost_is_the_median_of_its_timings(tmp_path: Path) -> None:
    route = config("http://127.0.0.1:1", tmp_path, "model").routes[0]
    target = ScriptedTarget({"plain": [0.09, 0.07, 0.10], "verify 1": [0.12, 0.13, 0.5],
                             "verify 4": [0.2, 0.31, 0.3], "verify 8": [0.6, 0.55, 0.58]})
    drafter = TimedToyDrafter(iter([0.5, 0.004, 0.003, 0.01]))  # the first draft read the context first
    calibration = await calibrate(route, target, drafter, clock=target.clock)
    # One fast or slow call among three moves nothing: neither the first timing nor the mean is kept.
    assert calibration.plain_seconds_per_token == pytest.approx(0.09)
    assert dict(calibration.verify_seconds) == pytest.approx({1: 0.13, 4: 0.3, 8: 0.58})
    assert calibration.draft_seconds_per_token == 0.004


class ClockedToyDrafter(TimedToyDrafter):
    """The timed toy draft on a pinned clock: each draft moves it by its tokens' time, the first also by a reading."""

    def __init__(self, target: ScriptedTarget, reading: float) -> None:
        super().__init__(itertools.repeat(DRAFT_SECONDS))
        self.target, self.reading = target, reading

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        draft = await super().propose(context, plan)
        self.target.now += self.reading + DRAFT_SECONDS * len(draft.tokens)
        self.reading = 0.0  # the context is read once
        return draft


async def test_the_draft_models_reading_is_timed_apart_from_its_drafting(tmp_path: Path) -> None:
    route = config("http://127.0.0.1:1", tmp_path, "model").routes[0]
    target = ScriptedTarget({"plain": [0.09] * 3, "verify 1": [0.1] * 3, "verify 4": [0.2] * 3, "verify 8": [0.5] * 3})
    calibration = await calibrate(route, target, ClockedToyDrafter(target, reading=0.6), clock=target.clock)
    assert calibration.draft_seconds_per_token == DRAFT_SECONDS
    assert calibration.draft_read_seconds_per_token == pytest.approx(0.6 / calibration.context)
