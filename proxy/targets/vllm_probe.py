"""What the proxy learns from a vLLM server at start-up, and what it means for a route.

- Rounds: with the prefix cache on (`vllm:cache_config_info` in /metrics), a round asks one token after each of
  its K + 1 prefixes, and vLLM computes only their uncached tails: O(K) tokens a round. Without it, or where
  /metrics does not say, a round asks prompt log-probs, which never read the cache: O(context) a round.
  Prompt log-probs over a cached prefix are not used: vLLM (0.32.0) fills the cached rows with uninitialised
  memory (`LogprobsTensors.empty_cpu`), and a NaN or infinity there fails the whole answer ("Out of range float
  values are not JSON compliant", 400); its JSON also grows with the context.
- Sampling defaults: `vllm serve --enable-scale-out` serves /v1/completions/render, which answers the
  SamplingParams the server would use, its generation_config defaults applied to the fields a request omits
  (entrypoints/scale_out/render/serving.py, ModelConfig.get_diff_sampling_param).
- Log-probs: vLLM answers raw ones (`--logprobs-mode raw_logprobs`, the default) or, with `processed_logprobs`,
  those of the distribution it samples from: after penalties, temperature, min_p, top_k and top_p
  (v1/sample/sampler.py, ops/topk_topp_sampler.py). Under top_k 1 a processed answer leaves one id at log-prob 0.
- Reasoning: a server started with `--reasoning-parser` moves a chat answer's reasoning to `reasoning`, and counts
  it in the answer's `usage.completion_tokens_details`, which it leaves null without a parser
  (entrypoints/openai/chat_completion/serving.py); a one-token chat answer shows which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from proxy.errors import UpstreamError, UpstreamUnavailableError
from proxy.targets import checks
from proxy.targets.body_reading import read_body
from proxy.targets.upstream import Upstream, UpstreamStatusError
from proxy.targets.vllm_answers import CLAMPED_NEG_INF
from proxy.wire.request import GenerationRequest

# Fields vLLM fills from generation_config (ModelConfig.get_diff_sampling_param), at the values the proxy itself
# uses when a request names none: OpenAI's, which are vLLM's own SamplingParams defaults.
PROXY_DEFAULTS: dict[str, float] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# The defaults a request takes from the server where it omits them: the proxy samples with them (a repetition
# penalty only where the target's exactness_problem allows it). The others count generated ids alone, which a
# round's prompt is not: a request left to them passes through.
FOLLOWED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
RENDER_PATH = "/v1/completions/render"
NOT_HERE = (404, 405)
DISABLED = 403  # vLLM >= 0.32 without --enable-scale-out: "Scale-out endpoints are disabled"
MAX_METRICS_BYTES = 8 << 20
CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')
MAX_ALLOWED = re.compile(r"max allowed: (\d+)")
# More than any vocabulary: vLLM answers 400 "... greater than max allowed: N" (sampling_params.py).
OVER_ANY_CAP = 1_000_000_000
PROCESSED_TOLERANCE = 1e-4  # log(1) in float32
SCALE_OUT_HINT = "start vLLM with --enable-scale-out to learn them"


@dataclass(frozen=True)
class PrefixCache:
    """vLLM's prefix cache, as /metrics describes it."""

    enabled: bool
    block_size: int | None  # tokens a cache block holds: a round recomputes at most this many per prompt


