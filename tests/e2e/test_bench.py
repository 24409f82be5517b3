"""`speculoos bench` end to end: one short run against real SmolLM2 processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.servers import Process
from tests.unit.bench.test_bench import bench


def test_end_to_end_smollm2(smol_verifier: Process, smol_proxy: Process, tmp_path: Path,
                            capsys: pytest.CaptureFixture) -> None:
    out, trace_path = tmp_path / "bench.json", tmp_path / "trace.json"
    assert bench("--direct", smol_verifier.url, "--proxy", smol_proxy.url + "/v1",
                 "--workloads", "code_completion,code_editing", "--prompts", "2", "--repeat", "1",
                 "--max-tokens", "16", "--json", str(out), "--record-trace", str(trace_path)) == 0
    assert "| code_editing | k=4 |" in capsys.readouterr().out
    document: dict[str, Any] = json.loads(out.read_text())
    modes = ["direct", "auto", "k=1", "k=2", "k=4", "off"]
    assert [(r["workload"], r["mode"]) for r in document["rows"]] == \
        [(w, m) for w in ("code_completion", "code_editing") for m in modes]
    assert len(document["requests"]) == 2 * 2 * len(modes)
    assert all(r["status"] == 200 and r["error"] is None for r in document["requests"])
    for row in document["rows"]:
        assert row["errors"] == 0 and row["tokens_per_second"]["median"] > 0 and row["ttft_ms"] > 0
        if row["mode"].startswith("k="):
            assert row["speculative"] == 2 and 0 <= row["alpha"] <= 1 and row["tokens_per_round"] >= 1
            assert row["predicted_speedup"] > 0 and row["efficiency"] > 0
        if row["mode"] == "off":
            assert row["speculative"] == 0
    identity = document["identity"]
    assert identity["checked"] == 2 * 2 * 5 and identity["differ"] <= identity["checked"]
    assert document["proxy_status"]["verify_seconds_by_k"]
    trace = json.loads(trace_path.read_text())
    requests = [r for r in trace["requests"] if r["mode"].startswith("k=")]
    assert len(requests) == 2 * 2 * 3
    replayable = [r for r in requests if r["rounds"] is not None]  # the proxy's round_trace, where it sends one
    for r in replayable:
        assert [sum(d for d, _ in r["rounds"]), sum(a for _, a in r["rounds"])] == [r["drafted"], r["accepted"]]
    if replayable:
        assert bench("--simulate", str(trace_path), "--cost-model", "gpu", "--draft-ms", "5",
                     "--verify-ms-flat", "30", "--rtt-ms", "10") == 0
        assert "### SIMULATION" in capsys.readouterr().out
