"""`speculoos bench --simulate TRACE`: replay a recorded trace under a stated cost model (SIMULATION)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from proxy.bench import compare, report, simulate
from proxy.bench.client import BenchError


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """The simulation's flags."""
    sim = bench.add_argument_group("simulation (replay a trace; prints SIMULATION results)")
    sim.add_argument("--simulate", type=Path, metavar="TRACE", help="a file written by --record-trace")
    sim.add_argument("--cost-model", choices=simulate.COST_MODELS, default=None,
                     help="gpu (default): flat verification cost; cpu: cost per evaluated token; custom: both")
    sim.add_argument("--cost-curve", type=Path, metavar="FILE",
                     help="measured costs instead of a cost model: the JSON proxy/bench/gpu_costs.py writes "
                          "(verification by K, draft and plain ms); --rtt-ms still applies")
    sim.add_argument("--draft-ms", type=float, help="draft time per drafted token")
    sim.add_argument("--verify-ms-flat", type=float, help="verification time per pass, whatever K")
    sim.add_argument("--verify-ms-per-token", type=float, help="verification time per evaluated token (K + 1)")
    sim.add_argument("--rtt-ms", type=float, default=0.0, help="network round trip per call (default 0)")
    sim.add_argument("--plain-ms", type=float, help="target's plain decoding time per token "
                                                    "(default: one single-token verification pass)")
    sim.add_argument("--proxy-ms", default="0", metavar="MS|FILE",
                     help="the proxy's own CPU per round, charged to every round: ms, or the JSON `speculoos bench "
                          "overhead --json` wrote (the median of its one-stream rows' cpu_ms_per_round); default 0")


def _measured_model(args: argparse.Namespace) -> simulate.CostModel:
    given = [flag for flag, value in (("--cost-model", args.cost_model), ("--draft-ms", args.draft_ms),
                                      ("--verify-ms-flat", args.verify_ms_flat),
                                      ("--verify-ms-per-token", args.verify_ms_per_token),
                                      ("--plain-ms", args.plain_ms)) if value is not None]
    if given:
        raise BenchError(f"--cost-curve takes every cost from the file; drop {', '.join(given)}")
    try:
        document = json.loads(args.cost_curve.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchError(f"cannot read the cost curve {args.cost_curve}: {exc}") from exc
    return simulate.measured_cost_model(document, str(args.cost_curve), rtt_ms=args.rtt_ms)


def proxy_ms(given: str) -> float:
    """--proxy-ms: a number of ms, or the median one-stream cpu_ms_per_round of a `bench overhead --json` file."""
    try:
        value = float(given)
    except ValueError:
        try:
            rows = [json.loads(line) for line in Path(given).read_text().splitlines() if line.strip()]
            value = statistics.median(row["cpu_ms_per_round"] for row in rows if row["streams"] == 1)
        except (OSError, ValueError, TypeError, KeyError, statistics.StatisticsError) as exc:
            raise BenchError(f"--proxy-ms {given}: neither ms nor a bench overhead JSON with one-stream rows "
                             f"({type(exc).__name__}: {exc})") from exc
    if not value >= 0:
        raise BenchError(f"--proxy-ms must be a non-negative number of ms (got {given})")
    return value


def markdown_of(trace: Path, model: simulate.CostModel) -> tuple[str, dict, dict, str]:
    """The replay of `trace` under `model`: its table, JSON document, chart data and title."""
    try:
        document = json.loads(trace.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchError(f"cannot read the trace {trace}: {exc}") from exc
    rows = simulate.simulate(simulate.parse_trace(document, str(trace)), model)
    description = simulate.describe(model)
    return (report.simulation_markdown(rows, description),
            simulate.as_json(rows, model, str(trace), document.get("config")),
            report.simulation_series(rows), f"{simulate.SIMULATION} — {description}")


def run(args: argparse.Namespace) -> int:
    """Replay the trace, print the SIMULATION table and write what the flags ask for."""
    if args.cost_curve:
        model = _measured_model(args)
    else:
        model = simulate.cost_model(args.cost_model or "gpu", draft_ms=args.draft_ms,
                                    verify_ms_flat=args.verify_ms_flat, verify_ms_per_token=args.verify_ms_per_token,
                                    rtt_ms=args.rtt_ms, plain_ms=args.plain_ms)
    model = dataclasses.replace(model, proxy_ms=proxy_ms(args.proxy_ms))
    markdown, document, series, title = markdown_of(args.simulate, model)
    print(markdown)
    compare.write(compare.Outcome(title, markdown, document, series), json_path=args.json,
                  markdown=args.markdown, chart=args.chart)
    return 0
