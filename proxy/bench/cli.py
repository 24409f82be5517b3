"""`speculoos bench`: measure the proxy against its upstream, or replay a trace (SIMULATION)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from proxy.bench import concurrent, peers, report, runner, simulate
from proxy.bench.client import BenchError, get_json
from proxy.bench.stats import Costs, identity_check, summarise
from proxy.bench.workloads import WorkloadError, builtin_names, load

DEFAULT_MODES = "auto,k=1,k=2,k=4,off"
EXIT_FAILED = 1


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench`."""
    bench = commands.add_parser(
        "bench", help="benchmark the proxy against its upstream, or replay a trace",
        description="Send each workload straight to the upstream and through the proxy in every mode, "
                    "interleaved, streaming; report tokens/s, TTFT, ITL, α, and the speedup Leviathan's "
                    "formula predicts. With --simulate, replay a recorded trace under a cost model instead.")
    bench.add_argument("--direct", metavar="URL", help="the upstream's base URL (the verifier's OpenAI server)")
    bench.add_argument("--proxy", metavar="URL", help="the proxy's base URL")
    bench.add_argument("--model", help="model name to send (default: the upstream's first in /v1/models)")
    bench.add_argument("--route", help="the proxy route whose costs predict speedups (default: the first)")
    bench.add_argument("--workloads", default=None,
                       help="comma-separated names or .json files (default: all shipped: "
                            f"{','.join(builtin_names())})")
    bench.add_argument("--prompts", type=int, default=10, metavar="N", help="first N prompts of each workload (default 10)")
    bench.add_argument("--repeat", type=int, default=3, metavar="R", help="repetitions of every request (default 3)")
    bench.add_argument("--max-tokens", type=int, default=None, metavar="M",
                       help="override each prompt's max_tokens")
    bench.add_argument("--modes", default=DEFAULT_MODES,
                       help="proxy modes: auto, on, off, k=N; a /seq suffix (k=4/seq) turns draft-ahead off "
                            f"(default {DEFAULT_MODES})")
    bench.add_argument("--warmup", type=int, default=1, help="uncounted warm-up requests per path (default 1)")
    bench.add_argument("--prime", action="store_true",
                       help="cache each prompt in the target first (an uncounted 1-token request straight to it), so "
                            "neither side pays its prefill and the figures compare decoding (one at a time only)")
    bench.add_argument("--concurrency", type=int, default=1, metavar="N",
                       help="send N streams at once per path and report aggregate tokens/s (default 1: one at a time)")
    bench.add_argument("--timeout", type=float, default=600.0, help="seconds of silence before a request fails (default 600)")
    bench.add_argument("--json", type=Path, metavar="FILE", help="write the full results as JSON")
    bench.add_argument("--markdown", type=Path, metavar="FILE", help="write the table as Markdown")
    bench.add_argument("--chart", type=Path, metavar="FILE", help="write a PNG chart of speedup against K")
    bench.add_argument("--record-trace", type=Path, metavar="FILE",
                       help="write each speculative request's rounds ([drafted, accepted]) for --simulate")
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
    bench.set_defaults(run=run)
    # Sub-commands beside the flat usage above: `speculoos bench --direct ... --proxy ...` keeps working.
    peers.add_cli(bench.add_subparsers(dest="bench_command", metavar="{peers}", required=False))


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _write_outputs(args: argparse.Namespace, markdown: str, document: dict[str, Any],
                   series: dict[str, dict[str, list[tuple[int, float]]]], title: str) -> None:
    print(markdown)
    if args.markdown:
        args.markdown.write_text(markdown)
    if args.json:
        args.json.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    if args.chart:
        try:
            report.chart(args.chart, series, title)
        except ImportError as exc:
            raise BenchError("--chart needs matplotlib: pip install matplotlib") from exc


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


