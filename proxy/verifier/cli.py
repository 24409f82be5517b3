"""`speculoos verifier`: serve one GGUF model for verification and passthrough."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web

from proxy.models import registry as models
from proxy.observability import logs

DEFAULT_PORT = 8001


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register the `verifier` sub-command."""
    parser = commands.add_parser("verifier", help="serve a GGUF model that answers verification requests")
    parser.add_argument("--model", required=True, help="path to a .gguf file or a name from `speculoos models list`")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    parser.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    parser.add_argument("--gpu-layers", type=int, default=0, help="layers to offload (Metal/CUDA builds)")
    parser.add_argument("--name", default=None, help="model name to report (default: the model's name)")
    parser.add_argument("--parallel", type=int, default=4,
                        help="requests served at once, each in a KV-cache sequence of its own (default 4)")
    parser.add_argument("--shared-decode", action="store_true",
                        help="batch concurrent requests' rows into shared decodes: more throughput, but "
                             "logits (and near-tie outputs) then depend on the load")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load the model and serve until interrupted."""
    from proxy.engine.llama import EngineOptions
    from proxy.verifier.server import load_verifier_app

    logs.configure()
    try:
        path = models.resolve(args.model)
    except models.ModelError as exc:
        print(f"speculoos verifier: {exc}")
        return 1
    name = args.name or (args.model if args.model in models.MODEL_NAMES else Path(path).stem)
    if args.parallel < 1:
        print("speculoos verifier: --parallel must be at least 1")
        return 2
    options = EngineOptions(Path(path), n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.gpu_layers,
                            n_seq=args.parallel)
    app = load_verifier_app(options, model_name=name, shared_decode=args.shared_decode)
    print(f"speculoos verifier: {name} on http://{args.host}:{args.port}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0
