"""`speculoos bench --simulate`: cost models, replaying recorded traces, and its labelled outputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.bench import replay, report, simulate
from proxy.bench.client import BenchError
from tests.unit.bench.test_bench import bench, extension, sample

GPU = simulate.cost_model("gpu", draft_ms=1.0, verify_ms_flat=10.0)


def test_replay_times_each_round() -> None:
    request = simulate.TracedRequest("w", "k=4", ((4, 4), (4, 0)))
    result = simulate.replay(request, GPU)
    assert (result.tokens, result.speculative_ms, result.plain_ms) == (6, 28.0, 60.0)
    with_rtt = simulate.replay(request, replace(GPU, rtt_ms=5.0))
    assert (with_rtt.speculative_ms, with_rtt.plain_ms) == (38.0, 65.0)  # RTT per round vs once per request


def test_the_proxys_own_cost_is_charged_to_every_round_and_never_to_plain_decoding(tmp_path: Path) -> None:
    request = simulate.TracedRequest("w", "k=4", ((4, 4), (4, 0)), plain_tokens=3)
    result = simulate.replay(request, replace(GPU, proxy_ms=1.5))
    assert (result.speculative_ms, result.plain_ms) == (28.0 + 2 * 1.5 + 30.0, 90.0)
    rows = tmp_path / "overhead.json"  # as `speculoos bench overhead --json` writes it: a row a line
    rows.write_text("".join(json.dumps({"streams": streams, "cpu_ms_per_round": ms}) + "\n"
                            for streams, ms in ((1, 0.8), (1, 1.2), (1, 3.0), (64, 9.0))))
    assert replay.proxy_ms(str(rows)) == 1.2 and replay.proxy_ms("0.5") == 0.5
    for bad in ("-1", "nan", str(tmp_path / "missing.json")):
        with pytest.raises(BenchError, match="--proxy-ms"):
            replay.proxy_ms(bad)


def test_simulate_rows_compare_replay_with_the_formula() -> None:
    bursty = simulate.TracedRequest("w", "k=4", ((4, 4), (4, 0)))
    perfect = simulate.TracedRequest("w", "k=2", ((2, 2), (2, 2), (1, 1)), plain_tokens=2)
    rows = {r.mode: r for r in simulate.simulate([bursty, perfect], GPU)}
    assert rows["k=4"].speedup == pytest.approx(60 / 28)
    assert rows["k=4"].formula_speedup == pytest.approx((1 - 0.5 ** 5) / 0.5 / 14 * 10)  # α 0.5: i.i.d. is worse
    assert rows["k=2"].alpha == 1.0 and rows["k=2"].tokens_per_round == pytest.approx(8 / 3)
    assert rows["k=2"].speedup == pytest.approx(10 * 10 / (12 + 12 + 11 + 2 * 10))


@pytest.mark.parametrize(("name", "numbers", "message"), [
    ("gpu", {"draft_ms": 1.0}, "give --verify-ms-flat"),
    ("gpu", {"draft_ms": 1.0, "verify_ms_flat": 5.0, "verify_ms_per_token": 1.0}, "no --verify-ms-per-token"),
    ("cpu", {"draft_ms": 1.0, "verify_ms_flat": 5.0}, "give --verify-ms-per-token"),
    ("custom", {"verify_ms_flat": 5.0}, "--draft-ms is required"),
    ("custom", {"draft_ms": 1.0}, "must cost time"),
    ("tpu", {"draft_ms": 1.0}, "one of gpu, cpu, custom"),
])
def test_cost_model_rejects(name: str, numbers: dict, message: str) -> None:
    with pytest.raises(simulate.SimulationError, match=message):
        simulate.cost_model(name, **numbers)


def test_cpu_cost_model_charges_per_evaluated_token() -> None:
    model = simulate.cost_model("cpu", draft_ms=2.0, verify_ms_per_token=10.0, rtt_ms=1.0)
    assert (model.verify_ms(4), model.round_ms(4), model.plain_ms) == (50.0, 59.0, 10.0)


def test_trace_round_trip_and_refusals() -> None:
    samples = [sample("k=2", extension={**extension(2, 4, 3), "round_trace": [[2, 2], [2, 1]]}),
               sample("direct"), sample("k=2", prompt=1, extension=extension(1, 2, 0))]
    trace = json.loads(json.dumps(report.trace_json(samples, {"modes": ["k=2"]}, None)))
    assert [r["rounds"] for r in trace["requests"]] == [[[2, 2], [2, 1]], None]
    (request,) = simulate.parse_trace(trace, "t.json")  # the request without rounds is left out
    assert request.rounds == ((2, 2), (2, 1))
    with pytest.raises(simulate.SimulationError, match="no request has per-round data"):
        simulate.parse_trace({**trace, "requests": trace["requests"][1:]}, "t.json")
    with pytest.raises(simulate.SimulationError, match="not a trace"):
        simulate.parse_trace({"rows": []}, "t.json")


def test_simulation_outputs_are_labelled(tmp_path: Path) -> None:
    rows = simulate.simulate([simulate.TracedRequest("w", "k=4", ((4, 3),))], GPU)
    text = report.simulation_markdown(rows, simulate.describe(GPU))
    assert text.startswith("### SIMULATION — cost model gpu: draft 1 ms/token, verify 10 ms flat")
    document = simulate.as_json(rows, GPU, "t.json")
    assert document["label"] == "SIMULATION" and document["simulation"] is True
    assert all(row["label"] == "SIMULATION" for row in document["rows"])


def test_simulate_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = {"format": simulate.TRACE_FORMAT, "requests": [
        {"workload": "w", "mode": f"k={k}", "rounds": [[k, k - 1]] * 5} for k in (1, 2, 4)]}
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    assert bench("--simulate", str(tmp_path / "trace.json"), "--cost-model", "gpu", "--draft-ms", "2",
                 "--verify-ms-flat", "25", "--rtt-ms", "10", "--json", str(tmp_path / "sim.json")) == 0
    assert "### SIMULATION — cost model gpu" in capsys.readouterr().out
    assert json.loads((tmp_path / "sim.json").read_text())["label"] == "SIMULATION"
    assert bench("--simulate", str(tmp_path / "trace.json"), "--cost-model", "cpu", "--draft-ms", "2") == 1
    assert "give --verify-ms-per-token" in capsys.readouterr().err


def test_lookup_rounds_cost_no_draft_time_and_plain_chunks_cost_a_round_trip() -> None:
    model = simulate.cost_model("gpu", draft_ms=10, verify_ms_flat=30, rtt_ms=2)
    document = {"format": simulate.TRACE_FORMAT, "requests": [
        {"workload": "w", "mode": "auto", "rounds": [[16, 16, "lookup"], [4, 2]], "plain_tokens": 8,
         "plain_calls": 2}]}
    (request,) = simulate.parse_trace(document, "trace")
    timed = simulate.replay(request, model)
    assert timed.tokens == 17 + 3 + 8
    assert timed.speculative_ms == pytest.approx((30 + 2) + (4 * 10 + 30 + 2) + 8 * 30 + 2 * 2)


def test_a_path_round_charges_the_models_steps_it_took() -> None:
    document = {"format": simulate.TRACE_FORMAT, "requests": [{"workload": "w", "mode": "on", "rounds": [
        [12, 12, "prediction", 5], [12, 12, "prediction"], [4, 4, "lookup"], [8, 2, "lookup", 1], [4, 4]]}]}
    request, = simulate.parse_trace(document, "trace")
    assert request.steps == (5, None, None, 1, None)
    assert request.sources == ("prediction", "prediction", "lookup", "lookup", "model")
    result = simulate.replay(request, GPU)  # steps: 4 led + the check, 1 (a prediction's usual), 0, 1, 4 drafted
    assert result.speculative_ms == pytest.approx(5 * 10.0 + (5 + 1 + 0 + 1 + 4) * 1.0)
