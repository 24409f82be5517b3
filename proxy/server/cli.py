"""`speculoos serve` (run the proxy) and `speculoos check` (validate routes and probe their upstreams)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from proxy.config.load import ConfigError, load_config
from proxy.config.schema import Config
from proxy.control.cost_scale import COST_SCALE_ENV, cost_scale_from_env
from proxy.engine.threads import usable_cores
from proxy.observability import logs
from proxy.sampling.processors import SamplingParams
from proxy.server.cores import DraftCores, with_draft_threads

if TYPE_CHECKING:
    from proxy.server.runtime import RouteRuntime


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register the `serve` and `check` sub-commands."""
    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--routes", default="routes.yaml", help="the routes file (default routes.yaml)")
    serve.add_argument("--host", default=None, help="bind address (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default: server.port)")
    serve.set_defaults(run=run_serve)
    check = commands.add_parser("check", help="validate a routes file and probe each route")
    check.add_argument("--routes", default="routes.yaml")
    check.set_defaults(run=run_check)
    for parser in (serve, check):
        parser.add_argument("--draft-threads", type=int, default=None, metavar="N",
                            help="CPU threads of every route's draft model (default: draft.threads, else every core; "
                                 "a draft that shares its target's cores takes turns with it)")


def _load(args: argparse.Namespace, command: str) -> tuple[Config, list[DraftCores], float] | None:
    """The validated routes file with each draft's threads decided, where drafts share cores, and the test cost
    scale; None after printing why not."""
    logs.configure()
    if args.draft_threads is not None and args.draft_threads < 1:
        print(f"speculoos {command}: --draft-threads must be at least 1", file=sys.stderr)
        return None
    try:
        config = load_config(args.routes)
        scale = cost_scale_from_env()
    except (ConfigError, ValueError) as exc:
        print(f"speculoos {command}: {exc}", file=sys.stderr)
        return None
    if scale != 1.0:
        print(f"speculoos: {COST_SCALE_ENV}={scale:g}: speculation's measured costs are multiplied by it "
              "(a testing aid: decisions are those of another machine)", file=sys.stderr, flush=True)
    return (*with_draft_threads(config, usable_cores(), draft_threads=args.draft_threads), scale)


def run_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from proxy.server.app import create_app

    if (loaded := _load(args, "serve")) is None:
        return 2
    config, drafts, scale = loaded
    for draft in drafts:
        print(f"speculoos: route {draft.route}: {draft.line()}", flush=True)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    # The browser guard and the live page judge Host headers by the address actually bound, not the file's.
    config = config.model_copy(update={"server": config.server.model_copy(update={"host": host, "port": port})})
    print(f"speculoos: proxy on http://{host}:{port}/v1", flush=True)
    web.run_app(create_app(config, cost_scale=scale, settle_heap=True), host=host, port=port, print=None,
                access_log=None, handler_cancellation=True)
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Validate the file, load each draft, probe each upstream; exit 1 on any failure."""
    from proxy.drafting.llama import LlamaDrafter

    if (loaded := _load(args, "check")) is None:
        return 2
    config, drafts, scale = loaded
    lines, failures = asyncio.run(check_report(config, LlamaDrafter.load, drafts, cost_scale=scale))
    print("\n".join(lines))
    return 1 if failures else 0


def sampling_cases(top_n: int) -> list[tuple[str, SamplingParams]]:
    """Sampling parameters whose exactness `check` reports, by label."""
    return [("greedy", SamplingParams(temperature=0.0)),
            (f"temperature 0.7, top_k {top_n}", SamplingParams(0.7, top_k=top_n)),
            ("temperature 1.0", SamplingParams(1.0)),
            (f"temperature 0.7, top_k {top_n}, top_p 0.9", SamplingParams(0.7, top_k=top_n, top_p=0.9)),
            ("temperature 0.8, min_p 0.1", SamplingParams(0.8, min_p=0.1)),
            ("top_p 0", SamplingParams(0.7, top_p=0.0))]


def _findings(runtime: RouteRuntime) -> list[tuple[str, str]]:
    """What the probe learned (each protocol's own rows where it has them), then exactness by sampling parameters."""
    capabilities, target = runtime.capabilities, runtime.target
    if capabilities is None or target is None:
        return []
    rows = capabilities.lines() if hasattr(capabilities, "lines") else [("capabilities", str(capabilities))]
    for label, params in sampling_cases(runtime.route.speculation.top_logprobs):
        problem = target.exactness_problem(params, runtime.route.speculation.top_logprobs)
        rows.append((f"exact at {label}", "yes" if problem is None else f"no: {problem}"))
    return rows


def _costs(runtime: RouteRuntime) -> list[tuple[str, str]]:
    """The costs timed at start-up, and what the route decided from them."""
    from proxy.server.runtime import calibration_fields

    calibration = runtime.controller.calibration
    if calibration is None:
        return []
    fields = calibration_fields(calibration)
    verify = ", ".join(f"k={k} {ms} ms" for k, ms in fields["verify_ms_by_k"].items())  # type: ignore[attr-defined]
    draft = fields["draft_ms_per_token"]
    text = (f"plain {fields['plain_ms_per_token']} ms a token; verification {verify}"
            + (f"; draft {draft} ms a token, {fields['draft_read_ms_per_token']} ms a token read"
               if draft is not None else ""))
    return [("costs at start-up", text), ("model draft", runtime.controller.current.reason)]


async def check_report(config: Config, load_drafter: Callable, drafts: Sequence[DraftCores] = (), *,
                       cost_scale: float = 1.0) -> tuple[list[str], int]:
    """Open every route as `serve` would: one line per route and finding, and the number of failures."""
    from proxy.server.app import open_resources

    resources = await open_resources(config, load_drafter, cost_scale=cost_scale)
    lines, failures = [], 0
    try:
        for runtime in resources.runtimes.values():
            verdict = runtime.tokenizer
            if runtime.drafter is None:
                status = "passthrough only (no draft or non-verifying protocol)"
            elif verdict is None:
                status, failures = "upstream unreachable: tokenizer not checked", failures + 1
            elif verdict.compatible:
                status = f"speculative: {verdict.reason}"
            else:
                status, failures = f"passthrough: {verdict.reason}", failures + 1
            lines.append(f"{runtime.name}\t{runtime.route.upstream.shown_url}\t{status}")
            lines += [f"{runtime.name}\t{label}\t{value}" for label, value in _findings(runtime)]
            lines += [f"{runtime.name}\tcores\t{d.line()}" for d in drafts if d.route == runtime.name]
            lines += [f"{runtime.name}\t{label}\t{value}" for label, value in _costs(runtime)]
    finally:
        await resources.close()
    return lines, failures
