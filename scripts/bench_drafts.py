#!/usr/bin/env python3
"""Draft kinds side by side: prompt lookup, suffix lookup and hybrid (and the model) on the shipped workloads.

Usage: scripts/bench_drafts.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
       [--kinds ngram,suffix,hybrid] [--workloads code_editing,...] [--prompts 3] [--max-tokens 128]
       [--ks 0,1,2,4,8,16,32] [--anchor] [--simulate-gpu] [--out out/drafts]
Starts one verifier and one proxy with a route per draft kind (matched by model name), measures the
verifier's cost of a verification for each K next to plain decoding (scripts/bench_verifier.py),
then runs `speculoos bench --modes auto` once per kind, recording each kind's trace for
`speculoos bench --simulate`. Regime: shared cores (both servers on this machine, one thread each).
Prints, per workload and kind: tokens/s against direct, α, tokens per round, and the speedup the
cost model predicts from the run's own rounds and measured verification costs. With --anchor, the
same run then measures llama-cpp-python's in-process prompt lookup on the same prompts
(scripts/bench_anchor.py, one thread, 10 predicted tokens, after both servers have stopped) and
prints each kind's tokens/s against it.

With --simulate-gpu, every route instead decides with the GPU regime's costs (GPU_COSTS: a 4 ms
draft token, a 25 ms verification whatever K, 25 ms a plain token, a 2 ms round trip), in
sequential rounds, so the recorded rounds are the ones the proxy would make in front of a GPU
(acceptance is real, lengths and plain chunks follow those costs); each kind's trace is then
replayed under the same costs (`speculoos bench --simulate`). Only that replay means something:
the measured tokens/s of such a run do not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from proxy.bench.local import local_stack

ROOT = Path(__file__).resolve().parent.parent
GPU_COSTS = {"draft_ms": 4, "verify_ms_flat": 25, "plain_ms": 25, "rtt_ms": 2}


def run_bench(stack, kind: str, args: argparse.Namespace) -> dict:
    """One `speculoos bench` run through the kind's route; its JSON document."""
    document = args.out / f"{kind}.json"
    command = [sys.executable, "-m", "proxy", "bench", "--direct", stack.verifier_url, "--proxy", stack.proxy_url,
               "--model", kind, "--route", kind, "--modes", "auto", "--workloads", args.workloads,
               "--prompts", str(args.prompts), "--repeat", "1", "--max-tokens", str(args.max_tokens),
               "--json", str(document), "--record-trace", str(args.out / f"{kind}-trace.json"),
               "--markdown", str(args.out / f"{kind}.md"), *(["--prime"] if args.prime else [])]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(document.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--kinds", default="ngram,suffix,hybrid")
    parser.add_argument("--workloads", default="code_editing,code_completion,extraction,open_chat,creative")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ks", default="0,1,2,4,8,16,32")
    parser.add_argument("--anchor", action="store_true", help="also measure llama-cpp-python's prompt lookup")
    parser.add_argument("--prime", action="store_true", help="cache each prompt in the target before its pair "
                                                              "(speculoos bench --prime): the figures compare decoding")
    parser.add_argument("--simulate-gpu", action="store_true",
                        help="decide with the GPU regime's costs and replay the traces under them (SIMULATION)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "drafts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kinds = args.kinds.split(",")
    with local_stack(args.target, args.draft, kinds=kinds,
                     assume_costs=GPU_COSTS if args.simulate_gpu else None) as stack:
        print(f"regime: shared cores; {args.target} verifier and {args.draft} proxy on this machine, 1 thread each")
        if args.simulate_gpu:
            print(f"routes decide with assumed costs {GPU_COSTS} (ms): the tokens/s below mean nothing")
        costs = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_verifier.py"), "--url",
                                stack.verifier_url, "--ks", args.ks], check=True, capture_output=True, text=True)
        print(costs.stdout)
        documents = {kind: run_bench(stack, kind, args) for kind in kinds}
    anchor = run_anchor(args) if args.anchor else {}
    print("| workload | draft | direct tok/s | proxy tok/s | ÷ direct | α | tokens/round | predicted | efficiency |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, document in documents.items():
        rows = document["rows"]
        for row in rows:
            if row["mode"] != "auto":
                continue
            direct = next(r for r in rows if r["workload"] == row["workload"] and r["mode"] == "direct")
            print(f"| {row['workload']} | {kind} | {_rate(direct)} | {_rate(row)} | {_fmt(row['speedup'])}× | "
                  f"{_fmt(row['alpha'])} | {_fmt(row['tokens_per_round'], 1)} | {_fmt(row['predicted_speedup'])}× | "
                  f"{_fmt(row['efficiency'])} |")
    for workload, rates in anchor.items():
        for kind, document in documents.items():
            row = next(r for r in document["rows"] if r["workload"] == workload and r["mode"] == "auto")
            proxy = row["tokens_per_second"]["median"]
            print(f"{workload}, {kind}: {proxy:.1f} tok/s = {proxy / rates['lookup']:.2f}× the anchor's "
                  f"{rates['lookup']:.1f} (its plain decoding: {rates['plain']:.1f})")
    if args.simulate_gpu:
        for kind in kinds:
            print(f"\n{kind}: " + simulate_gpu(args.out / f"{kind}-trace.json"))
    print(f"\nper-kind tables, JSON and traces: {args.out}")


def simulate_gpu(trace: Path) -> str:
    """The trace replayed under GPU_COSTS: `speculoos bench --simulate`'s table."""
    options = [f"--{name.replace('_', '-')}={value}" for name, value in GPU_COSTS.items()]
    return subprocess.run([sys.executable, "-m", "proxy", "bench", "--simulate", str(trace), "--cost-model", "gpu",
                           *options], check=True, capture_output=True, text=True).stdout


def run_anchor(args: argparse.Namespace) -> dict:
    """llama-cpp-python's in-process prompt lookup on the same prompts: medians per workload."""
    document = args.out / "anchor.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_anchor.py"), "--model", args.target,
                    "--workloads", args.workloads, "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens),
                    "--threads", "1", "--num-pred-tokens", "10", "--json", str(document)], check=True)
    return json.loads(document.read_text())


def _rate(row: dict) -> str:
    spread = row.get("tokens_per_second")
    return _fmt(spread["median"], 1) if spread else "–"


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
