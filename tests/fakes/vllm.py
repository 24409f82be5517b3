"""Fake vLLM servers, real aiohttp apps in vLLM's own shapes; each records every request as ("METHOD /path", body).

`replay_vllm_app` answers with bodies captured from a real vLLM (tests/unit/targets/data/), chosen by
the kind of request. `toy_vllm_app` serves a toy model, read from vLLM's sources (vllm/):
- `POST /v1/completions` (entrypoints/openai/completion/protocol.py `CompletionRequest`, serving.py):
  one `prompt` of token ids (used verbatim) or text; `max_tokens` (default: what fits the context),
  `temperature` (below 1e-5 greedy), `top_k` (0 or -1 off), `top_p`, `min_p`, `seed`, `ignore_eos`,
  checked as sampling_params.py does (a refusal is 400 with vLLM's error body). Sampling follows vLLM's
  order: `repetition_penalty` (every id in the prompt or the output: a positive logit divided by it, any other
  multiplied, model_executor/layers/utils.py `apply_penalties`), greedy, else temperature, min_p, top_k, top_p.
- `prompt_logprobs: k` -> `choices[0].prompt_logprobs`: entry 0 null, entry j a dict keyed by the id as
  a string, `{logprob, rank, decoded_token}`, the prompt token first (ranked by how many tokens score
  at least as high) then the top k (ranks 1..k); a token in both appears once.
- `logprobs: k` -> `choices[0].logprobs` `{text_offset, token_logprobs, tokens, top_logprobs}`, each
  top dict the sampled token then the top k (keys `token_id:<id>` with `return_tokens_as_token_ids`).
- Log-probs are raw (the default `--logprobs-mode raw_logprobs`), or with `PROCESSED` those of the distribution
  sampled from (v1/sample/sampler.py: after the penalty; then, unless greedy, temperature and truncation); -inf
  is written as -9999.0; k
  above `--max-logprobs` (20 by default) is refused with vLLM's "greater than max allowed" message.
- `return_token_ids` adds `prompt_token_ids` and `token_ids` (the end token included).
- Generation ends at the ids in `ENDS` (the toy's end token by default) unless `ignore_eos`, checked before the
  length as vllm/v1/core/sched/utils.py `check_stop` does: `finish_reason` "stop", `stop_reason` null for the
  end token (the tokenizer's EOS) and the id for any other (a generation_config `eos_token_id`).
- `POST /tokenize` (`prompt`, or `messages` through the toy chat template, `add_generation_prompt`
  true by default) answers `{count, max_model_len, tokens, token_strs}`; `GET /v1/models` one card
  with `max_model_len`; `GET /version`.
Batches and streaming are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from aiohttp import web

from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs
from proxy.sampling.rejection import sample
from tests.fakes.sglang import toy_chat_ids
from tests.fakes.toy_model import END, ToyModel, ToyVocabulary

VLLM_ORDER = SamplerOrder.TEMPERATURE_THEN_TRUNCATE
VLLM_GREEDY_EPS = 1e-5  # _SAMPLING_EPS in vllm/sampling_params.py
CLAMPED_NEG_INF = -9999.0
MAX_LOGPROBS = 20
CONTEXT_SIZE = 4096
SERVED_NAME = "toy"
ADAPTER = "toy-lora"  # a LoRA adapter (--lora-modules): listed after the base model, answering as the base does here
ADAPTERS = web.AppKey("adapters", tuple)  # the LoRA adapters served besides the base model
VERSION = "0.32.0"

SEEN = web.AppKey("seen", list)  # ("POST /v1/completions", body) per request
MODEL = web.AppKey("model", ToyModel)
ENDS = web.AppKey("ends", frozenset)  # the ids generation ends at, when not the toy's end token alone
PROCESSED = web.AppKey("processed_logprobs", bool)  # started with --logprobs-mode processed_logprobs
CAPTURED = web.AppKey("captured", dict)  # the replayed bodies by kind


class RefusedError(ValueError):
    """A request vLLM refuses; carries vLLM's error body."""

    def __init__(self, message: str, *, param: str | None = None, value: Any = None, status: int = 400,
                 error_type: str = "BadRequestError") -> None:
        super().__init__(message if param is None else f"{message} (parameter={param}, value={value})")
        self.param, self.status, self.error_type = param, status, error_type

    def response(self) -> web.Response:
        error = {"message": str(self), "type": self.error_type, "param": self.param, "code": self.status}
        return web.json_response({"error": error}, status=self.status)


async def _record(request: web.Request) -> Any:
    body = await request.json() if request.can_read_body else None
    request.app[SEEN].append((f"{request.method} {request.path}", body))
    return body


# The replaying server.


