"""`speculoos bench anchor`: llama-cpp-python's own in-process prompt-lookup speculation on the workloads' prompts.

Each greedy prompt runs twice in this process, with and without LlamaPromptLookupDecoding: output
tokens/s (median) per workload beside the ratio, what prompt lookup gives with no HTTP and no proxy
at all, to put the proxy's lookup figures in context. Decoding and batches (the lookup's
verifications) both use --threads, as our verifier does. Timed around each in-process call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.bench.command import guarded, model_path
from proxy.bench.workloads import CHAT, Prompt, load

CONTEXT = 4096  # as our verifier's default --ctx


@dataclass(frozen=True)
class AnchorRow:
    """One workload's medians."""

    workload: str
    prompts: int  # greedy prompts run
    plain: float | None  # tokens/s
    lookup: float | None
    identical: int  # prompts whose two outputs are the same


def _once(llm: Any, prompt: Prompt, max_tokens: int) -> tuple[float, str]:
    """Tokens/s and text of one greedy request."""
    started = time.perf_counter()
    if prompt.kind == CHAT:
        out = llm.create_chat_completion(messages=[dict(m) for m in prompt.messages or ()], max_tokens=max_tokens,
                                         temperature=0.0)
        text = out["choices"][0]["message"]["content"]
    else:
        out = llm.create_completion(prompt.text, max_tokens=max_tokens, temperature=0.0)
        text = out["choices"][0]["text"]
    return out["usage"]["completion_tokens"] / (time.perf_counter() - started), text


def measure(model: Path, workloads: Sequence[str], *, prompts: int, max_tokens: int, threads: int,
            num_pred_tokens: int) -> list[AnchorRow]:
    """Plain and prompt-lookup tokens/s on each workload's first `prompts` greedy prompts."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    common = {"model_path": str(model), "n_ctx": CONTEXT, "n_threads": threads, "n_threads_batch": threads,
              "verbose": False}
    plain = Llama(**common)
    lookup = Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens))
    rows = []
    for name in workloads:
        chosen = [p for p in load(name).prompts if p.greedy][:prompts]
        rates: dict[str, list[float]] = {"plain": [], "lookup": []}
        same = 0
        for prompt in chosen:
            (plain_rate, plain_text), (lookup_rate, lookup_text) = (_once(llm, prompt, max_tokens)
                                                                    for llm in (plain, lookup))
            rates["plain"].append(plain_rate)
            rates["lookup"].append(lookup_rate)
            same += plain_text == lookup_text
        rows.append(AnchorRow(name, len(chosen), statistics.median(rates["plain"]) if chosen else None,
                              statistics.median(rates["lookup"]) if chosen else None, same))
    return rows


def markdown(rows: Sequence[AnchorRow], header: str) -> str:
    """The table: plain and lookup medians, their ratio and identical outputs."""
    lines = [header, "",
             "| workload | plain tok/s (median) | prompt-lookup tok/s (median) | ratio | identical outputs |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r.plain is None or r.lookup is None:
            lines.append(f"| {r.workload} | – | – | – | no greedy prompts |")
        else:
            lines.append(f"| {r.workload} | {r.plain:.1f} | {r.lookup:.1f} | {r.lookup / r.plain:.2f} "
                         f"| {r.identical}/{r.prompts} |")
    return "\n".join(lines) + "\n"


def _run(args: argparse.Namespace) -> int:
    """Measure and print the anchor."""
    path = model_path(args.model)
    rows = measure(path, [w.strip() for w in args.workloads.split(",") if w.strip()], prompts=args.prompts,
                   max_tokens=args.max_tokens, threads=args.threads, num_pred_tokens=args.num_pred_tokens)
    print(markdown(rows, f"anchor: llama-cpp-python in-process, {path.name}, {args.threads} threads, greedy, "
                         f"max_tokens {args.max_tokens}, num_pred_tokens {args.num_pred_tokens}"))
    if args.json:
        args.json.write_text(json.dumps({r.workload: {"plain": r.plain, "lookup": r.lookup} for r in rows},
                                        indent=2) + "\n")
    return 0


run = guarded("speculoos bench anchor", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench anchor`."""
    parser = commands.add_parser("anchor", help="llama-cpp-python's in-process prompt lookup on the same prompts",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a registry name or a .gguf")
    parser.add_argument("--workloads", default="code_completion,code_editing,extraction,open_chat")
    parser.add_argument("--prompts", type=int, default=3, help="greedy prompts per workload (default 3)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-pred-tokens", type=int, default=4, help="the lookup's tokens a round (default 4)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the medians, per workload")
    parser.set_defaults(run=run)
