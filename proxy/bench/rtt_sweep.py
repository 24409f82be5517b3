"""One Markdown table over `speculoos bench` runs at several round-trip times (pure: JSON documents in, text out).

Per RTT, workload and mode: direct's tokens/s, the mode's, their ratio, α, τ (tokens per round),
the pre-draft hit rate, and, for a mode run beside its /seq twin, pipelined ÷ sequential tokens/s
next to what the cost model predicts for it from the run's own costs and hit rate.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from proxy.bench.report import number, pre_draft_cell
from proxy.bench.stats import DIRECT, SEQUENTIAL_SUFFIX, Costs, pinned_k, ratio
from proxy.control.cost_model import round_seconds

NOTES = ("tok/s: median output tokens ÷ request time, end to end, client beside the proxy (so direct pays "
         "the RTT too). α: accepted ÷ drafted. τ: tokens per round. pre-draft hits: rounds drafted ahead "
         "during a verification whose tokens were used ÷ those started. pipelined ÷ seq: the mode's tok/s ÷ "
         "its /seq twin's (draft-ahead off); predicted: sequential ÷ pipelined round time, "
         "(K·d + V) ÷ (V + (1 − h)·K·d + h·max(0, (K + 1)·d − V)), from the run's draft time per token d, "
         "verification time V at K (both as the proxy measured them) and hit rate h.")


def _cores(cores: Collection[int]) -> str:
    return f"core{'s' if len(cores) > 1 else ''} {','.join(str(c) for c in sorted(cores))}"


def regime(verifier_cores: Collection[int], proxy_cores: Collection[int], rtts_ms: Sequence[float]) -> str:
    """The header line saying what was emulated."""
    rtts = "/".join(f"{r:g}" for r in rtts_ms)
    if set(verifier_cores) & set(proxy_cores):
        return (f"shared cores: verifier and proxy + draft on {_cores(set(verifier_cores) | set(proxy_cores))}, "
                f"{rtts} ms RTT through speculoos relay")
    return (f"two devices emulated: verifier on {_cores(verifier_cores)}, proxy + draft on {_cores(proxy_cores)}, "
            f"{rtts} ms RTT through speculoos relay")


def _rate(row: Mapping[str, Any] | None) -> float | None:
    spread = (row or {}).get("tokens_per_second")
    return spread["median"] if spread else None


def predicted_gain(mode: str, hit_rate: float | None, route: Mapping[str, Any] | None) -> float | None:
    """Pipelined ÷ sequential tokens/s the cost model predicts for a pinned-K mode (None when unknown)."""
    k = pinned_k(mode)
    costs = Costs.from_status(route) if route else None
    verify = costs.verify_seconds(k) if costs and k else None
    if verify is None or hit_rate is None or costs.draft_seconds_per_token is None:
        return None
    draft = costs.draft_seconds_per_token
    return (round_seconds(k, 0.0, draft, verify, pipelined=False)
            / round_seconds(k, hit_rate, draft, verify, pipelined=True))


def _route(document: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The benchmarked route's status, as `speculoos bench --json` keeps it."""
    return document.get("proxy_status") or None


def _line(rtt: float, workload: str, mode: str, rows: Mapping[tuple[str, str], Mapping[str, Any]],
          modes: Sequence[str], route: Mapping[str, Any] | None) -> str | None:
    row = rows.get((workload, mode))
    if row is None:
        return None
    direct, rate = _rate(rows.get((workload, DIRECT))), _rate(row)
    twin = mode + SEQUENTIAL_SUFFIX
    gain = ratio(rate, _rate(rows.get((workload, twin)))) if twin in modes else None
    predicted = predicted_gain(mode, row.get("pre_draft_hit_rate"), route) if twin in modes else None
    failed = f" ({row['errors']} failed)" if row.get("errors") else ""
    hits = pre_draft_cell(row.get("pre_draft_hit_rate"), row.get("pre_draft_hits"), row.get("pre_drafts_started"))
    return (f"| {rtt:g} | {workload} | {mode}{failed} | {number(direct, 1)} | {number(rate, 1)} "
            f"| {number(ratio(rate, direct), 2, '×')} | {number(row.get('alpha'), 2)} "
            f"| {number(row.get('tokens_per_round'), 2)} | {hits} | {number(gain, 2, '×')} "
            f"| {number(predicted, 2, '×')} |")


def sweep_markdown(documents: Mapping[float, Mapping[str, Any]], modes: Sequence[str], header: str) -> str:
    """The table: `documents` maps each RTT in ms to its `speculoos bench --json` document."""
    lines = [f"### {header}", "",
             "| RTT ms | workload | mode | direct tok/s | tok/s | ÷ direct | α | τ | pre-draft hits | pipelined ÷ seq "
             "| predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rtt, document in documents.items():
        rows, route = {(r["workload"], r["mode"]): r for r in document.get("rows") or []}, _route(document)
        for workload in dict.fromkeys(w for w, _ in rows):
            lines += [line for mode in modes if (line := _line(rtt, workload, mode, rows, modes, route)) is not None]
    return "\n".join([*lines, "", NOTES]) + "\n"
