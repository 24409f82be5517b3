"""SIMULATION: replay recorded per-round acceptance under a stated cost model.

A trace (written by `speculoos bench --record-trace`) lists, per speculative request, each round
as [drafted, accepted], or [drafted, accepted, source, steps] for a lookup or prediction path, steps
being the draft model's steps it took (one for reading the path in one batched pass, one per token
the model drafted ahead of it); traces without steps charge a prediction one step and a lookup none.
A round emits accepted + 1 tokens. The cost model is
proxy/control/cost_model.py's CostModel, the one a route with fallback.assume_costs decides by:
    round      steps · draft_ms (drafted, for model drafts) + verify_ms(drafted) + rtt_ms + proxy_ms
    verify_ms  verify_ms_flat + verify_ms_per_token · (drafted + 1)     (tokens evaluated)
               or, from a measured curve (`--cost-curve`, written by proxy/bench/gpu_costs.py),
               as the controller predicts from measured K: linear between the measured K around
               it, beyond them the least-squares line through all of them
    plain      rtt_ms once per request + plain_ms per token              (streamed decoding)
a request's speedup is its plain time ÷ its speculative time for the same tokens. Tokens a request
decoded plainly (after a switch, or in chunks after lookup misses) cost plain_ms each, and each
chunk after a miss one more round trip. Prefill is left out of both sides.
The `formula` column is Leviathan's i.i.d. prediction from the same rounds' α and mean K under the
same costs: where replay and formula differ, acceptance was not independent from round to round.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.bench.stats import Spread, spread
from proxy.control.cost_model import CostModel, expected_tokens
from proxy.drafting.base import Source

SIMULATION = "SIMULATION"
COST_MODELS = ("gpu", "cpu", "custom")
MEASURED = "measured"  # the cost model of a measured curve
TRACE_FORMAT = "speculoos-bench-trace"
CURVE_FORMAT = "speculoos-verify-cost-curve"  # proxy.bench.gpu_costs writes it


class SimulationError(ValueError):
    """A bad cost model or trace; the message says which."""


def cost_model(name: str, *, draft_ms: float | None = None, verify_ms_flat: float | None = None,
               verify_ms_per_token: float | None = None, rtt_ms: float = 0.0,
               plain_ms: float | None = None) -> CostModel:
    """Validate the numbers for one of COST_MODELS.

    gpu: verification costs verify_ms_flat for any K; cpu: verify_ms_per_token per evaluated token;
    custom: both. Plain decoding defaults to one single-token pass: verify_ms(0).
    """
    if name not in COST_MODELS:
        raise SimulationError(f"cost model must be one of {', '.join(COST_MODELS)}, not {name!r}")
    if draft_ms is None:
        raise SimulationError("--draft-ms is required for a simulation")
    if name == "gpu" and (verify_ms_flat is None or verify_ms_per_token):
        raise SimulationError("cost model gpu: give --verify-ms-flat and no --verify-ms-per-token")
    if name == "cpu" and (verify_ms_per_token is None or verify_ms_flat):
        raise SimulationError("cost model cpu: give --verify-ms-per-token and no --verify-ms-flat")
    flat, per_token = verify_ms_flat or 0.0, verify_ms_per_token or 0.0
    model = CostModel(name, draft_ms, flat, per_token, rtt_ms, 0.0)
    plain = model.verify_ms(0) if plain_ms is None else plain_ms
    if min(draft_ms, flat, per_token, rtt_ms) < 0 or plain <= 0 or model.verify_ms(1) <= 0:
        raise SimulationError("costs must be non-negative, and verification and plain decoding must cost time")
    return CostModel(name, draft_ms, flat, per_token, rtt_ms, plain)


def _positive_ms(value: Any, where: str, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero):
        raise SimulationError(f"{where} must be a {'non-negative' if zero else 'positive'} number of ms")
    return float(value)


def measured_cost_model(document: Any, source: str, *, rtt_ms: float = 0.0) -> CostModel:
    """The cost model of a measured curve: {"verify_ms": {"K": ms}, "plain_ms", "draft_ms"} (gpu_costs.py)."""
    if not isinstance(document, dict) or document.get("format", CURVE_FORMAT) != CURVE_FORMAT:
        raise SimulationError(f"{source}: not a cost curve written by proxy/bench/gpu_costs.py")
    by_k = document.get("verify_ms")
    if not isinstance(by_k, dict) or not by_k:
        raise SimulationError(f"{source}: verify_ms must map each measured K to its ms")
    if not all(isinstance(k, str) and k.isdigit() for k in by_k):
        raise SimulationError(f"{source}: verify_ms: each K must be a whole number, 0 or more")
    curve = sorted((int(k), _positive_ms(ms, f"{source}: verify_ms[{k}]")) for k, ms in by_k.items())
    if rtt_ms < 0:
        raise SimulationError("costs must be non-negative, and verification and plain decoding must cost time")
    return CostModel(MEASURED, _positive_ms(document.get("draft_ms"), f"{source}: draft_ms", zero=True), 0.0, 0.0,
                     rtt_ms, _positive_ms(document.get("plain_ms"), f"{source}: plain_ms"), tuple(curve))


@dataclass(frozen=True)
class TracedRequest:
    """One speculative request's rounds."""

    workload: str
    mode: str
    rounds: tuple[tuple[int, int], ...]  # (drafted, accepted) per round
    plain_tokens: int = 0  # decoded plainly after a mid-stream switch or a lookup miss
    sources: tuple[str, ...] = ()  # per round: what drafted it ("model", "lookup", "prediction")
    plain_calls: int = 0  # plain chunks after lookup misses, each a round trip
    steps: tuple[int | None, ...] = ()  # per round: the model's steps for a path (None: the source's usual)


