"""Render results: Markdown tables, the JSON document, the trace file and a PNG chart."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from proxy.bench.simulate import SIMULATION, TRACE_FORMAT, SimulatedRow
from proxy.bench.stats import DIRECT, PASSTHROUGH_MODE, SEQUENTIAL_SUFFIX, Identity, Row, Sample, pinned_k

SCHEMA_VERSION = 1
PREDICTED = " (predicted)"  # chart line-name suffix: drawn dashed in the workload's colour
NEAR_TIE_NOTE = ("llama.cpp's logits depend on batch shape, so a verification pass can break a near-tie of the "
                 "target's top two logits differently from plain decoding: a greedy difference is not by itself "
                 "a bug (tests/e2e/greedy.py checks each one against the target's margin).")
NOTES = ("tok/s: output tokens ÷ request time, end to end. speedup: median tok/s ÷ direct's. "
         "paired: the median of each prompt's tok/s ÷ its own direct request's (min–max). "
         "ITL: time per token after the first; decode ×: direct's ITL ÷ this ITL. "
         "predicted: Leviathan's formula from the row's α and the proxy's measured costs (/speculoos/status), "
         "÷ direct's decode rate, for sequential rounds (draft-ahead gains show as efficiency above 1). "
         "efficiency: decode × ÷ predicted. pre-draft hits: rounds drafted ahead "
         "during a verification whose tokens were used ÷ those started. /seq: the mode with draft-ahead off.")


def number(value: float | None, digits: int = 1, suffix: str = "") -> str:
    """A figure for a table cell: '–' when missing."""
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def pre_draft_cell(rate: float | None, hits: int | None, started: int | None) -> str:
    """'0.67 (4/6)': the hit rate and its counts; '–' when the proxy did not report draft-ahead."""
    return "–" if started is None else f"{number(rate, 2)} ({hits}/{started})"


def bench_markdown(rows: Sequence[Row], identity: Identity, title: str) -> str:
    """The results table, its notes and the identical-output line."""
    lines = [f"### {title}", "",
             "| workload | mode | speculative | tok/s median (min–max) | speedup | paired | TTFT ms | ITL ms "
             "| decode × | α | tokens/round | K | pre-draft hits | predicted | efficiency |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rate = "–" if r.tokens_per_second is None else (
            f"{r.tokens_per_second.median:.1f} ({r.tokens_per_second.low:.1f}–{r.tokens_per_second.high:.1f})")
        served = "–" if r.mode == DIRECT else f"{r.speculative}/{r.requests - r.errors}"
        errors = f" ({r.errors} failed)" if r.errors else ""
        paired = "–" if r.paired_speedup is None else (
            f"{r.paired_speedup.median:.2f}× ({r.paired_speedup.low:.2f}–{r.paired_speedup.high:.2f})")
        lines.append(f"| {r.workload} | {r.mode}{errors} | {served} | {rate} | {number(r.speedup, 2, '×')} "
                     f"| {paired} | {number(r.ttft_ms, 0)} | {number(r.itl_ms, 1)} "
                     f"| {number(r.decode_speedup, 2, '×')} | {number(r.alpha, 2)} | {number(r.tokens_per_round, 2)} "
                     f"| {number(r.mean_k, 1)} "
                     f"| {pre_draft_cell(r.pre_draft_hit_rate, r.pre_draft_hits, r.pre_drafts_started)} "
                     f"| {number(r.predicted_speedup, 2, '×')} | {number(r.efficiency, 2)} |")
    lines += ["", NOTES, "", identity_line(identity)]
    return "\n".join(lines) + "\n"


def identity_line(identity: Identity) -> str:
    """How many greedy outputs matched the direct ones, and why a few may not."""
    if not identity.total_checked:
        return "Identical-output check: no greedy (temperature 0) pairs to compare."
    by_mode = ", ".join(f"{mode} {sum(d.mode == mode for d in identity.differences)}/{n}"
                        for mode, n in identity.checked.items())
    return (f"Identical-output check (greedy prompts vs direct): {len(identity.differences)} of "
            f"{identity.total_checked} differ ({by_mode}). {NEAR_TIE_NOTE}")


def simulation_markdown(rows: Sequence[SimulatedRow], description: str) -> str:
    """The simulation table, titled SIMULATION."""
    lines = [f"### {SIMULATION} — {description}", "",
             "| workload | mode | requests | rounds | α | mean K | tokens/round | speedup | per request (min–max) "
             "| formula |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.workload} | {r.mode} | {r.requests} | {r.rounds} | {number(r.alpha, 2)} | {r.mean_k:.1f} "
                     f"| {r.tokens_per_round:.2f} | {r.speedup:.2f}× "
                     f"| {r.per_request.low:.2f}–{r.per_request.high:.2f} "
                     f"| {r.formula_speedup:.2f}× |")
    lines += ["", f"{SIMULATION}: replayed acceptance under an assumed cost model, not a measurement. "
              "formula: Leviathan's i.i.d. prediction at the same α and mean K."]
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def bench_json(rows: Sequence[Row], identity: Identity, samples: Sequence[Sample], config: Mapping[str, Any],
               status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The whole run as one JSON document."""
    return {
        "schema": SCHEMA_VERSION, "simulation": False, "config": dict(config),
        "rows": [_plain(r) for r in rows],
        "identity": {"checked": identity.total_checked, "differ": len(identity.differences),
                     "checked_by_mode": identity.checked, "differences": [_plain(d) for d in identity.differences],
                     "note": NEAR_TIE_NOTE},
        "proxy_status": status, "requests": [_plain(s) for s in samples],
    }


