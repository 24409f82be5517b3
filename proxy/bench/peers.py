"""`speculoos bench peers`: the proxy beside llama-server's own speculation, one GGUF pair, the same prompts.

Rows, each in processes of its own started afresh for every regime, round trip and temperature (no
row sees another's answers; no route has history from another row):
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
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from proxy.bench import peers_report
from proxy.bench.client import BenchError, get_json, stream
from proxy.bench.local import START_TIMEOUT_S, Relay, cores_argument, pinned, stop_process
from proxy.bench.peers_report import PeerSample, Speculation
from proxy.bench.workloads import Workload, WorkloadError, load
from proxy.engine.threads import usable_cores

HOST = "127.0.0.1"
SHARED, TWO_DEVICE = "shared", "two-device"
LLAMA, LLAMA_DRAFT, LLAMA_SPEC, VERIFIER, SPECULOOS = "llama", "llama-draft", "llama-spec", "verifier", "speculoos"
ROW_KINDS = (LLAMA, LLAMA_DRAFT, LLAMA_SPEC, VERIFIER, SPECULOOS)
# The draft-free types of the vendored llama.cpp's --spec-type (common/speculative.cpp); ngram-simple ran fastest here.
DRAFT_FREE_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DEFAULT_SPEC_TYPES = "ngram-simple"
DEFAULT_WORKLOADS = "code_editing,code_completion,open_chat"
CONTEXT = 4096  # as our verifier's default --ctx
METRICS_SETTLE_S = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5)  # llama-server counts a request's rounds as its slot is freed


@dataclass(frozen=True)
class Peer:
    """One row: what serves the requests."""

    kind: str  # one of ROW_KINDS
    spec_type: str | None = None  # LLAMA_SPEC only

    @property
    def name(self) -> str:
        """The row's name in the table."""
        return {LLAMA: "llama-server", LLAMA_DRAFT: "llama-server --model-draft",
                LLAMA_SPEC: f"llama-server --spec-type {self.spec_type}", VERIFIER: "our verifier",
                SPECULOOS: "Speculoos + our verifier"}[self.kind]

    @property
    def llama(self) -> bool:
        """Served by llama-server."""
        return self.kind in (LLAMA, LLAMA_DRAFT, LLAMA_SPEC)


@dataclass(frozen=True)
class Setting:
    """Where and how a row runs."""

    regime: str  # SHARED or TWO_DEVICE
    rtt_ms: float | None  # TWO_DEVICE only
    temperature: float


def parse_peers(rows: str, spec_types: str) -> list[Peer]:
    """'llama,llama-spec,speculoos' and 'ngram-simple,ngram-mod' -> the rows, a llama-spec row per type."""
    kinds = [part.strip() for part in rows.split(",") if part.strip()]
    types = [part.strip() for part in spec_types.split(",") if part.strip()]
    if bad := [k for k in kinds if k not in ROW_KINDS]:
        raise ValueError(f"--rows: unknown {', '.join(bad)} (rows: {', '.join(ROW_KINDS)})")
    if bad := [t for t in types if t not in DRAFT_FREE_SPEC_TYPES]:
        raise ValueError(f"--spec-types: unknown {', '.join(bad)} "
                         f"(draft-free types: {', '.join(DRAFT_FREE_SPEC_TYPES)})")
    if not kinds or len(set(kinds)) != len(kinds) or len(set(types)) != len(types):
        raise ValueError("give each row and each spec type once, and at least one row")
    if LLAMA_SPEC in kinds and not types:
        raise ValueError("--rows llama-spec needs at least one --spec-types entry")
    peers = []
    for kind in kinds:
        peers += [Peer(kind, t) for t in types] if kind == LLAMA_SPEC else [Peer(kind)]
    return peers


