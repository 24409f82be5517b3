"""Whether a file on disk is the model its spec describes: size, sha256, and a stamp.

The stamp (NAME.gguf.verified: size, mtime_ns, sha256) spares re-hashing a 1.1 GB file on every
call; when it no longer matches the file's size and mtime, the file is hashed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from proxy.models import progress
from proxy.models.progress import Log
from proxy.models.spec import ModelSpec

COPY_BUFFER = 1 << 20  # bytes per read while extracting, assembling and hashing
STAMP_SUFFIX = ".verified"
TEMPORARY_SUFFIX = ".tmp"


@dataclasses.dataclass(frozen=True)
class Stamp:
    """What a verified model file looked like when it was last hashed."""

    size: int
    mtime_ns: int
    sha256: str


def stamp_path(model: Path) -> Path:
    """Where the verification stamp of `model` lives."""
    return model.with_name(model.name + STAMP_SUFFIX)


def _read_stamp(model: Path) -> Stamp | None:
    """The stamp next to `model`, or None if it is missing or unreadable."""
    try:
        return Stamp(**json.loads(stamp_path(model).read_text()))
    except (OSError, ValueError, TypeError):  # missing or garbled: the caller re-hashes
        return None


def write_stamp(model: Path, stamp: Stamp) -> None:
    """Record `stamp` next to `model`, atomically."""
    temporary = model.with_name(model.name + STAMP_SUFFIX + TEMPORARY_SUFFIX)
    temporary.write_text(json.dumps(dataclasses.asdict(stamp)))
    os.replace(temporary, stamp_path(model))


def _sha256_file(path: Path, description: str) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as source, progress.bar(path.stat().st_size, 0, description) as bar:
        while block := source.read(COPY_BUFFER):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def problem(spec: ModelSpec, path: Path, log: Log) -> str | None:
    """None when the existing file `path` is the verified model, else what is wrong with it."""
    stat = path.stat()
    if stat.st_size != spec.size:
        return f"size {stat.st_size} B, expected {spec.size} B"
    if _read_stamp(path) == Stamp(stat.st_size, stat.st_mtime_ns, spec.sha256):
        return None
    log(f"{spec.name}: no up-to-date stamp, checking the sha256 of {path}")
    actual = _sha256_file(path, f"checking {spec.name}")
    if actual != spec.sha256:
        return f"sha256 {actual}, expected {spec.sha256}"
    # The stat from before hashing: a write during the hash changes mtime, so it re-hashes.
    write_stamp(path, Stamp(stat.st_size, stat.st_mtime_ns, actual))
    return None
