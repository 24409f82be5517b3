#!/usr/bin/env python3
"""Four requests at once against the same four one after another, through the proxy and straight to the verifier.

Usage: .venv/bin/python scripts/concurrency_check.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
       [--requests 4] [--max-tokens 64] [--k 4] [--shared-decode]
Starts a verifier (--parallel = requests) and a proxy on this machine (shared cores), sends greedy
chat requests pinned to k (X-Speculoos: k=K) one after another, then all at once, and prints both
wall times, their ratio, whether every concurrent output equals the same request served alone, and
α and tokens per round; then the same for plain requests straight to the verifier.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp

from proxy.bench.local import local_stack

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is and when to use one.",
    "Write a SQL query that lists the ten most recent orders with their customer names.",
    "Rewrite this loop as a list comprehension: result = []\nfor x in items:\n    if x > 0:\n        result.append(x * 2)",
    "Write a bash one-liner that counts the lines of every .py file in a folder.",
    "Give three tips for writing readable code.",
    "Write a function that merges two sorted lists.",
    "What does the Python keyword yield do?",
]


async def chat(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int,
               headers: dict[str, str]) -> tuple[str, dict]:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as reply:
        answer = await reply.json()
        if reply.status != 200:
            raise SystemExit(f"concurrency_check: {reply.status}: {answer}")
        return answer["choices"][0]["message"]["content"], answer.get("speculoos") or {}


async def compare(url: str, prompts: list[str], max_tokens: int, headers: dict[str, str], label: str) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        await chat(session, url, "Say hi.", 4, headers)  # warm-up, uncounted
        started = time.perf_counter()
        alone = [await chat(session, url, p, max_tokens, headers) for p in prompts]
        one_by_one = time.perf_counter() - started
        started = time.perf_counter()
        together = await asyncio.gather(*(chat(session, url, p, max_tokens, headers) for p in prompts))
        at_once = time.perf_counter() - started
    same = sum(a[0] == t[0] for a, t in zip(alone, together))
    print(f"{label}: one after another {one_by_one:.1f} s, all at once {at_once:.1f} s "
          f"(ratio {at_once / one_by_one:.2f}); concurrent outputs equal to alone: {same}/{len(prompts)}")
    stats = [s for _, s in alone + list(together) if s.get("drafted")]
    if stats:
        drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
        rounds = sum(s["rounds"] for s in stats)
        emitted = sum(s["rounds"] * (s["tokens_per_round"] or 0) for s in stats)
        print(f"{label}: α {accepted / drafted:.2f}, tokens per round {emitted / rounds:.2f} ({len(stats)} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--shared-decode", action="store_true", help="start the verifier with --shared-decode")
    args = parser.parse_args()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    extra = ["--shared-decode"] if args.shared_decode else []
    with local_stack(args.target, args.draft, parallel=args.requests, verifier_args=extra) as stack:
        print(f"regime: shared cores (verifier and proxy on this machine, 1 thread each); {args.requests} greedy "
              f"{args.max_tokens}-token chat requests{'; verifier --shared-decode' if extra else ''}")
        asyncio.run(compare(stack.proxy_url, prompts, args.max_tokens, {"X-Speculoos": f"k={args.k}"},
                            f"proxy k={args.k}"))
        asyncio.run(compare(stack.verifier_url, prompts, args.max_tokens, {}, "verifier direct"))


if __name__ == "__main__":
    main()