@dataclass(frozen=True)
class VLLMInfo:
    """What probe() learns about the server."""

    version: str
    model: str
    max_model_len: int
    max_logprobs: int | None  # the --max-logprobs cap on top_n; None if the server did not say
    prefix_cache: PrefixCache | None = None  # None: /metrics did not say
    # What the server applies to a request that names no sampling field (PROXY_DEFAULTS' keys); None: unknown.
    sampling_defaults: tuple[tuple[str, float], ...] | None = None
    defaults_source: str = "not probed"
    reasoning: bool | None = None  # whether chat answers' reasoning is split off; None: unknown
    processed_logprobs: bool = False  # whether answered log-probs are the sampled distribution's

    @property
    def rounds_read_cache(self) -> bool:
        """Whether rounds ask one token per prefix, reading the prefix cache (else prompt log-probs)."""
        return self.prefix_cache is not None and self.prefix_cache.enabled

    def lines(self) -> list[tuple[str, str]]:
        """`speculoos check`'s rows: the server, the rounds' path and cost, the sampling defaults."""
        return [("vllm", f"{self.version}, model {self.model}, context {self.max_model_len}, "
                         f"--max-logprobs {self.max_logprobs}"),
                ("rounds", self.rounds_line()), ("sampling defaults", self.defaults_line()),
                ("log-probs", "processed (--logprobs-mode processed_logprobs): sampling under a repetition penalty "
                              "is followed" if self.processed_logprobs else
                              "raw: a repetition penalty is followed at temperature 0 only (--logprobs-mode "
                              "processed_logprobs follows it at any temperature)"),
                ("chat answers", {True: "a reasoning parser splits off their reasoning: chat requests pass through",
                                  False: "no reasoning parser", None: "unknown: the chat endpoint did not answer"}[
                                      self.reasoning])]

    def rounds_line(self) -> str:
        """The verification path and what a round costs the server."""
        if self.rounds_read_cache:
            block = self.prefix_cache.block_size if self.prefix_cache is not None else None
            return (f"one token after each of the K + 1 prefixes, over the prefix cache (blocks of {block} tokens): "
                    "a round computes their uncached tails, O(K) tokens")
        why = ("the prefix cache is off: drop --no-enable-prefix-caching" if self.prefix_cache is not None
               else "/metrics does not show the prefix cache (vllm:cache_config_info)")
        return f"prompt log-probs: a round re-prefills the whole context, O(context) tokens ({why})"

    def defaults_line(self) -> str:
        """What the server applies to fields a request omits, and what follows for the proxy."""
        if self.sampling_defaults is None:
            return f"unknown ({self.defaults_source}): {SCALE_OUT_HINT}"
        changed = {name: value for name, value in self.sampling_defaults if value != PROXY_DEFAULTS[name]}
        if not changed:
            return f"the proxy's own ({self.defaults_source})"
        line = f"{', '.join(f'{name} {value:g}' for name, value in changed.items())} ({self.defaults_source}): "
        if changed.keys() - set(FOLLOWED):
            return line + "requests that omit the penalties on generated ids pass through"
        if "repetition_penalty" in changed:
            return line + "followed (the repetition penalty as the log-probs row says)"
        return line + "followed"


async def server_info(upstream: Upstream, model: str, max_model_len: int) -> VLLMInfo:
    """Version, the --max-logprobs cap (from the error a huge request gets), the prefix cache, the sampling
    defaults, and how the server answers chat reasoning and log-probs."""
    version = await upstream.get_json("/version")
    try:
        await upstream.post_json("/v1/completions", {"model": model, "prompt": [0], "max_tokens": 1,
                                                     "prompt_logprobs": OVER_ANY_CAP})
        max_logprobs = None
    except UpstreamStatusError as exc:
        max_logprobs = parse_max_logprobs(exc.message)
    defaults, source = await sampling_defaults(upstream, model)
    try:
        return VLLMInfo(str(version["version"]), model, max_model_len, max_logprobs, await prefix_cache(upstream),
                        defaults, source, await splits_reasoning(upstream, model),
                        await answers_processed_logprobs(upstream, model))
    except checks.MALFORMED as exc:
        raise UpstreamUnavailableError("upstream sent a malformed /version answer") from exc


def parse_max_logprobs(message: str) -> int | None:
    """The cap from vLLM's "greater than max allowed: N" error, or None."""
    match = MAX_ALLOWED.search(message)
    return int(match.group(1)) if match else None


def parse_prefix_cache(metrics: str) -> PrefixCache | None:
    """The prefix cache from /metrics' `vllm:cache_config_info` labels, or None where they are absent."""
    match = CACHE_CONFIG.search(metrics)
    if match is None:
        return None
    labels = dict(LABEL.findall(match.group(1)))
    if "enable_prefix_caching" not in labels:
        return None
    block = labels.get("block_size", "")
    return PrefixCache(labels["enable_prefix_caching"] == "True", int(block) if block.isdigit() else None)


