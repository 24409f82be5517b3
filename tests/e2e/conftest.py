"""Fixtures of the end-to-end tier: the real models, and real verifier and proxy processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.models import fetch as models
from tests.e2e.servers import DRAFT_QWEN, GEMMA, SMOL, TARGET_QWEN, Process, start_proxy, start_verifier, write_routes


@pytest.fixture(scope="session")
def model_paths() -> dict[str, Path]:
    """Every model the tests use, fetched (a no-op when already present)."""
    return models.fetch([TARGET_QWEN, DRAFT_QWEN, SMOL, GEMMA])


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where server logs go."""
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def smol_verifier(model_paths: dict[str, Path], log_dir: Path) -> Iterator[Process]:
    """The verifier serving SmolLM2-135M."""
    process = start_verifier(SMOL, log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def qwen_verifier(model_paths: dict[str, Path], log_dir: Path) -> Iterator[Process]:
    """The verifier serving the Qwen2.5-Coder-1.5B target."""
    process = start_verifier(TARGET_QWEN, log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def smol_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy with SmolLM2 drafting for itself."""
    process = start_proxy(write_routes(log_dir / "smol.yaml", smol_verifier.url, SMOL), log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def smol_ngram_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy drafting by prompt lookup (SmolLM2's GGUF as the tokenizer)."""
    routes = write_routes(log_dir / "smol-ngram.yaml", smol_verifier.url, SMOL, kind="ngram")
    process = start_proxy(routes, log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def qwen_proxy(qwen_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy with the Qwen 0.5B draft in front of the 1.5B target."""
    process = start_proxy(write_routes(log_dir / "qwen.yaml", qwen_verifier.url, DRAFT_QWEN), log_dir)
    yield process
    process.stop()
