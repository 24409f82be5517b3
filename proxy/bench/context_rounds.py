"""`speculoos bench context-rounds`: what a round costs the target as the context grows, through a running proxy.

For each context size, fresh prompts of about that many tokens (numbered lines, one request's apart from the
next's) go through the proxy with rounds forced at a fixed K (`"speculoos": {"k": K}`); each answer's `speculoos`
extension gives its rounds and their verification time. The prompt is first sent once passed through (one token),
so that the server holds it as a user's earlier turn would have left it and the figure is a round's, not the
prompt's first prefill. Medians of the per-request means; α and tokens per round beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from proxy.bench.client import BenchError, call
from proxy.bench.command import guarded, numbers
from proxy.bench.compare import base_url

PROBE_LINES = 40  # lines in the request that measures tokens per line
PASS = {"mode": "off"}
FORMAT = "speculoos-context-rounds"


@dataclass(frozen=True)
class ContextRounds:
    """One context size's rounds."""

    target_tokens: int
    prompt_tokens: tuple[int, ...]  # per request, as the server counted them
    rounds: int
    verify_ms_per_round: float  # median over requests of each request's mean
    alpha: float | None
    tokens_per_round: float | None


@dataclass(frozen=True)
class SpeculatedAnswer:
    """What one speculated answer says of its rounds."""

    prompt_tokens: int
    rounds: int
    verify_ms: float
    drafted: int
    accepted: int
    round_tokens: int  # completion tokens the rounds emitted (plain chunks' left out)

    @classmethod
    def read(cls, answer: dict, target: int) -> SpeculatedAnswer:
        """The answer's figures, or a BenchError that says what is missing."""
        extension = answer.get("speculoos") if isinstance(answer, dict) else None
        if not isinstance(extension, dict) or not extension.get("rounds"):
            raise BenchError(f"no rounds at {target} tokens: was the request speculated? {extension}")
        try:
            usage = answer["usage"]
            return cls(int(usage["prompt_tokens"]), int(extension["rounds"]), float(extension["verify_ms"]),
                       int(extension["drafted"]), int(extension["accepted"]),
                       int(usage["completion_tokens"]) - int(extension.get("plain_tokens", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchError(f"the proxy's answer at {target} tokens lacks its usage or round figures "
                             f"({type(exc).__name__}: {exc})") from exc


def prompt(lines: int, request: int) -> str:
    """A completion prompt of `lines` numbered lines, its first line naming the request (no two share a prefix)."""
    body = "\n".join(f"line {i}: total_{i} = combine(total_{i - 1}, weight={i % 11}, offset={3 * i})"
                     for i in range(1, lines + 1))
    return f"# request {request}: continue the sequence\n{body}\nline {lines + 1}:"


async def _complete(session: aiohttp.ClientSession, url: str, model: str, text: str, max_tokens: int,
                    control: dict) -> dict:
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "speculoos": control}
    return (await call(session, url + "/v1/completions", body, 600.0)).document


async def measure(url: str, model: str, contexts: list[int], k: int, max_tokens: int,
                  requests: int) -> list[ContextRounds]:
    """Each context size's rounds through the proxy at `url`."""
    url = base_url(url)
    async with aiohttp.ClientSession() as session:
        probe = await _complete(session, url, model, prompt(PROBE_LINES, -1), 1, PASS)
        per_line = probe["usage"]["prompt_tokens"] / PROBE_LINES
        results = []
        for request_base, target in enumerate(contexts):
            lines = max(1, round(target / per_line))
            counted, means, rounds, drafted, accepted, emitted = [], [], 0, 0, 0, 0
            for request in range(requests):
                text = prompt(lines, request_base * requests + request)
                await _complete(session, url, model, text, 1, PASS)  # the server holds the prompt
                answer = SpeculatedAnswer.read(await _complete(session, url, model, text, max_tokens, {"k": k}), target)
                counted.append(answer.prompt_tokens)
                means.append(answer.verify_ms / answer.rounds)
                rounds += answer.rounds
                drafted, accepted = drafted + answer.drafted, accepted + answer.accepted
                emitted += answer.round_tokens
            results.append(ContextRounds(target, tuple(counted), rounds, statistics.median(means),
                                         accepted / drafted if drafted else None, emitted / rounds))
    return results


def markdown(results: list[ContextRounds], k: int) -> str:
    """The table, and each size's cost against the smallest's."""
    base = results[0].verify_ms_per_round
    lines = [f"| context (prompt tokens) | rounds | verify ms a round (median) | vs {results[0].target_tokens} "
             f"| α | tokens per round |", "|---|---|---|---|---|---|"]
    for row in results:
        alpha = f"{row.alpha:.2f}" if row.alpha is not None else "–"
        tau = f"{row.tokens_per_round:.2f}" if row.tokens_per_round is not None else "–"
        lines.append(f"| {min(row.prompt_tokens)}–{max(row.prompt_tokens)} | {row.rounds} "
                     f"| {row.verify_ms_per_round:.0f} | {row.verify_ms_per_round / base:.2f}× | {alpha} | {tau} |")
    return f"K = {k}, rounds forced\n\n" + "\n".join(lines) + "\n"


def _run(args: argparse.Namespace) -> int:
    """Measure and print the table."""
    contexts = numbers(args.contexts, "--contexts", int)
    if not contexts or any(c < 1 for c in contexts) or args.k < 1 or args.requests < 1 or args.max_tokens < 1:
        raise BenchError("--contexts, --k, --requests and --max-tokens must be positive")
    results = asyncio.run(measure(args.proxy, args.model, contexts, args.k, args.max_tokens, args.requests))
    print(markdown(results, args.k))
    if args.json:
        args.json.write_text(json.dumps({"format": FORMAT, "proxy": args.proxy, "k": args.k,
                                         "rows": [asdict(row) for row in results]}, indent=1) + "\n")
    return 0


run = guarded("speculoos bench context-rounds", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench context-rounds`."""
    parser = commands.add_parser("context-rounds", help="a round's cost to the target as the context grows",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--proxy", default="http://127.0.0.1:8000", help="the proxy (default http://127.0.0.1:8000)")
    parser.add_argument("--model", required=True, help="the model to name (a route of the proxy)")
    parser.add_argument("--contexts", default="300,1800,4096", help="prompt sizes in tokens (default 300,1800,4096)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens a round (default 4)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens a request (default 64)")
    parser.add_argument("--requests", type=int, default=3, help="requests per size (default 3)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the rows as JSON")
    parser.set_defaults(run=run)
