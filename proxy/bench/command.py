"""What every `speculoos bench` sub-command shares: one line on stderr and exit 1 when it cannot go on."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from proxy.bench.client import BenchError
from proxy.bench.simulate import SimulationError
from proxy.bench.workloads import WorkloadError

EXIT_FAILED = 1
FAILURES = (BenchError, WorkloadError, SimulationError)


def guarded(name: str, body: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`body` as a sub-command's run: its failures become one line naming the command, and exit 1."""
    def run(args: argparse.Namespace) -> int:
        try:
            return body(args)
        except FAILURES as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    run.__doc__ = body.__doc__
    return run


def numbers(text: str, what: str, kind: type = float) -> list:
    """'0,10,30' -> [0, 10, 30] of `kind`; BenchError naming `what` when a part is not one."""
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise BenchError(f"{what}: {exc}") from exc


def model_path(name_or_path: str) -> Path:
    """A registry name or a .gguf, resolved; BenchError saying how to fetch it when it is missing."""
    from proxy.models.registry import ModelError, resolve

    try:
        return Path(resolve(name_or_path))
    except ModelError as exc:
        raise BenchError(f"{exc} (speculoos models fetch NAME)") from exc
