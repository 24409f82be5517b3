"""`speculoos serve` (run the proxy) and `speculoos check` (validate routes and probe their upstreams)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

from proxy.config.load import ConfigError, load_config
from proxy.config.schema import Config
from proxy.observability import logs


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


def _load(args: argparse.Namespace, command: str) -> Config | None:
    """The validated routes file, or None after printing why not."""
    logs.configure()
    try:
        return load_config(args.routes)
    except ConfigError as exc:
        print(f"speculoos {command}: {exc}", file=sys.stderr)
        return None


def run_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from proxy.server.app import create_app

    if (config := _load(args, "serve")) is None:
        return 2
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    print(f"speculoos: proxy on http://{host}:{port}/v1", flush=True)
    web.run_app(create_app(config), host=host, port=port, print=None, access_log=None,
                handler_cancellation=True)
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Validate the file, load each draft, probe each upstream; exit 1 on any failure."""
    from proxy.drafting.llama import LlamaDrafter
    from proxy.server.app import open_resources

    if (config := _load(args, "check")) is None:
        return 2

    async def probe() -> int:
        resources = await open_resources(config, LlamaDrafter.load)
        failures = 0
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
            print(f"{runtime.name}\t{runtime.route.upstream.url}\t{status}")
            if runtime.capabilities:
                print(f"{runtime.name}\tcapabilities\t{runtime.capabilities}")
        await resources.close()
        return 1 if failures else 0

    return asyncio.run(probe())
