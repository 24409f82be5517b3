"""The fake SGLang's `/generate` (tests/fakes/sglang.py builds the app): a toy model answering in SGLang's shapes.

Read from SGLang's sources (python/sglang/srt/; release 0.5.23 and older commits):
- `POST /generate` (managers/io_struct.py `GenerateReqInput`, one sequence of `input_ids`; unknown
  fields are ignored) answers `{text, output_ids, meta_info}`. `meta_info` holds `id`, `finish_reason`
  (`{"type": "length", "length": n}` or `{"type": "stop", "matched": id}`), `prompt_tokens`,
  `completion_tokens`, `cached_tokens`, ...
- With `return_logprob`, `input_token_logprobs[j] = [logprob, id, text|null]`. Current releases put a
  null entry for the token at `logprob_start_len` first, at any start (managers/scheduler_components/
  logprob_result_processor.py: `[None] + ...`, ids `origin_input_ids[start:]`), so a start of `L - 1`
  gives K + 1 entries for K drafts; an older path padded only a start of 0, and otherwise began with
  the token after the start (K entries). `input_top_logprobs` follows the same alignment;
  `output_token_logprobs` and `output_top_logprobs` score the generated tokens. Top lists only when
  `top_logprobs_num > 0`; text only with `return_text_in_logprobs`. A start of -1 (the default) means
  the last input token; one at or past the input length is refused.
- Sampling params (sampling/sampling_params.py): temperature below 1e-6 is greedy (top_k 1), top_k -1
  is off (0 is refused), top_p in (0, 1], min_p in [0, 1], max_new_tokens 128 by default; a null is the
  default; a refused value answers 400 `{"error": {"message"}}` (entrypoints/http_server.py).
  `sampling_seed` is used only with --enable-deterministic-inference (sampling_batch_info.py; 42 when
  the request gives none); otherwise draws are unseeded.
- Log-probs: input ones are raw; output ones are divided by the temperature when sampling (the default,
  without SGLANG_RETURN_ORIGINAL_LOGPROB) and raw when greedy (layers/sampler.py). Sampling filters
  jointly after temperature, as SGLang's sampler does.
- Radix cache: `cached_tokens` is the longest prefix seen before, capped at `input_len - 1` and, with
  logprobs, at `logprob_start_len` (managers/schedule_batch.py `_compute_max_prefix_len`).
Batches (lists of sequences), streaming and text prompts are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.sampling.rejection import sample
from tests.fakes.toy_model import END, ToyModel, ToyVocabulary

SGLANG_ORDER = SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE
SGLANG_GREEDY_EPS = 1e-6  # _SAMPLING_EPS in sampling_params.py
DEFAULT_MAX_NEW_TOKENS = 128
DETERMINISTIC_DEFAULT_SEED = 42  # sampling_batch_info.py, for requests without a sampling_seed


@dataclass(frozen=True)
class Release:
    """Which SGLang the fake plays: the shapes that differ between releases, and its launch flags."""

    version: str = "0.5.23"
    null_first_always: bool = True  # the input log-probs' null entry at any start (older: only at 0)
    tokenize_paths: tuple[str, ...] = ("/v1/tokenize", "/tokenize")
    tokenize_messages: bool = True  # tokenize takes `messages` (older: `prompt` only)
    generation_prompt_flag: bool = True  # tokenize honours add_generation_prompt: false (0.5.23)
    clamps_placeholder: bool = True  # a 1e30 model_max_length is answered as the context length (0.5.23)
    model_info_paths: tuple[str, ...] = ("/model_info", "/get_model_info")
    server_info_paths: tuple[str, ...] = ("/server_info", "/get_server_info")
    models_card_length: bool = True  # /v1/models gives max_model_len
    prompt_token_ids: bool = True  # chat completions answer return_prompt_token_ids
    deterministic: bool = False  # --enable-deterministic-inference


SEEN = web.AppKey("seen", list)  # ("POST /generate", body) per request
MODEL = web.AppKey("model", ToyModel)
CACHE = web.AppKey("cache", list)  # every sequence computed so far (the radix cache's contents)
RELEASE = web.AppKey("release", Release)
ENDS = web.AppKey("ends", frozenset)  # the ids generation ends at, when not the toy's end token alone


class RefusedError(ValueError):
    """A request SGLang refuses with 400."""


def token_text(token: int) -> str:
    """The toy vocabulary's text for one token."""
    return ToyVocabulary().token_bytes(token).decode()


def _entry(logprob: float | None, token: int, with_text: bool) -> list[Any]:
    return [logprob, token, token_text(token) if with_text else None]


