"""`speculoos bench` end to end: one short run against real SmolLM2 processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.bench.workloads import load
from tests.e2e import greedy
from tests.e2e.servers import Process
from tests.unit.bench.test_bench import bench


def assert_differences_are_near_ties(verifier: Process, document: dict[str, Any]) -> None:
    """Every greedy output the run reports as differing from direct's first differs at a near-tie of the target."""
    texts = {(r["workload"], r["prompt"], r["repetition"], r["mode"]): r["text"] for r in document["requests"]}
    for difference in document["identity"]["differences"]:
        where = (difference["workload"], difference["prompt"], difference["repetition"])
        expected, actual = texts[(*where, "direct")], texts[(*where, difference["mode"])]
        assert actual != expected, difference
        prompt = load(difference["workload"]).prompts[difference["prompt"]]
        ids = greedy.tokenize(verifier.url, {"prompt": prompt.text} if prompt.messages is None
                              else {"messages": [dict(m) for m in prompt.messages]})
        divergence = greedy.find_divergence(verifier.url, ids, expected, actual)
        answer = greedy.tokenize(verifier.url, {"prompt": expected, "add_special_tokens": False})
        tolerance = greedy.near_tie_tolerance(verifier.url, (ids + answer)[-64:])
        assert divergence.is_near_tie(tolerance), (difference, divergence, tolerance)


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
    assert identity["checked"] == 2 * 2 * 5
    assert_differences_are_near_ties(smol_verifier, document)
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


def lookup_accepted(request: dict[str, Any]) -> int:
    """Lookup draft tokens the target accepted in one proxied request."""
    return ((request["extension"] or {}).get("drafts") or {}).get("lookup", {}).get("accepted", 0)


def test_no_mode_or_repetition_drafts_from_anothers_answers(smol_verifier: Process, smol_suffix_proxy: Process,
                                                            tmp_path: Path) -> None:
    """The suffix route drafts from earlier outputs of the same key: were the bench's modes and repetitions to
    share one, each prompt's later requests would copy its first answer (open chat answers do not copy
    their prompts, so lookup alone accepts little of them)."""
    out = tmp_path / "history.json"
    assert bench("--direct", smol_verifier.url, "--proxy", smol_suffix_proxy.url, "--workloads", "open_chat",
                 "--prompts", "2", "--repeat", "2", "--max-tokens", "32", "--modes", "k=4,k=8",
                 "--warmup", "0", "--json", str(out)) == 0
    requests = [r for r in json.loads(out.read_text())["requests"] if r["mode"] != "direct"]
    assert len(requests) == 2 * 2 * 2 and all(r["served_as"] == "speculative" for r in requests)
    for prompt in (0, 1):
        accepted = [lookup_accepted(r) for r in requests if r["prompt"] == prompt]
        print(prompt, accepted)
        # Fresh, each request accepts what its own context gives; one copying an earlier answer, most of it.
        assert max(accepted) - min(accepted) <= 8, accepted


def test_cost_curve_times_rounds_after_a_cached_prefix(smol_verifier: Process, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "curve.json"
    assert bench("cost-curve", "--url", smol_verifier.url, "--ks", "0,4", "--rounds", "2", "--context", "64",
                 "--json", str(out)) == 0
    assert "| 4 |" in capsys.readouterr().out
    curve = json.loads(out.read_text())
    assert [c["k"] for c in curve["by_k"]] == [0, 4] and curve["plain_ms_per_token"] > 0
    # Each round finds its prefix cached, as consecutive speculative rounds do.
    assert all(c["cached_tokens"] >= 64 - 1 and 0 < c["low_ms"] <= c["median_ms"] <= c["high_ms"]
               for c in curve["by_k"])
