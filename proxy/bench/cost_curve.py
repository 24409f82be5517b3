"""`speculoos bench cost-curve`: a running verifier's cost of one verification round per K, and of plain decoding.

Each round sends `context + K drafts` to /generate with logprob_start_len = L - 1, then advances
the context by one token, as consecutive speculative rounds do, so the KV cache holds the prefix
and each round evaluates K + 1 new tokens. Medians (these machines are noisy; quote medians and
ratios). Plain decoding: 16 tokens after the same context, three times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from proxy.bench.client import BenchError, call
from proxy.bench.command import guarded, numbers
from proxy.bench.compare import base_url

FILLER = " ".join(f"value_{i} = compute({i}, scale={i % 7})" for i in range(200))
PLAIN_TOKENS = 16
PLAIN_RUNS = 3
TOP_LOGPROBS = 20  # as the proxy asks for
FORMAT = "speculoos-verifier-round-costs"


@dataclass(frozen=True)
class RoundCost:
    """One K's rounds."""

    k: int
    median_ms: float
    low_ms: float
    high_ms: float
    cached_tokens: int  # the fewest any round found cached


@dataclass(frozen=True)
class Curve:
    """Verification cost by K and the plain decoding cost per token."""

    context: int  # tokens before the first round's drafts
    rounds: int  # timed per K, each one token further on
    by_k: tuple[RoundCost, ...]
    plain_ms_per_token: float  # the median of PLAIN_RUNS runs of PLAIN_TOKENS tokens


async def _generate(session: aiohttp.ClientSession, url: str, ids: list[int], new: int, *,
                    start: int | None = None) -> tuple[float, dict]:
    body: dict = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0}}
    if start is not None:
        body |= {"return_logprob": True, "logprob_start_len": start, "top_logprobs_num": TOP_LOGPROBS}
    answer = await call(session, url + "/generate", body, 600.0)
    return answer.seconds * 1000.0, answer.document


async def measure(url: str, ks: Sequence[int], *, rounds: int = 7, context: int = 200) -> Curve:
    """Time `rounds` verification rounds per K, and plain decoding, on the verifier at `url`."""
    url = base_url(url)
    async with aiohttp.ClientSession() as session:
        ids = (await call(session, url + "/tokenize", {"prompt": FILLER}, 60.0)).document["tokens"]
        if len(ids) <= context + rounds + max(ks, default=0):
            raise BenchError(f"--context {context}: the filler text has only {len(ids)} tokens")
        costs = []
        for k in ks:
            prefix = ids[:context]
            await _generate(session, url, prefix, 0)  # the prefix cached
            times, cached = [], []
            for step in range(rounds):
                drafts = ids[context + step: context + step + k]
                ms, answer = await _generate(session, url, prefix + drafts, 1, start=len(prefix) - 1)
                times.append(ms)
                cached.append(int(answer["meta_info"]["cached_tokens"]))
                prefix = prefix + ids[context + step: context + step + 1]  # one accepted: the next round shares it
            costs.append(RoundCost(k, statistics.median(times), min(times), max(times), min(cached)))
        await _generate(session, url, ids[:context], 0)
        plain = [(await _generate(session, url, ids[:context], PLAIN_TOKENS))[0] / PLAIN_TOKENS
                 for _ in range(PLAIN_RUNS)]
    return Curve(context, rounds, tuple(costs), statistics.median(plain))


def markdown(curve: Curve, url: str) -> str:
    """The table: each K's round time beside the time per evaluated token, and plain decoding's."""
    lines = [f"verifier {url}: context {curve.context} tokens, {curve.rounds} rounds per K (median)", "",
             "| K | round ms (median) | min–max ms | cached tokens | ms per evaluated token |", "|---|---|---|---|---|"]
    lines += [f"| {c.k} | {c.median_ms:.0f} | {c.low_ms:.0f}–{c.high_ms:.0f} | {c.cached_tokens} "
              f"| {c.median_ms / (c.k + 1):.0f} |" for c in curve.by_k]
    lines += ["", f"plain decoding: {curve.plain_ms_per_token:.0f} ms per token "
                  f"(median of {PLAIN_RUNS} runs of {PLAIN_TOKENS} tokens)"]
    return "\n".join(lines) + "\n"


def as_json(curve: Curve, url: str) -> dict:
    """The curve as a JSON document."""
    return {"format": FORMAT, "verifier": url, **asdict(curve)}


def _run(args: argparse.Namespace) -> int:
    """Measure and print the curve."""
    ks = numbers(args.ks, "--ks", int)
    if not ks or any(k < 0 for k in ks) or args.rounds < 1 or args.context < 1:
        raise BenchError("--ks must be numbers 0 or more; --rounds and --context positive")
    curve = asyncio.run(measure(args.url, ks, rounds=args.rounds, context=args.context))
    print(markdown(curve, args.url))
    if args.json:
        args.json.write_text(json.dumps(as_json(curve, args.url), indent=1) + "\n")
    return 0


run = guarded("speculoos bench cost-curve", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench cost-curve`."""
    parser = commands.add_parser("cost-curve", help="a running verifier's verification cost by K and plain decoding",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default="http://127.0.0.1:8001", help="the verifier (default http://127.0.0.1:8001)")
    parser.add_argument("--ks", default="1,2,4,8", help="comma-separated K (default 1,2,4,8)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per K (default 7)")
    parser.add_argument("--context", type=int, default=200, help="cached context in tokens (default 200)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the curve as JSON")
    parser.set_defaults(run=run)
