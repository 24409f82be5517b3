"""`speculoos bench concurrency`: N requests at once against the same N one after another, through the proxy and
straight to the verifier.

Starts a verifier (--parallel = N) and a proxy on this machine (shared cores, one thread each),
sends a workload's first N greedy prompts pinned to k=K one after another, then all at once, and
prints both wall times, their ratio, whether every concurrent output equals the same request served
alone, and α and tokens per round; then the same for plain requests straight to the verifier. The
two phases draft from histories of their own, so the second does not copy the first's answers.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from proxy.bench.client import BenchError, Reply
from proxy.bench.command import guarded
from proxy.bench.compare import parse_modes
from proxy.bench.local import local_stack
from proxy.bench.runner import WARMUP_TOKENS, Endpoints, Mode, request_for, send, warm_up_prompt
from proxy.bench.workloads import Prompt, load

TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Phases:
    """One path's requests served alone and together."""

    label: str
    alone_s: float
    together_s: float
    alone: tuple[Reply, ...]
    together: tuple[Reply, ...]

    @property
    def same(self) -> int:
        """Concurrent outputs equal to the same request's served alone."""
        return sum(a.text == t.text for a, t in zip(self.alone, self.together))


async def phases(endpoints: Endpoints, prompts: Sequence[Prompt], warm: Prompt, mode: Mode | None,
                 label: str) -> Phases:
    """Send `prompts` one after another, then all at once; every request drafts from a history of its own."""
    def request(phase: str, index: int) -> tuple[str, dict, dict[str, str]]:
        return request_for(endpoints, prompts[index], mode, endpoints.max_tokens, f"{phase}-{index}")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await send(session, request_for(endpoints, warm, mode, WARMUP_TOKENS), endpoints.timeout_s)  # uncounted
        started = time.perf_counter()
        alone = [await send(session, request("alone", i), endpoints.timeout_s) for i in range(len(prompts))]
        alone_s = time.perf_counter() - started
        started = time.perf_counter()
        together = await asyncio.gather(*(send(session, request("together", i), endpoints.timeout_s)
                                          for i in range(len(prompts))))
        together_s = time.perf_counter() - started
    if failed := [r.error for r in (*alone, *together) if r.error]:
        raise BenchError(f"{label}: {failed[0]}")
    return Phases(label, alone_s, together_s, tuple(alone), tuple(together))


def report(result: Phases) -> str:
    """The path's lines: wall times and identical outputs, then α and τ over its speculative requests."""
    lines = [f"{result.label}: one after another {result.alone_s:.1f} s, all at once {result.together_s:.1f} s "
             f"(ratio {result.together_s / result.alone_s:.2f}); concurrent outputs equal to alone: "
             f"{result.same}/{len(result.alone)}"]
    stats = [r.extension for r in (*result.alone, *result.together) if r.extension and r.extension.get("drafted")]
    if stats:
        drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
        rounds = sum(s["rounds"] for s in stats)
        emitted = sum(s["rounds"] * (s["tokens_per_round"] or 0) for s in stats)
        lines.append(f"{result.label}: α {accepted / drafted:.2f}, tokens per round {emitted / rounds:.2f} "
                     f"({len(stats)} requests)")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    """Start the stack and compare both paths."""
    if args.requests < 1 or args.max_tokens < 1:
        raise BenchError("--requests and --max-tokens must be positive")
    workload = load(args.workload)
    greedy = [p for p in workload.prompts if p.greedy]
    if not greedy:
        raise BenchError(f"--workload {args.workload} has no greedy prompt")
    prompts = [greedy[i % len(greedy)] for i in range(args.requests)]
    extra = ["--shared-decode"] if args.shared_decode else []
    mode, warm = parse_modes(f"k={args.k}")[0], warm_up_prompt(workload)
    with local_stack(args.target, args.draft, parallel=args.requests, verifier_args=extra) as stack:
        print(f"regime: shared cores (verifier and proxy on this machine, 1 thread each); {args.requests} greedy "
              f"{args.max_tokens}-token {args.workload} requests{'; verifier --shared-decode' if extra else ''}")
        endpoints = Endpoints(stack.verifier_url, stack.proxy_url, "m", args.max_tokens, TIMEOUT_S)
        print(report(asyncio.run(phases(endpoints, prompts, warm, mode, f"proxy k={args.k}"))))
        print(report(asyncio.run(phases(endpoints, prompts, warm, None, "verifier direct"))))
    return 0


run = guarded("speculoos bench concurrency", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench concurrency`."""
    parser = commands.add_parser("concurrency", help="N requests at once against the same N one after another",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model: a registry name or a .gguf")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model")
    parser.add_argument("--workload", default="open_chat", help="whose greedy prompts are sent (default open_chat)")
    parser.add_argument("--requests", type=int, default=4, help="requests at once (default 4)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="drafts a round, pinned (default 4)")
    parser.add_argument("--shared-decode", action="store_true", help="start the verifier with --shared-decode")
    parser.set_defaults(run=run)
