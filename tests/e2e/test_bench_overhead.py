"""`speculoos bench overhead` end to end: a tiny grid with the real Qwen GGUF as the lookup's tokenizer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from proxy.bench import cli
from tests.e2e.servers import DRAFT_QWEN


@pytest.mark.slow
def test_a_tiny_lookup_grid_measures_rounds(model_paths: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="speculoos")
    cli.add_cli(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "rows.jsonl"
    args = parser.parse_args(["bench", "overhead", "--ks", "4", "--streams", "2", "--temperatures", "0",
                              "--drafts", "lookup", "--requests", "2", "--max-tokens", "32",
                              "--model", str(model_paths[DRAFT_QWEN]), "--json", str(out)])
    assert args.run(args) == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert row["k"] == 4 and row["streams"] == 2 and row["rounds"] > 0
    assert row["cpu_ms_per_round"] > 0 and row["loop_lag_ms"] >= 0
    assert set(row["stages_ms_per_round"]) >= {"parse", "support", "sampling", "events", "text", "emit", "other"}
    assert "| lookup | 0 | 4 | 2 |" in capsys.readouterr().out