async def _replay(request: web.Request) -> web.Response:
    body, captured = await _record(request), request.app[CAPTURED]
    endpoints = captured["endpoints"]
    if request.path in ("/version", "/v1/models"):
        return web.json_response(endpoints[f"GET {request.path}"]["body"])
    if request.path == "/tokenize":
        kind = "POST /tokenize chat" if "messages" in body else "POST /tokenize prompt"
        return web.json_response(endpoints[kind]["body"])
    if request.path != "/v1/completions":
        raise web.HTTPNotFound()  # as a vLLM without the path (the scale-out ones, /metrics) answers
    if "prompt_logprobs" not in body:
        return web.json_response(endpoints["POST /v1/completions generate"]["body"])
    if body["prompt_logprobs"] > MAX_LOGPROBS:
        over = endpoints["POST /v1/completions over the cap"]
        return web.json_response(over["body"], status=over["status"])
    return web.json_response(captured["verify"])


def replay_vllm_app(endpoints: dict[str, Any], verify_answer: dict[str, Any]) -> web.Application:
    """A vLLM that answers every request with the captured body of its kind (`verify_answer` for verification)."""
    app = web.Application()
    app[SEEN] = []
    app[CAPTURED] = {"endpoints": endpoints, "verify": verify_answer}
    app.router.add_route("*", "/{tail:.*}", _replay)
    return app


# The toy-model server.


def _text(token: int) -> str:
    return ToyVocabulary().token_bytes(token).decode()


def _check_model(app: web.Application, body: dict[str, Any]) -> None:
    if body.get("model") not in (None, SERVED_NAME, *app[ADAPTERS]):
        raise RefusedError(f"The model `{body['model']}` does not exist.", status=404, error_type="NotFoundError")


