"""A route's start-up calibration: the target's plain steps and verifications, the draft model's steps and reading.

A fresh route that learns its costs from requests makes its first requests pay for the lesson (on
shared CPU cores a model round can cost many plain steps). Timed before any request, the same
calls a request makes give the route's first decisions this hardware's costs; acceptance is left
for requests to measure (it depends on the workload, not the hardware). The calibration text
shares no prefix with a chat prompt, so neither cache keeps a head start for a request, and it goes
through no request's bookkeeping: nothing joins the route's output history.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from proxy.config.schema import Route
from proxy.control.costs import Calibration
from proxy.drafting.base import Draft, Drafter, DraftPlan, Source
from proxy.sampling.processors import SamplingParams, one_hot
from proxy.targets.base import ScorePlan, Target

# Plain code, as the shipped workloads' prompts are; about 32 tokens in Qwen's vocabulary (its
# prefill is not timed: shorter is sooner).
CALIBRATION_TEXT = (
    "def merge_intervals(intervals):\n"
    "    merged = []\n"
    "    for start, end in sorted(intervals):\n"
    "        if merged and start <= merged[-1][1]:\n"
)
PLAIN_TOKENS = 8  # a timed plain chunk, as long as a request's
# Each cost is timed this many times, in turns, and the median kept: on shared cores one call can come out a third
# faster or slower than the next, and a route's first decisions stand on these figures.
TIMINGS = 3
CALIBRATION_ID = "speculoos-calibration"  # the draft sequence's lease, released at the end
GREEDY = SamplingParams(temperature=0.0)


def verification_sizes(route: Route, *, looks_up: bool) -> tuple[int, ...]:
    """The K whose verification is timed: 1, the configured k, the controller's k_max, and the longest lookup path."""
    sizes = {1, route.speculation.k, route.fallback.k_max}
    if looks_up and route.draft is not None:
        sizes.add(route.draft.k_max)
    return tuple(sorted(sizes))


async def calibrate(route: Route, target: Target, drafter: Drafter,
                    clock: Callable[[], float] = time.perf_counter) -> Calibration:
    """Time plain chunks, verifications at each size and the draft model's steps after the calibration text: each
    TIMINGS times, in turns (a slow moment then weighs on every size alike), keeping each one's median."""
    context = drafter.vocabulary.tokenize(CALIBRATION_TEXT, add_special=False)
    context += await target.generate(context, 1, GREEDY, 0)  # the prefill: not timed
    top_n = route.speculation.top_logprobs
    sizes = verification_sizes(route, looks_up=drafter.looks_up)
    plain_seconds: list[float] = []
    verify: dict[int, list[float]] = {k: [] for k in sizes}
    for _ in range(TIMINGS):
        started = clock()
        plain = await target.generate(context, PLAIN_TOKENS, GREEDY, 0)
        if plain:
            plain_seconds.append((clock() - started) / len(plain))
        context += plain
        for k in sizes:
            tokens = tuple(context[i % len(context)] for i in range(k))  # what is verified does not change its cost
            draft = Draft(tokens, one_hot(tokens, drafter.vocabulary.n_vocab))
            started = clock()
            await target.score(list(context), draft, ScorePlan(GREEDY, top_n, 0))
            verify[k].append(clock() - started)
    drafting, reading = await _draft_costs(drafter, context, route.speculation.k, target, top_n, clock)
    return Calibration(len(context), statistics.median(plain_seconds) if plain_seconds else None,
                       tuple((k, statistics.median(seconds)) for k, seconds in verify.items()), drafting, reading)


async def _draft_costs(drafter: Drafter, context: Sequence[int], k: int, target: Target, top_n: int,
                       clock: Callable[[], float]) -> tuple[float | None, float | None]:
    """The draft model's time per drafted token, and per token of context it read first (None, None: the route
    drafts by lookup only, or no sequence was free)."""
    if not drafter.fits(len(context) + k) or not drafter.reserve(CALIBRATION_ID, context):
        return None, None
    # No lookup path is worth verifying here, so a hybrid drafts with its model.
    plan = DraftPlan(k, GREEDY, target.order, top_n, np.random.default_rng(0), CALIBRATION_ID, k,
                     worth=lambda _probs, _match: 0)
    try:
        timed, first = [], (0.0, 0)  # per drafted token; the first proposal's (seconds, drafted tokens)
        for attempt in range(1 + TIMINGS):  # the first reads the context, then drafts as the others do
            started = clock()
            draft = await drafter.propose(context, plan)
            if draft.source != Source.MODEL or draft.seconds_per_token is None:
                return None, None
            first = (clock() - started, len(draft.tokens)) if attempt == 0 else first
            timed.append(draft.seconds_per_token)
        drafting = statistics.median(timed[1:])
        # What the first proposal took beyond drafting at the others' rate was the reading.
        return drafting, max(0.0, first[0] - drafting * first[1]) / len(context)
    finally:
        drafter.release(CALIBRATION_ID)
