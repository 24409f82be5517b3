"""One table over bench runs at several RTTs: rows, ratios, tolerance of missing figures."""

from __future__ import annotations

import pytest

from proxy.bench.rtt_sweep import regime, sweep_markdown


def row(workload: str, mode: str, rate: float | None, **figures: float | int | None) -> dict:
    spread = None if rate is None else {"median": rate, "low": rate, "high": rate, "n": 1}
    return {"workload": workload, "mode": mode, "tokens_per_second": spread, "errors": 0, **figures}


ROUTE = {"route": "local", "draft_seconds_per_token": 0.05, "verify_seconds_by_k": {"4": 0.3}}
DOCUMENTS = {
    0.0: {"proxy_status": ROUTE, "rows": [row("w", "direct", 10.0),
                   row("w", "auto", 12.0, alpha=0.5, tokens_per_round=2.0),
                   row("w", "k=4/seq", 15.0, alpha=0.6, tokens_per_round=3.0),
                   row("w", "k=4", 18.0, alpha=0.6, tokens_per_round=3.0, pre_draft_hit_rate=0.25,
                       pre_draft_hits=1, pre_drafts_started=4)]},
    10.0: {"rows": [row("w", "direct", 8.0), row("w", "auto", None, errors=1), row("w", "k=4/seq", 8.0),
                    row("w", "k=4", 10.0), row("v", "direct", 5.0), row("v", "k=4", 6.0)]},
}


@pytest.mark.parametrize("line", [
    "| 0 | w | auto | 10.0 | 12.0 | 1.20× | 0.50 | 2.00 | – | – | – |",
    "| 0 | w | k=4/seq | 10.0 | 15.0 | 1.50× | 0.60 | 3.00 | – | – | – |",
    # predicted: (4·0.05 + 0.3) ÷ (0.3 + 0.75·4·0.05 + 0.25·max(0, 5·0.05 − 0.3)) = 0.5 ÷ 0.45
    "| 0 | w | k=4 | 10.0 | 18.0 | 1.80× | 0.60 | 3.00 | 0.25 (1/4) | 1.20× | 1.11× |",
    "| 10 | w | auto (1 failed) | 8.0 | – | – | – | – | – | – | – |",
    "| 10 | w | k=4 | 8.0 | 10.0 | 1.25× | – | – | – | 1.25× | – |",  # no costs, no hit rate: no prediction
    "| 10 | v | k=4 | 5.0 | 6.0 | 1.20× | – | – | – | – | – |",  # no /seq twin on this workload
])
def test_sweep_lines(line: str) -> None:
    assert line in sweep_markdown(DOCUMENTS, ["auto", "k=4/seq", "k=4"], "h").splitlines()


def test_sweep_has_one_row_per_rtt_workload_and_measured_mode() -> None:
    lines = sweep_markdown(DOCUMENTS, ["auto", "k=4/seq", "k=4"], "header").splitlines()
    assert lines[0] == "### header"
    assert sum(line.startswith("| 0 ") or line.startswith("| 10 ") for line in lines) == 3 + 3 + 1


def test_a_mode_without_its_twin_in_the_run_has_no_pipelining_ratio() -> None:
    assert "| 0 | w | k=4 | 10.0 | 18.0 | 1.80× | 0.60 | 3.00 | 0.25 (1/4) | – | – |" in sweep_markdown(
        DOCUMENTS, ["k=4"], "h").splitlines()


@pytest.mark.parametrize(("verifier", "proxy", "rtts", "expected"), [
    ({0}, {1}, [0.0, 10.0, 30.0], "two devices emulated: verifier on core 0, proxy + draft on core 1, "
                                  "0/10/30 ms RTT through speculoos relay"),
    ({2, 0}, {1}, [2.5], "two devices emulated: verifier on cores 0,2, proxy + draft on core 1, "
                         "2.5 ms RTT through speculoos relay"),
    ({0, 1}, {0, 1}, [0.0], "shared cores: verifier and proxy + draft on cores 0,1, 0 ms RTT through speculoos relay"),
])
def test_regime(verifier: set, proxy: set, rtts: list, expected: str) -> None:
    assert regime(verifier, proxy, rtts) == expected
