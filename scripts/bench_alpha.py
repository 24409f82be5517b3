#!/usr/bin/env python3
"""α and tokens per round through the proxy for a few prompts at several temperatures (K pinned).

Usage: scripts/bench_alpha.py --proxy http://127.0.0.1:8080 --model qwen-model [--k 4] [--max-tokens 48]
Speculation is pinned (`"speculoos": {"k": K}`) so the controller cannot pass requests through;
α = accepted ÷ drafted over each request, from the response's `speculoos` extension.
"""

from __future__ import annotations

import argparse
import json
import urllib.request

PROMPTS = {
    "code": "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "prose": "Explain in three sentences how a bicycle's gears work.",
    "list": "List the planets of the solar system in order from the sun, one per line.",
}
TEMPERATURES = (0.0, 0.7, 1.0)


def ask(url: str, model: str, text: str, temperature: float, k: int, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": temperature, "seed": 7, "speculoos": {"k": k}}
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())["speculoos"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="qwen-model")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    print(f"α (accepted/drafted) and τ (tokens/round), K = {args.k}, {args.max_tokens} tokens, seed 7")
    print("| prompt | " + " | ".join(f"T={t:g} α / τ" for t in TEMPERATURES) + " |")
    print("|---|" + "---|" * len(TEMPERATURES))
    for name, text in PROMPTS.items():
        cells = []
        for temperature in TEMPERATURES:
            ext = ask(args.proxy, args.model, text, temperature, args.k, args.max_tokens)
            cells.append(f"{ext['alpha']:.2f} / {ext['tokens_per_round']:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
