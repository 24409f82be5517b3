"""Pure statistics over benchmark samples: spreads, speedups, Leviathan's prediction, output identity.

Glossary (one row = one workload in one mode):
    speedup          median output tokens/s of the mode ÷ that of `direct` (end to end, prefill included)
    paired speedup   the median, over prompts, of each request's tokens/s ÷ its own direct request's
                     (same prompt and repetition): prompts of different lengths do not blur it
    decode speedup   median ITL of `direct` ÷ median ITL of the mode (tokens after the first)
    predicted        Leviathan et al. 2023 (§3.1) from the row's measured α and the proxy's measured
                     costs (GET /speculoos/status):
                         rate(α, k) = E(α, k) / (k · draft_seconds_per_token + verify_seconds(k))
                     divided by the plain rate, 1 / median ITL of `direct` on the same workload.
                     Tokens the proxy served by plain decoding (passthrough, a mid-stream switch)
                     are predicted at the plain rate.
    efficiency       decode speedup ÷ predicted = measured decode rate ÷ predicted rate: what the
                     formula does not explain (proxy overhead, HTTP, tokenization, cost drift).
    pre-draft hits   of the rounds drafted ahead while the previous round was verified (draft-ahead),
                     the share whose tokens were used, summed over the row's requests
                     (the `draft_ahead` object of the proxy's `speculoos` extension, when present).
When the proxy reports each request's rounds (round_trace), the prediction replays them: each
round at the measured verification time of its own K (lookup paths vary from 1 to 32), model
drafts at the measured draft time, plain chunks at the plain rate. Without a trace it falls back
to the paper's formula at the mean K (drafted ÷ rounds); a `k=N` mode is predicted at N.
A mode named with /seq (k=4/seq) is the same mode with draft-ahead turned off.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from proxy.control.costs import expected_tokens

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


@dataclass(frozen=True)
class Costs:
    """A route's measured costs, from GET /speculoos/status."""

    draft_seconds_per_token: float | None
    verify_seconds_by_k: Mapping[int, float]
    plain_tokens_per_second: float | None

    @classmethod
    def from_status(cls, route: Mapping[str, Any]) -> Costs:
        """Read one route's entry (JSON turns the K keys into strings)."""
        by_k = {int(k): float(v) for k, v in (route.get("verify_seconds_by_k") or {}).items() if v is not None}
        return cls(route.get("draft_seconds_per_token"), by_k, route.get("plain_tokens_per_second"))

    def verify_seconds(self, k: float) -> float | None:
        """Verification time at k: measured, interpolated between the measured K around it, or extrapolated
        along a least-squares line through every measured K (as the controller does)."""
        if k in self.verify_seconds_by_k:
            return self.verify_seconds_by_k[int(k)]
        if len(self.verify_seconds_by_k) < 2:
            return None  # one point cannot tell a flat (GPU) cost from a steep (CPU) one
        ks = np.array(sorted(self.verify_seconds_by_k), dtype=float)
        seconds = np.array([self.verify_seconds_by_k[int(x)] for x in ks])
        if ks[0] < k < ks[-1]:
            return float(np.interp(k, ks, seconds))  # neighbours only: one slow outlier K elsewhere cannot skew it
        slope, intercept = np.polyfit(ks, seconds, 1)
        return max(float(intercept + slope * k), 0.0)


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


def predicted_rate(alpha: float, k: float, draft_seconds_per_token: float, verify_seconds: float) -> float:
    """Leviathan's tokens/s for k drafts per round at acceptance rate α."""
    return expected_tokens(alpha, k) / (k * draft_seconds_per_token + verify_seconds)  # type: ignore[arg-type]


def predicted_speedup(alpha: float, k: float, costs: Costs, plain_rate: float,
                      speculative_share: float = 1.0) -> float | None:
    """Predicted rate ÷ plain rate; a share of tokens served plainly runs at the plain rate."""
    verify = costs.verify_seconds(k)
    if verify is None or costs.draft_seconds_per_token is None or plain_rate <= 0:
        return None
    rate = predicted_rate(alpha, k, costs.draft_seconds_per_token, verify)
    seconds_per_token = speculative_share / rate + (1.0 - speculative_share) / plain_rate
    return (1.0 / seconds_per_token) / plain_rate


def traced_rate(extensions: Sequence[Mapping[str, Any]], costs: Costs, plain_rate: float) -> float | None:
    """Tokens/s predicted for speculative requests from their own rounds: each round's K at its measured
    verification time, the model's drafted tokens at its measured draft time, plain chunks at the plain rate.

    Rounds whose K varies (lookup paths of any length) are predicted round by round, not at a mean K.
    """
    tokens = seconds = 0.0
    for extension in extensions:
        trace = extension.get("round_trace")
        if not trace:
            return None
        for drafted, accepted, *_ in trace:
            verify = costs.verify_seconds(drafted)
            if verify is None:
                return None
            tokens, seconds = tokens + accepted + 1, seconds + verify
        model_drafted = int(((extension.get("drafts") or {}).get("model") or {}).get("drafted") or 0)
        if model_drafted:
            if costs.draft_seconds_per_token is None:
                return None
            seconds += model_drafted * costs.draft_seconds_per_token
        plain = int(extension.get("plain_tokens") or 0)
        tokens, seconds = tokens + plain, seconds + plain / plain_rate
    return tokens / seconds if seconds > 0 else None


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
