"""A fake stock SGLang server backed by a toy model, in SGLang's own shapes; it records every request.

`POST /generate` (GenerateReqInput: `input_ids`, `sampling_params`, `return_logprob`,
`logprob_start_len`, `top_logprobs_num`) answers `text`, `output_ids` and `meta_info`, where
`input_token_logprobs[j] = [logprob, id, null]` for the input token at `logprob_start_len + j`
(entry 0 has a null logprob), `input_top_logprobs` holds the top-N `[logprob, id, null]` lists
(entry 0 null), and `output_token_logprobs`/`output_top_logprobs` score the generated tokens.
Log-probs are raw; sampling filters jointly after temperature, as SGLang's sampler does.
`POST /tokenize` answers `{tokens, count, max_model_len}`; `GET /get_model_info` has no
vocabulary size, as in SGLang.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from aiohttp import web

from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.sampling.rejection import sample
from tests.fakes.toy_model import END, ToyModel, ToyVocabulary

SGLANG_ORDER = SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE
CONTEXT_SIZE = 4096
SEEN = web.AppKey("seen", list)
MODEL = web.AppKey("model", ToyModel)


def _top(logprobs: np.ndarray, n: int) -> list[list[Any]]:
    order = np.lexsort((np.arange(len(logprobs)), -logprobs))[:n]  # best first, ties to the lower id
    return [[float(logprobs[i]), int(i), None] for i in order]


def _params(sampling: dict[str, Any]) -> SamplingParams:
    top_k = sampling.get("top_k", -1)
    return SamplingParams(float(sampling.get("temperature", 1.0)), 0 if top_k == -1 else int(top_k),
                          float(sampling.get("top_p", 1.0)), float(sampling.get("min_p", 0.0)))


def _scored_input(model: ToyModel, ids: list[int], start: int, top_n: int) -> dict[str, Any]:
    actual: list[list[Any]] = [[None, ids[start], None]]
    tops: list[Any] = [None]
    for j in range(start + 1, len(ids)):
        logprobs = model.log_softmax(ids[:j])
        actual.append([float(logprobs[ids[j]]), ids[j], None])
        tops.append(_top(logprobs, top_n))
    return {"input_token_logprobs": actual, "input_top_logprobs": tops}


async def generate(request: web.Request) -> web.Response:
    """SGLang's /generate for one sequence."""
    body = await request.json()
    request.app[SEEN].append(body)
    model, ids = request.app[MODEL], list(body["input_ids"])
    sampling = body.get("sampling_params", {})
    params, rng = _params(sampling), np.random.default_rng(sampling.get("sampling_seed"))
    top_n = int(body.get("top_logprobs_num", 0))
    meta: dict[str, Any] = {"prompt_tokens": len(ids), "cached_tokens": 0}
    if body.get("return_logprob"):
        meta.update(_scored_input(model, ids, int(body.get("logprob_start_len", -1)), top_n))
    output, actual, tops, context = [], [], [], list(ids)
    finish: dict[str, Any] = {"type": "length", "length": sampling.get("max_new_tokens", 128)}
    for _ in range(int(sampling.get("max_new_tokens", 128))):
        logprobs = model.log_softmax(context)
        token = int(np.argmax(logprobs)) if params.greedy else sample(model.probs(context, params, SGLANG_ORDER), rng)
        output.append(token)
        actual.append([float(logprobs[token]), token, None])
        tops.append(_top(logprobs, top_n))
        context.append(token)
        if token == END:
            finish = {"type": "stop", "matched": token}
            break
    meta.update(completion_tokens=len(output), finish_reason=finish)
    if body.get("return_logprob"):
        meta.update(output_token_logprobs=actual, output_top_logprobs=tops)
    text = b"".join(ToyVocabulary().token_bytes(t) for t in output).decode()
    return web.json_response({"text": text, "output_ids": output, "meta_info": meta})


async def tokenize(request: web.Request) -> web.Response:
    """SGLang's tokenize endpoint for a text prompt."""
    body = await request.json()
    request.app[SEEN].append(body)
    tokens = ToyVocabulary().tokenize(body.get("prompt", ""))
    return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": CONTEXT_SIZE})


async def model_info(request: web.Request) -> web.Response:
    """SGLang's /get_model_info: paths and flags, no vocabulary size."""
    return web.json_response({"model_path": "toy", "tokenizer_path": "toy", "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": "default"})


def fake_sglang_app(model: ToyModel) -> web.Application:
    """The fake server around one toy model."""
    app = web.Application()
    app[SEEN] = []
    app[MODEL] = model
    app.router.add_post("/generate", generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/get_model_info", model_info)
    return app
