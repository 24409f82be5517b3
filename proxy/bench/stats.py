"""Pure statistics over benchmark samples: spreads, speedups and their prediction, output identity.

Glossary (one row = one workload in one mode):
    speedup          median output tokens/s of the mode ÷ that of `direct` (end to end, prefill included)
    paired speedup   the median, over prompts, of each request's tokens/s ÷ its own direct request's
                     (same prompt and repetition): prompts of different lengths do not blur it
    decode speedup   median ITL of `direct` ÷ median ITL of the mode (tokens after the first)
    predicted        the speedup the cost model predicts from the proxy's measured costs
                     (proxy/bench/prediction.py): from each request's rounds when the proxy reports
                     them (round_trace), else from the row's α at the mean K (drafted ÷ rounds);
                     a `k=N` mode is predicted at N
    efficiency       decode speedup ÷ predicted = measured decode rate ÷ predicted rate: what the
                     formula does not explain (proxy overhead, HTTP, tokenization, cost drift).
    pre-draft hits   of the rounds drafted ahead while the previous round was verified (draft-ahead),
                     the share whose tokens were used, summed over the row's requests
                     (the `draft_ahead` object of the proxy's `speculoos` extension, when present).
A mode named with /seq (k=4/seq) is the same mode with draft-ahead turned off.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.bench.prediction import Costs, predicted_speedup, traced_rate

DIRECT = "direct"
PASSTHROUGH_MODE = "off"
SEQUENTIAL_SUFFIX = "/seq"  # a mode's name with draft-ahead (pipelining) turned off
SPECULATIVE = "speculative"


@dataclass(frozen=True)
class Sample:
    """One measured request."""

    workload: str
    prompt: int  # index in the workload
    repetition: int
    mode: str  # DIRECT or a proxy mode name (auto, off, on, k=N)
    position: int  # its place in the interleaved group of this prompt and repetition
    greedy: bool
    status: int
    error: str | None
    text: str
    completion_tokens: int | None
    served_as: str | None
    extension: Mapping[str, Any] | None
    seconds: float
    ttft_s: float | None
    itl_s: float | None
    tokens_per_second: float | None

    @property
    def ok(self) -> bool:
        """Answered in full, without an error."""
        return self.status == 200 and self.error is None

    @property
    def speculative(self) -> bool:
        """Served by speculation (at least in part)."""
        return self.served_as == SPECULATIVE and self.extension is not None


@dataclass(frozen=True)
class Spread:
    """Median and range of a handful of measurements."""

    median: float
    low: float
    high: float
    n: int


def spread(values: Iterable[float | None]) -> Spread | None:
    """The spread of the values that were measured, or None if none were."""
    measured = [v for v in values if v is not None]
    if not measured:
        return None
    return Spread(statistics.median(measured), min(measured), max(measured), len(measured))


def pinned_k(mode: str) -> int | None:
    """N for a `k=N` or `k=N/seq` mode."""
    base = mode.removesuffix(SEQUENTIAL_SUFFIX)
    return int(base[2:]) if base.startswith("k=") and base[2:].isdigit() else None


def draft_ahead(extensions: Iterable[Mapping[str, Any]]) -> tuple[int, int] | None:
    """(pre-drafts started, pre-drafts whose tokens were used), summed; None when no request reports them."""
    reports = [e["draft_ahead"] for e in extensions if isinstance(e.get("draft_ahead"), Mapping)]
    if not reports:
        return None
    return sum(int(r.get("started") or 0) for r in reports), sum(int(r.get("hits") or 0) for r in reports)


@dataclass(frozen=True)
class Row:
    """One workload in one mode."""

    workload: str
    mode: str
    requests: int
    errors: int
    speculative: int  # requests the proxy served speculatively
    tokens_per_second: Spread | None
    ttft_ms: float | None  # median
    itl_ms: float | None  # median
    alpha: float | None
    tokens_per_round: float | None
    mean_k: float | None
    speedup: float | None
    paired_speedup: Spread | None  # per prompt and repetition: tokens/s ÷ its direct request's
    decode_speedup: float | None
    predicted_speedup: float | None
    efficiency: float | None
    pre_drafts_started: int | None  # drafted during a verification (draft-ahead); None: not reported
    pre_draft_hits: int | None  # of those, the ones whose tokens were used
    pre_draft_hit_rate: float | None  # hits ÷ started


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator ÷ denominator, or None when either is missing (or the denominator is 0)."""
    return numerator / denominator if numerator is not None and denominator else None


def _median(values: Iterable[float | None]) -> float | None:
    s = spread(values)
    return s.median if s else None


def paired_ratios(samples: Sequence[Sample], direct: Sequence[Sample]) -> list[float]:
    """Each answered request's tokens/s ÷ that of the direct request for the same prompt and repetition."""
    baseline = {(s.prompt, s.repetition): s.tokens_per_second for s in direct if s.ok and s.tokens_per_second}
    return [s.tokens_per_second / base for s in samples
            if s.ok and s.tokens_per_second and (base := baseline.get((s.prompt, s.repetition)))]


