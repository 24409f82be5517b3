"""`speculoos bench first-request`: the first request on a fresh route, against passthrough, while the route learns
its costs.

For each workload, starts a fresh verifier and a fresh proxy (nothing measured yet) and sends the
workload's first prompt through the proxy in auto mode; then, on another fresh stack, the same
request straight to the verifier (through the relay too). Neither finds the prompt cached on the
verifier, as a user's first request would not. --repeat N does that N times per workload. Prints
each workload's median tokens/s both ways and the median of the paired ratios. Requests stream
and are timed as `bench run` times them. Overlapping --verifier-cores and --proxy-cores (e.g.
both 0,1) give the shared-cores regime.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp

from proxy.bench.client import BenchError, Reply
from proxy.bench.command import guarded
from proxy.bench.local import LocalStack, cores_argument, local_stack
from proxy.bench.rtt_sweep import regime
from proxy.bench.runner import Endpoints, parse_modes, request_for, send
from proxy.bench.workloads import Prompt, load

RELAY_PORT = 18002
TIMEOUT_S = 600.0


def _fresh_stack(args: argparse.Namespace) -> AbstractContextManager[LocalStack]:
    """A verifier and a proxy that have seen nothing yet."""
    return local_stack(args.target, args.draft, threads=1, kinds=[args.kind] if args.kind else (),
                       verifier_cores=args.verifier_cores, proxy_cores=args.proxy_cores, relay_port=RELAY_PORT,
                       rtt_ms=args.rtt_ms)


async def _once(stack: LocalStack, prompt: Prompt, model: str, max_tokens: int, proxied: bool) -> Reply:
    endpoints = Endpoints(stack.direct_url, stack.proxy_url, model, max_tokens, TIMEOUT_S)
    request = request_for(endpoints, prompt, parse_modes("auto")[0] if proxied else None, max_tokens)
    async with aiohttp.ClientSession() as session:
        reply = await send(session, request, TIMEOUT_S)
    if reply.error or not reply.tokens_per_second:
        raise BenchError(f"{request[0]}: {reply.error or 'no tokens'}")
    return reply


def line(workload: str, pairs: Sequence[dict[str, Any]]) -> str:
    """A workload's table line from its (proxy, direct, speculoos) pairs."""
    ratios = [p["proxy"] / p["direct"] for p in pairs]
    alphas = [a for p in pairs if (a := p["speculoos"].get("alpha")) is not None]
    taus = [t for p in pairs if (t := p["speculoos"].get("tokens_per_round")) is not None]
    modes = sorted({p["speculoos"].get("mode", "passthrough") for p in pairs})
    return (f"| {workload} | {median(p['proxy'] for p in pairs):.2f} | {median(p['direct'] for p in pairs):.2f} "
            f"| {median(ratios):.2f}× ({', '.join(f'{r:.2f}' for r in ratios)}) "
            f"| {f'{median(alphas):.2f}' if alphas else '–'} | {f'{median(taus):.2f}' if taus else '–'} "
            f"| {', '.join(modes)} |")


def _run(args: argparse.Namespace) -> int:
    """Fresh pairs per workload; one table line each."""
    if args.repeat < 1 or args.max_tokens < 1:
        raise BenchError("--repeat and --max-tokens must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.kind or "local"  # a route per kind matches its name; the one plain route, anything
    print(f"regime: {regime(args.verifier_cores, args.proxy_cores, [args.rtt_ms])}; draft: {args.kind or 'model'}")
    print("| workload | proxy tok/s (first request, fresh route) | direct tok/s "
          "| ÷ direct (each pair) | α | τ | mode |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for name in (w.strip() for w in args.workloads.split(",") if w.strip()):
        prompt = load(name).prompts[0]
        pairs = []
        for _ in range(args.repeat):
            with _fresh_stack(args) as stack:
                proxied = asyncio.run(_once(stack, prompt, model, args.max_tokens, True))
            with _fresh_stack(args) as stack:
                direct = asyncio.run(_once(stack, prompt, model, args.max_tokens, False))
            pairs.append({"proxy": proxied.tokens_per_second, "direct": direct.tokens_per_second,
                          "speculoos": dict(proxied.extension or {})})
        results.append({"workload": name, "pairs": pairs})
        print(line(name, pairs), flush=True)
    (args.out / "first_request.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


run = guarded("speculoos bench first-request", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench first-request`."""
    parser = commands.add_parser("first-request", help="the first request on a fresh route against a fresh verifier",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model: a registry name or a .gguf")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model")
    parser.add_argument("--workloads", default="code_completion,code_editing,extraction,open_chat,creative")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kind", help="draft kind of the route (default: the model)")
    parser.add_argument("--rtt-ms", type=float, default=10.0, help="round trip through the relay (default 10)")
    parser.add_argument("--verifier-cores", type=cores_argument, default={0}, help="the server's cores (default 0)")
    parser.add_argument("--proxy-cores", type=cores_argument, default={1}, help="the proxy's (default 1)")
    parser.add_argument("--repeat", type=int, default=1, help="fresh pairs per workload (medians are reported)")
    parser.add_argument("--out", type=Path, default=Path("out") / "first_request", help="where the JSON goes")
    parser.set_defaults(run=run)
