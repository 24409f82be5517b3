#!/usr/bin/env python3
"""The anchor: llama-cpp-python's own in-process prompt-lookup speculative decoding on the same prompts.

Usage: scripts/bench_anchor.py --model qwen2.5-coder-1.5b [--workloads code_editing,extraction] [--prompts 3]
       [--max-tokens 64] [--threads 2] [--num-pred-tokens 4] [--json FILE]
Runs each greedy prompt twice in one process, with and without LlamaPromptLookupDecoding, and
prints output tokens/s (median) per workload beside the ratio: what prompt lookup gives with no
HTTP and no proxy at all, to put the proxy's lookup numbers in context. Decoding and batches
(the lookup's verifications) both use --threads, as our verifier does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from proxy.models import fetch as models

WORKLOADS = Path(__file__).resolve().parent.parent / "proxy" / "workloads"


def run_one(llm: Llama, prompt: dict, max_tokens: int) -> tuple[int, float, str]:
    """Completion tokens, seconds and text of one greedy request."""
    started = time.perf_counter()
    if prompt["kind"] == "chat":
        messages = prompt.get("messages") or [{"role": "user", "content": prompt["text"]}]
        out = llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0.0)
        text = out["choices"][0]["message"]["content"]
    else:
        out = llm.create_completion(prompt["text"], max_tokens=max_tokens, temperature=0.0)
        text = out["choices"][0]["text"]
    return out["usage"]["completion_tokens"], time.perf_counter() - started, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--workloads", default="code_completion,code_editing,extraction,open_chat")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-pred-tokens", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the medians here, per workload")
    args = parser.parse_args()
    path = str(models.resolve(args.model))
    common = {"model_path": path, "n_ctx": 4096, "n_threads": args.threads, "n_threads_batch": args.threads,
              "verbose": False}
    plain = Llama(**common)
    lookup = Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=args.num_pred_tokens))
    print(f"anchor: llama-cpp-python in-process, {Path(path).name}, {args.threads} threads, greedy, "
          f"max_tokens {args.max_tokens}, num_pred_tokens {args.num_pred_tokens}")
    print("| workload | plain tok/s (median) | prompt-lookup tok/s (median) | ratio | identical outputs |")
    print("|---|---|---|---|---|")
    medians: dict[str, dict[str, float]] = {}
    for name in args.workloads.split(","):
        prompts = [p for p in json.loads((WORKLOADS / f"{name}.json").read_text())["prompts"]
                   if not p.get("temperature")][: args.prompts]
        if not prompts:
            print(f"| {name} | – | – | – | no greedy prompts |")
            continue
        rates: dict[str, list[float]] = {"plain": [], "lookup": []}
        same = 0
        for prompt in prompts:
            results = {}
            for label, llm in (("plain", plain), ("lookup", lookup)):
                tokens, seconds, text = run_one(llm, prompt, args.max_tokens)
                rates[label].append(tokens / seconds)
                results[label] = text
            same += results["plain"] == results["lookup"]
        p, s = statistics.median(rates["plain"]), statistics.median(rates["lookup"])
        print(f"| {name} | {p:.1f} | {s:.1f} | {s / p:.2f} | {same}/{len(prompts)} |")
        medians[name] = {"plain": p, "lookup": s}
    if args.json:
        args.json.write_text(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
