"""`speculoos bench peers`, pure: speculation counts from each server's reply, rows, the table and the JSON.

Glossary (one row = one peer, in one regime at one round trip and temperature, on one workload):
    tok/s        the median over prompts of completion tokens ÷ request time, end to end, prefill included
    TTFT         the median time to the first text chunk
    α            accepted ÷ drafted tokens over the row's requests
    τ            tokens per verification round: the rounds' accepted tokens and one more each, ÷ rounds.
                 llama-server counts a round per verification it ran with a draft (its
                 `spec_decode_num_drafts_total` counter); the proxy per round it verified
    ÷ llama      the row's tok/s ÷ plain llama-server's, same regime, RTT, temperature and workload
    ÷ best spec  the row's tok/s ÷ that of the fastest llama-server speculative row there
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from proxy.bench.report import number
from proxy.bench.stats import Spread, ratio, spread

FORMAT = "speculoos-bench-peers"
LLAMA_PREFIX = "llama-server"  # every llama-server row's name starts so
LLAMA_PLAIN = "llama-server"
METRIC_PREFIX = "llamacpp:"
METRIC_ROUNDS = "spec_decode_num_drafts_total"
METRIC_DRAFTED = "spec_decode_num_draft_tokens_total"


@dataclass(frozen=True)
class Speculation:
    """What one request's drafts did."""

    drafted: int
    accepted: int
    rounds: int | None  # verification rounds with a draft; None: not reported
    emitted: float | None  # tokens those rounds produced (accepted + one each)


def parse_metrics(text: str) -> dict[str, float]:
    """llama-server's Prometheus text (GET /metrics) -> {name without the llamacpp: prefix: value}."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            try:
                values[parts[0].removeprefix(METRIC_PREFIX)] = float(parts[1])
            except ValueError:
                continue  # a value Prometheus allows but this table does not use
    return values


def llama_speculation(timings: Mapping[str, Any] | None, before: Mapping[str, float] | None,
                      after: Mapping[str, float] | None) -> Speculation | None:
    """One llama-server request: drafts from its `timings` (draft_n, draft_n_accepted, absent when it drafted
    nothing), rounds from the /metrics counters before and after it; None without timings."""
    if not timings:
        return None
    drafted, accepted = int(timings.get("draft_n") or 0), int(timings.get("draft_n_accepted") or 0)
    rounds = None
    if before is not None and after is not None and METRIC_ROUNDS in before and METRIC_ROUNDS in after:
        rounds = int(after[METRIC_ROUNDS] - before[METRIC_ROUNDS])
    return Speculation(drafted, accepted, rounds, None if rounds is None else float(accepted + rounds))


def proxy_speculation(extension: Mapping[str, Any] | None) -> Speculation | None:
    """One proxied request, from the proxy's `speculoos` object; None when it was not served speculatively."""
    if not extension:
        return None
    rounds = int(extension.get("rounds") or 0)
    return Speculation(int(extension.get("drafted") or 0), int(extension.get("accepted") or 0), rounds,
                       float(extension.get("tokens_per_round") or 0.0) * rounds)


@dataclass(frozen=True)
class PeerSample:
    """One measured request."""

    regime: str
    rtt_ms: float | None  # None: no relay (shared cores)
    temperature: float
    row: str
    workload: str
    prompt: int
    error: str | None
    completion_tokens: int | None
    seconds: float
    ttft_s: float | None
    tokens_per_second: float | None
    speculation: Speculation | None

    @property
    def decode_rate(self) -> float | None:
        """Tokens after the first ÷ the time after the first (None: not streamed, or one token)."""
        if self.error is not None or self.ttft_s is None or (self.completion_tokens or 0) < 2:
            return None
        after = self.seconds - self.ttft_s
        return (self.completion_tokens - 1) / after if after > 0 else None


@dataclass(frozen=True)
class PeerRow:
    """One peer on one workload, in one regime at one RTT and temperature."""

    regime: str
    rtt_ms: float | None
    temperature: float
    workload: str
    row: str
    requests: int
    errors: int
    tokens_per_second: Spread | None
    ttft_ms: float | None
    decode_tokens_per_second: float | None  # median over prompts: what an answer's length does not move
    alpha: float | None
    tokens_per_round: float | None
    drafted: int
    accepted: int
    rounds: int | None


