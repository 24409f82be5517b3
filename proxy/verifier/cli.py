"""`speculoos verifier`: serve one GGUF model for verification and passthrough."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.config.server import host_names
from proxy.models import registry as models
from proxy.observability import logs
from proxy.verifier.parse import CONTEXTS_PER_REQUEST, DEFAULT_MAX_BATCH, RequestLimits
from proxy.wire.browsers import Bound

if TYPE_CHECKING:
    from aiohttp import web

DEFAULT_PORT = 8001
DEFAULT_QUEUE = 64
API_KEY_ENV = "SPECULOOS_VERIFIER_API_KEY"


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register the `verifier` sub-command."""
    parser = commands.add_parser("verifier", help="serve a GGUF model that answers verification requests")
    parser.add_argument("--model", required=True, help="path to a .gguf file or a name from `speculoos models list`")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: every core this process may run on; a proxy whose draft model "
                             "runs on this machine takes turns with it)")
    parser.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    parser.add_argument("--gpu-layers", type=int, default=0, help="layers to offload (Metal/CUDA builds)")
    parser.add_argument("--name", default=None, help="model name to report (default: the model's name)")
    parser.add_argument("--parallel", type=int, default=4,
                        help="requests served at once, each in a KV-cache sequence of its own (default 4)")
    parser.add_argument("--queue", type=int, default=DEFAULT_QUEUE,
                        help="requests that may wait for a sequence when all are in use; beyond them, 503 with "
                             f"Retry-After (default {DEFAULT_QUEUE})")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="a Host name clients use besides loopback and --host (repeatable; \"*\": any): "
                             "browsers' requests naming others are refused")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help=f"ask every request but /health for `Authorization: Bearer KEY` (default: ${API_KEY_ENV}, "
                             "which keeps the key out of the process list; unset: no key)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                        help=f"sequences one /generate request may hold (default {DEFAULT_MAX_BATCH})")
    parser.add_argument("--max-request-tokens", type=int, default=None,
                        help="input plus new tokens one request may ask for, over its sequences (default "
                             f"{CONTEXTS_PER_REQUEST} x --ctx)")
    parser.add_argument("--shared-decode", action="store_true",
                        help="batch concurrent requests' rows into shared decodes: more throughput, but "
                             "logits (and near-tie outputs) then depend on the load")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load the model and serve until interrupted."""
    from proxy.engine.llama import EngineOptions
    from proxy.verifier.server import load_verifier_app, run_verifier

    logs.configure()
    try:
        path = models.resolve(args.model)
    except models.ModelError as exc:
        print(f"speculoos verifier: {exc}")
        return 1
    name = args.name or (args.model if args.model in models.MODEL_NAMES else Path(path).stem)
    if args.threads is not None and args.threads < 1:
        print("speculoos verifier: --threads must be at least 1")
        return 2
    if args.parallel < 1:
        print("speculoos verifier: --parallel must be at least 1")
        return 2
    if args.queue < 0:
        print("speculoos verifier: --queue must be at least 0")
        return 2
    if (limits := _limits(args)) is None:
        return 2
    try:
        listener = Bound(args.host, allowed_hosts=host_names(args.allowed_host))
    except ValueError as exc:
        print(f"speculoos verifier: --allowed-host {exc}")
        return 2
    options = EngineOptions(Path(path), n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.gpu_layers,
                            n_seq=args.parallel)
    app = load_verifier_app(options, model_name=name, shared_decode=args.shared_decode, max_waiting=args.queue,
                            listener=listener, api_key=args.api_key, limits=limits)
    print(f"speculoos verifier: {name} on http://{args.host}:{args.port} ({threads_line(app)})", flush=True)
    run_verifier(app, args.host, args.port)
    return 0


def _limits(args: argparse.Namespace) -> RequestLimits | None:
    """The request caps the options ask for; None after printing why they cannot be."""
    limits = RequestLimits.for_context(args.ctx)
    tokens = args.max_request_tokens if args.max_request_tokens is not None else limits.max_tokens
    if args.max_batch < 1:
        print("speculoos verifier: --max-batch must be at least 1")
        return None
    if tokens < args.ctx:  # a request the context holds must never be refused for its size
        print("speculoos verifier: --max-request-tokens must be at least --ctx")
        return None
    if args.api_key is not None and not args.api_key.strip():
        print("speculoos verifier: --api-key must not be empty")
        return None
    return RequestLimits(args.max_batch, tokens)


def threads_line(app: web.Application) -> str:
    """The model's CPU threads against the cores, as the start-up line says them."""
    from proxy.engine.threads import usable_cores
    from proxy.verifier.info import MODEL

    threads = app[MODEL].engine.threads
    return f"{threads} thread{'s' if threads != 1 else ''} of {usable_cores()} cores"