def _row(workload: str, mode: str, samples: Sequence[Sample], baseline: Row | None, costs: Costs | None,
         direct: Sequence[Sample] = ()) -> Row:
    ok = [s for s in samples if s.ok]
    rate = spread(s.tokens_per_second for s in ok)
    ttft, itl = _median(s.ttft_s for s in ok), _median(s.itl_s for s in ok)
    extensions = [s.extension for s in ok if s.speculative and s.extension is not None]
    drafted = sum(int(e.get("drafted") or 0) for e in extensions)
    accepted = sum(int(e.get("accepted") or 0) for e in extensions)
    rounds = sum(int(e.get("rounds") or 0) for e in extensions)
    emitted = sum(float(e.get("tokens_per_round") or 0.0) * int(e.get("rounds") or 0) for e in extensions)
    alpha = accepted / drafted if drafted else None
    started, hits = draft_ahead(extensions) or (None, None)
    mean_k = drafted / rounds if rounds else None
    all_tokens = sum(s.completion_tokens or 0 for s in ok)
    plain_in_spec = sum(int(s.extension.get("plain_tokens") or 0) for s in ok if s.speculative and s.extension)
    spec_tokens = sum(s.completion_tokens or 0 for s in ok if s.speculative) - plain_in_spec
    share = spec_tokens / all_tokens if all_tokens else 0.0
    predicted = None
    plain_rate = 1.0 / baseline.itl_ms * 1000.0 if baseline and baseline.itl_ms else None
    if mode != DIRECT and plain_rate is not None:
        if share == 0.0:
            predicted = 1.0  # everything went the plain way: the ideal is the direct rate
        elif costs is not None and (rate_traced := traced_rate(extensions, costs, plain_rate)) is not None:
            share = sum(s.completion_tokens or 0 for s in ok if s.speculative) / all_tokens
            predicted = 1.0 / (share / rate_traced + (1.0 - share) / plain_rate) / plain_rate
        elif costs is not None and alpha is not None and mean_k is not None:
            # A pinned K drafts fewer only in a generation's last round; auto mode's K varies.
            predicted = predicted_speedup(alpha, pinned_k(mode) or mean_k, costs, plain_rate, share)
    speedup = ratio(rate.median if rate else None, baseline.tokens_per_second.median
                     if baseline and baseline.tokens_per_second else None)
    decode_speedup = ratio(baseline.itl_ms if baseline else None, itl * 1000.0 if itl else None)
    return Row(workload, mode, len(samples), len(samples) - len(ok), len(extensions), rate,
               ttft * 1000.0 if ttft is not None else None, itl * 1000.0 if itl is not None else None,
               alpha, emitted / rounds if rounds else None, mean_k,
               1.0 if mode == DIRECT else speedup, None if mode == DIRECT else spread(paired_ratios(samples, direct)),
               1.0 if mode == DIRECT else decode_speedup,
               predicted, ratio(decode_speedup, predicted) if mode != DIRECT else None,
               started, hits, ratio(hits, started))


def summarise(samples: Sequence[Sample], modes: Sequence[str], costs: Costs | None) -> list[Row]:
    """One row per workload and mode (direct first), in the order the workloads were run."""
    rows = []
    for workload in dict.fromkeys(s.workload for s in samples):
        mine = [s for s in samples if s.workload == workload]
        direct = [s for s in mine if s.mode == DIRECT]
        baseline = _row(workload, DIRECT, direct, None, costs)
        rows.append(baseline)
        rows += [_row(workload, mode, [s for s in mine if s.mode == mode], baseline, costs, direct) for mode in modes]
    return rows


@dataclass(frozen=True)
class Difference:
    """A greedy output that differs from the direct one."""

    workload: str
    prompt: int
    repetition: int
    mode: str
    first_difference: int  # character index


@dataclass(frozen=True)
class Identity:
    """Greedy outputs compared with `direct`, per mode."""

    checked: dict[str, int]
    differences: tuple[Difference, ...]

    @property
    def total_checked(self) -> int:
        """Pairs compared."""
        return sum(self.checked.values())


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def identity_check(samples: Sequence[Sample]) -> Identity:
    """Compare every greedy proxy output with the direct output of the same prompt and repetition."""
    direct = {(s.workload, s.prompt, s.repetition): s for s in samples if s.mode == DIRECT and s.ok}
    checked: dict[str, int] = {}
    differences = []
    for s in samples:
        reference = direct.get((s.workload, s.prompt, s.repetition))
        if s.mode == DIRECT or not s.greedy or not s.ok or reference is None:
            continue
        checked[s.mode] = checked.get(s.mode, 0) + 1
        if s.text != reference.text:
            differences.append(Difference(s.workload, s.prompt, s.repetition, s.mode,
                                          _first_difference(s.text, reference.text)))
    return Identity(checked, tuple(differences))
