"""The GPU cost curve's parts, run on the CPU: random-weight Qwen2 GGUFs that llama.cpp loads, and the curve's JSON.

The shapes are tiny here (the script writes a 7B and a 0.5B shape on the GPU machine); the tokenizer
comes from the real Qwen2.5 draft GGUF, as the script takes it from llama.cpp's vocabulary file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.bench import gpu_costs
from proxy.bench.random_gguf import Qwen2Shape, write_random_qwen2
from proxy.bench.simulate import measured_cost_model
from proxy.engine.llama import EngineOptions, LlamaEngine
from tests.e2e.servers import DRAFT_QWEN

pytestmark = pytest.mark.slow  # a benchmark script's parts: about 25 s of writing GGUFs

TINY_TARGET = Qwen2Shape("tiny-target", layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, tied_output=False)
TINY_DRAFT = Qwen2Shape("tiny-draft", layers=1, hidden=256, ffn=256, heads=4, kv_heads=2, tied_output=True)


@pytest.fixture(scope="module")
def tokenizer(model_paths: dict[str, Path]) -> Path:
    return model_paths[DRAFT_QWEN]


def test_a_random_weight_model_loads_with_the_real_tokenizer_and_gives_finite_logits(tokenizer: Path,
                                                                                      tmp_path: Path) -> None:
    path = write_random_qwen2(tmp_path / "tiny.gguf", TINY_TARGET, tokenizer)
    engine = LlamaEngine(EngineOptions(path, n_ctx=256, n_threads=1))
    real = LlamaEngine(EngineOptions(tokenizer, n_ctx=256, n_threads=1))
    try:
        text = "def is_prime(n):"
        assert engine.vocabulary.tokenize(text) == real.vocabulary.tokenize(text)
        assert engine.n_vocab == real.n_vocab
        evaluation = engine.evaluate(0, engine.vocabulary.tokenize(text), 1)
        assert evaluation.logits.shape[1] == engine.n_vocab and bool((abs(evaluation.logits) < 1e30).all())
    finally:
        engine.close()
        real.close()


def test_the_script_writes_a_curve_the_simulation_takes(tokenizer: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_costs, "QWEN25_7B", TINY_TARGET)
    monkeypatch.setattr(gpu_costs, "QWEN25_05B", TINY_DRAFT)
    out = tmp_path / "curve.json"
    assert gpu_costs.main(["--tokenizer", str(tokenizer), "--models-dir", str(tmp_path), "--out", str(out),
                           "--ks", "1,4", "--rounds", "2", "--context", "16", "--gpu-layers", "0"]) == 0
    curve = json.loads(out.read_text())
    assert curve["format"] == gpu_costs.CURVE_FORMAT and sorted(curve["verify_ms"], key=int) == ["0", "1", "4"]
    assert curve["plain_ms"] == curve["verify_ms"]["0"] > 0 and curve["draft_ms"] > 0
    model = measured_cost_model(curve, str(out), rtt_ms=10.0)
    assert model.verify_ms(4) == pytest.approx(curve["verify_ms"]["4"]) and model.rtt_ms == 10.0
