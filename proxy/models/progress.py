"""Progress on stderr: one-line log messages, and byte bars that stay silent off a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from tqdm import tqdm

Log = Callable[[str], None]


def log_stderr(message: str) -> None:
    """The default progress log: one line on stderr."""
    tqdm.write(message, file=sys.stderr)  # clears and redraws an active progress bar


def interactive() -> bool:
    """Whether progress bars make sense (stderr is a terminal)."""
    return sys.stderr.isatty()


def bar(total: int, initial: int, description: str) -> tqdm[NoReturn]:
    """A byte progress bar on stderr, silent when stderr is not a terminal."""
    return tqdm(
        total=total,
        initial=initial,
        desc=description,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not interactive(),
        file=sys.stderr,
    )
