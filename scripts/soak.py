#!/usr/bin/env python3
"""Soak: mixed traffic at concurrency N against a verifier and a proxy it starts, then a verdict.

Usage: .venv/bin/python scripts/soak.py [--minutes 20] [--concurrency 4] [--target qwen2.5-coder-1.5b]
       [--draft qwen2.5-coder-0.5b] [--seed 0] [--hostile]
Traffic, drawn with a seeded generator: chat and completions, streamed and not, automatic and
forced speculation, clients that hang up mid-stream, and bad requests. Every few minutes the
workers pause for a quiet check: a stream is dropped mid-way and the drafts counter must stop
moving within a second, with every draft sequence free again. Prints RSS and open file
descriptors of both processes after warm-up and at the end, error counts, and one verdict line.
With --hostile, attackers (scripts/soak_hostile.py) run beside the clients for `--minutes`, in
windows of HOSTILE_WINDOW_S that alternate with clean windows of CLEAN_WINDOW_S, and the clients'
p95 latency in the hostile windows must stay within P95_LIMIT of theirs in the clean ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
from soak_hostile import Attack

from proxy.bench.local import local_stack

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in two sentences.",
    "Rename the variable x to count in: def f(x):\n    return x + 1",
    "List three uses of a binary search tree.",
    "Write a haiku about compilers.",
]
BAD_BODIES = [b"{not json", b'{"model": "m", "messages": []}', b'{"model": "m", "prompt": "x", "max_tokens": -1}']
RSS_GROWTH_LIMIT = 0.10
STOP_WITHIN_S = 1.0
QUIET_EVERY_S = 120.0
HOSTILE_WINDOW_S, CLEAN_WINDOW_S = 120.0, 60.0
ATTACKERS = 2
ATTACK_PAUSE_S = 1.0  # between one attacker's attacks: a hostile mix beside the traffic, not a flood
P95_LIMIT = 1.5
DRAFTS_METRIC = re.compile(rb"^speculoos_spec_decode_num_drafts_total\{[^}]*\} ([0-9.e+]+)$", re.M)


@dataclass
class Usage:
    """A process's resident memory and open file descriptors."""

    rss_kib: int
    fds: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
        return cls(rss, len(os.listdir(f"/proc/{pid}/fd")))


class Soak:
    """The workers, their counters, and the quiet checks."""

    def __init__(self, proxy: str, concurrency: int, seed: int, attack: Attack | None = None) -> None:
        self.proxy = proxy
        self.attack = attack
        self.hostile = asyncio.Event()  # set during a hostile window
        self.latency: dict[str, list[float]] = {"clean": [], "hostile": []}  # the clients' answered requests
        self.concurrency = concurrency
        self.random = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.open = asyncio.Event()  # cleared during a quiet check
        self.open.set()
        self.in_flight = 0

    async def request(self, session: aiohttp.ClientSession) -> None:
        kind = self.random.choices(["chat", "completion", "drop", "bad"], weights=[5, 3, 1, 1])[0]
        if kind == "bad":
            async with session.post(self.proxy + "/v1/chat/completions", data=self.random.choice(BAD_BODIES),
                                    headers={"Content-Type": "application/json"}) as reply:
                await reply.read()
                self.counts["bad_4xx" if 400 <= reply.status < 500 else "bad_other"] += 1
                if not 400 <= reply.status < 500:
                    self.failures.append(f"bad request answered {reply.status}")
            return
        prompt = self.random.choice(PROMPTS)
        stream = kind == "drop" or self.random.random() < 0.5
        body: dict = {"model": "m", "max_tokens": self.random.choice([16, 32, 64]), "stream": stream,
                      "temperature": self.random.choice([0.0, 0.7])}
        if kind == "completion":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        headers = {"X-Speculoos": "k=4"} if self.random.random() < 0.3 else {}
        path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
        window, began = "hostile" if self.hostile.is_set() else "clean", time.monotonic()
        async with session.post(self.proxy + path, json=body, headers=headers) as reply:
            if kind == "drop":
                await reply.content.readline()
                reply.close()  # hang up mid-stream
                self.counts["dropped"] += 1
                return
            text = await reply.read()
            ok = reply.status == 200 and b'"error"' not in text
            self.counts["ok" if ok else f"failed_{reply.status}"] += 1
            if ok:
                self.latency[window].append(time.monotonic() - began)
            if not ok:
                self.failures.append(f"{path} answered {reply.status}: {text[:200]!r}")

    async def worker(self, session: aiohttp.ClientSession, until: float) -> None:
        while time.monotonic() < until:
            await self.open.wait()
            self.in_flight += 1
            try:
                await self.request(session)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.counts["client_error"] += 1
                self.failures.append(f"client error: {type(exc).__name__}: {exc}")
            finally:
                self.in_flight -= 1

    async def attacker(self, session: aiohttp.ClientSession, until: float) -> None:
        assert self.attack is not None
        while time.monotonic() < until:
            await self.open.wait()
            await self.hostile.wait()
            if not self.open.is_set() or time.monotonic() >= until:
                continue
            self.in_flight += 1
            try:
                name, problem = await self.attack.run(session)
                self.counts[f"attack_{name}"] += 1
                if problem:
                    self.failures.append(f"attack {name}: {problem}")
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.failures.append(f"attack: client error: {type(exc).__name__}: {exc}")
            finally:
                self.in_flight -= 1
            await asyncio.sleep(ATTACK_PAUSE_S)

    async def windows(self, until: float) -> None:
        """Hostile and clean windows in turn, until the end."""
        while time.monotonic() < until:
            self.hostile.set()
            await asyncio.sleep(min(HOSTILE_WINDOW_S, max(0.0, until - time.monotonic())))
            self.hostile.clear()
            await asyncio.sleep(min(CLEAN_WINDOW_S, max(0.0, until - time.monotonic())))
        self.hostile.set()  # attackers waiting for a window see the end

    async def drafts(self, session: aiohttp.ClientSession) -> float:
        async with session.get(self.proxy + "/metrics") as reply:
            return sum(float(v) for v in DRAFTS_METRIC.findall(await reply.read()))

    async def quiet_check(self, session: aiohttp.ClientSession) -> None:
        """Pause the workers, drop one forced-speculative stream, and watch its rounds stop."""
        self.open.clear()
        while self.in_flight:
            await asyncio.sleep(0.05)
        body = {"model": "m", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 400,
                "stream": True, "temperature": 0}
        async with session.post(self.proxy + "/v1/chat/completions", json=body,
                                headers={"X-Speculoos": "k=4"}) as reply:
            for _ in range(3):
                await reply.content.readline()
            reply.close()
        await asyncio.sleep(STOP_WITHIN_S)
        before = await self.drafts(session)
        await asyncio.sleep(STOP_WITHIN_S)
        after = await self.drafts(session)
        async with session.get(self.proxy + "/speculoos/status") as reply:
            sequences = (await reply.json())["routes"][0].get("draft_sequences") or {"in_use": 0}
        stopped = after == before and sequences["in_use"] == 0
        self.counts["quiet_checks"] += 1
        if not stopped:
            self.failures.append(f"a dropped stream's rounds went on: drafts {before} -> {after}, {sequences}")
        self.open.set()

    async def run(self, minutes: float) -> None:
        # With attackers, `minutes` is their time: the clean windows between come on top.
        scale = 1 + CLEAN_WINDOW_S / HOSTILE_WINDOW_S if self.attack is not None else 1
        until = time.monotonic() + minutes * 60 * scale
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            workers = [asyncio.create_task(self.worker(session, until)) for _ in range(self.concurrency)]
            if self.attack is not None:
                workers += [asyncio.create_task(self.attacker(session, until)) for _ in range(ATTACKERS)]
                workers.append(asyncio.create_task(self.windows(until)))
            while time.monotonic() + QUIET_EVERY_S < until:
                await asyncio.sleep(QUIET_EVERY_S)
                await self.quiet_check(session)
            await asyncio.gather(*workers)
            await self.quiet_check(session)


