"""Tests for proxy.models.cli: `speculoos models fetch|list|path` through a real parser, on a real fetch."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from proxy.models.cli import add_cli
from proxy.models.registry import REGISTRY, resolve

SMOLLM2 = REGISTRY["smollm2-135m"]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run `speculoos ARGV` through a fresh parser; exit code, stdout, stderr."""
    parser = argparse.ArgumentParser(prog="speculoos")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_path(fetched: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["models", "path", "smollm2-135m", "--dir", str(fetched)], capsys)
    assert (code, out) == (0, f"{fetched / SMOLLM2.filename}\n")


def test_a_fetched_model_resolves_by_name(fetched: Path) -> None:
    assert resolve("smollm2-135m", directory=fetched) == fetched / SMOLLM2.filename


def test_cli_fetch_prints_name_and_path(fetched: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["models", "fetch", "smollm2-135m", "--dir", str(fetched)], capsys)
    assert (code, out) == (0, f"smollm2-135m\t{fetched / SMOLLM2.filename}\n")
    assert "already present" in err


def test_cli_list(fetched: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["models", "list", "--dir", str(fetched)], capsys)
    rows = [line.split() for line in out.splitlines()]
    assert code == 0 and rows[0] == ["NAME", "ROLE", "SIZE", "FETCHED", "PATH"]
    fetched_column = {row[0]: row[-2] for row in rows[1:]}
    assert fetched_column == {
        "qwen2.5-coder-1.5b": "no",
        "qwen2.5-coder-0.5b": "no",
        "smollm2-135m": "yes",
        "gemma3-270m": "no",
    }
    assert rows[3][-1] == str(fetched / SMOLLM2.filename)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["models", "path", "smollm2-135m"], "speculoos models fetch smollm2-135m"),
        (["models", "path", "nope"], "known: qwen2.5-coder-1.5b"),
        (["models", "fetch", "nope"], "unknown model(s) nope"),
    ],
)
def test_cli_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli([*argv, "--dir", str(tmp_path)], capsys)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
