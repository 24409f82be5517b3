"""llama-server built by scripts/setup_llama_server.sh, and `speculoos bench peers` with it (slow: the first run
compiles llama-server, minutes).

SmolLM2 serves as target and draft for speed: these tests check that the pieces run and report, not speed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest

from proxy.bench import peers
from proxy.bench.peers import LLAMA_SPEC, SHARED, Models, Peer, Setting
from proxy.bench.workloads import load
from tests.e2e.servers import SMOL
from tests.support import free_port
from tests.unit.bench.test_bench import bench

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup_llama_server.sh"
BUILD_TIMEOUT_S = 3600
SECOND_RUN_S = 30.0


def _setup() -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def llama_server() -> Path:
    """The binary, built once per machine."""
    return Path(_setup().stdout.strip().splitlines()[-1])


def test_the_set_up_is_idempotent(llama_server: Path) -> None:
    started = time.monotonic()
    again = _setup()
    assert time.monotonic() - started < SECOND_RUN_S
    assert again.stdout.strip().splitlines()[-1] == str(llama_server) and llama_server.is_file()
    assert llama_server.parent.parent.parent.name == "llama-server"  # <cache>/speculoos/llama-server/<version>/bin


def test_llama_server_answers_with_its_speculation(llama_server: Path, model_paths: dict[str, Path],
                                                   tmp_path: Path) -> None:
    smol = model_paths[SMOL]
    peer, setting = Peer(LLAMA_SPEC, "ngram-simple"), Setting(SHARED, None, 0.0)
    with peers.serving(peer, setting, Models(smol, smol, llama_server, ""), tmp_path, server_cores={0},
                       client_cores={1}) as base:
        (sample,) = asyncio.run(peers.measure([base], [peer], setting, [load("code_editing")], prompts=1,
                                              max_tokens=48, timeout_s=120))
    assert sample.error is None and sample.completion_tokens and sample.tokens_per_second and sample.ttft_s
    speculation = sample.speculation
    assert speculation is not None and speculation.rounds is not None  # timings and /metrics both answered
    assert 0 <= speculation.accepted <= speculation.drafted


def test_llama_server_is_built_without_amx(llama_server: Path, model_paths: dict[str, Path]) -> None:
    """As scripts/setup.sh builds our engine: the CPU features it reports at trace verbosity leave AMX out."""
    command = [str(llama_server), "--model", str(model_paths[SMOL]), "--port", str(free_port()),
               "--log-verbosity", "4"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as server:
        try:
            assert server.stdout is not None
            features = next((line for line in server.stdout if "CPU :" in line or "listening on" in line), "")
        finally:
            server.terminate()
    assert "AVX" in features and "AMX_INT8 = 1" not in features


def test_bench_peers_in_both_regimes(llama_server: Path, model_paths: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "peers.json"
    assert bench("peers", "--target", str(model_paths[SMOL]), "--draft", str(model_paths[SMOL]),
                 "--llama-server", str(llama_server), "--routes", str(ROOT / "routes.yaml"),
                 "--rows", "llama-draft,speculoos", "--workloads", "code_editing", "--prompts", "1",
                 "--max-tokens", "16", "--temperatures", "0", "--two-device", "--rtts", "10", "--out", str(out)) == 0
    assert "| two-device | 10 | 0 | code_editing | Speculoos + our verifier |" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert [(r["regime"], r["rtt_ms"], r["row"]) for r in document["rows"]] == [
        ("shared", None, "llama-server --model-draft"), ("shared", None, "Speculoos + our verifier"),
        ("two-device", 10.0, "llama-server --model-draft"), ("two-device", 10.0, "Speculoos + our verifier")]
    for row in document["rows"]:
        assert row["errors"] == 0 and row["tokens_per_second"]["median"] > 0 and 0 <= row["accepted"] <= row["drafted"]
        # llama-server drafts every round; whether Speculoos drafts is its controller's call on this machine's costs
        assert row["drafted"] > 0 or row["row"] == "Speculoos + our verifier"
        assert (row["alpha"] is None) == (row["drafted"] == 0)
        assert row["alpha"] is None or 0 <= row["alpha"] <= 1
