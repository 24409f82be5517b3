#!/usr/bin/env python3
"""Measure the verifier's cost of one verification round for several K, and of plain decoding.

Usage: scripts/bench_verifier.py --url http://127.0.0.1:8001 [--ks 1,2,4,8] [--rounds 7] [--context 200]
Each round sends `context + K drafts` with logprob_start_len = L - 1, then advances the context by
one token, as consecutive speculative rounds do, so the KV cache holds the prefix and each round
evaluates K + 1 new tokens. Prints medians (these machines are noisy; quote medians and ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request

FILLER = " ".join(f"value_{i} = compute({i}, scale={i % 7})" for i in range(200))


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8001")
    parser.add_argument("--ks", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--context", type=int, default=200)
    args = parser.parse_args()
    ids = post(args.url + "/tokenize", {"prompt": FILLER})["tokens"]
    assert len(ids) > args.context + 64, "filler text too short"
    print(f"verifier {args.url}: context {args.context} tokens, {args.rounds} rounds per K (median)")
    print("| K | round ms (median) | min–max ms | cached tokens | ms per evaluated token |")
    print("|---|---|---|---|---|")
    for k in [int(x) for x in args.ks.split(",")]:
        context = ids[: args.context]
        post(args.url + "/generate", {"input_ids": context, "sampling_params": {"max_new_tokens": 0}})  # warm prefix
        times, cached = [], []
        for step in range(args.rounds):
            drafts = ids[args.context + step : args.context + step + k]
            started = time.perf_counter()
            answer = post(args.url + "/generate", {
                "input_ids": context + drafts, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True, "logprob_start_len": len(context) - 1, "top_logprobs_num": 20})
            times.append((time.perf_counter() - started) * 1000)
            cached.append(answer["meta_info"]["cached_tokens"])
            context = context + drafts[:1]  # one accepted token: the next round shares this prefix
        median = statistics.median(times)
        print(f"| {k} | {median:.0f} | {min(times):.0f}–{max(times):.0f} | {min(cached)} | {median / (k + 1):.0f} |")
    context = ids[: args.context]
    post(args.url + "/generate", {"input_ids": context, "sampling_params": {"max_new_tokens": 0}})
    plain = []
    for _ in range(3):
        started = time.perf_counter()
        post(args.url + "/generate", {"input_ids": context, "sampling_params": {"max_new_tokens": 16, "temperature": 0}})
        plain.append((time.perf_counter() - started) * 1000 / 16)
    print(f"plain decoding: {statistics.median(plain):.0f} ms per token (median of 3 runs of 16 tokens)")


if __name__ == "__main__":
    main()
