"""`speculoos bench two-device`: two devices on one machine, the proxy and its draft on some cores, the verifier on
others, a round trip between; `bench run` at each RTT.

Starts `speculoos verifier` pinned to --verifier-cores and `speculoos serve` (a route drafting with
the model, or with --kind's draft kind) pinned to --proxy-cores, one thread each, with `speculoos
relay` between them on the verifier's cores. For each RTT it restarts only the relay and runs
`bench run` in this process, pinned to the proxy's cores as the client sits beside the proxy:
direct requests go through the relay too. Writes each RTT's JSON and Markdown under --out, then
prints one table (rtt_sweep.py): per RTT, workload and mode, tokens/s against direct, α, τ, the
pre-draft hit rate, and pipelined ÷ sequential (a mode beside its /seq twin, draft-ahead off).
Overlapping core sets (e.g. both 0,1) give the shared-cores regime.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from proxy.bench import compare
from proxy.bench.client import BenchError
from proxy.bench.command import guarded, numbers
from proxy.bench.local import client_on, cores_argument, local_stack
from proxy.bench.rtt_sweep import regime, sweep_markdown
from proxy.bench.workloads import load

VERIFIER_PORT, PROXY_PORT, RELAY_PORT = 18001, 18080, 18002


def _run(args: argparse.Namespace) -> int:
    """Start the stack once, measure at every RTT, print the sweep."""
    rtts = numbers(args.rtts, "--rtts")
    if not rtts or any(r < 0 for r in rtts):
        raise BenchError("--rtts: give round trips of 0 ms or more")
    modes = compare.parse_modes(args.modes)
    workloads = [load(name.strip()) for name in args.workloads.split(",") if name.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    header = regime(args.verifier_cores, args.proxy_cores, rtts)
    print(f"regime: {header}; {args.target} verifier, {args.draft} draft, 1 thread each", flush=True)
    documents = {}
    with local_stack(args.target, args.draft, threads=1, verifier_port=VERIFIER_PORT, proxy_port=PROXY_PORT,
                     kinds=[args.kind] if args.kind else (), verifier_cores=args.verifier_cores,
                     proxy_cores=args.proxy_cores, relay_port=RELAY_PORT, rtt_ms=rtts[0]) as stack:
        assert stack.relay is not None  # relay_port was given
        for rtt_ms in rtts:
            if stack.relay.rtt_ms != rtt_ms:
                stack.relay.start(rtt_ms)
            print(f"RTT {rtt_ms:g} ms: bench run --modes {args.modes}", flush=True)
            plan = compare.Plan(stack.direct_url, stack.proxy_url, workloads, modes, model=args.kind,
                                route=args.kind, prompts=args.prompts, repeat=args.repeat, max_tokens=args.max_tokens)
            with client_on(args.proxy_cores):
                outcome = compare.measure(plan)
            stem = args.out / f"rtt-{rtt_ms:g}ms"
            compare.write(outcome, json_path=Path(f"{stem}.json"), markdown=Path(f"{stem}.md"))
            documents[rtt_ms] = outcome.document
    table = sweep_markdown(documents, [m.name for m in modes], header)
    (args.out / "two_device.md").write_text(table)
    print(table)
    print(f"per-RTT tables and JSON: {args.out}")
    return 0


run = guarded("speculoos bench two-device", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench two-device`."""
    parser = commands.add_parser("two-device", help="two devices emulated here (cores apart, RTT through the relay): "
                                                    "bench run at each RTT",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model: a registry name or a .gguf")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model")
    parser.add_argument("--rtts", default="0,10,30", help="round trips in ms (default 0,10,30)")
    parser.add_argument("--modes", default="auto,k=4/seq,k=4", help="as bench run's (default auto,k=4/seq,k=4)")
    parser.add_argument("--workloads", default="code_completion,code_editing,open_chat")
    parser.add_argument("--prompts", type=int, default=3, help="first N prompts of each workload (default 3)")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions of every request (default 1)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kind", help="draft kind of the route (default: the model, as a plain route drafts)")
    parser.add_argument("--verifier-cores", type=cores_argument, default={0}, help="the server's cores (default 0)")
    parser.add_argument("--proxy-cores", type=cores_argument, default={1},
                        help="the proxy's, its draft's and the client's (default 1)")
    parser.add_argument("--out", type=Path, default=Path("out") / "two_device", help="where each RTT's tables go")
    parser.set_defaults(run=run)
