"""`speculoos models fetch|list|path`: the command line of the registry and the fetcher."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

from proxy.models import progress, verify
from proxy.models.fetch import fetch
from proxy.models.registry import MODELS_ENV, REGISTRY, ModelError, known_names, models_dir, resolve

EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT
DESCRIPTION = "The model registry and `speculoos models fetch|list|path`."  # for `speculoos models --help`

Command = Callable[[argparse.Namespace], int]


def _cli_errors(command: Command) -> Command:
    """Turn a ModelError into one line on stderr and exit code 1."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ModelError as exc:
            print(f"speculoos models: error: {exc}", file=sys.stderr)
            return 1

    return run


@_cli_errors
def _run_fetch(args: argparse.Namespace) -> int:
    """`models fetch [NAME ...]`: print NAME<TAB>PATH per model."""
    try:
        paths = fetch(args.names, directory=args.dir)
    except KeyboardInterrupt:
        print("speculoos models: interrupted; run the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


@_cli_errors
def _run_list(args: argparse.Namespace) -> int:
    """`models list`: one row per registry model."""
    directory = args.dir if args.dir is not None else models_dir()
    rows = [("NAME", "ROLE", "SIZE", "FETCHED", "PATH")]
    for spec in REGISTRY.values():
        path = directory / spec.filename
        fetched = path.is_file() and verify.problem(spec, path, progress.log_stderr) is None
        size = f"{spec.size / 1e6:,.0f} MB"
        rows.append((spec.name, spec.role, size, "yes" if fetched else "no", str(path)))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
            + "  "
            + row[-1]
        )
    return 0


@_cli_errors
def _run_path(args: argparse.Namespace) -> int:
    """`models path NAME`: the verified path of a fetched model."""
    print(resolve(args.name, directory=args.dir))
    return 0


def add_cli(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `models fetch|list|path` on the top-level sub-command parsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir",
        type=Path,
        default=None,
        help=f"models directory (default: ${MODELS_ENV}, else ~/.cache/speculoos/models)",
    )
    parser = subparsers.add_parser(
        "models", help="fetch and inspect the GGUF models", description=DESCRIPTION
    )
    actions = parser.add_subparsers(dest="models_command", required=True)
    fetch_parser = actions.add_parser(
        "fetch", parents=[common], help="download, assemble and verify models"
    )
    fetch_parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"any of {known_names()}; default: all"
    )
    fetch_parser.set_defaults(run=_run_fetch)
    list_parser = actions.add_parser("list", parents=[common], help="show the registry")
    list_parser.set_defaults(run=_run_list)
    path_parser = actions.add_parser("path", parents=[common], help="print a fetched model's path")
    path_parser.add_argument("name", metavar="NAME")
    path_parser.set_defaults(run=_run_path)