def latency_problems(latency: dict[str, list[float]]) -> list[str]:
    """The clients' p95 latency in hostile windows against clean ones, printed; a problem past P95_LIMIT."""
    p95 = {window: float(np.percentile(seconds, 95)) if seconds else float("nan")
           for window, seconds in latency.items()}
    ratio = p95["hostile"] / p95["clean"]
    print(f"clients' p95 latency: clean {p95['clean']:.2f} s ({len(latency['clean'])} requests), "
          f"hostile {p95['hostile']:.2f} s ({len(latency['hostile'])} requests): {ratio:.2f}x")
    return [] if ratio <= P95_LIMIT else [f"clients' p95 latency {ratio:.2f}x a clean window's (limit {P95_LIMIT}x)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--warmup-minutes", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hostile", action="store_true", help="attackers beside the clients (see the docstring)")
    args = parser.parse_args()
    with local_stack(args.target, args.draft, parallel=args.concurrency, live=args.hostile) as stack:
        attack = Attack(stack.proxy_url, stack.verifier_url, PROMPTS, random.Random(args.seed + 2))
        # With attackers the warm-up has them too: the memory their bodies took once is the baseline, growth is not.
        warm = Soak(stack.proxy_url, args.concurrency, args.seed + 1, attack if args.hostile else None)
        asyncio.run(warm.run(args.warmup_minutes))
        start_usage = {"verifier": Usage.of(stack.verifier_pid), "proxy": Usage.of(stack.proxy_pid)}
        soak = Soak(stack.proxy_url, args.concurrency, args.seed, attack if args.hostile else None)
        asyncio.run(soak.run(args.minutes))
        end_usage = {"verifier": Usage.of(stack.verifier_pid), "proxy": Usage.of(stack.proxy_pid)}
    problems = list(dict.fromkeys(soak.failures))
    for name in ("verifier", "proxy"):
        a, b = start_usage[name], end_usage[name]
        growth = (b.rss_kib - a.rss_kib) / a.rss_kib
        print(f"{name}: RSS {a.rss_kib / 1024:.0f} -> {b.rss_kib / 1024:.0f} MiB ({growth:+.1%}), "
              f"open fds {a.fds} -> {b.fds}")
        if growth >= RSS_GROWTH_LIMIT:
            problems.append(f"{name} RSS grew {growth:.1%}")
        if b.fds > a.fds + 2:  # a pooled connection or two may come and go
            problems.append(f"{name} open fds went from {a.fds} to {b.fds}")
    print("requests:", json.dumps(dict(sorted(soak.counts.items()))))
    if args.hostile:
        problems += latency_problems(soak.latency)
    for problem in problems[:20]:
        print("problem:", problem)
    verdict = "PASS" if not problems else "FAIL"
    print(f"soak {verdict}: {args.minutes:g} min at concurrency {args.concurrency}, "
          f"{sum(v for k, v in soak.counts.items() if k != 'quiet_checks')} requests, {len(problems)} problem(s) "
          f"(logs: {stack.folder})")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
