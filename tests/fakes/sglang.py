"""A fake stock SGLang server backed by a toy model, in SGLang's own shapes; it records every request.

Read from SGLang's sources (python/sglang/srt/):
- `POST /generate` (managers/io_struct.py `GenerateReqInput`, one sequence of `input_ids`; unknown
  fields are ignored) answers `{text, output_ids, meta_info}` (managers/tokenizer_manager.py
  `_handle_batch_output`). `meta_info` holds `id`, `finish_reason` (`{"type": "length", "length": n}`
  or `{"type": "stop", "matched": id}`), `prompt_tokens`, `completion_tokens`, `cached_tokens`, ...
- With `return_logprob`, `input_token_logprobs[j] = [logprob, id, text|null]` scores the input token
  at `logprob_start_len + j`; entry 0 has a null logprob (managers/scheduler_output_processor_mixin.py
  `_process_input_token_logprobs`: `[None] + ...`), so a start of `L - 1` gives K + 1 entries for
  K drafts. `input_top_logprobs` holds the top-N `[logprob, id, text|null]` lists, entry 0 null;
  `output_token_logprobs` and `output_top_logprobs` score the generated tokens. Top lists are there
  only when `top_logprobs_num > 0`; text only with `return_text_in_logprobs`. A start of -1 (the
  default) means the last input token; one at or past the input length is refused.
- Sampling params (sampling/sampling_params.py): temperature below 1e-6 is greedy (top_k 1),
  top_k -1 is off (0 is refused), top_p in (0, 1], min_p in [0, 1], max_new_tokens 128 by default,
  `sampling_seed`; a refused value answers 400 `{"error": {"message"}}` (entrypoints/http_server.py).
- Log-probs: input ones are raw; output ones are divided by the temperature when sampling (SGLang's
  default, without SGLANG_RETURN_ORIGINAL_LOGPROB) and raw when greedy (layers/sampler.py).
  Sampling filters jointly after temperature, as SGLang's sampler does.
- Radix cache: `cached_tokens` is the longest prefix seen before, capped at `input_len - 1` and, with
  logprobs, at `logprob_start_len` (managers/schedule_batch.py `_compute_max_prefix_len`).
- `POST /v1/tokenize` and its hidden alias `/tokenize` (entrypoints/openai/protocol.py
  `TokenizeRequest`, serving_tokenize.py): exactly one of `prompt` (a string or a list of strings)
  and `messages`; other fields are allowed but there is no `add_generation_prompt`: messages are
  rendered as for a chat completion, always with the generation prompt, a final assistant message
  appended after it with `continue_final_message` (entrypoints/openai/serving_chat.py
  `_apply_jinja_template`). JSON content type required. Answers `{tokens, count, max_model_len}`,
  where `max_model_len` is the tokenizer's `model_max_length`, not necessarily the context length.
- `GET /v1/models` gives the context length as `max_model_len`; `GET /get_model_info` gives paths and
  flags, no vocabulary size.
Batches (lists of sequences), streaming and text prompts are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from aiohttp import web

from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.sampling.rejection import sample
from tests.fakes.toy_model import END, ToyModel, ToyVocabulary

SGLANG_ORDER = SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE
SGLANG_GREEDY_EPS = 1e-6  # _SAMPLING_EPS in sampling_params.py
DEFAULT_MAX_NEW_TOKENS = 128
CONTEXT_SIZE = 4096
SERVED_NAME = "toy"
ROLE_IDS = {"system": 21, "user": 22, "assistant": 23}  # the toy chat template's role markers

SEEN = web.AppKey("seen", list)  # ("POST /generate", body) per request
MODEL = web.AppKey("model", ToyModel)
CACHE = web.AppKey("cache", list)  # every sequence computed so far (the radix cache's contents)
LIMITS = web.AppKey("limits", dict)  # context_size, tokenizer_max_length


class RefusedError(ValueError):
    """A request SGLang refuses with 400."""


def toy_chat_ids(messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """The toy chat template: a role marker then the content per message, then the assistant's marker."""
    vocabulary, ids = ToyVocabulary(), []
    for message in messages:
        ids += [ROLE_IDS[message["role"]], *vocabulary.tokenize(message.get("content") or "")]
    return ids + [ROLE_IDS["assistant"]] if add_generation_prompt else ids


def _text(token: int) -> str:
    return ToyVocabulary().token_bytes(token).decode()


def _entry(logprob: float | None, token: int, with_text: bool) -> list[Any]:
    return [logprob, token, _text(token) if with_text else None]


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