def parse_numbers(text: str, what: str, *, low: float, high: float | None = None) -> list[float]:
    """'0,0.7' -> [0.0, 0.7], each in [low, high], none twice."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from exc
    if not values or len(set(values)) != len(values) or any(v < low or (high is not None and v > high)
                                                            for v in values):
        raise ValueError(f"{what}: give distinct numbers in {low:g}..{'' if high is None else f'{high:g}'}")
    return values


def settings(temperatures: Sequence[float], *, shared: bool, rtts: Sequence[float] | None) -> list[Setting]:
    """Every (regime, RTT, temperature) the run measures, shared cores first."""
    regimes: list[tuple[str, float | None]] = [(SHARED, None)] if shared else []
    regimes += [(TWO_DEVICE, rtt) for rtt in rtts or ()]
    return [Setting(regime, rtt, t) for regime, rtt in regimes for t in temperatures]


def llama_server_binary() -> Path:
    """Where scripts/setup_llama_server.sh caches llama-server for the installed llama-cpp-python."""
    if folder := os.environ.get("SPECULOOS_LLAMA_SERVER_DIR"):
        return Path(folder) / "bin" / "llama-server"
    xdg_cache = os.environ.get("XDG_CACHE_HOME", "")
    cache = Path(xdg_cache) if os.path.isabs(xdg_cache) else Path.home() / ".cache"
    version = importlib.metadata.version("llama_cpp_python")
    return cache / "speculoos" / "llama-server" / version / "bin" / "llama-server"


def llama_server_command(binary: Path, target: Path, draft: Path, peer: Peer, port: int, *,
                         threads: int | None) -> list[str]:
    """llama-server for one row; `threads` for the target and its draft (None: llama-server's default)."""
    command = [str(binary), "--model", str(target), "--host", HOST, "--port", str(port), "--ctx-size", str(CONTEXT),
               "--metrics"]
    if threads is not None:
        command += ["--threads", str(threads), "--threads-batch", str(threads)]
    if peer.kind == LLAMA_DRAFT:
        # This llama.cpp speculates with a draft model only when a type says so.
        command += ["--model-draft", str(draft), "--spec-type", "draft-simple"]
        if threads is not None:
            command += ["--spec-draft-threads", str(threads), "--spec-draft-threads-batch", str(threads)]
    elif peer.kind == LLAMA_SPEC:
        command += ["--spec-type", str(peer.spec_type)]
    return command


def speculoos_routes(shipped: str, upstream_url: str, draft: str, *, apart: bool = False) -> str:
    """The shipped routes file with every route's upstream and draft model replaced (`apart`: the draft on cores of
    its own, as on a second device, so it need not take turns with the target)."""
    document = yaml.safe_load(shipped)
    for route in document["routes"]:
        route["upstream"]["url"] = upstream_url
        route.setdefault("draft", {})["model"] = draft
        if apart:
            route["draft"]["shares_cores"] = False
    return yaml.safe_dump(document, sort_keys=False)


def _speculoos(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy", *args]


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _launch(command: Sequence[str], log: Path, ready: str, cores: Collection[int] | None) -> subprocess.Popen:
    """Start a server and wait until `ready` answers 200."""
    process = subprocess.Popen(list(command), stdout=log.open("w"), stderr=subprocess.STDOUT,
                               preexec_fn=pinned(cores))
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"{Path(command[0]).name} {' '.join(command[1:4])} exited with {process.returncode}: "
                             f"see {log}\n{log.read_text()[-1500:]}")
        try:
            urllib.request.urlopen(ready, timeout=2)
            return process
        except OSError:  # refused, or 503 while the model loads
            time.sleep(0.5)
    stop_process(process)
    raise BenchError(f"{command[0]} did not answer {ready} within {START_TIMEOUT_S:g} s: see {log}")


@dataclass(frozen=True)
class Models:
    """The GGUF pair, the llama-server binary and the routes file every row uses."""

    target: Path
    draft: Path
    llama_server: Path
    routes: str  # the shipped routes file's text


@contextmanager
def serving(peer: Peer, setting: Setting, models: Models, folder: Path, *, server_cores: Collection[int],
            client_cores: Collection[int]) -> Iterator[str]:
    """The row's processes, fresh, stopped on exit; yields the base URL the client sends to."""
    two_device = setting.regime == TWO_DEVICE
    server = set(server_cores) if two_device else None
    stem = f"{setting.regime}-{setting.rtt_ms or 0:g}ms-t{setting.temperature:g}-{peer.name.replace(' ', '_')}"
    threads = draft_threads = 1 if two_device else None
    if peer.kind == SPECULOOS and not two_device:  # as scripts/run.sh starts them: every core each, taking turns
        threads = draft_threads = usable_cores()
    port = free_port()
    with ExitStack() as stack:
        def start(command: Sequence[str], name: str, ready: str, cores: Collection[int] | None) -> None:
            stack.callback(stop_process, _launch(command, folder / f"{stem}-{name}.log", ready, cores))

        if peer.llama:
            start(llama_server_command(models.llama_server, models.target, models.draft, peer, port, threads=threads),
                  "llama-server", f"http://{HOST}:{port}/health", server)
        else:
            start(_speculoos("verifier", "--model", str(models.target), "--port", str(port),
                             *(["--threads", str(threads)] if threads else [])),
                  "verifier", f"http://{HOST}:{port}/health", server)
        upstream = f"http://{HOST}:{port}"
        if two_device:
            relay = Relay(free_port(), port, folder, server)
            stack.callback(relay.stop)
            relay.start(float(setting.rtt_ms or 0.0))
            upstream = relay.url
        if peer.kind != SPECULOOS:
            yield upstream
            return
        proxy_port = free_port()
        routes = folder / f"{stem}-routes.yaml"
        routes.write_text(speculoos_routes(models.routes, upstream, str(models.draft), apart=two_device))
        start(_speculoos("serve", "--routes", str(routes), "--port", str(proxy_port),
                         *(["--draft-threads", str(draft_threads)] if draft_threads else [])),
              "proxy", f"http://{HOST}:{proxy_port}/v1/models", set(client_cores) if two_device else None)
        yield f"http://{HOST}:{proxy_port}"


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


async def measure(base: str, peer: Peer, setting: Setting, workloads: Sequence[Workload], *, prompts: int,
                  max_tokens: int, timeout_s: float) -> list[PeerSample]:
    """Send each workload's first `prompts` prompts at the setting's temperature, one at a time; no warm-up."""
    samples = []
    async with aiohttp.ClientSession() as session:
        listed = await get_json(session, base + "/v1/models", peer.name)
        model = str(((listed or {}).get("data") or [{}])[0].get("id") or "model")
        for workload in workloads:
            for index, prompt in enumerate(workload.prompts[:prompts]):
                prompt = replace(prompt, temperature=setting.temperature)
                before = await _metrics(session, base) if peer.llama else {}
                reply = await stream(session, base + prompt.path, prompt.body(model, max_tokens), timeout_s)
                speculation = (await _llama_speculation(session, base, reply.timings, before) if peer.llama
                               else peers_report.proxy_speculation(reply.extension) if peer.kind == SPECULOOS
                               else None)
                # Where a stream carries no usage, llama-server's timings still count the tokens.
                tokens = reply.completion_tokens or int((reply.timings or {}).get("predicted_n") or 0) or None
                sample = PeerSample(setting.regime, setting.rtt_ms, setting.temperature, peer.name, workload.name,
                                    index, reply.error, tokens, reply.seconds, reply.ttft_s,
                                    tokens / reply.seconds if tokens and reply.seconds > 0 else None, speculation)
                samples.append(sample)
                rate = f"{sample.tokens_per_second:.1f} tok/s" if sample.tokens_per_second else reply.error
                print(f"{setting.regime} {setting.rtt_ms or 0:g} ms T={setting.temperature:g} {peer.name} "
                      f"{workload.name} #{index}: {rate}", file=sys.stderr, flush=True)
    return samples


@contextmanager
def _client_on(cores: Collection[int] | None) -> Iterator[None]:
    """This process on `cores` for a while (None: left as it is), as the client sits beside the proxy."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


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
    from proxy.models.registry import ModelError, resolve

    try:
        target, draft = resolve(args.target), resolve(args.draft)
    except ModelError as exc:
        raise BenchError(f"{exc} (speculoos models fetch NAME)") from exc
    binary = args.llama_server or llama_server_binary()
    if any(p.llama for p in peers) and not os.access(binary, os.X_OK):
        raise BenchError(f"no llama-server at {binary}: run scripts/setup_llama_server.sh (or give --llama-server)")
    routes = args.routes.read_text() if any(p.kind == SPECULOOS for p in peers) and args.routes.is_file() else ""
    if any(p.kind == SPECULOOS for p in peers) and not routes:
        raise BenchError(f"no routes file at {args.routes}: give --routes (the shipped routes.yaml)")
    return Models(Path(target), Path(draft), binary, routes)


def run(args: argparse.Namespace) -> int:
    """Measure every row in every setting and print one table; one line and exit 1 on failure."""
    try:
        chosen = plan(args)
        models = _models(args, chosen.peers)
        folder = Path(tempfile.mkdtemp(prefix="speculoos-peers-"))
        print(f"speculoos bench peers: {len(chosen.peers)} rows × {len(chosen.settings)} settings; logs in {folder}",
              file=sys.stderr, flush=True)
        samples: list[PeerSample] = []
        for setting in chosen.settings:
            client = args.client_cores if setting.regime == TWO_DEVICE else None
            for peer in chosen.peers:
                with serving(peer, setting, models, folder, server_cores=args.server_cores,
                             client_cores=args.client_cores) as base, _client_on(client):
                    samples += asyncio.run(measure(base, peer, setting, chosen.workloads, prompts=args.prompts,
                                                   max_tokens=args.max_tokens, timeout_s=args.timeout))
    except (BenchError, WorkloadError, OSError, RuntimeError) as exc:  # RuntimeError: the relay did not start
        print(f"speculoos bench peers: {exc}", file=sys.stderr)
        return 1
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
