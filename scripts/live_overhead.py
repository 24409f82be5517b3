#!/usr/bin/env python3
"""The live page's cost: 4 streams at once through the proxy, with no page open, with one reading, and one stuck.

Usage: .venv/bin/python scripts/live_overhead.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
       [--bursts 6] [--streams 4] [--max-tokens 64] [--k 4]
Starts a verifier (--parallel = streams) and a proxy with `server.live: true` on this machine, then
runs bursts of `streams` greedy streaming chat requests pinned to k, interleaving the conditions
(ABCCBA...) so drift hits each alike: no page; a page reading /speculoos/live/events; a page that
connects and never reads. Prints tokens per second per condition, its ratio to "no page", and
whether every output equals the same request's output without a page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiohttp

from proxy.bench.local import local_stack

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is and when to use one.",
    "Write a SQL query that lists the ten most recent orders with their customer names.",
    "Write a function that merges two sorted lists.",
]
CONDITIONS = ("no page", "page reading", "page stuck")


async def stream(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, k: int) -> tuple[str, int]:
    """One streaming chat request: its text and completion tokens."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    text, tokens = [], 0
    async with session.post(url + "/v1/chat/completions", json=body, headers={"X-Speculoos": f"k={k}"}) as reply:
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            text += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return "".join(text), tokens


async def page(url: str, read: bool, opened: asyncio.Event) -> None:
    """An open live page: reads every event, or connects and then never reads (its socket buffer fills)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/speculoos/live/events") as response:
        assert response.status == 200, "is server.live on?"
        opened.set()
        if not read:
            await asyncio.Event().wait()
        async for _ in response.content:
            pass


async def burst(url: str, condition: str, args: argparse.Namespace) -> tuple[float, int, list[str]]:
    """`streams` requests at once under `condition`: wall seconds, tokens, texts."""
    reader, opened = None, asyncio.Event()
    if condition != "no page":
        reader = asyncio.create_task(page(url, condition == "page reading", opened))
        await asyncio.wait_for(opened.wait(), 30)
    try:
        async with aiohttp.ClientSession() as session:
            started = time.perf_counter()
            replies = await asyncio.gather(*(stream(session, url, PROMPTS[i % len(PROMPTS)], args.max_tokens, args.k)
                                             for i in range(args.streams)))
            seconds = time.perf_counter() - started
    finally:
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return seconds, sum(t for _, t in replies), [text for text, _ in replies]


async def measure(url: str, args: argparse.Namespace) -> None:
    await burst(url, "no page", args)  # warm-up: caches and the route's first measurements
    totals = {c: [0.0, 0] for c in CONDITIONS}
    texts: dict[str, list[list[str]]] = {c: [] for c in CONDITIONS}
    for index in range(args.bursts):
        for condition in CONDITIONS if index % 2 == 0 else CONDITIONS[::-1]:
            seconds, tokens, outputs = await burst(url, condition, args)
            totals[condition][0] += seconds
            totals[condition][1] += tokens
            texts[condition].append(outputs)
            print(f"burst {index + 1} {condition:13} {tokens / seconds:7.1f} tok/s ({seconds:.1f} s)", flush=True)
    base = totals["no page"][1] / totals["no page"][0]
    print(f"\n{args.streams} streams, {args.bursts} bursts per condition, interleaved")
    for condition in CONDITIONS:
        seconds, tokens = totals[condition]
        same = texts[condition] == texts["no page"]
        print(f"{condition:13} {tokens / seconds:7.1f} tok/s  ×{tokens / seconds / base:.3f}  "
              f"outputs {'identical' if same else 'DIFFER'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verifier-port", type=int, default=18011)
    parser.add_argument("--proxy-port", type=int, default=18090)
    args = parser.parse_args()
    with local_stack(args.target, args.draft, parallel=args.streams, threads=args.threads,
                     verifier_port=args.verifier_port, proxy_port=args.proxy_port, live=True) as stack:
        asyncio.run(measure(stack.proxy_url, args))
        folder = stack.folder
    print(f"logs: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
