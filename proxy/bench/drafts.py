"""`speculoos bench drafts`: draft kinds side by side (prompt lookup, suffix lookup, hybrid, the model) on workloads.

Starts one verifier and one proxy with a route per draft kind (matched by model name), measures
the verifier's cost of a verification for each K next to plain decoding (`bench cost-curve`),
then runs `bench run --modes auto` once per kind, recording each kind's trace for --simulate.
Regime: shared cores (both servers on this machine, one thread each). Prints, per workload and
kind: tokens/s against direct, α, tokens per round, and the speedup the cost model predicts from
the run's own rounds and measured verification costs. With --anchor, llama-cpp-python's
in-process prompt lookup then runs on the same prompts (`bench anchor`, one thread, 10 predicted
tokens, after both servers have stopped), and each kind's tokens/s is set against it.

With --simulate-gpu, every route instead decides with the GPU regime's costs (GPU_COSTS: a 4 ms
draft token, a 25 ms verification whatever K, 25 ms a plain token, a 2 ms round trip), in
sequential rounds, so the recorded rounds are the ones the proxy would make in front of a GPU;
each kind's trace is then replayed under the same costs. Only that replay means something: the
measured tokens/s of such a run do not.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from proxy.bench import anchor, compare, cost_curve, replay, simulate
from proxy.bench.command import guarded, model_path, numbers
from proxy.bench.local import local_stack
from proxy.bench.report import number
from proxy.bench.runner import parse_modes
from proxy.bench.workloads import load

GPU_COSTS = {"draft_ms": 4, "verify_ms_flat": 25, "plain_ms": 25, "rtt_ms": 2}
ANCHOR_THREADS = 1
ANCHOR_PREDICTED = 10


def table(documents: Mapping[str, Mapping[str, Any]]) -> str:
    """Per workload and kind: the auto mode against direct, α, τ, predicted speedup and efficiency."""
    lines = ["| workload | draft | direct tok/s | proxy tok/s | ÷ direct | α | tokens/round | predicted | efficiency |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind, document in documents.items():
        rows = document["rows"]
        for row in (r for r in rows if r["mode"] == "auto"):
            direct = next(r for r in rows if r["workload"] == row["workload"] and r["mode"] == "direct")
            lines.append(f"| {row['workload']} | {kind} | {number(_rate(direct), 1)} | {number(_rate(row), 1)} "
                         f"| {number(row['speedup'], 2, '×')} | {number(row['alpha'], 2)} "
                         f"| {number(row['tokens_per_round'], 1)} | {number(row['predicted_speedup'], 2, '×')} "
                         f"| {number(row['efficiency'], 2)} |")
    return "\n".join(lines) + "\n"


def against_anchor(documents: Mapping[str, Mapping[str, Any]], rows: Sequence[anchor.AnchorRow]) -> list[str]:
    """Each kind's tokens/s as a multiple of the anchor's prompt lookup, per workload."""
    lines = []
    for row in rows:
        for kind, document in documents.items():
            mine = next((r for r in document["rows"] if r["workload"] == row.workload and r["mode"] == "auto"), None)
            rate = _rate(mine)
            if rate is not None and row.lookup:
                lines.append(f"{row.workload}, {kind}: {rate:.1f} tok/s = {rate / row.lookup:.2f}× the anchor's "
                             f"{row.lookup:.1f} (its plain decoding: {number(row.plain, 1)})")
    return lines


def _rate(row: Mapping[str, Any] | None) -> float | None:
    spread = (row or {}).get("tokens_per_second")
    return spread["median"] if spread else None


def _run(args: argparse.Namespace) -> int:
    """Start the stack, measure every kind, print the tables."""
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    workloads = [load(name.strip()) for name in args.workloads.split(",") if name.strip()]
    ks = numbers(args.ks, "--ks", int)
    args.out.mkdir(parents=True, exist_ok=True)
    documents = {}
    with local_stack(args.target, args.draft, kinds=kinds,
                     assume_costs=GPU_COSTS if args.simulate_gpu else None) as stack:
        print(f"regime: shared cores; {args.target} verifier and {args.draft} proxy on this machine, 1 thread each")
        if args.simulate_gpu:
            print(f"routes decide with assumed costs {GPU_COSTS} (ms): the tokens/s below mean nothing")
        print(cost_curve.markdown(asyncio.run(cost_curve.measure(stack.verifier_url, ks)), stack.verifier_url))
        for kind in kinds:
            plan = compare.Plan(stack.verifier_url, stack.proxy_url, workloads, parse_modes("auto"), model=kind,
                                route=kind, prompts=args.prompts, repeat=1, max_tokens=args.max_tokens,
                                prime=args.prime)
            outcome = compare.measure(plan)
            compare.write(outcome, json_path=args.out / f"{kind}.json", markdown=args.out / f"{kind}.md",
                          trace=args.out / f"{kind}-trace.json")
            documents[kind] = outcome.document
    print(table(documents))
    if args.anchor:
        rows = anchor.measure(model_path(args.target), [w.name for w in workloads], prompts=args.prompts,
                              max_tokens=args.max_tokens, threads=ANCHOR_THREADS, num_pred_tokens=ANCHOR_PREDICTED)
        print("\n".join(against_anchor(documents, rows)))
    if args.simulate_gpu:
        model = simulate.cost_model("gpu", **GPU_COSTS)
        for kind in kinds:
            print(f"\n{kind}: " + replay.markdown_of(args.out / f"{kind}-trace.json", model)[0])
    print(f"\nper-kind tables, JSON and traces: {args.out}")
    return 0


run = guarded("speculoos bench drafts", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench drafts`."""
    parser = commands.add_parser("drafts", help="draft kinds side by side on a verifier and proxy started here",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model: a registry name or a .gguf")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model (and the lookups' tokenizer)")
    parser.add_argument("--kinds", default="ngram,suffix,hybrid", help="draft kinds, a route each (default "
                                                                       "ngram,suffix,hybrid; model too)")
    parser.add_argument("--workloads", default="code_editing,code_completion,extraction,open_chat,creative")
    parser.add_argument("--prompts", type=int, default=3, help="first N prompts of each workload (default 3)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ks", default="0,1,2,4,8,16,32", help="K of the verifier's cost curve")
    parser.add_argument("--anchor", action="store_true", help="also measure llama-cpp-python's prompt lookup")
    parser.add_argument("--prime", action="store_true", help="cache each prompt in the target before its pair "
                                                             "(as bench run --prime): the figures compare decoding")
    parser.add_argument("--simulate-gpu", action="store_true",
                        help="decide with the GPU regime's costs and replay the traces under them (SIMULATION)")
    parser.add_argument("--out", type=Path, default=Path("out") / "drafts", help="where tables, JSON and traces go")
    parser.set_defaults(run=run)
