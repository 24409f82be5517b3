"""`speculoos bench`: the benchmark, one command with a sub-command per measurement.

With no sub-command, `speculoos bench --direct URL --proxy URL ...` is `speculoos bench run`, as it
always was, and `speculoos bench --simulate TRACE ...` replays a trace.
"""

from __future__ import annotations

import argparse

from proxy.bench import (
    anchor,
    at_once,
    compare,
    context_rounds,
    cost_curve,
    drafts,
    first_request,
    overhead,
    peers,
    replay,
    two_device,
)
from proxy.bench.command import guarded


def _run_or_replay(args: argparse.Namespace) -> int:
    """Measure the proxy against its upstream, or replay a trace."""
    return replay.run(args) if args.simulate else compare.run(args)


run = guarded("speculoos bench", _run_or_replay)


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    compare.add_arguments(parser)
    replay.add_arguments(parser)
    parser.set_defaults(run=run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench` and its sub-commands."""
    bench = commands.add_parser(
        "bench", help="benchmark the proxy against its upstream, its drafts, two devices, peers...",
        description="Measure Speculoos. With no sub-command: `run` (send each workload straight to the upstream "
                    "and through the proxy in every mode, interleaved, streaming; report tokens/s, TTFT, ITL, α, "
                    "and the speedup Leviathan's formula predicts), or with --simulate, replay a recorded trace "
                    "under a cost model.")
    _run_arguments(bench)
    sub = bench.add_subparsers(dest="bench_command", title="sub-commands", required=False)
    _run_arguments(sub.add_parser(
        "run", help="the proxy against its upstream, every mode interleaved (the default)",
        description=compare.__doc__.split("\n\n")[0] if compare.__doc__ else None))
    for module in (drafts, two_device, first_request, cost_curve, context_rounds, anchor, at_once, peers, overhead):
        module.add_cli(sub)
