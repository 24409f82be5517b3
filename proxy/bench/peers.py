"""`speculoos bench peers`: the proxy beside llama-server's own speculation, one GGUF pair, the same prompts.

Rows, each in processes of its own started afresh for every regime, round trip, temperature and workload
(no row sees another's answers; no route has history or measurements from another row or workload, as a
fresh route would not), all of a setting's rows up at once and taking turns prompt by prompt:
    llama-server                      plain
    llama-server --model-draft        the draft model inside the server (--spec-type draft-simple)
    llama-server --spec-type TYPE     a draft-free lookup inside the server (ngram-simple, ...)
    our verifier                      plain
    Speculoos                         the shipped route (routes.yaml, its upstream and draft replaced)
                                      in front of our verifier
Regimes:
    shared      as a user runs each on this machine: llama-server and our verifier at their default
                threads; Speculoos with the threads scripts/run.sh gives the verifier and the draft
    two-device  the server (with llama-server's draft: it would run on the server's box) on --server-cores
                with one thread; the proxy with its draft, and this client, on --client-cores with one
                thread; `speculoos relay` adds the round trip in front of the server
The llama-server binary comes from scripts/setup_llama_server.sh (the llama.cpp our engine runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from proxy.bench import peers_report
from proxy.bench.client import BenchError, get_json, stream
from proxy.bench.command import guarded, model_path
from proxy.bench.local import client_on, cores_argument
from proxy.bench.peers_plan import (
    DEFAULT_SPEC_TYPES,
    DRAFT_FREE_SPEC_TYPES,
    LLAMA,
    LLAMA_DRAFT,
    LLAMA_SPEC,
    ROW_KINDS,
    SHARED,
    SPECULOOS,
    TWO_DEVICE,
    VERIFIER,
    Peer,
    Setting,
    parse_numbers,
    parse_peers,
    settings,
)
from proxy.bench.peers_report import PeerSample, Speculation
from proxy.bench.peers_serve import Models, llama_server_binary, llama_server_command, serving, speculoos_routes
from proxy.bench.workloads import Prompt, Workload, load
from proxy.engine.threads import usable_cores

# Re-exported: the command's parts, as its tests and callers name them.
__all__ = ["LLAMA", "LLAMA_DRAFT", "LLAMA_SPEC", "SHARED", "SPECULOOS", "TWO_DEVICE", "VERIFIER", "Models", "Peer",
           "Setting", "add_cli", "llama_server_binary", "llama_server_command", "measure", "parse_numbers",
           "parse_peers", "plan", "run", "serving", "settings", "speculoos_routes"]

DEFAULT_WORKLOADS = "code_editing,code_rewrite,code_completion,open_chat"
METRICS_SETTLE_S = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5)  # llama-server counts a request's rounds as its slot is freed


async def _metrics(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """llama-server's counters ({} when it serves none)."""
    try:
        async with session.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=30)) as reply:
            return peers_report.parse_metrics(await reply.text()) if reply.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BenchError(f"cannot read {base}/metrics: {exc or type(exc).__name__}") from exc


async def _llama_speculation(session: aiohttp.ClientSession, base: str, timings: Mapping[str, Any] | None,
                             before: Mapping[str, float]) -> Speculation | None:
    """The request's drafts and rounds, once the server's counters include it."""
    speculation = None
    for pause in METRICS_SETTLE_S:
        await asyncio.sleep(pause)
        after = await _metrics(session, base)
        speculation = peers_report.llama_speculation(timings, before, after)
        drafted = after.get(peers_report.METRIC_DRAFTED, 0.0) - before.get(peers_report.METRIC_DRAFTED, 0.0)
        if speculation is None or drafted == speculation.drafted:
            break
    return speculation


async def _model_name(session: aiohttp.ClientSession, base: str, peer: Peer) -> str:
    """The model id the row serves."""
    listed = await get_json(session, base + "/v1/models", peer.name)
    return str(((listed or {}).get("data") or [{}])[0].get("id") or "model")


