#!/usr/bin/env python3
"""Two devices on one machine: the proxy and its draft on one core, the verifier on another, an RTT between.

Usage: scripts/bench_two_device.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
       [--rtts 0,10,30] [--modes auto,k=4/seq,k=4] [--workloads code_completion,code_editing,open_chat]
       [--prompts 3] [--repeat 1] [--max-tokens 128] [--kind hybrid] [--verifier-cores 0] [--proxy-cores 1]
       [--out out/two_device]
Starts `speculoos verifier` pinned to the verifier cores and `speculoos serve` (route drafting with
the model, or with --kind's draft kind) pinned to the proxy cores, one thread each, with
`speculoos relay` between them on the verifier's cores. For each RTT it restarts only the relay
and runs `speculoos bench` pinned to the proxy cores, the client beside the proxy: direct
requests go through the relay too. Writes each RTT's JSON and Markdown under --out, then prints
one table: per RTT, workload and mode, tokens/s against direct, α, τ, the pre-draft hit rate, and
pipelined ÷ sequential (a mode beside its /seq twin, draft-ahead off).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from proxy.bench.local import LocalStack, cores_argument, local_stack, pinned
from proxy.bench.rtt_sweep import regime, sweep_markdown
from proxy.bench.runner import parse_modes

ROOT = Path(__file__).resolve().parent.parent
VERIFIER_PORT, PROXY_PORT, RELAY_PORT = 18001, 18080, 18002


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def run_bench(stack: LocalStack, rtt_ms: float, args: argparse.Namespace) -> dict:
    """One `speculoos bench` run, the client on the proxy's cores; its JSON document."""
    stem = args.out / f"rtt-{rtt_ms:g}ms"
    command = [sys.executable, "-m", "proxy", "bench", "--direct", stack.direct_url, "--proxy", stack.proxy_url,
               "--modes", args.modes, "--workloads", args.workloads, "--prompts", str(args.prompts),
               "--repeat", str(args.repeat), "--max-tokens", str(args.max_tokens),
               "--json", f"{stem}.json", "--markdown", f"{stem}.md"]
    if args.kind:
        command += ["--model", args.kind, "--route", args.kind]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, preexec_fn=pinned(args.proxy_cores))
    return json.loads(Path(f"{stem}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rtts", type=_floats, default=[0.0, 10.0, 30.0], help="round trips in ms (default 0,10,30)")
    parser.add_argument("--modes", default="auto,k=4/seq,k=4")
    parser.add_argument("--workloads", default="code_completion,code_editing,open_chat")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kind", help="draft kind of the route (default: the model, as a plain route drafts)")
    parser.add_argument("--verifier-cores", type=cores_argument, default={0})
    parser.add_argument("--proxy-cores", type=cores_argument, default={1})
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "two_device")
    args = parser.parse_args()
    try:
        modes = [m.name for m in parse_modes(args.modes)]
    except ValueError as exc:
        parser.error(f"--modes: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    header = regime(args.verifier_cores, args.proxy_cores, args.rtts)
    print(f"regime: {header}; {args.target} verifier, {args.draft} draft, 1 thread each", flush=True)
    documents = {}
    with local_stack(args.target, args.draft, threads=1, verifier_port=VERIFIER_PORT, proxy_port=PROXY_PORT,
                     kinds=[args.kind] if args.kind else (), verifier_cores=args.verifier_cores,
                     proxy_cores=args.proxy_cores, relay_port=RELAY_PORT, rtt_ms=args.rtts[0]) as stack:
        assert stack.relay is not None
        for rtt_ms in args.rtts:
            if stack.relay.rtt_ms != rtt_ms:
                stack.relay.start(rtt_ms)
            print(f"RTT {rtt_ms:g} ms: speculoos bench --modes {args.modes}", flush=True)
            documents[rtt_ms] = run_bench(stack, rtt_ms, args)
    table = sweep_markdown(documents, modes, header)
    (args.out / "two_device.md").write_text(table)
    print(table)
    print(f"per-RTT tables and JSON: {args.out}")


if __name__ == "__main__":
    main()