def load_json(rows: Sequence[Any], identity: Identity, bursts: Sequence[Any], config: Mapping[str, Any],
              status: Mapping[str, Any] | None) -> dict[str, Any]:
    """A concurrent-load run as one JSON document: rows, identity, and every burst with its requests."""
    document = bench_json(rows, identity, [], config, status)
    document["bursts"] = [{"workload": b.workload, "target": b.target, "wall_s": b.wall_s,
                           "requests": [_plain(s) for s in b.samples]} for b in bursts]
    return document


def trace_json(samples: Sequence[Sample], config: Mapping[str, Any], status: Mapping[str, Any] | None) -> dict:
    """Per speculative request, its rounds as [drafted, accepted(, "lookup")] (None where the proxy omitted them)."""
    requests = []
    for s in samples:
        if s.ok and s.speculative and s.extension is not None:
            rounds = s.extension.get("round_trace")
            requests.append({"workload": s.workload, "mode": s.mode, "prompt": s.prompt, "repetition": s.repetition,
                             "greedy": s.greedy, "completion_tokens": s.completion_tokens,
                             "plain_tokens": s.extension.get("plain_tokens") or 0,
                             "plain_calls": s.extension.get("lookup_misses") or 0,
                             "drafted": s.extension.get("drafted"), "accepted": s.extension.get("accepted"),
                             "draft_ahead": s.extension.get("draft_ahead"), "rounds": rounds})
    return {"format": TRACE_FORMAT, "schema": SCHEMA_VERSION, "config": dict(config),
            "proxy_status": status, "requests": requests}


def _k_of(mode: str) -> int | None:
    if mode.endswith(SEQUENTIAL_SUFFIX):
        return None  # a workload's line has one point per K: the sequential twin would be a second
    return 0 if mode == PASSTHROUGH_MODE else pinned_k(mode)


def chart(path: Path, series: Mapping[str, Mapping[str, list[tuple[int, float]]]], title: str) -> None:
    """Speedup against K, one colour per workload; `series` maps panel title -> line name -> [(K, speedup)].

    A line named "WORKLOAD (predicted)" is drawn dashed in its workload's colour.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import MaxNLocator

    workloads = sorted({name.removesuffix(PREDICTED) for lines in series.values() for name in lines})
    colours = {w: f"C{i % 10}" for i, w in enumerate(workloads)}
    figure, axes = pyplot.subplots(1, len(series), figsize=(6 * len(series), 4.5), squeeze=False)
    for axis, (panel, lines) in zip(axes[0], series.items()):
        for name, points in lines.items():
            workload = name.removesuffix(PREDICTED)
            predicted = name != workload
            axis.plot(*zip(*sorted(points)), "--" if predicted else "-", marker="x" if predicted else "o",
                      color=colours[workload], label=None if predicted else workload)
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set(xlabel="K (0 = passthrough)", ylabel="speedup vs direct")
        axis.set_title(panel, fontsize="medium")
        axis.legend(fontsize="small")
    figure.suptitle(title, fontsize="medium", wrap=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def bench_series(rows: Sequence[Row]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Chart data for a measured run: end-to-end speedup, and decode speedup with the prediction."""
    end_to_end: dict[str, list[tuple[int, float]]] = {}
    decode: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        k = _k_of(r.mode)
        if k is None:
            continue
        if r.speedup is not None:
            end_to_end.setdefault(r.workload, []).append((k, r.speedup))
        if r.decode_speedup is not None:
            decode.setdefault(r.workload, []).append((k, r.decode_speedup))
        if r.predicted_speedup is not None:
            decode.setdefault(r.workload + PREDICTED, []).append((k, r.predicted_speedup))
    return {"end to end (tok/s)": end_to_end, "decode (ITL): measured (solid), predicted (dashed)": decode}


def simulation_series(rows: Sequence[SimulatedRow]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Chart data for a simulation: replayed speedup and the formula's."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if (k := _k_of(r.mode)) is not None:
            lines.setdefault(r.workload, []).append((k, r.speedup))
            lines.setdefault(r.workload + PREDICTED, []).append((k, r.formula_speedup))
    return {f"{SIMULATION}: replayed (solid) and formula (dashed)": lines}