async def measure(bases: Sequence[str], peers: Sequence[Peer], setting: Setting, workloads: Sequence[Workload], *,
                  prompts: int, max_tokens: int, timeout_s: float) -> list[PeerSample]:
    """Send each workload's first `prompts` prompts at the setting's temperature to every row, one request at a
    time, the rows taking turns prompt by prompt (a slow spell of a shared machine then falls on every row
    alike, not on whichever row was running); no warm-up."""
    samples = []
    async with aiohttp.ClientSession() as session:
        models = [await _model_name(session, base, peer) for base, peer in zip(bases, peers)]
        rows = list(zip(bases, peers, models))
        for workload in workloads:
            for index, prompt in enumerate(workload.prompts[:prompts]):
                prompt = replace(prompt, temperature=setting.temperature)
                turn = index % len(rows)  # who goes first rotates, so no row always follows the same one
                for base, peer, model in rows[turn:] + rows[:turn]:
                    sample = await _send(session, base, peer, model, setting, workload.name, index, prompt,
                                         max_tokens=max_tokens, timeout_s=timeout_s)
                    samples.append(sample)
    return samples


async def _send(session: aiohttp.ClientSession, base: str, peer: Peer, model: str, setting: Setting,
                workload: str, index: int, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> PeerSample:
    """One prompt to one row, timed, with the row's drafting counters."""
    before = await _metrics(session, base) if peer.llama else {}
    reply = await stream(session, base + prompt.path, prompt.body(model, max_tokens), timeout_s)
    speculation = (await _llama_speculation(session, base, reply.timings, before) if peer.llama
                   else peers_report.proxy_speculation(reply.extension) if peer.kind == SPECULOOS
                   else None)
    # Where a stream carries no usage, llama-server's timings still count the tokens.
    tokens = reply.completion_tokens or int((reply.timings or {}).get("predicted_n") or 0) or None
    sample = PeerSample(setting.regime, setting.rtt_ms, setting.temperature, peer.name, workload, index,
                        reply.error, tokens, reply.seconds, reply.ttft_s,
                        tokens / reply.seconds if tokens and reply.seconds > 0 else None, speculation)
    rate = f"{sample.tokens_per_second:.1f} tok/s" if sample.tokens_per_second else reply.error
    print(f"{setting.regime} {setting.rtt_ms or 0:g} ms T={setting.temperature:g} {peer.name} {workload} #{index}: "
          f"{rate}", file=sys.stderr, flush=True)
    return sample


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench peers`."""
    peers = commands.add_parser(
        "peers", help="the proxy beside llama-server's own speculation, on one GGUF pair and the same prompts",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    peers.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model: a registry name or a .gguf")
    peers.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model: a registry name or a .gguf")
    peers.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                       help=f"comma-separated shipped names or .json files (default {DEFAULT_WORKLOADS})")
    peers.add_argument("--prompts", type=int, default=5, metavar="N",
                       help="first N prompts of each workload (default 5)")
    peers.add_argument("--max-tokens", type=int, default=128, metavar="M", help="tokens per answer (default 128)")
    peers.add_argument("--temperatures", default="0,0.7", help="comma-separated (default 0,0.7)")
    peers.add_argument("--rows", default=",".join(ROW_KINDS), help=f"which rows (default {','.join(ROW_KINDS)})")
    peers.add_argument("--spec-types", default=DEFAULT_SPEC_TYPES,
                       help=f"llama-server's draft-free --spec-type, a row each: {', '.join(DRAFT_FREE_SPEC_TYPES)} "
                            f"(default {DEFAULT_SPEC_TYPES})")
    peers.add_argument("--two-device", action="store_true", help="also emulate two devices at each --rtts")
    peers.add_argument("--no-shared", action="store_true", help="leave the shared-cores regime out")
    peers.add_argument("--rtts", default="0,10,30", help="round trips in ms for --two-device (default 0,10,30)")
    peers.add_argument("--server-cores", type=cores_argument, default={0}, help="two devices: the server's (default 0)")
    peers.add_argument("--client-cores", type=cores_argument, default={1},
                       help="two devices: the proxy's, its draft's and the client's (default 1)")
    peers.add_argument("--routes", type=Path, default=Path("routes.yaml"),
                       help="the routes file whose route Speculoos runs (default routes.yaml, the shipped one)")
    peers.add_argument("--llama-server", type=Path, default=None,
                       help="the llama-server binary (default: the one scripts/setup_llama_server.sh caches)")
    peers.add_argument("--timeout", type=float, default=600.0, help="seconds of silence before a request fails")
    peers.add_argument("--out", type=Path, metavar="FILE", help="write the rows and every request as JSON")
    peers.add_argument("--markdown", type=Path, metavar="FILE", help="write the table as Markdown")
    peers.set_defaults(run=run)


@dataclass(frozen=True)
class Plan:
    """A validated run."""

    peers: list[Peer]
    settings: list[Setting]
    workloads: list[Workload]


def plan(args: argparse.Namespace) -> Plan:
    """The rows, settings and workloads the arguments ask for; BenchError naming the bad one."""
    if args.prompts < 1 or args.max_tokens < 1:
        raise BenchError("--prompts and --max-tokens must be positive")
    if args.no_shared and not args.two_device:
        raise BenchError("--no-shared leaves nothing to measure without --two-device")
    if args.two_device and set(args.server_cores) & set(args.client_cores):
        raise BenchError("--server-cores and --client-cores must not overlap: they stand for two devices")
    try:
        peers = parse_peers(args.rows, args.spec_types)
        temperatures = parse_numbers(args.temperatures, "--temperatures", low=0.0, high=2.0)
        rtts = parse_numbers(args.rtts, "--rtts", low=0.0) if args.two_device else None
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    workloads = [load(name.strip()) for name in args.workloads.split(",") if name.strip()]
    if not workloads:
        raise BenchError("--workloads: give at least one")
    return Plan(peers, settings(temperatures, shared=not args.no_shared, rtts=rtts), workloads)


def _models(args: argparse.Namespace, peers: Sequence[Peer]) -> Models:
    binary = args.llama_server or llama_server_binary()
    if any(p.llama for p in peers) and not os.access(binary, os.X_OK):  # before the models: it needs no file
        raise BenchError(f"no llama-server at {binary}: run scripts/setup_llama_server.sh (or give --llama-server)")
    target, draft = model_path(args.target), model_path(args.draft)
    routes = args.routes.read_text() if any(p.kind == SPECULOOS for p in peers) and args.routes.is_file() else ""
    if any(p.kind == SPECULOOS for p in peers) and not routes:
        raise BenchError(f"no routes file at {args.routes}: give --routes (the shipped routes.yaml)")
    return Models(target, draft, binary, routes)


def _measure_all(args: argparse.Namespace, chosen: Plan, models: Models, folder: Path) -> list[PeerSample]:
    """Every row in every setting and workload, each row in processes of its own, all of their rows up at once."""
    samples: list[PeerSample] = []
    for setting in chosen.settings:
        client = args.client_cores if setting.regime == TWO_DEVICE else None
        # Fresh processes for each workload: a route starts as a user's would, and a process that runs slow for
        # its whole life (one verifier ran 10 % slow through a whole run on a 2-core machine) weighs on one workload.
        for workload in chosen.workloads:
            with ExitStack() as stack:
                # An idle server computes nothing, so the rows waiting for their turn cost the measured one no time.
                bases = [stack.enter_context(serving(peer, setting, models, folder, server_cores=args.server_cores,
                                                     client_cores=args.client_cores, workload=workload.name))
                         for peer in chosen.peers]
                with client_on(client):
                    samples += asyncio.run(measure(bases, chosen.peers, setting, [workload], prompts=args.prompts,
                                                   max_tokens=args.max_tokens, timeout_s=args.timeout))
    return samples


def _run(args: argparse.Namespace) -> int:
    """Measure every row in every setting and print one table."""
    chosen = plan(args)
    models = _models(args, chosen.peers)
    folder = Path(tempfile.mkdtemp(prefix="speculoos-peers-"))
    print(f"speculoos bench peers: {len(chosen.peers)} rows × {len(chosen.settings)} settings; logs in {folder}",
          file=sys.stderr, flush=True)
    try:
        samples = _measure_all(args, chosen, models, folder)
    except OSError as exc:  # a log or port that could not be opened
        raise BenchError(str(exc)) from exc
    rows = peers_report.summarise(samples)
    header = (f"speculoos bench peers — target {models.target.name}, draft {models.draft.name}, "
              f"{args.prompts} prompts per workload, {args.max_tokens} tokens")
    table = peers_report.markdown(rows, header)
    print(table)
    config = {"target": str(models.target), "draft": str(models.draft), "llama_server": str(models.llama_server),
              "workloads": [w.name for w in chosen.workloads], "prompts": args.prompts, "max_tokens": args.max_tokens,
              "rows": [p.name for p in chosen.peers], "server_cores": sorted(args.server_cores),
              "client_cores": sorted(args.client_cores), "cores": usable_cores(), "logs": str(folder),
              "settings": [vars(s) for s in chosen.settings]}
    if args.markdown:
        args.markdown.write_text(table)
    if args.out:
        args.out.write_text(json.dumps(peers_report.as_json(rows, samples, config), indent=1) + "\n")
    return 0


run = guarded("speculoos bench peers", _run)
