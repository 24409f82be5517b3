"""`speculoos bench run` (and `speculoos bench` alone): the proxy against its upstream, every mode interleaved.

`measure(plan)` is the whole measurement as a function, so the sub-commands that start servers
(drafts, two-device) run it in this process; `write` puts its outputs where the flags say.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from proxy.bench import concurrent, report, runner
from proxy.bench.client import BenchError, get_json
from proxy.bench.stats import Costs, identity_check, summarise
from proxy.bench.workloads import Workload, builtin_names, load

DEFAULT_MODES = "auto,k=1,k=2,k=4,off"


def base_url(url: str) -> str:
    """A server's base URL, without a trailing /v1."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


@dataclass(frozen=True)
class Plan:
    """One validated run."""

    direct: str  # base URLs, no /v1
    proxy: str
    workloads: list[Workload]
    modes: list[runner.Mode]
    model: str | None = None  # None: the upstream's first
    route: str | None = None  # the route whose costs predict speedups; None: the first
    prompts: int = 10
    repeat: int = 3
    max_tokens: int | None = None
    warmup: int = 1
    prime: bool = False
    concurrency: int = 1
    timeout_s: float = 600.0


@dataclass(frozen=True)
class Outcome:
    """A run's table, JSON document, chart data and trace."""

    title: str
    markdown: str
    document: dict[str, Any]
    series: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)


def plan_of(args: argparse.Namespace) -> Plan:
    """The run the flags ask for; BenchError naming a bad one."""
    if not args.direct or not args.proxy:
        raise BenchError("give --direct URL and --proxy URL (or --simulate TRACE, or a sub-command: see --help)")
    if args.cost_curve:
        raise BenchError("--cost-curve is for --simulate")
    if args.prompts < 1 or args.repeat < 1 or args.concurrency < 1 or (args.max_tokens is not None
                                                                       and args.max_tokens < 1):
        raise BenchError("--prompts, --repeat, --concurrency and --max-tokens must be positive")
    if args.prime and args.concurrency > 1:
        raise BenchError("--prime primes requests sent one at a time; drop it or --concurrency")
    names = (args.workloads or ",".join(builtin_names())).split(",")
    return Plan(base_url(args.direct), base_url(args.proxy), [load(n.strip()) for n in names if n.strip()],
                parse_modes(args.modes), args.model, args.route, args.prompts, args.repeat, args.max_tokens,
                args.warmup, args.prime, args.concurrency, args.timeout)


def parse_modes(text: str) -> list[runner.Mode]:
    """--modes, or a BenchError saying what is wrong with it."""
    try:
        return runner.parse_modes(text)
    except ValueError as exc:
        raise BenchError(f"--modes: {exc}") from exc


async def _measure(plan: Plan) -> tuple[list, Any, str]:
    """Run the requests one at a time (samples) or in bursts (concurrency: bursts); the proxy's status after."""
    async with aiohttp.ClientSession() as session:
        model = await runner.probe(session, plan.direct, plan.proxy, plan.model)
    endpoints = runner.Endpoints(plan.direct, plan.proxy, model, plan.max_tokens, plan.timeout_s)
    if plan.concurrency > 1:
        bursts = concurrent.schedule(plan.workloads, plan.prompts, plan.repeat, plan.modes, plan.concurrency)
        results: list = await concurrent.run(bursts, plan.modes, endpoints, warmup=plan.warmup)
    else:
        jobs = runner.schedule(plan.workloads, plan.prompts, plan.repeat, plan.modes)
        results = await runner.run(jobs, plan.modes, endpoints, warmup=plan.warmup, prime=plan.prime)
    async with aiohttp.ClientSession() as session:
        status = await get_json(session, plan.proxy + "/speculoos/status", "the proxy (--proxy)")
    return results, status, model


def route_status(status: Any, name: str | None) -> dict[str, Any] | None:
    """The benchmarked route's entry in /speculoos/status (the first when unnamed)."""
    routes = status.get("routes") if isinstance(status, dict) else None
    if not routes:
        return None
    if name is None:
        return routes[0]
    chosen = [r for r in routes if r.get("route") == name]
    if not chosen:
        raise BenchError(f"the proxy has no route {name!r} (routes: {', '.join(r.get('route', '?') for r in routes)})")
    return chosen[0]