def _top(logprobs: np.ndarray, n: int, with_text: bool) -> list[list[Any]]:
    order = np.lexsort((np.arange(len(logprobs)), -logprobs))[:n]  # best first, ties to the lower id
    return [_entry(float(logprobs[i]), int(i), with_text) for i in order]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def _sampling(raw: dict[str, Any]) -> tuple[SamplingParams, float, int]:
    """SGLang's normalisation and verify(): (the distribution's params, the logprob temperature, max_new_tokens)."""

    def value(key: str, default: Any) -> Any:
        return default if raw.get(key) is None else raw[key]  # null means the default, as in SGLang

    temperature, top_p = float(value("temperature", 1.0)), float(value("top_p", 1.0))
    top_k, min_p = int(value("top_k", -1)), float(value("min_p", 0.0))
    max_new_tokens = int(value("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    if not math.isfinite(temperature) or temperature < 0.0:
        raise RefusedError(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise RefusedError(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise RefusedError(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1 and top_k != -1:
        raise RefusedError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if max_new_tokens < 0:
        raise RefusedError(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
    if temperature < SGLANG_GREEDY_EPS:  # SGLang: temperature 1 and top_k 1
        return SamplingParams(temperature=0.0), 1.0, max_new_tokens
    return SamplingParams(temperature, 0 if top_k == -1 else top_k, top_p, min_p), temperature, max_new_tokens


def _common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


def _cached(cache: list[list[int]], ids: list[int], cap: int) -> int:
    """The radix cache's match: the longest common prefix with anything computed before, capped."""
    return max(min(max((_common_prefix(seen, ids) for seen in cache), default=0), cap), 0)


def _scored_input(model: ToyModel, ids: list[int], start: int, top_n: int, with_text: bool,
                  null_first_always: bool) -> dict[str, Any]:
    actual: list[list[Any]] = []
    tops: list[Any] = []
    if start == 0 or null_first_always:
        actual, tops = [_entry(None, ids[start], with_text)], [None]
    for j in range(start + 1, len(ids)):
        logprobs = model.log_softmax(ids[:j])
        actual.append(_entry(float(logprobs[ids[j]]), ids[j], with_text))
        tops.append(_top(logprobs, top_n, with_text))
    scored: dict[str, Any] = {"input_token_logprobs": actual}
    if top_n > 0:
        scored["input_top_logprobs"] = tops
    return scored


def answer(app: web.Application, body: dict[str, Any]) -> dict[str, Any]:
    """SGLang's /generate answer for one sequence; RefusedError for what SGLang refuses."""
    model, ids, release = app[MODEL], body.get("input_ids"), app[RELEASE]
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < model.vocab for t in ids):
        raise RefusedError("the fake serves one non-empty sequence of input_ids in the vocabulary per call")
    raw = body.get("sampling_params") or {}
    params, logprob_temperature, max_new_tokens = _sampling(raw)
    seed = raw.get("sampling_seed")
    rng = np.random.default_rng(DETERMINISTIC_DEFAULT_SEED if seed is None else seed) if release.deterministic \
        else np.random.default_rng()
    with_logprobs, with_text = bool(body.get("return_logprob")), bool(body.get("return_text_in_logprobs"))
    top_n = int(body.get("top_logprobs_num") or 0)
    start = body.get("logprob_start_len")
    start = len(ids) - 1 if start is None or start == -1 else int(start)
    if with_logprobs and start >= len(ids):
        raise RefusedError(f"logprob_start_len={start} is higher than the number of input tokens {len(ids)}. "
                           "Please use a smaller logprob_start_len.")
    cap = min(len(ids) - 1, start) if with_logprobs else len(ids) - 1
    meta: dict[str, Any] = {"id": f"fake-{len(app[SEEN])}", "prompt_tokens": len(ids), "weight_version": "default",
                            "num_retractions": 0, "cached_tokens": _cached(app[CACHE], ids, cap)}
    if with_logprobs:
        meta.update(_scored_input(model, ids, start, top_n, with_text, release.null_first_always))
    output, actual, tops, context = [], [], [], list(ids)
    finish: dict[str, Any] = {"type": "length", "length": max_new_tokens}
    for _ in range(max_new_tokens):
        logprobs = _log_softmax(model.logits(context) / logprob_temperature)
        token = int(np.argmax(logprobs)) if params.greedy else sample(model.probs(context, params, SGLANG_ORDER), rng)
        output.append(token)
        actual.append(_entry(float(logprobs[token]), token, with_text))
        tops.append(_top(logprobs, top_n, with_text))
        context.append(token)
        if token in app.get(ENDS, frozenset({END})):
            finish = {"type": "stop", "matched": token}
            break
    app[CACHE].append(context)
    meta.update(finish_reason=finish, reasoning_tokens=0, completion_tokens=len(output), e2e_latency=0.001)
    if with_logprobs:
        meta.update(output_token_logprobs=actual, output_token_logprobs_length=len(actual))
        if top_n > 0:
            meta["output_top_logprobs"] = tops
    return {"text": "".join(token_text(t) for t in output), "output_ids": output, "meta_info": meta}


async def generate(request: web.Request) -> web.Response:
    """SGLang's /generate for one sequence."""
    body = await request.json()
    request.app[SEEN].append((f"{request.method} {request.path}", body))
    try:
        return web.json_response(answer(request.app, body))
    except RefusedError as exc:
        return web.json_response({"error": {"message": str(exc)}}, status=400)