def _scored_input(model: ToyModel, ids: list[int], start: int, top_n: int, with_text: bool) -> dict[str, Any]:
    actual: list[list[Any]] = [_entry(None, ids[start], with_text)]
    tops: list[Any] = [None]
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
    model, ids = app[MODEL], body.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < model.vocab for t in ids):
        raise RefusedError("the fake serves one non-empty sequence of input_ids in the vocabulary per call")
    params, logprob_temperature, max_new_tokens = _sampling(body.get("sampling_params") or {})
    rng = np.random.default_rng((body.get("sampling_params") or {}).get("sampling_seed"))
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
        meta.update(_scored_input(model, ids, start, top_n, with_text))
    output, actual, tops, context = [], [], [], list(ids)
    finish: dict[str, Any] = {"type": "length", "length": max_new_tokens}
    for _ in range(max_new_tokens):
        logprobs = _log_softmax(model.logits(context) / logprob_temperature)
        token = int(np.argmax(logprobs)) if params.greedy else sample(model.probs(context, params, SGLANG_ORDER), rng)
        output.append(token)
        actual.append(_entry(float(logprobs[token]), token, with_text))
        tops.append(_top(logprobs, top_n, with_text))
        context.append(token)
        if token == END:
            finish = {"type": "stop", "matched": token}
            break
    app[CACHE].append(context)
    meta.update(finish_reason=finish, reasoning_tokens=0, completion_tokens=len(output), e2e_latency=0.001)
    if with_logprobs:
        meta.update(output_token_logprobs=actual, output_token_logprobs_length=len(actual))
        if top_n > 0:
            meta["output_top_logprobs"] = tops
    return {"text": "".join(_text(t) for t in output), "output_ids": output, "meta_info": meta}


async def generate(request: web.Request) -> web.Response:
    """SGLang's /generate for one sequence."""
    body = await request.json()
    request.app[SEEN].append((f"{request.method} {request.path}", body))
    try:
        return web.json_response(answer(request.app, body))
    except RefusedError as exc:
        return web.json_response({"error": {"message": str(exc)}}, status=400)


def _refused(message: str) -> web.Response:
    """SGLang's 400 for an OpenAI-side request it cannot validate (http_server.py)."""
    return web.json_response({"object": "error", "message": message, "type": "Bad Request", "param": None,
                              "code": 400}, status=400)


async def tokenize(request: web.Request) -> web.Response:
    """SGLang's /v1/tokenize: a prompt (or a list of them), or one conversation through the chat template."""
    if request.content_type != "application/json":
        request.app[SEEN].append((f"{request.method} {request.path}", None))
        return _refused("Unsupported Media Type: Only 'application/json' is allowed")
    body = await request.json()
    request.app[SEEN].append((f"{request.method} {request.path}", body))
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        return _refused("Exactly one of 'prompt' or 'messages' must be provided.")
    vocabulary = ToyVocabulary()
    tokens: list[int] | list[list[int]]
    if messages is not None:
        # Rendered with the generation prompt, the final assistant message (if continued) appended after it:
        # with the toy template that is the conversation without the assistant's marker added again.
        continued = bool(body.get("continue_final_message")) and bool(messages) and messages[-1]["role"] == "assistant"
        tokens = toy_chat_ids(messages, add_generation_prompt=not continued)
        count: int | list[int] = len(tokens)
    elif isinstance(prompt, str):
        tokens = vocabulary.tokenize(prompt)
        count = len(tokens)
    else:
        tokens = [vocabulary.tokenize(text) for text in prompt]
        count = [len(row) for row in tokens]
    limits = request.app[LIMITS]
    return web.json_response({"tokens": tokens, "count": count, "max_model_len": limits["tokenizer_max_length"]})


async def model_info(request: web.Request) -> web.Response:
    """SGLang's /get_model_info: paths and flags, no vocabulary size."""
    return web.json_response({"model_path": SERVED_NAME, "tokenizer_path": SERVED_NAME, "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": "default"})


async def models(request: web.Request) -> web.Response:
    """SGLang's /v1/models: one card, the context length as max_model_len."""
    card = {"id": SERVED_NAME, "object": "model", "created": 0, "owned_by": "sglang", "root": SERVED_NAME,
            "max_model_len": request.app[LIMITS]["context_size"]}
    return web.json_response({"object": "list", "data": [card]})


def fake_sglang_app(model: ToyModel, *, context_size: int = CONTEXT_SIZE,
                    tokenizer_max_length: int | None = None) -> web.Application:
    """The fake server around one toy model; the tokenizer's model_max_length defaults to the context size."""
    app = web.Application()
    app[SEEN] = []
    app[MODEL] = model
    app[CACHE] = []
    app[LIMITS] = {"context_size": context_size,
                   "tokenizer_max_length": context_size if tokenizer_max_length is None else tokenizer_max_length}
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/tokenize", tokenize)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/v1/models", models)
    return app
