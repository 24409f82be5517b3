"""Interleaved A/B runs: each prompt goes to the upstream directly and through the proxy in every mode.

For each repetition, workload and prompt, `direct` and every proxy mode run back to back, the
order rotated by one place per prompt and repetition, so drift in machine load, and the
verifier's prompt cache (whoever runs second finds the prompt's prefix cached), fall on every
mode alike. Requests run one at a time.

Every proxy mode and repetition sees each prompt fresh. A route's suffix lookup drafts from the
earlier outputs of the same API key (`share_history: key`, the default): sent under one key, a
prompt's later requests would copy its first answer. So each (workload, mode, repetition) sends a
key of its own, new for every run (`Authorization: Bearer speculoos-bench-RUN-...`), which the
proxy passes on to the upstream. Within one, a workload's other prompts' answers are history, as
for one client. A route with `share_history: route` pools every key's outputs: keep such a route
out of a comparison of modes.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from proxy.bench.client import BenchError, Reply, get_json, stream
from proxy.bench.stats import DIRECT, PASSTHROUGH_MODE, SEQUENTIAL_SUFFIX, Sample
from proxy.bench.workloads import Prompt, Workload
from proxy.config.section import MAX_K

WARMUP_TOKENS = 4
WARMUP_TEXT = "Say hello."  # in no workload: a warm-up that cached a measured prompt would spare one side its prefill
HISTORY_KEY_PREFIX = "speculoos-bench"
WARMUP_SCOPE = "warm-up"


@dataclass(frozen=True)
class Mode:
    """How a request goes through the proxy."""

    name: str  # auto, on, off, k=N; auto/seq, on/seq, k=N/seq: the same with draft-ahead off
    control: dict[str, Any] | None  # the body's `speculoos` field; None: no field (the controller decides)


def _mode(name: str) -> Mode:
    if name == "auto":
        return Mode(name, None)
    if name in ("on", "off"):
        return Mode(name, {"mode": name})
    if name.startswith("k=") and name[2:].isdigit() and 1 <= int(name[2:]) <= MAX_K:
        return Mode(f"k={int(name[2:])}", {"k": int(name[2:])})
    raise ValueError(f"bad mode {name!r}: use auto, on, off or k=N with N in 1..{MAX_K}; "
                     f"add {SEQUENTIAL_SUFFIX} to any but off to turn draft-ahead off")


def _sequential(mode: Mode) -> Mode:
    if mode.name == PASSTHROUGH_MODE:
        raise ValueError(f"bad mode 'off{SEQUENTIAL_SUFFIX}': passthrough drafts nothing, ahead or not")
    return Mode(mode.name + SEQUENTIAL_SUFFIX, {**(mode.control or {}), "pipeline": False})


def parse_modes(text: str) -> list[Mode]:
    """'auto,k=1,k=4/seq,off' -> modes; raise ValueError naming a bad one."""
    modes = []
    for name in (part.strip().lower() for part in text.split(",") if part.strip()):
        base = name.removesuffix(SEQUENTIAL_SUFFIX)
        modes.append(_sequential(_mode(base)) if base != name else _mode(name))
    if not modes or len({m.name for m in modes}) != len(modes):
        raise ValueError("give at least one mode, each once")
    return modes


@dataclass(frozen=True)
class Job:
    """One request of the schedule."""

    workload: Workload
    prompt: int
    repetition: int
    target: str  # DIRECT or a mode name
    position: int


def schedule(workloads: Sequence[Workload], prompts: int, repeat: int, modes: Sequence[Mode]) -> list[Job]:
    """Every request in the order it runs."""
    targets = [DIRECT, *(m.name for m in modes)]
    jobs = []
    for repetition in range(repeat):
        for workload in workloads:
            for prompt in range(min(prompts, len(workload.prompts))):
                shift = (prompt + repetition) % len(targets)
                order = targets[shift:] + targets[:shift]
                jobs += [Job(workload, prompt, repetition, t, i) for i, t in enumerate(order)]
    return jobs


@dataclass(frozen=True)
class Endpoints:
    """Where requests go and with which model name."""

    direct: str  # base URL, no /v1
    proxy: str
    model: str
    max_tokens: int | None  # overrides each prompt's default
    timeout_s: float
    run: str = field(default_factory=lambda: secrets.token_hex(4))  # this run's part of every history key


def scope_of(job: Job) -> str:
    """The history scope of a job's request: its workload, mode and repetition."""
    return f"{job.workload.name}-{job.target}-r{job.repetition}"