def _row(samples: Sequence[PeerSample]) -> PeerRow:
    first = samples[0]
    ok = [s for s in samples if s.error is None and s.tokens_per_second]
    ttft, decode = spread(s.ttft_s for s in ok), spread(s.decode_rate for s in ok)
    speculations = [s.speculation for s in ok if s.speculation is not None]
    drafted, accepted = sum(s.drafted for s in speculations), sum(s.accepted for s in speculations)
    counted = [s for s in speculations if s.rounds is not None and s.emitted is not None]
    rounds = sum(s.rounds or 0 for s in counted) if counted else None
    emitted = sum(s.emitted or 0.0 for s in counted)
    return PeerRow(first.regime, first.rtt_ms, first.temperature, first.workload, first.row, len(samples),
                   len(samples) - len(ok), spread(s.tokens_per_second for s in ok),
                   ttft.median * 1000.0 if ttft else None, decode.median if decode else None,
                   ratio(accepted, drafted) if drafted else None,
                   emitted / rounds if rounds else None, drafted, accepted, rounds)


def summarise(samples: Sequence[PeerSample]) -> list[PeerRow]:
    """One row per (regime, RTT, temperature, workload, peer), in the order they were first measured."""
    groups: dict[tuple, list[PeerSample]] = {}
    for s in samples:
        groups.setdefault((s.regime, s.rtt_ms, s.temperature, s.workload, s.row), []).append(s)
    return [_row(group) for group in groups.values()]


def _rate(row: PeerRow | None) -> float | None:
    return row.tokens_per_second.median if row and row.tokens_per_second else None


def _cell(row: PeerRow) -> tuple:
    return row.regime, row.rtt_ms, row.temperature, row.workload


def comparisons(rows: Sequence[PeerRow]) -> dict[int, tuple[float | None, float | None]]:
    """Per row (by index): its tok/s ÷ plain llama-server's and ÷ the fastest llama-server row's, plain or
    speculative (where speculation loses, plain decoding is llama-server's best)."""
    plain: dict[tuple, float | None] = {}
    best: dict[tuple, float] = {}
    for row in rows:
        rate = _rate(row)
        if row.row == LLAMA_PLAIN:
            plain[_cell(row)] = rate
        if row.row.startswith(LLAMA_PREFIX) and rate is not None:
            best[_cell(row)] = max(rate, best.get(_cell(row), 0.0))
    return {i: (ratio(_rate(row), plain.get(_cell(row))), ratio(_rate(row), best.get(_cell(row))))
            for i, row in enumerate(rows)}


def _rtt(rtt_ms: float | None) -> str:
    return "–" if rtt_ms is None else f"{rtt_ms:g}"


def markdown(rows: Sequence[PeerRow], header: str) -> str:
    """The table, one line per row, with the glossary's notes under it."""
    against = comparisons(rows)
    lines = [f"### {header}", "",
             "| regime | RTT ms | T | workload | row | tok/s | ÷ llama | ÷ llama's best | TTFT ms | decode tok/s "
             "| α | τ |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(rows):
        failed = f" ({row.errors} of {row.requests} failed)" if row.errors else ""
        plain, best = against[i]
        lines.append(f"| {row.regime} | {_rtt(row.rtt_ms)} | {row.temperature:g} | {row.workload} | {row.row}{failed} "
                     f"| {number(_rate(row), 1)} | {number(plain, 2, '×')} | {number(best, 2, '×')} "
                     f"| {number(row.ttft_ms, 0)} | {number(row.decode_tokens_per_second, 1)} | {number(row.alpha, 2)} "
                     f"| {number(row.tokens_per_round, 2)} |")
    notes = ("tok/s: median over prompts, end to end. ÷ llama: ÷ plain llama-server; ÷ llama's best: ÷ the fastest "
             "llama-server row, plain or speculative (same regime, RTT, T and workload). decode tok/s: median over "
             "prompts of the tokens after the first ÷ the time after the first (greedy rows may answer at different "
             "lengths where near-ties tip, and end to end a shorter answer carries its prefill over fewer tokens). "
             "α: accepted ÷ drafted. τ: tokens per verification round. Every row ran in processes of its own, "
             "started afresh for each workload; each prompt fresh.")
    return "\n".join([*lines, "", notes]) + "\n"


def as_json(rows: Sequence[PeerRow], samples: Sequence[PeerSample], config: Mapping[str, Any]) -> dict[str, Any]:
    """The run's JSON document: its configuration, the rows (with both ratios) and every request."""
    against = comparisons(rows)
    return {
        "format": FORMAT, "config": dict(config),
        "rows": [{**asdict(row), "vs_llama_plain": against[i][0], "vs_best_llama": against[i][1]}
                 for i, row in enumerate(rows)],
        "requests": [asdict(s) for s in samples],
    }
