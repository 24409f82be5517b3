#!/usr/bin/env python3
"""The first request on a fresh route: how much slower than passthrough while the route learns its costs.

Usage: scripts/bench_first_request.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
       [--workloads code_completion,code_editing,extraction,open_chat,creative] [--max-tokens 128]
       [--kind hybrid] [--rtt-ms 10] [--verifier-cores 0] [--proxy-cores 1] [--repeat 1] [--out out/first_request]
For each workload, starts a fresh verifier and a fresh proxy (nothing measured yet), sends the
workload's first prompt through the proxy in auto mode; then, on another fresh stack, the same
request straight to the verifier (through the relay too). Neither finds the prompt cached on the
verifier, as a user's first request would not. With --repeat N, does that N times per workload.
Prints each workload's median tokens/s both ways and the median of the paired ratios. With --verifier-cores and
--proxy-cores overlapping (e.g. both 0,1), the regime is shared cores.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from contextlib import AbstractContextManager
from pathlib import Path
from statistics import median

from proxy.bench.local import LocalStack, cores_argument, local_stack
from proxy.bench.rtt_sweep import regime
from proxy.bench.workloads import load

ROOT = Path(__file__).resolve().parent.parent


def timed(url: str, body: dict) -> tuple[float, dict]:
    """Tokens/s of one non-streaming completion (request time, end to end), and the reply."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as reply:
        document = json.loads(reply.read())
    return document["usage"]["completion_tokens"] / (time.perf_counter() - started), document


def fresh_stack(args: argparse.Namespace) -> AbstractContextManager[LocalStack]:
    """A verifier and a proxy that have seen nothing yet."""
    return local_stack(args.target, args.draft, threads=1, kinds=[args.kind] if args.kind else (),
                       verifier_cores=args.verifier_cores, proxy_cores=args.proxy_cores, relay_port=18002,
                       rtt_ms=args.rtt_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--workloads", default="code_completion,code_editing,extraction,open_chat,creative")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kind", help="draft kind of the route (default: the model)")
    parser.add_argument("--rtt-ms", type=float, default=10.0)
    parser.add_argument("--verifier-cores", type=cores_argument, default={0})
    parser.add_argument("--proxy-cores", type=cores_argument, default={1})
    parser.add_argument("--repeat", type=int, default=1, help="fresh pairs per workload (medians are reported)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "first_request")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.kind or "local"
    print(f"regime: {regime(args.verifier_cores, args.proxy_cores, [args.rtt_ms])}; draft: {args.kind or 'model'}")
    print("| workload | proxy tok/s (first request, fresh route) | direct tok/s | ÷ direct (each pair) | α | τ | mode |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for name in args.workloads.split(","):
        prompt = load(name).prompts[0]
        path = prompt.path
        body = {k: v for k, v in prompt.body(model, args.max_tokens).items() if k not in ("stream", "stream_options")}
        pairs = []
        for _ in range(args.repeat):
            with fresh_stack(args) as stack:
                proxied, reply = timed(stack.proxy_url + path, body)
            with fresh_stack(args) as stack:
                direct, _ = timed(stack.direct_url + path, body)
            extension = reply.get("speculoos") or {}
            pairs.append({"proxy": proxied, "direct": direct, "speculoos": extension})
        results.append({"workload": name, "pairs": pairs})
        ratios = [p["proxy"] / p["direct"] for p in pairs]
        alphas = [a for p in pairs if (a := p["speculoos"].get("alpha")) is not None]
        taus = [t for p in pairs if (t := p["speculoos"].get("tokens_per_round")) is not None]
        modes = sorted({p["speculoos"].get("mode", "passthrough") for p in pairs})
        print(f"| {name} | {median(p['proxy'] for p in pairs):.2f} | {median(p['direct'] for p in pairs):.2f} "
              f"| {median(ratios):.2f}× ({', '.join(f'{r:.2f}' for r in ratios)}) "
              f"| {f'{median(alphas):.2f}' if alphas else '–'} | {f'{median(taus):.2f}' if taus else '–'} "
              f"| {', '.join(modes)} |", flush=True)
    (args.out / "first_request.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
