"""`speculoos bench overhead` without a model: its arguments, its fake target's answers, and its accounting."""

from __future__ import annotations

import argparse
import asyncio
import gc
import threading

import numpy as np
import pytest

from proxy.bench import cli, overhead, overhead_stages
from proxy.bench.client import BenchError
from proxy.bench.overhead_load import request_body
from proxy.bench.overhead_proxy import CollectorClock
from proxy.bench.overhead_target import FakeState, copy_next, plain_answer, verification_answer
from proxy.targets.sglang import parse_verification

VOCAB = 151_936  # Qwen2.5's
TOP_N = 20


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speculoos")
    cli.add_cli(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", "overhead", *argv])


def state(acceptance: float, seed: int = 0) -> FakeState:
    return FakeState(acceptance, VOCAB, np.random.default_rng(seed), lambda text, special: [], 32768)


# -- arguments --------------------------------------------------------------------------------------------------

def test_defaults_make_the_full_grid() -> None:
    grid = overhead.parse_grid(parse())
    assert (grid.ks, grid.streams, grid.temperatures, grid.drafts) == ((1, 4, 8, 16, 32), (1, 8, 64), (0.0, 0.7),
                                                                       ("lookup", "model"))
    assert len(overhead.configurations(grid, "lookup")) == 5 * 3 * 2


def test_pin_makes_each_request_pin_k() -> None:
    grid = overhead.parse_grid(parse("--pin", "--ks", "8", "--streams", "1", "--temperatures", "0.7"))
    (configuration,) = overhead.configurations(grid, "model")
    assert configuration.pinned and request_body("prompt", configuration, 1)["speculoos"] == {"k": 8}
    (unpinned,) = overhead.configurations(overhead.parse_grid(parse("--ks", "8", "--streams", "1",
                                                                    "--temperatures", "0")), "lookup")
    assert "speculoos" not in request_body("prompt", unpinned, 1)


@pytest.mark.parametrize(("argv", "message"), [
    (["--ks", "0"], "--ks: each K must lie in 1..32"),
    (["--ks", "33"], "--ks: each K must lie in 1..32"),
    (["--ks", "x"], "--ks: invalid literal"),
    (["--streams", "65"], "--streams: each must lie in 1..64"),
    (["--temperatures", "-1"], "--temperatures: each must lie in 0..2"),
    (["--drafts", "hybrid"], "--drafts: hybrid; choose from lookup, model"),
    (["--drafts", ","], "--drafts: none given"),
    (["--contexts", "8"], "--contexts: each must be at least 16 tokens"),
    (["--requests", "0"], "--requests and --max-tokens must be positive"),
    (["--acceptance", "1.5"], "--acceptance must lie in 0..1"),
])
def test_bad_arguments_are_one_line_and_exit_1(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(*argv)
    with pytest.raises(BenchError, match=message.replace(".", r"\.")):
        overhead.parse_grid(args)
    assert args.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("speculoos bench overhead: ") and err.count("\n") == 1


# -- the fake target --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 4, 8, 16, 32])
def test_verification_answers_parse_with_the_proxys_parser(k: int) -> None:
    fake, rng = state(0.5, seed=k), np.random.default_rng(k)
    context = rng.integers(VOCAB, size=50).tolist()
    drafts = rng.integers(VOCAB, size=k).tolist()
    answer = verification_answer(context + drafts, len(context) - 1, TOP_N, fake)
    verification = parse_verification(answer, drafts, context[-1], top_n=TOP_N, vocab_size=VOCAB)
    assert len(verification.positions) == k + 1
    assert [p.token_id for p in verification.positions] == [*drafts, None]
    assert all(p.top_ids.size == TOP_N for p in verification.positions)
    assert verification.bonus_token == answer["output_ids"][0]


@pytest.mark.parametrize("acceptance", [0.0, 0.3, 0.8, 1.0])
def test_the_draft_is_on_top_as_often_as_configured(acceptance: float) -> None:
    fake, rng = state(acceptance, seed=7), np.random.default_rng(7)
    on_top = total = 0
    for _ in range(300):
        context, drafts = rng.integers(VOCAB, size=20).tolist(), rng.integers(VOCAB, size=8).tolist()
        verification = parse_verification(verification_answer(context + drafts, 19, TOP_N, fake), drafts,
                                          context[-1], top_n=TOP_N, vocab_size=VOCAB)
        on_top += sum(int(p.top_ids[np.argmax(p.top_logprobs)]) == d
                      for p, d in zip(verification.positions, drafts))
        total += len(drafts)
    assert on_top / total == pytest.approx(acceptance, abs=0.03)


def test_the_alignment_probe_sees_current_sglang() -> None:
    answer = verification_answer([5, 6, 7, 8], 2, 0, state(1.0))  # the probe: start L - 2, no top log-probs
    entries = answer["meta_info"]["input_token_logprobs"]
    assert len(entries) == 2 and entries[0][0] is None and "input_top_logprobs" not in answer["meta_info"]


def test_plain_answers_continue_a_copy() -> None:
    copy = [10, 11, 12, 13, 14, 15]
    assert copy_next([*copy, 99, 10, 11], 3, np.random.default_rng(0), VOCAB) == [12, 13, 14]
    answer = plain_answer([*copy, 99, 10, 11], 4, state(1.0))
    assert answer["output_ids"] == [12, 13, 14, 15]
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


# -- accounting -------------------------------------------------------------------------------------------------

class FakeClock:
    """thread_time, advanced by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nested_stages_are_exclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClock()
    monkeypatch.setattr(overhead_stages.time, "thread_time", fake)
    clock = overhead_stages.StageClock(thread=threading.get_ident())

    def inner() -> None:
        fake.now += 2.0

    def outer() -> None:
        fake.now += 1.0
        overhead_stages.timed(clock, "inner", inner)()
        fake.now += 3.0

    overhead_stages.timed(clock, "outer", outer)()
    assert clock.totals == {"outer": 4.0, "inner": 2.0}


def test_a_coroutine_is_charged_only_for_its_own_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClock()
    monkeypatch.setattr(overhead_stages.time, "thread_time", fake)
    clock = overhead_stages.StageClock(thread=threading.get_ident())

    async def stepped() -> str:
        fake.now += 1.0
        await asyncio.sleep(0)
        fake.now += 1.0
        return "done"

    async def elsewhere() -> None:
        fake.now += 10.0  # another task's time, between the steps

    async def main() -> str:
        result, _ = await asyncio.gather(overhead_stages.timed_async(clock, "stage", stepped)(), elsewhere())
        return result

    assert asyncio.run(main()) == "done"
    assert clock.totals == {"stage": 2.0}


def test_calls_from_another_thread_are_not_counted() -> None:
    clock = overhead_stages.StageClock(thread=-1)
    assert overhead_stages.timed(clock, "stage", lambda: 3)() == 3
    assert clock.totals == {}


def test_the_collector_is_timed_on_its_thread_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClock()
    monkeypatch.setattr(overhead_stages.time, "thread_time", fake)
    collector = CollectorClock()
    collector.thread = threading.get_ident()
    for spent in (2.0, 5.0):
        collector("start", {})
        fake.now += spent
        collector("stop", {})

    def another_threads_collection() -> None:
        collector("start", {})
        fake.now += 100.0
        collector("stop", {})

    elsewhere = threading.Thread(target=another_threads_collection)
    elsewhere.start()
    elsewhere.join()
    assert (collector.total, collector.longest) == (7.0, 5.0)
    collector.reset()
    assert (collector.total, collector.longest) == (0.0, 0.0)


def test_the_collector_clock_counts_a_real_collection() -> None:
    collector = CollectorClock()
    collector.thread = threading.get_ident()
    gc.callbacks.append(collector)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(collector)
    assert 0.0 < collector.longest <= collector.total


def test_every_stage_names_a_function_the_proxy_calls_by_that_name() -> None:
    # The bench patches module and class attributes by name: a moved or renamed function must fail here,
    # not only when the slow bench runs.
    clock = overhead_stages.StageClock(thread=-1)
    with overhead_stages.patched(clock, overhead_stages.proxy_stages()):
        pass
    for owner, name, _, _ in overhead_stages.proxy_stages():
        assert callable(vars(owner)[name])


@pytest.mark.parametrize(("samples", "least", "expected"), [
    ([], 2, []),
    ([(0.0, 0), (1.0, 1), (2.0, 2), (3.0, 4), (3.5, 5)], 2, [1.0, 0.5]),  # the last window is too short
    ([(0.0, 0), (0.4, 4), (1.2, 8)], 4, [0.1, 0.2]),
])
def test_window_costs(samples: list[tuple[float, int]], least: int, expected: list[float]) -> None:
    assert overhead_stages.window_costs(samples, least) == pytest.approx(expected)


def test_percentiles_and_the_split() -> None:
    assert overhead_stages.percentile([], 50) is None
    assert overhead_stages.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert overhead_stages.percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    split = overhead_stages.stage_split({"parse": 1.0, "emit": 0.5}, 4.0)
    assert split["parse"] == 1.0 and split["sampling"] == 0.0 and split["other"] == 2.5
    assert sum(split.values()) == pytest.approx(4.0)
    assert overhead_stages.per_round_ms(split, 0)["other"] is None
    assert overhead_stages.per_round_ms(split, 10)["parse"] == pytest.approx(100.0)