def _simulate(args: argparse.Namespace) -> int:
    if args.cost_curve:
        model = _measured_model(args)
    else:
        model = simulate.cost_model(args.cost_model or "gpu", draft_ms=args.draft_ms,
                                    verify_ms_flat=args.verify_ms_flat, verify_ms_per_token=args.verify_ms_per_token,
                                    rtt_ms=args.rtt_ms, plain_ms=args.plain_ms)
    try:
        document = json.loads(args.simulate.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchError(f"cannot read the trace {args.simulate}: {exc}") from exc
    rows = simulate.simulate(simulate.parse_trace(document, str(args.simulate)), model)
    description = simulate.describe(model)
    _write_outputs(args, report.simulation_markdown(rows, description),
                   simulate.as_json(rows, model, str(args.simulate), document.get("config")),
                   report.simulation_series(rows), f"{simulate.SIMULATION} — {description}")
    return 0


async def _measure(args: argparse.Namespace, workloads: list, modes: list[runner.Mode]) -> tuple[list, Any, str]:
    """Run the requests one at a time (samples) or in bursts (--concurrency: bursts); the proxy's status after."""
    direct, proxy = _base(args.direct), _base(args.proxy)
    async with aiohttp.ClientSession() as session:
        model = await runner.probe(session, direct, proxy, args.model)
    endpoints = runner.Endpoints(direct, proxy, model, args.max_tokens, args.timeout)
    if args.concurrency > 1:
        bursts = concurrent.schedule(workloads, args.prompts, args.repeat, modes, args.concurrency)
        results: list = await concurrent.run(bursts, modes, endpoints, warmup=args.warmup)
    else:
        jobs = runner.schedule(workloads, args.prompts, args.repeat, modes)
        results = await runner.run(jobs, modes, endpoints, warmup=args.warmup, prime=args.prime)
    async with aiohttp.ClientSession() as session:
        status = await get_json(session, proxy + "/speculoos/status", "the proxy (--proxy)")
    return results, status, model


def _route_status(status: Any, name: str | None) -> dict[str, Any] | None:
    routes = status.get("routes") if isinstance(status, dict) else None
    if not routes:
        return None
    if name is None:
        return routes[0]
    chosen = [r for r in routes if r.get("route") == name]
    if not chosen:
        raise BenchError(f"the proxy has no route {name!r} (routes: {', '.join(r.get('route', '?') for r in routes)})")
    return chosen[0]


def _bench(args: argparse.Namespace) -> int:
    if not args.direct or not args.proxy:
        raise BenchError("give --direct URL and --proxy URL (or --simulate TRACE, or the peers sub-command)")
    if args.cost_curve:
        raise BenchError("--cost-curve is for --simulate")
    if args.prompts < 1 or args.repeat < 1 or args.concurrency < 1 or (args.max_tokens is not None
                                                                       and args.max_tokens < 1):
        raise BenchError("--prompts, --repeat, --concurrency and --max-tokens must be positive")
    if args.prime and args.concurrency > 1:
        raise BenchError("--prime primes requests sent one at a time; drop it or --concurrency")
    try:
        modes = runner.parse_modes(args.modes)
    except ValueError as exc:
        raise BenchError(f"--modes: {exc}") from exc
    names = (args.workloads or ",".join(builtin_names())).split(",")
    workloads = [load(name.strip()) for name in names if name.strip()]
    results, status, model = asyncio.run(_measure(args, workloads, modes))
    route = _route_status(status, args.route)
    config = {"direct": _base(args.direct), "proxy": _base(args.proxy), "model": model,
              "route": route.get("route") if route else None, "workloads": [w.name for w in workloads],
              "prompts": args.prompts, "repeat": args.repeat, "max_tokens": args.max_tokens,
              "modes": [m.name for m in modes], "warmup": args.warmup, "prime": args.prime,
              "concurrency": args.concurrency}
    title = (f"speculoos bench — {model}: direct {config['direct']} vs proxy {config['proxy']}, "
             f"{args.prompts} prompts × {args.repeat} repetitions per workload")
    if args.concurrency > 1:
        samples = [s for burst in results for s in burst.samples]
        rows = concurrent.summarise(results, [m.name for m in modes])
        identity = identity_check(samples)
        markdown = concurrent.markdown(rows, args.concurrency, title) + "\n" + report.identity_line(identity) + "\n"
        _write_outputs(args, markdown, report.load_json(rows, identity, results, config, route), {}, title)
    else:
        samples = results
        rows = summarise(samples, [m.name for m in modes], Costs.from_status(route) if route else None)
        identity = identity_check(samples)
        _write_outputs(args, report.bench_markdown(rows, identity, title),
                       report.bench_json(rows, identity, samples, config, route),
                       report.bench_series(rows), title)
    if args.record_trace:
        trace = report.trace_json(samples, config, route)
        args.record_trace.write_text(json.dumps(trace, indent=1) + "\n")
        if trace["requests"] and all(r["rounds"] is None for r in trace["requests"]):
            print("speculoos bench: warning: the proxy's `speculoos` object has no round_trace; the trace holds "
                  "per-request totals only and --simulate cannot replay it", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark or the simulation; one line and exit 1 on failure."""
    try:
        return _simulate(args) if args.simulate else _bench(args)
    except (BenchError, WorkloadError, simulate.SimulationError) as exc:
        print(f"speculoos bench: {exc}", file=sys.stderr)
        return EXIT_FAILED