def parse_trace(document: Any, source: str) -> list[TracedRequest]:
    """The replayable requests of a trace file."""
    if not isinstance(document, dict) or document.get("format") != TRACE_FORMAT:
        raise SimulationError(f"{source}: not a trace written by speculoos bench --record-trace")
    requests = []
    for i, entry in enumerate(document.get("requests") or []):
        rounds = entry.get("rounds")
        if rounds is None:
            continue  # the proxy did not report per-round acceptance for this request
        if not all(isinstance(r, list) and len(r) in (2, 3, 4) and 0 <= r[1] <= r[0] for r in rounds):
            raise SimulationError(f"{source}: requests[{i}].rounds must be [drafted, accepted(, source(, steps))] "
                                  "entries")
        requests.append(TracedRequest(entry["workload"], entry["mode"], tuple((int(r[0]), int(r[1])) for r in rounds),
                                      int(entry.get("plain_tokens") or 0),
                                      tuple(str(r[2]) if len(r) >= 3 else Source.MODEL for r in rounds),
                                      int(entry.get("plain_calls") or 0),
                                      tuple(int(r[3]) if len(r) == 4 else None for r in rounds)))
    if not requests:
        raise SimulationError(f"{source}: no request has per-round data (the proxy's `speculoos` object "
                              f"must carry round_trace)")
    return requests


@dataclass(frozen=True)
class Replay:
    """One request under a cost model."""

    tokens: int
    speculative_ms: float
    plain_ms: float

    @property
    def speedup(self) -> float:
        """Plain time ÷ speculative time."""
        return self.plain_ms / self.speculative_ms


def replay(request: TracedRequest, model: CostModel) -> Replay:
    """Time one request's rounds, and the same tokens decoded plainly."""
    tokens = sum(accepted + 1 for _, accepted in request.rounds) + request.plain_tokens
    sources = request.sources or (Source.MODEL,) * len(request.rounds)
    steps = request.steps or (None,) * len(request.rounds)
    speculative = (sum(model.round_ms(drafted, source=source, steps=step)
                       for (drafted, _), source, step in zip(request.rounds, sources, steps, strict=True))
                   + request.plain_tokens * model.plain_ms + request.plain_calls * model.rtt_ms)
    return Replay(tokens, speculative, model.rtt_ms + tokens * model.plain_ms)


@dataclass(frozen=True)
class SimulatedRow:
    """One workload in one mode, simulated."""

    workload: str
    mode: str
    requests: int
    rounds: int
    alpha: float | None
    mean_k: float
    tokens_per_round: float
    speedup: float  # all the workload's tokens: Σ plain time ÷ Σ speculative time
    per_request: Spread
    formula_speedup: float  # Leviathan's i.i.d. prediction at the same α and mean K


def simulate(requests: Sequence[TracedRequest], model: CostModel) -> list[SimulatedRow]:
    """Replay every request; one row per workload and mode, in the trace's order."""
    groups: dict[tuple[str, str], list[TracedRequest]] = {}
    for r in requests:
        groups.setdefault((r.workload, r.mode), []).append(r)
    rows = []
    for (workload, mode), group in groups.items():
        replays = [replay(r, model) for r in group]
        rounds = [pair for r in group for pair in r.rounds]
        drafted, accepted = sum(d for d, _ in rounds), sum(a for _, a in rounds)
        alpha = accepted / drafted if drafted else None
        mean_k = drafted / len(rounds) if rounds else 0.0
        formula_rate = expected_tokens(alpha or 0.0, mean_k) / model.round_ms(mean_k)  # type: ignore[arg-type]
        rows.append(SimulatedRow(
            workload, mode, len(group), len(rounds), alpha, mean_k,
            (accepted + len(rounds)) / len(rounds) if rounds else 0.0,
            sum(r.plain_ms for r in replays) / sum(r.speculative_ms for r in replays),
            spread(r.speedup for r in replays),  # type: ignore[arg-type]
            formula_rate * model.plain_ms))
    return rows


def describe(model: CostModel) -> str:
    """The cost model in words, for titles."""
    if model.verify_curve:
        points = ", ".join(f"K={k}: {ms:.3g}" for k, ms in model.verify_curve)
        return (f"cost model {model.name}: draft {model.draft_ms:.3g} ms/token, verify ms by K ({points}), "
                f"RTT {model.rtt_ms:g} ms, plain {model.plain_ms:.3g} ms/token{_proxy(model)}")
    verify = " + ".join(part for part in (
        f"{model.verify_ms_flat:g} ms flat" if model.verify_ms_flat else "",
        f"{model.verify_ms_per_token:g} ms/evaluated token" if model.verify_ms_per_token else "") if part)
    return (f"cost model {model.name}: draft {model.draft_ms:g} ms/token, verify {verify}, "
            f"RTT {model.rtt_ms:g} ms, plain {model.plain_ms:g} ms/token{_proxy(model)}")


def _proxy(model: CostModel) -> str:
    return f", proxy {model.proxy_ms:.3g} ms/round" if model.proxy_ms else ""


def as_json(rows: Sequence[SimulatedRow], model: CostModel, source: str,
            recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The simulation's JSON document; labelled SIMULATION throughout."""
    return {
        "label": SIMULATION, "simulation": True, "trace": source, "cost_model": vars(model),
        "description": f"{SIMULATION}: {describe(model)}", "recorded_with": recorded,
        "rows": [{"label": SIMULATION, **{k: v for k, v in vars(r).items() if k != "per_request"},
                  "per_request_speedup": vars(r.per_request)} for r in rows],
    }
