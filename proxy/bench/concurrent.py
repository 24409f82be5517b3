"""Concurrent load: N streams at once for each path, aggregate and per-request tokens/s.

For each repetition and workload, prompts go out in bursts of N (cycling through the prompts when
a workload has fewer), each burst to one path at a time: straight to the upstream, then through
the proxy in every mode, the order rotated burst by burst so drift falls on every path alike.
Aggregate tokens/s is a path's output tokens ÷ the wall time of its bursts. History scopes as in
runner.py: one per workload, mode and repetition.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from proxy.bench.report import number, pre_draft_cell
from proxy.bench.runner import Endpoints, Job, Mode, request_for, sample_of, scope_of, send, warm_up
from proxy.bench.stats import DIRECT, Sample, Spread, draft_ahead, ratio, spread
from proxy.bench.workloads import Workload

ALL_WORKLOADS = "all"


@dataclass(frozen=True)
class Burst:
    """N requests sent at once to one path."""

    workload: str
    target: str  # DIRECT or a mode name
    wall_s: float
    samples: tuple[Sample, ...]

    @property
    def tokens(self) -> int:
        """Output tokens of the burst's answered requests."""
        return sum(s.completion_tokens or 0 for s in self.samples if s.ok)


def schedule(workloads: Sequence[Workload], prompts: int, repeat: int, modes: Sequence[Mode],
             concurrency: int) -> list[list[Job]]:
    """Every burst, in the order they run: the jobs of one burst go out together."""
    targets = [DIRECT, *(m.name for m in modes)]
    bursts, turn = [], 0
    for repetition in range(repeat):
        for workload in workloads:
            count = min(prompts, len(workload.prompts))
            for first in range(0, count, concurrency):
                indices = [(first + i) % count for i in range(concurrency)]
                order = targets[turn % len(targets):] + targets[:turn % len(targets)]
                turn += 1
                for position, target in enumerate(order):
                    bursts.append([Job(workload, i, repetition, target, position) for i in indices])
    return bursts


async def run(bursts: Sequence[list[Job]], modes: Sequence[Mode], endpoints: Endpoints, *, warmup: int = 1,
              progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> list[Burst]:
    """Warm every path up (uncounted), then send each burst's requests at once."""
    by_name: dict[str, Mode | None] = {DIRECT: None, **{m.name: m for m in modes}}
    done = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        if bursts and warmup:
            await warm_up(session, bursts[0][0].workload, by_name.values(), endpoints, warmup)
        for number, jobs in enumerate(bursts, 1):
            started = time.perf_counter()
            replies = await asyncio.gather(*(
                send(session, request_for(endpoints, job.workload.prompts[job.prompt], by_name[job.target],
                                          endpoints.max_tokens, scope_of(job)), endpoints.timeout_s)
                for job in jobs))
            burst = Burst(jobs[0].workload.name, jobs[0].target, time.perf_counter() - started,
                          tuple(sample_of(job, reply) for job, reply in zip(jobs, replies)))
            done.append(burst)
            progress(f"[{number}/{len(bursts)}] {burst.workload} {burst.target} ×{len(jobs)}: "
                     f"{burst.tokens / burst.wall_s:.1f} tok/s aggregate")
    return done


@dataclass(frozen=True)
class LoadRow:
    """One path's figures on one workload (or all of them) under concurrent load."""

    workload: str
    target: str
    requests: int
    errors: int
    speculative: int
    aggregate_tokens_per_second: float | None
    vs_direct: float | None  # aggregate ÷ direct's aggregate on the same workload
    per_request: Spread | None  # tokens/s of each request
    alpha: float | None  # accepted ÷ drafted over the path's speculative requests
    tokens_per_round: float | None
    pre_drafts_started: int | None  # drafted during a verification (draft-ahead); None: not reported
    pre_draft_hits: int | None  # of those, the ones whose tokens were used
    pre_draft_hit_rate: float | None  # hits ÷ started


def _row(workload: str, target: str, bursts: Sequence[Burst], direct: float | None) -> LoadRow:
    samples = [s for b in bursts for s in b.samples]
    wall = sum(b.wall_s for b in bursts)
    aggregate = sum(b.tokens for b in bursts) / wall if wall > 0 else None
    extensions = [s.extension for s in samples if s.ok and s.speculative and s.extension]
    drafted = sum(e.get("drafted") or 0 for e in extensions)
    rounds = sum(e.get("rounds") or 0 for e in extensions)
    started, hits = draft_ahead(extensions) or (None, None)
    emitted = sum((s.completion_tokens or 0) - (s.extension or {}).get("plain_tokens", 0)
                  for s in samples if s.ok and s.speculative)
    return LoadRow(workload, target, len(samples), sum(not s.ok for s in samples), len(extensions), aggregate,
                   aggregate / direct if aggregate and direct else None,
                   spread(s.tokens_per_second for s in samples if s.ok),
                   sum(e.get("accepted") or 0 for e in extensions) / drafted if drafted else None,
                   emitted / rounds if rounds else None, started, hits,
                   ratio(hits, started))


def summarise(bursts: Sequence[Burst], targets: Sequence[str]) -> list[LoadRow]:
    """Rows per workload and path (direct first), then the same over all workloads."""
    rows = []
    for workload in [*dict.fromkeys(b.workload for b in bursts), ALL_WORKLOADS]:
        mine = [b for b in bursts if workload in (ALL_WORKLOADS, b.workload)]
        direct = _row(workload, DIRECT, [b for b in mine if b.target == DIRECT], None)
        rows.append(direct)
        rows += [_row(workload, t, [b for b in mine if b.target == t], direct.aggregate_tokens_per_second)
                 for t in targets]
    return rows


def markdown(rows: Sequence[LoadRow], concurrency: int, title: str) -> str:
    """The concurrent-load table."""
    lines = [f"### {title}", "", f"{concurrency} streams at once per burst.", "",
             "| workload | path | speculative | aggregate tok/s | ÷ direct | per request tok/s median (min–max) "
             "| α | tokens/round | pre-draft hits |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per = "–" if r.per_request is None else (
            f"{r.per_request.median:.1f} ({r.per_request.low:.1f}–{r.per_request.high:.1f})")
        errors = f" ({r.errors} failed)" if r.errors else ""
        served = "–" if r.target == DIRECT else f"{r.speculative}/{r.requests - r.errors}"
        lines.append(f"| {r.workload} | {r.target}{errors} | {served} | {number(r.aggregate_tokens_per_second, 1)} "
                     f"| {number(r.vs_direct, 2, '×')} | {per} | {number(r.alpha, 2)} "
                     f"| {number(r.tokens_per_round, 2)} "
                     f"| {pre_draft_cell(r.pre_draft_hit_rate, r.pre_draft_hits, r.pre_drafts_started)} |")
    return "\n".join(lines) + "\n"
