"""`speculoos bench overhead`: the proxy's own CPU time per speculative round, against a target that computes nothing.

The proxy (create_app, one sglang route) serves in a thread of its own with its own event loop; a fake
SGLang (overhead_target.py) and the clients run in a process of their own (overhead_load.py), so the
proxy's thread shares the GIL with none of the bench's work. The proxy thread's CPU time
(time.thread_time, read inside that thread) is then the proxy's alone: not the clients', not the fake's,
not llama.cpp's threads (the draft model's compute, reported apart as the rounds' draft wall time).
Each K has a route of its own (k_min = k_max = K) that measures its costs against a fake that sleeps a
GPU's step, so its controller speculates at K as for any request it chose; the stage split times the
proxy's own functions, patched only while the bench runs (overhead_stages.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from proxy.bench import overhead_load
from proxy.bench import overhead_stages as stages
from proxy.bench.client import BenchError
from proxy.bench.command import guarded, model_path, numbers
from proxy.bench.overhead_proxy import ProxyThread
from proxy.bench.overhead_report import Row, markdown, row_from
from proxy.bench.overhead_run import Configuration, draft_route, measure, warm_up
from proxy.config.section import MAX_K

DRAFT_KINDS = ("lookup", "model")
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
SOURCE_FILES = ("proxy/sampling/rejection.py", "proxy/decode/loop.py", "proxy/wire/textstream.py",
                "proxy/targets/sglang.py", "proxy/drafting/lookup.py", "proxy/server/handlers.py")
INSTRUCTION = "Repeat this code exactly, then stop:\n```python\n"


@dataclass(frozen=True)
class Grid:
    """What the command measures: every combination of these."""

    ks: tuple[int, ...]
    streams: tuple[int, ...]
    temperatures: tuple[float, ...]
    drafts: tuple[str, ...]
    contexts: tuple[int, ...]
    requests: int
    max_tokens: int
    acceptance: float
    step_ms: float = 0.0  # the fake's wall time per step (asleep: no CPU)
    pinned: bool = False  # requests pin K: rounds run where the route would decode plainly (a model draft on a CPU)


def parse_grid(args: argparse.Namespace) -> Grid:
    """The command's arguments, checked; BenchError naming the first bad one."""
    ks = tuple(numbers(args.ks, "--ks", int))
    streams = tuple(numbers(args.streams, "--streams", int))
    temperatures = tuple(numbers(args.temperatures, "--temperatures", float))
    contexts = tuple(numbers(args.contexts, "--contexts", int))
    drafts = tuple(part.strip() for part in args.drafts.split(",") if part.strip())
    if not ks or any(not 1 <= k <= MAX_K for k in ks):
        raise BenchError(f"--ks: each K must lie in 1..{MAX_K}")
    if not streams or any(not 1 <= s <= 64 for s in streams):
        raise BenchError("--streams: each must lie in 1..64 (the draft model's sequences)")
    if not temperatures or any(not 0 <= t <= 2 for t in temperatures):
        raise BenchError("--temperatures: each must lie in 0..2")
    if not contexts or any(c < 16 for c in contexts):
        raise BenchError("--contexts: each must be at least 16 tokens")
    unknown = sorted(set(drafts) - set(DRAFT_KINDS))
    if not drafts or unknown:
        raise BenchError(f"--drafts: {', '.join(unknown) or 'none given'}; choose from {', '.join(DRAFT_KINDS)}")
    if args.requests < 1 or args.max_tokens < 1:
        raise BenchError("--requests and --max-tokens must be positive")
    if not 0 <= args.acceptance <= 1:
        raise BenchError("--acceptance must lie in 0..1")
    if not 0 <= args.step_ms <= 1000:
        raise BenchError("--step-ms must lie in 0..1000")
    return Grid(ks, streams, temperatures, drafts, contexts, args.requests, args.max_tokens, args.acceptance,
                args.step_ms, args.pin)


def configurations(grid: Grid, draft: str) -> list[Configuration]:
    """One draft kind's configurations, in the order they run."""
    return [Configuration(draft, t, k, s, c, grid.requests, grid.max_tokens, grid.pinned)
            for c in grid.contexts for t in grid.temperatures for k in grid.ks for s in grid.streams]


def code_prompt(tokenize, tokens: int, root: Path) -> str:  # noqa: ANN001 -- (text, add_special) -> ids
    """A copy instruction around the project's own code, about `tokens` tokens long."""
    code = "\n".join((root / name).read_text() for name in SOURCE_FILES)
    while len(tokenize(code, False)) < tokens:
        code += "\n" + code
    text = code
    for _ in range(3):  # cut by characters at the measured characters per token
        count = len(tokenize(INSTRUCTION + text + "\n```\n", True))
        if abs(count - tokens) <= tokens // 50:
            break
        text = text[: max(int(len(text) * tokens / count), 1)]
    return INSTRUCTION + text + "\n```\n"


