"""Command line: `speculoos serve | verifier | check | models`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; each module registers its own sub-command."""
    from proxy import relay
    from proxy.bench import cli as bench_cli
    from proxy.models import cli as models
    from proxy.server import cli as cli_serve
    from proxy.verifier import cli as verifier_cli

    parser = argparse.ArgumentParser(prog="speculoos", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cli_serve.add_cli(commands)
    verifier_cli.add_cli(commands)
    models.add_cli(commands)
    relay.add_cli(commands)
    bench_cli.add_cli(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the chosen sub-command."""
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
