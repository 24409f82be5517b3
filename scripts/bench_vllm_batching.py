#!/usr/bin/env python3
"""Does sharing one HTTP call for several requests' verification rounds beat separate calls on vLLM?

Usage: scripts/bench_vllm_batching.py --url http://127.0.0.1:8011 --model smollm2-135m [--requests 2,4] [--repeat 5]
For N in-flight requests (different ~100-token contexts, K = 4 drafts each) it times, median of
--repeat runs: N sequential calls, N concurrent calls (vLLM batches them itself), and one call whose
`prompt` is the list of N token-id lists.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp

TEXT = "The harbour was busy at dawn; gulls circled the fishing boats as the nets came in. "


async def verify(session: aiohttp.ClientSession, url: str, model: str, prompt: list) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 8,
            "logprobs": 8, "return_token_ids": True, "return_tokens_as_token_ids": True}
    async with session.post(url + "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        await reply.read()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", default="2,4")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    async with aiohttp.ClientSession() as session:
        async with session.post(args.url + "/tokenize", json={"model": args.model, "prompt": TEXT * 6}) as reply:
            base = (await reply.json())["tokens"][:96]
        print("| in flight | sequential ms | concurrent ms | one batched call ms |")
        print("|---|---|---|---|")
        for n in [int(x) for x in args.requests.split(",")]:
            prompts = [base[i:] + base[:i] + base[:4] for i in range(n)]  # distinct contexts + 4 drafts
            timings: dict[str, list[float]] = {"sequential": [], "concurrent": [], "batched": []}
            for _ in range(args.repeat):
                started = time.perf_counter()
                for p in prompts:
                    await verify(session, args.url, args.model, p)
                timings["sequential"].append(time.perf_counter() - started)
                started = time.perf_counter()
                await asyncio.gather(*(verify(session, args.url, args.model, p) for p in prompts))
                timings["concurrent"].append(time.perf_counter() - started)
                started = time.perf_counter()
                await verify(session, args.url, args.model, prompts)
                timings["batched"].append(time.perf_counter() - started)
            cells = [f"{statistics.median(timings[k]) * 1000:.0f}" for k in ("sequential", "concurrent", "batched")]
            print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    asyncio.run(main())
