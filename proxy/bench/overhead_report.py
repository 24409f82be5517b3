"""`bench overhead`'s rows: the figures of one configuration, as a markdown table and as JSON."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.bench import overhead_stages as stages
from proxy.bench.overhead_run import Configuration, Measurement


@dataclass(frozen=True)
class Row:
    """One configuration's figures (milliseconds of the proxy thread's CPU unless named otherwise)."""

    draft: str
    temperature: float
    k: int
    streams: int
    context_tokens: int
    requests: int
    rounds: int
    tokens: int
    drafted_per_round: float | None
    tokens_per_round: float | None
    alpha: float | None
    plain_tokens: int
    cpu_ms_per_round: float | None  # median over windows of at least `window_rounds` rounds
    cpu_ms_p95: float | None
    cpu_ms_per_round_mean: float | None  # the whole run's CPU over its rounds
    cpu_ms_per_token: float | None
    rounds_per_s: float
    loop_lag_ms: float
    gc_ms_per_round: float | None  # the garbage collector's CPU, within the stages it interrupted
    gc_longest_ms: float  # its longest run: a hold of the loop
    draft_wall_ms_per_round: float | None  # the rounds' wait for their drafts (the model's compute is elsewhere)
    window_rounds: int
    stages_ms_per_round: dict[str, float | None]
    pinned: bool = False  # K pinned by each request (--pin), not the route's own decision


def _ratio(numerator: float, denominator: float, scale: float = 1.0) -> float | None:
    return numerator * scale / denominator if denominator else None


def row_from(configuration: Configuration, measurement: Measurement, context_tokens: int) -> Row:
    """The row of one measured configuration."""
    tally = measurement.tally
    window = max(configuration.streams, 8)
    windows = stages.window_costs(measurement.samples, window)
    median, p95 = stages.percentile(windows, 50), stages.percentile(windows, 95)
    split = stages.stage_split(measurement.stage_seconds, measurement.cpu_seconds)
    return Row(
        draft=configuration.draft, temperature=configuration.temperature, k=configuration.k,
        streams=configuration.streams, context_tokens=context_tokens,
        requests=configuration.requests_per_stream * configuration.streams, rounds=tally.rounds,
        tokens=measurement.tokens,
        drafted_per_round=_ratio(tally.drafted, tally.rounds), tokens_per_round=_ratio(tally.emitted, tally.rounds),
        alpha=_ratio(tally.accepted, tally.drafted), plain_tokens=tally.plain_tokens,
        cpu_ms_per_round=None if median is None else median * 1000, cpu_ms_p95=None if p95 is None else p95 * 1000,
        cpu_ms_per_round_mean=_ratio(measurement.cpu_seconds, tally.rounds, 1000),
        cpu_ms_per_token=_ratio(measurement.cpu_seconds, measurement.tokens, 1000),
        rounds_per_s=tally.rounds / measurement.wall_seconds if measurement.wall_seconds else 0.0,
        loop_lag_ms=measurement.lag_seconds * 1000,
        gc_ms_per_round=_ratio(measurement.collector_seconds[0], tally.rounds, 1000),
        gc_longest_ms=measurement.collector_seconds[1] * 1000,
        draft_wall_ms_per_round=_ratio(tally.draft_seconds, tally.rounds, 1000), window_rounds=window,
        stages_ms_per_round=stages.per_round_ms(split, tally.rounds), pinned=configuration.pinned)


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


COLUMNS = ("draft", "T", "K", "streams", "context", "rounds", "drafted/rd", "tokens/rd", "CPU ms/rd median",
           "p95", "mean", "CPU ms/token", "rounds/s", "loop lag ms", "GC ms/rd", "GC longest ms", "draft wall ms/rd",
           *(f"{stage} ms/rd" for stage in (*stages.STAGES, stages.OTHER)))


def markdown(rows: list[Row], *, header: bool = True) -> str:
    """The rows as a markdown table (its header only when asked: rows are printed as they are measured)."""
    lines = []
    if header:
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [row.draft, f"{row.temperature:g}", str(row.k), str(row.streams), str(row.context_tokens),
                 str(row.rounds), _number(row.drafted_per_round, 1), _number(row.tokens_per_round, 1),
                 _number(row.cpu_ms_per_round), _number(row.cpu_ms_p95), _number(row.cpu_ms_per_round_mean),
                 _number(row.cpu_ms_per_token, 3), f"{row.rounds_per_s:.0f}", _number(row.loop_lag_ms, 1),
                 _number(row.gc_ms_per_round, 3), _number(row.gc_longest_ms, 1), _number(row.draft_wall_ms_per_round),
                 *(_number(row.stages_ms_per_round[stage], 3) for stage in (*stages.STAGES, stages.OTHER))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