def _sampling(body: dict[str, Any], prompt_len: int) -> tuple[SamplingParams, int]:
    """vLLM's SamplingParams checks: (the distribution's params, max_tokens)."""

    def value(key: str, default: Any) -> Any:
        return default if body.get(key) is None else body[key]

    temperature, top_p = float(value("temperature", 1.0)), float(value("top_p", 1.0))
    top_k, min_p = int(value("top_k", 0)), float(value("min_p", 0.0))
    penalty = float(value("repetition_penalty", 1.0))
    max_tokens = int(value("max_tokens", CONTEXT_SIZE - prompt_len))
    if not math.isfinite(temperature) or temperature < 0.0:
        raise RefusedError(f"temperature must be non-negative, got {temperature}.", param="temperature",
                           value=temperature)
    if temperature > 2.0:
        raise RefusedError(f"temperature must be in [0, 2], got {temperature}.", param="temperature",
                           value=temperature)
    if not 0.0 < top_p <= 1.0:
        raise RefusedError(f"top_p must be in (0, 1], got {top_p}.", param="top_p", value=top_p)
    if top_k < -1:
        raise RefusedError(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    if not 0.0 <= min_p <= 1.0:
        raise RefusedError(f"min_p must be in [0, 1], got {min_p}.")
    if not penalty > 0.0:
        raise RefusedError(f"repetition_penalty must be greater than zero, got {penalty}.")
    if max_tokens < 1:
        raise RefusedError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens", value=max_tokens)
    for key, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
        if (body.get(key) or 0) > MAX_LOGPROBS:
            raise RefusedError(f"Requested {kind} logprobs of {body[key]}, which is greater than max allowed: "
                               f"{MAX_LOGPROBS}", param=key, value=body[key])
    if temperature < VLLM_GREEDY_EPS:
        return SamplingParams(temperature=0.0, repetition_penalty=penalty), max_tokens
    return SamplingParams(temperature, 0 if top_k in (0, -1) else top_k, top_p, min_p, penalty), max_tokens


def penalised(logits: np.ndarray, seen: Sequence[int], penalty: float) -> np.ndarray:
    """vLLM's repetition penalty on the ids of the prompt and the output."""
    out, ids = logits.copy(), np.unique(np.asarray(seen, dtype=np.int64))
    out[ids] = np.where(out[ids] > 0, out[ids] / penalty, out[ids] * penalty)
    return out


def _ranked(logprobs: np.ndarray, standing: int, k: int) -> list[tuple[int, float, int]]:
    """(id, logprob, rank): the standing token first, then the top k, each id once."""
    top = np.lexsort((np.arange(len(logprobs)), -logprobs))[:k]  # best first, ties to the lower id
    rows = {standing: (float(logprobs[standing]), int(np.sum(logprobs >= logprobs[standing])))}
    for rank, token in enumerate(top.tolist(), start=1):
        rows[token] = (float(logprobs[token]), rank)
    return [(token, max(logprob, CLAMPED_NEG_INF), rank) for token, (logprob, rank) in rows.items()]


def _prompt_logprobs(model: ToyModel, ids: Sequence[int], k: int) -> list[Any]:
    entries: list[Any] = [None]
    for j in range(1, len(ids)):
        ranked = _ranked(model.log_softmax(ids[:j]), ids[j], k)
        entries.append({str(t): {"logprob": lp, "rank": rank, "decoded_token": _text(t)} for t, lp, rank in ranked})
    return entries


def _completion_logprobs(rows: list[list[tuple[int, float, int]]], as_ids: bool) -> dict[str, Any]:
    """vLLM's CompletionLogProbs for the generated tokens (the first row of each is the sampled token)."""
    name = (lambda t: f"token_id:{t}") if as_ids else _text
    offsets, offset, tokens = [], 0, []
    for row in rows:
        offsets.append(offset)
        tokens.append(name(row[0][0]))
        offset += len(tokens[-1])
    return {"text_offset": offsets, "token_logprobs": [row[0][1] for row in rows], "tokens": tokens,
            "top_logprobs": [{name(t): lp for t, lp, _ in row} for row in rows]}


def _prompt_ids(body: dict[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return ToyVocabulary().tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and 0 <= t < ToyVocabulary.n_vocab
                                                   for t in prompt):
        return list(prompt)
    raise RefusedError("the fake serves one prompt per call: a string or a list of token ids in the vocabulary",
                       param="prompt", value=prompt)


def completion(app: web.Application, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's /v1/completions answer for one prompt; RefusedError for what vLLM refuses."""
    _check_model(app, body)
    model, ids = app[MODEL], _prompt_ids(body)
    params, max_tokens = _sampling(body, len(ids))
    rng = np.random.default_rng(body.get("seed"))
    output, rows, context, finish, stop_reason = [], [], list(ids), "length", None
    for _ in range(max_tokens):
        logits = penalised(model.logits(context), context, params.repetition_penalty)
        probs = None if params.greedy else processed_probs(logits, params, VLLM_ORDER)
        token = int(np.argmax(logits)) if probs is None else sample(probs, rng)
        logprobs = model.log_softmax(context)  # raw: before the penalty, as vLLM's default logprobs_mode
        if app.get(PROCESSED, False):
            with np.errstate(divide="ignore"):
                logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum()) if probs is None \
                    else np.log(probs)
        output.append(token)
        rows.append(_ranked(logprobs, token, int(body.get("logprobs") or 0)))
        context.append(token)
        if token in app.get(ENDS, frozenset({END})) and not body.get("ignore_eos"):
            finish, stop_reason = "stop", None if token == END else token
            break
    with_ids, k = bool(body.get("return_token_ids")), body.get("prompt_logprobs")
    choice = {
        "index": 0,
        "text": "".join(_text(t) for t in output),
        "logprobs": None if body.get("logprobs") is None else
        _completion_logprobs(rows, bool(body.get("return_tokens_as_token_ids"))),
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "token_ids": output if with_ids else None,
        "prompt_logprobs": None if k is None else _prompt_logprobs(model, ids, int(k)),
        "prompt_token_ids": ids if with_ids else None,
        "routed_experts": None,
    }
    usage = {"prompt_tokens": len(ids), "total_tokens": len(ids) + len(output), "completion_tokens": len(output),
             "prompt_tokens_details": None, "completion_tokens_details": None}
    return {"id": f"cmpl-fake-{len(app[SEEN])}", "object": "text_completion", "created": 0, "model": SERVED_NAME,
            "choices": [choice], "service_tier": None, "system_fingerprint": f"vllm-{VERSION}", "usage": usage,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


async def completions(request: web.Request) -> web.Response:
    """vLLM's /v1/completions for one prompt."""
    body = await _record(request)
    try:
        return web.json_response(completion(request.app, body))
    except RefusedError as exc:
        return exc.response()


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's /tokenize: a text prompt, or a conversation through the (toy) chat template."""
    body = await _record(request)
    try:
        _check_model(request.app, body)
    except RefusedError as exc:
        return exc.response()
    if "messages" in body:
        add_generation_prompt = bool(body.get("add_generation_prompt", True))
        if add_generation_prompt and body.get("continue_final_message"):
            return RefusedError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                                error_type="BadRequestError").response()
        tokens = toy_chat_ids(body["messages"], add_generation_prompt)
    else:
        tokens = ToyVocabulary().tokenize(body.get("prompt", ""))
    return web.json_response({"count": len(tokens), "max_model_len": CONTEXT_SIZE, "tokens": tokens,
                              "token_strs": None})


async def models(request: web.Request) -> web.Response:
    """vLLM's /v1/models: the one model, with its context size."""
    await _record(request)
    permission = {"id": "modelperm-fake", "object": "model_permission", "created": 0, "allow_create_engine": False,
                  "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                  "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}
    card = {"id": SERVED_NAME, "object": "model", "created": 0, "owned_by": "vllm", "root": SERVED_NAME,
            "parent": None, "max_model_len": CONTEXT_SIZE, "permission": [permission]}
    adapters = [{**card, "id": name, "root": f"/adapters/{name}", "parent": SERVED_NAME}
                for name in request.app[ADAPTERS]]
    return web.json_response({"object": "list", "data": [card, *adapters]})


async def version(request: web.Request) -> web.Response:
    """vLLM's /version."""
    await _record(request)
    return web.json_response({"version": VERSION})


def toy_vllm_app(model: ToyModel, *, adapters: tuple[str, ...] = ()) -> web.Application:
    """A vLLM serving one toy model as `toy` (and as each LoRA adapter named)."""
    app = web.Application()
    app[SEEN], app[ADAPTERS] = [], adapters
    app[MODEL] = model
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    return app
