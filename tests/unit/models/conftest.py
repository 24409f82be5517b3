"""Shared fixtures for the model tests: one real SmolLM2 fetch, reused by every module."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.models.fetch import fetch


@pytest.fixture(scope="session")
def fetched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a verified SmolLM2, assembled once for the session."""
    directory = tmp_path_factory.mktemp("models")
    fetch(["smollm2-135m"], directory=directory, log=lambda message: None)  # quiet: tests read no log here
    return directory