def parse_sampling_defaults(rendered: Any) -> tuple[tuple[str, float], ...]:
    """The defaulted fields of a rendered SamplingParams (msgspec leaves out fields at vLLM's own defaults)."""
    params = rendered[0]["sampling_params"]
    values = {name: float(params.get(name, default)) for name, default in PROXY_DEFAULTS.items()}
    values["top_k"] = max(values["top_k"], 0.0)  # -1 and 0 both mean off
    return tuple(values.items())


def with_server_defaults(defaults: tuple[tuple[str, float], ...] | None,
                         request: GenerationRequest) -> GenerationRequest:
    """The request as the server samples it: its omitted sampling fields at the server's defaults."""
    if defaults is None:
        return request
    filled: dict[str, float | int] = {name: value for name, value in defaults
                                      if name in FOLLOWED and request.body.get(name) is None}
    filled["top_k"] = int(filled.get("top_k", request.top_k))
    return replace(request, **filled)


def defaults_problem(defaults: tuple[tuple[str, float], ...] | None, body: dict) -> str | None:
    """Why the server's defaults for the fields this request omits are ones the proxy cannot follow (None: it can,
    or they are unknown)."""
    if defaults is None:
        return None
    differ = [f"{name} {value:g}" for name, value in defaults
              if name not in FOLLOWED and body.get(name) is None and value != PROXY_DEFAULTS[name]]
    if not differ:
        return None
    return (f"the server's generation_config applies {', '.join(differ)} to a request that leaves "
            f"{'it' if len(differ) == 1 else 'them'} out, which counts generated ids only: a round's prompt is not")


async def sampling_defaults(upstream: Upstream, model: str) -> tuple[tuple[tuple[str, float], ...] | None, str]:
    """The server's sampling defaults from its render endpoint, and where they came from (or why they are
    unknown)."""
    try:
        rendered = await upstream.post_json(RENDER_PATH, {"model": model, "prompt": [0], "max_tokens": 1})
    except UpstreamStatusError as exc:
        if exc.status == DISABLED:
            return None, f"{RENDER_PATH} is disabled"
        if exc.status in NOT_HERE:
            return None, f"this vLLM has no {RENDER_PATH}"
        return None, f"{RENDER_PATH} failed: {exc.message}"
    try:
        return parse_sampling_defaults(rendered), RENDER_PATH
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None, f"{RENDER_PATH} answered in an unknown shape"


async def answers_processed_logprobs(upstream: Upstream, model: str) -> bool:
    """Whether answered log-probs are those vLLM samples from: under top_k 1 only the kept id is finite, at 0."""
    body = {"model": model, "prompt": [0], "max_tokens": 1, "temperature": 1.0, "top_k": 1, "top_p": 1.0,
            "min_p": 0.0, "repetition_penalty": 1.0, "logprobs": 2}
    try:
        answer = await upstream.post_json("/v1/completions", body)
        values = [float(value) for value in answer["choices"][0]["logprobs"]["top_logprobs"][0].values()]
    except (UpstreamStatusError, KeyError, IndexError, TypeError, ValueError, AttributeError):
        return False  # raw is what every round assumes unless shown otherwise
    finite = [value for value in values if value > CLAMPED_NEG_INF]
    return len(finite) == 1 and abs(finite[0]) < PROCESSED_TOLERANCE


async def splits_reasoning(upstream: Upstream, model: str) -> bool | None:
    """Whether chat answers have their reasoning split off, from a one-token answer's usage (None: no answer)."""
    try:
        answer = await upstream.post_json("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0})
    except UpstreamStatusError:
        return None  # no chat template, or no chat endpoint
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return isinstance(usage, dict) and isinstance(usage.get("completion_tokens_details"), dict)


async def prefix_cache(upstream: Upstream) -> PrefixCache | None:
    """The prefix cache as /metrics describes it, or None where it does not."""
    try:
        response = await upstream.open("GET", "/metrics", headers=upstream.auth_headers(), idempotent=True)
        async with response:
            text = await read_body(response, upstream.timeouts.idle, limit=MAX_METRICS_BYTES, path="/metrics")
    except UpstreamError:
        return None
    return parse_prefix_cache(text.decode(errors="replace")) if response.status == 200 else None