def request_for(endpoints: Endpoints, prompt: Prompt, mode: Mode | None, max_tokens: int | None,
                scope: str = WARMUP_SCOPE) -> tuple[str, dict, dict[str, str]]:
    """URL, body and headers of one request: straight to the upstream (mode None), or through the proxy in
    `mode`, drafting only from the outputs of its history `scope` in this run."""
    body = prompt.body(endpoints.model, max_tokens)
    if mode is None:
        return endpoints.direct + prompt.path, body, {}
    if mode.control is not None:
        body["speculoos"] = mode.control
    key = f"{HISTORY_KEY_PREFIX}-{endpoints.run}-{scope}"
    return endpoints.proxy + prompt.path, body, {"Authorization": f"Bearer {key}"}


async def send(session: aiohttp.ClientSession, request: tuple[str, dict, dict[str, str]], timeout_s: float) -> Reply:
    """One request built by `request_for`, streamed and timed."""
    url, body, headers = request
    return await stream(session, url, body, timeout_s, headers=headers)


def sample_of(job: Job, reply: Reply) -> Sample:
    return Sample(job.workload.name, job.prompt, job.repetition, job.target, job.position,
                  job.workload.prompts[job.prompt].greedy, reply.status, reply.error, reply.text,
                  reply.completion_tokens, reply.served_as, reply.extension, reply.seconds, reply.ttft_s,
                  reply.itl_s, reply.tokens_per_second)


async def probe(session: aiohttp.ClientSession, direct: str, proxy: str, model: str | None) -> str:
    """Check both servers answer; the model name to send (the upstream's first, unless given)."""
    models = await get_json(session, direct + "/v1/models", "the upstream (--direct)")
    await get_json(session, proxy + "/speculoos/status", "the proxy (--proxy)")
    if model is not None:
        return model
    try:
        return str(models["data"][0]["id"])
    except (KeyError, IndexError, TypeError) as exc:
        raise BenchError(f"the upstream at {direct}/v1/models lists no model: give --model") from exc


async def warm_up(session: aiohttp.ClientSession, workload: Workload, modes: Iterable[Mode | None],
                  endpoints: Endpoints, times: int) -> None:
    """Uncounted short requests on every path, so first-request costs (loading, caches) stay out of the figures."""
    prompt = warm_up_prompt(workload)
    for _ in range(times):
        for mode in modes:
            await send(session, request_for(endpoints, prompt, mode, WARMUP_TOKENS), endpoints.timeout_s)


def warm_up_prompt(workload: Workload) -> Prompt:
    """A short request to the workload's endpoint that shares no prompt with it."""
    first = workload.prompts[0]
    messages = ({"role": "user", "content": WARMUP_TEXT},) if first.messages is not None else None
    return replace(first, text=None if messages else WARMUP_TEXT, messages=messages, max_tokens=WARMUP_TOKENS)


def primed(jobs: Sequence[Job]) -> set[int]:
    """The jobs before which their prompt is primed: each one whose prompt the job before did not send."""
    return {i for i, job in enumerate(jobs)
            if i == 0 or (jobs[i - 1].workload.name, jobs[i - 1].prompt) != (job.workload.name, job.prompt)}


async def run(jobs: Sequence[Job], modes: Sequence[Mode], endpoints: Endpoints, *, warmup: int = 1,
              prime: bool = False,
              progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> list[Sample]:
    """Warm every path up (uncounted), then run the jobs one at a time.

    With prime, an uncounted one-token request straight to the target first caches each prompt there,
    so neither side of a pair pays its prefill (otherwise whichever goes first does) and the figures
    compare decoding.
    """
    by_name: dict[str, Mode | None] = {DIRECT: None, **{m.name: m for m in modes}}
    primes = primed(jobs) if prime else set()
    samples = []
    async with aiohttp.ClientSession() as session:
        if jobs and warmup:
            await warm_up(session, jobs[0].workload, by_name.values(), endpoints, warmup)
        for i, job in enumerate(jobs, 1):
            prompt = job.workload.prompts[job.prompt]
            if i - 1 in primes:
                await send(session, request_for(endpoints, prompt, None, 1), endpoints.timeout_s)
            request = request_for(endpoints, prompt, by_name[job.target], endpoints.max_tokens, scope_of(job))
            sample = sample_of(job, await send(session, request, endpoints.timeout_s))
            samples.append(sample)
            rate = f"{sample.tokens_per_second:.1f} tok/s" if sample.tokens_per_second else sample.error or "no tokens"
            progress(f"[{i}/{len(jobs)}] {job.workload.name} #{job.prompt} r{job.repetition} {job.target}: "
                     f"{rate}{' (' + sample.served_as + ')' if sample.served_as else ''}")
    return samples
