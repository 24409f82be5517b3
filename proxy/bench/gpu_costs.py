"""Measure a GPU's verification cost curve and draft cost with random-weight models of real shapes.

Usage (on a machine with a CUDA or Metal build of llama-cpp-python; scripts/gpu_costs.sh builds one):
    python -m proxy.bench.gpu_costs --tokenizer ggml-vocab-qwen2.gguf --models-dir /tmp/models --out costs.json

The target (a Qwen2.5-7B shape) and the draft (a Qwen2.5-0.5B shape) are written as random-weight
Q4_K GGUFs (`random_gguf`) and loaded by the verifier's own engine with every layer on the GPU. A
verification of K drafts is one `evaluate` of K + 1 new tokens after a cached context, returning
K + 1 logit rows, as the verifier runs it; the verifier's log-softmax of those rows is timed apart.
K = 0 is a plain decoding step. The draft's cost is its plain step. Medians of `--rounds` rounds
after warm-up rounds. The JSON it writes is what `speculoos bench --simulate --cost-curve` takes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from proxy.bench.random_gguf import QWEN25_05B, QWEN25_7B, Qwen2Shape, write_random_qwen2

DEFAULT_KS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
WARM_UP_ROUNDS = 3
CURVE_FORMAT = "speculoos-verify-cost-curve"


@dataclass(frozen=True)
class VerifyCost:
    """One K's median cost."""

    k: int
    evaluate_ms: float  # the engine's evaluation of K + 1 tokens, logits copied out
    rows_ms: float  # the verifier's log-softmax of the K + 1 rows


def measure_model(path: Path, ks: Sequence[int], *, context: int, rounds: int, gpu_layers: int,
                  seed: int = 0) -> tuple[list[VerifyCost], float]:
    """Per K, the median cost of verifying K drafts after `context` cached tokens; and the load time in s."""
    from proxy.engine.llama import EngineOptions, LlamaEngine  # needs llama_cpp, built for the GPU
    from proxy.verifier.generate import log_softmax

    started = time.perf_counter()
    engine = LlamaEngine(EngineOptions(path, n_ctx=context + max(ks) + 8, n_gpu_layers=gpu_layers))
    loaded = time.perf_counter() - started
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, engine.n_vocab, size=context).tolist()
    engine.evaluate(0, prompt, context - 1)  # the prefill, cached for every round below
    costs = []
    for k in ks:
        evaluate_ms, rows_ms = [], []
        for round_index in range(WARM_UP_ROUNDS + rounds):
            # The last emitted token and K drafts are new; the prompt is cached, as in a steady round.
            fresh = rng.integers(0, engine.n_vocab, size=k + 1).tolist()
            began = time.perf_counter()
            evaluation = engine.evaluate(0, prompt + fresh, context)
            evaluated = time.perf_counter()
            log_softmax(evaluation.logits)
            done = time.perf_counter()
            if round_index >= WARM_UP_ROUNDS:
                evaluate_ms.append((evaluated - began) * 1000)
                rows_ms.append((done - evaluated) * 1000)
        costs.append(VerifyCost(k, statistics.median(evaluate_ms), statistics.median(rows_ms)))
        print(f"  {path.name}: K = {k}: {costs[-1].evaluate_ms:.2f} + {costs[-1].rows_ms:.2f} ms", flush=True)
    engine.close()
    return costs, loaded


def _model(models_dir: Path, shape: Qwen2Shape, tokenizer: Path) -> Path:
    """The random-weight GGUF of shape, written once."""
    path = models_dir / f"{shape.name}-random-q4_k.gguf"
    if not path.exists():
        started = time.perf_counter()
        write_random_qwen2(path, shape, tokenizer)
        print(f"wrote {path} ({path.stat().st_size / 2 ** 30:.2f} GiB) in {time.perf_counter() - started:.0f} s",
              flush=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="a GGUF whose tokenizer the models take")
    parser.add_argument("--models-dir", type=Path, required=True, help="where the random-weight GGUFs are written")
    parser.add_argument("--out", type=Path, required=True, help="the cost curve, as JSON")
    parser.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)))
    parser.add_argument("--context", type=int, default=512, help="cached tokens before each verification")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--gpu-layers", type=int, default=-1)
    parser.add_argument("--device", default="", help="the GPU's name, for the record")
    args = parser.parse_args(argv)
    ks = sorted({int(k) for k in args.ks.split(",")} | {0})
    args.models_dir.mkdir(parents=True, exist_ok=True)

    measured = {}
    for role, shape, role_ks in (("target", QWEN25_7B, ks), ("draft", QWEN25_05B, [0])):
        path = _model(args.models_dir, shape, args.tokenizer)
        costs, loaded = measure_model(path, role_ks, context=args.context, rounds=args.rounds,
                                      gpu_layers=args.gpu_layers)
        measured[role] = {"shape": asdict(shape), "load_s": round(loaded, 1), "costs": [asdict(c) for c in costs]}
        print(f"{role} {shape.name}: loaded in {loaded:.1f} s", flush=True)

    target = measured["target"]["costs"]
    plain_ms = target[0]["evaluate_ms"] + target[0]["rows_ms"]
    draft_ms = measured["draft"]["costs"][0]["evaluate_ms"]
    print(f"\ncontext {args.context} cached tokens, median of {args.rounds} rounds; {args.device}")
    print("| K | verify ms (evaluate + rows) | evaluate ms | rows ms | plain steps |")
    print("|---|---|---|---|---|")
    for cost in target:
        total = cost["evaluate_ms"] + cost["rows_ms"]
        print(f"| {cost['k']} | {total:.2f} | {cost['evaluate_ms']:.2f} | {cost['rows_ms']:.2f} | "
              f"{total / plain_ms:.2f} |")
    print(f"plain step (K = 0): {plain_ms:.2f} ms; draft step (0.5B shape): {draft_ms:.2f} ms")
    document = {
        "format": CURVE_FORMAT, "device": args.device, "context": args.context, "rounds": args.rounds,
        "plain_ms": plain_ms, "draft_ms": draft_ms,
        "verify_ms": {str(c["k"]): c["evaluate_ms"] + c["rows_ms"] for c in target},
        "measured": measured,
    }
    args.out.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