def measure(plan: Plan) -> Outcome:
    """Run the plan against the servers and summarise it."""
    results, status, model = asyncio.run(_measure(plan))
    route = route_status(status, plan.route)
    names = [m.name for m in plan.modes]
    config = {"direct": plan.direct, "proxy": plan.proxy, "model": model,
              "route": route.get("route") if route else None, "workloads": [w.name for w in plan.workloads],
              "prompts": plan.prompts, "repeat": plan.repeat, "max_tokens": plan.max_tokens, "modes": names,
              "warmup": plan.warmup, "prime": plan.prime, "concurrency": plan.concurrency}
    title = (f"speculoos bench — {model}: direct {plan.direct} vs proxy {plan.proxy}, "
             f"{plan.prompts} prompts × {plan.repeat} repetitions per workload")
    if plan.concurrency > 1:
        samples = [s for burst in results for s in burst.samples]
        rows: list = concurrent.summarise(results, names)
        identity = identity_check(samples)
        markdown = concurrent.markdown(rows, plan.concurrency, title) + "\n" + report.identity_line(identity) + "\n"
        return Outcome(title, markdown, report.load_json(rows, identity, results, config, route), {},
                       report.trace_json(samples, config, route))
    rows = summarise(results, names, Costs.from_status(route) if route else None)
    identity = identity_check(results)
    return Outcome(title, report.bench_markdown(rows, identity, title),
                   report.bench_json(rows, identity, results, config, route), report.bench_series(rows),
                   report.trace_json(results, config, route))


def write(outcome: Outcome, *, json_path: Path | None = None, markdown: Path | None = None,
          chart: Path | None = None, trace: Path | None = None) -> None:
    """Each output the caller names; a trace without rounds is written with a warning."""
    if markdown:
        markdown.write_text(outcome.markdown)
    if json_path:
        json_path.write_text(json.dumps(outcome.document, indent=2, ensure_ascii=False) + "\n")
    if chart:
        try:
            report.chart(chart, outcome.series, outcome.title)
        except ImportError as exc:
            raise BenchError("--chart needs matplotlib: pip install matplotlib") from exc
    if trace:
        trace.write_text(json.dumps(outcome.trace, indent=1) + "\n")
        requests = outcome.trace.get("requests") or []
        if requests and all(r["rounds"] is None for r in requests):
            print("speculoos bench: warning: the proxy's `speculoos` object has no round_trace; the trace holds "
                  "per-request totals only and --simulate cannot replay it", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Measure, print the table and write what the flags ask for."""
    outcome = measure(plan_of(args))
    print(outcome.markdown)
    write(outcome, json_path=args.json, markdown=args.markdown, chart=args.chart, trace=args.record_trace)
    return 0


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """The run's flags (on `bench run`, and on `bench` itself, where they always were)."""
    bench.add_argument("--direct", metavar="URL", help="the upstream's base URL (the verifier's OpenAI server)")
    bench.add_argument("--proxy", metavar="URL", help="the proxy's base URL")
    bench.add_argument("--model", help="model name to send (default: the upstream's first in /v1/models)")
    bench.add_argument("--route", help="the proxy route whose costs predict speedups (default: the first)")
    bench.add_argument("--workloads", default=None,
                       help="comma-separated names or .json files (default: all shipped: "
                            f"{','.join(builtin_names())})")
    bench.add_argument("--prompts", type=int, default=10, metavar="N",
                       help="first N prompts of each workload (default 10)")
    bench.add_argument("--repeat", type=int, default=3, metavar="R", help="repetitions of every request (default 3)")
    bench.add_argument("--max-tokens", type=int, default=None, metavar="M",
                       help="override each prompt's max_tokens")
    bench.add_argument("--modes", default=DEFAULT_MODES,
                       help="proxy modes: auto, on, off, k=N; a /seq suffix (k=4/seq) turns draft-ahead off "
                            f"(default {DEFAULT_MODES}). Each mode and repetition drafts from a history of its own")
    bench.add_argument("--warmup", type=int, default=1, help="uncounted warm-up requests per path (default 1)")
    bench.add_argument("--prime", action="store_true",
                       help="cache each prompt in the target first (an uncounted 1-token request straight to it), so "
                            "neither side pays its prefill and the figures compare decoding (one at a time only)")
    bench.add_argument("--concurrency", type=int, default=1, metavar="N",
                       help="send N streams at once per path and report aggregate tokens/s (default 1: one at a time)")
    bench.add_argument("--timeout", type=float, default=600.0,
                       help="seconds of silence before a request fails (default 600)")
    bench.add_argument("--json", type=Path, metavar="FILE", help="write the full results as JSON")
    bench.add_argument("--markdown", type=Path, metavar="FILE", help="write the table as Markdown")
    bench.add_argument("--chart", type=Path, metavar="FILE", help="write a PNG chart of speedup against K")
    bench.add_argument("--record-trace", type=Path, metavar="FILE",
                       help="write each speculative request's rounds ([drafted, accepted]) for --simulate")
