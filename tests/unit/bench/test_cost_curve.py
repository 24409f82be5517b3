"""`speculoos bench --simulate --cost-curve`: a measured verification cost by K in place of an assumed model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.bench import simulate
from tests.unit.bench.test_bench import bench

CURVE = {"format": simulate.CURVE_FORMAT, "device": "a GPU", "plain_ms": 20.0, "draft_ms": 3.0,
         "verify_ms": {"0": 20.0, "1": 21.0, "4": 24.0, "8": 36.0}}
MODEL = simulate.measured_cost_model(CURVE, "curve.json", rtt_ms=5.0)


def line(k: float) -> float:
    """The least-squares line through the curve's four points: their mean (3.25, 25.25), slope 76.75 / 38.75."""
    return 25.25 + 76.75 / 38.75 * (k - 3.25)


@pytest.mark.parametrize(("drafted", "expected"), [
    (0, 20.0), (1, 21.0), (4, 24.0), (8, 36.0),  # measured
    (2, 22.0), (2.5, 22.5), (6, 30.0),  # between the measured K around it
    (17, line(17)),  # beyond the measured K: the line through them, as the controller extends its measurements
    (-1, line(-1)),
])
def test_verification_cost_follows_the_curve(drafted: float, expected: float) -> None:
    assert MODEL.verify_ms(drafted) == pytest.approx(expected)


def test_the_curve_model_takes_draft_and_plain_costs_from_the_file() -> None:
    assert (MODEL.name, MODEL.draft_ms, MODEL.plain_ms, MODEL.rtt_ms) == ("measured", 3.0, 20.0, 5.0)
    assert MODEL.round_ms(4) == 4 * 3.0 + 24.0 + 5.0 and MODEL.round_ms(4, source="lookup") == 24.0 + 5.0
    assert MODEL.round_ms(4, source="prediction") == 3.0 + 24.0 + 5.0  # the model checks the path in one step
    unsorted = simulate.measured_cost_model({**CURVE, "verify_ms": {"8": 36.0, "0": 20.0}}, "c")
    assert unsorted.verify_curve == ((0, 20.0), (8, 36.0)) and unsorted.verify_ms(4) == 28.0
    assert "verify ms by K (K=0: 20, K=1: 21, K=4: 24, K=8: 36), RTT 5 ms" in simulate.describe(MODEL)


@pytest.mark.parametrize(("change", "message"), [
    ({"format": "speculoos-bench-trace"}, "not a cost curve"),
    ({"verify_ms": {}}, "verify_ms must map each measured K"),
    ({"verify_ms": {"x": 1.0}}, "each K must be a whole number"),
    ({"verify_ms": {"-1": 1.0}}, "each K must be a whole number"),
    ({"verify_ms": {"0": 0}}, r"verify_ms\[0\] must be a positive number"),
    ({"plain_ms": None}, "plain_ms must be a positive number"),
    ({"draft_ms": -1}, "draft_ms must be a non-negative number"),
])
def test_bad_curves(change: dict, message: str) -> None:
    with pytest.raises(simulate.SimulationError, match=message):
        simulate.measured_cost_model({**CURVE, **change}, "c")


def test_a_free_draft_is_allowed() -> None:
    assert simulate.measured_cost_model({**CURVE, "draft_ms": 0}, "c").draft_ms == 0.0


def test_simulate_command_with_a_cost_curve(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = {"format": simulate.TRACE_FORMAT, "requests": [{"workload": "w", "mode": "k=4", "rounds": [[4, 3]] * 5}]}
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    (tmp_path / "curve.json").write_text(json.dumps(CURVE))
    assert bench("--simulate", str(tmp_path / "trace.json"), "--cost-curve", str(tmp_path / "curve.json"),
                 "--rtt-ms", "10", "--json", str(tmp_path / "sim.json")) == 0
    assert "### SIMULATION — cost model measured: draft 3 ms/token" in capsys.readouterr().out
    document = json.loads((tmp_path / "sim.json").read_text())
    (row,) = document["rows"]
    assert row["speedup"] == pytest.approx((10 + 20 * 20) / (5 * (4 * 3 + 24 + 10)))
    assert document["cost_model"]["verify_curve"] == [[0, 20.0], [1, 21.0], [4, 24.0], [8, 36.0]]
    assert bench("--simulate", str(tmp_path / "trace.json"), "--cost-curve", str(tmp_path / "curve.json"),
                 "--draft-ms", "2") == 1
    assert "--cost-curve takes every cost from the file; drop --draft-ms" in capsys.readouterr().err
    assert bench("--simulate", str(tmp_path / "trace.json"), "--cost-curve", str(tmp_path / "none.json")) == 1
    assert "cannot read the cost curve" in capsys.readouterr().err