async def _run_grid(grid: Grid, gguf: Path) -> list[Row]:
    """Start the fake, then a proxy per draft kind, and measure each configuration."""
    from proxy.engine.vocabulary import LlamaVocabulary  # llama.cpp only once the command runs

    vocabulary = LlamaVocabulary.from_gguf(str(gguf))
    tokenize = lambda text, special: vocabulary.tokenize(text, add_special=special)  # noqa: E731
    context_length = max(grid.contexts) + grid.max_tokens + 4 * MAX_K + 256
    root = Path(__file__).resolve().parents[2]
    prompts = {c: code_prompt(tokenize, c, root) for c in grid.contexts}
    rows: list[Row] = []
    async with overhead_load.started(str(gguf), grid.acceptance, context_length, grid.step_ms / 1000.0) as load:
        for draft in grid.drafts:
            clock = stages.StageClock()
            route = draft_route(draft, str(gguf), load.url, max(grid.streams), context_length, grid.ks)
            async with ProxyThread(route, clock) as proxy:
                for configuration in configurations(grid, draft):
                    prompt = prompts[configuration.prompt_size]
                    await warm_up(load, proxy.url, prompt, configuration)
                    result = await measure(proxy, load, prompt, configuration)
                    row = row_from(configuration, result, len(tokenize(prompt, True)))
                    print(markdown([row], header=not rows), flush=True)
                    rows.append(row)
    return rows


def _run(args: argparse.Namespace) -> int:
    """Measure every configuration and print the table (and write the JSON rows)."""
    grid = parse_grid(args)
    gguf = model_path(args.model)
    import structlog

    from proxy.observability import logs

    logs.configure(json_lines=True)  # every request's log line is rendered, as `serve` renders it, then dropped
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=open(os.devnull, "w")))  # noqa: SIM115
    k_means = "K pinned by each request" if grid.pinned else "K the route's own (k_min = k_max = K, costs measured)"
    print(f"regime: fake SGLang spending {grid.step_ms:g} ms asleep a step (a verification, or a plain token), "
          f"acceptance {grid.acceptance:g} per draft position, top-20 over "
          f"the draft's vocabulary, in a process of its own with the clients; the proxy in a thread of its own; "
          f"{grid.requests} streamed requests per stream, {grid.max_tokens} tokens each, "
          f"{k_means}; CPU is "
          f"the proxy thread's; \"other\" = {stages.OTHER_MEANS}", flush=True)
    started = time.perf_counter()
    rows = asyncio.run(_run_grid(grid, gguf))
    print(f"\n{len(rows)} configurations in {time.perf_counter() - started:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(asdict(row)) for row in rows) + "\n")
    return 0


run = guarded("speculoos bench overhead", _run)


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register `bench overhead`."""
    parser = commands.add_parser("overhead",
                                 help="the proxy's own CPU time per round, against a target that computes nothing",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--ks", default="1,4,8,16,32", help="K of each route (default 1,4,8,16,32)")
    parser.add_argument("--streams", default="1,8,64", help="concurrent clients (default 1,8,64)")
    parser.add_argument("--temperatures", default="0,0.7", help="0 = greedy; sampled ones send top_k 20 (exact "
                                                                 "with top-20 log-probs)")
    parser.add_argument("--drafts", default="lookup,model", help="lookup (suffix lookup; no model runs) and/or "
                                                                  "model (the GGUF drafts)")
    parser.add_argument("--contexts", default="400", help="prompt lengths in tokens (default 400; e.g. 400,4096)")
    parser.add_argument("--requests", type=int, default=4, help="requests per stream, one after another (default 4)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--acceptance", type=float, default=0.8,
                        help="the fake's chance to put the draft token on top, per position (default 0.8)")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="the fake target's wall time per step, asleep (a GPU's: a verification or a plain "
                             "token; default 20): the route measures real costs and speculates at K, as on a GPU")
    parser.add_argument("--pin", action="store_true",
                        help="each request pins K (`speculoos: {k: K}`): rounds run even where the route would decode "
                             "plainly (a CPU draft model against a GPU's step time); the controller is left out")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the draft (and tokenizer) GGUF: name or path")
    parser.add_argument("--json", metavar="FILE", help="write one JSON row per configuration")
    parser.set_defaults(run=run)

