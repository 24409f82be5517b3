"""The verifier: an aiohttp server around one llama.cpp model.

It answers SGLang's `/generate` (token ids in, per-position raw logprobs out) so the proxy can
verify drafts against a GGUF target, and plain OpenAI generation so the proxy can pass requests
through to it. One model, several KV-cached sequences: each request in flight keeps its own prefix.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence

import numpy as np
from aiohttp import web

from proxy.engine.llama import EngineOptions, LlamaEngine
from proxy.engine.vocabulary import LlamaVocabulary
from proxy.errors import BadRequestError
from proxy.sampling.processors import SamplingParams
from proxy.verifier.generate import pick_token, run_generate
from proxy.verifier.model import VerifierModel
from proxy.verifier.parse import parse_generate
from proxy.wire.emit import write_generation
from proxy.wire.errors import error_middleware
from proxy.wire.request import CHAT, COMPLETION, GenerationRequest, parse_generation_request, read_json
from proxy.wire.textstream import TextStream

MODEL = web.AppKey("model", VerifierModel)
MODEL_NAME = web.AppKey("model_name", str)
UNSUPPORTED_HERE = "the speculoos verifier does not support {fields}; send them to a full server"


async def generate(request: web.Request) -> web.Response:
    """SGLang-native /generate."""
    requests, batched = parse_generate(await read_json(request))
    model = request.app[MODEL]
    async with model.sequence(requests[0].input_ids) as seq:  # a batch's sequences take turns in one
        answers = [await run_generate(model.evaluate, model.vocabulary, seq, req, np.random.default_rng(req.seed))
                   for req in requests]
    return web.json_response(answers if batched else answers[0])


async def tokenize(request: web.Request) -> web.Response:
    """vLLM-shaped /tokenize: a prompt or chat messages to token ids."""
    body = await read_json(request)
    model = request.app[MODEL]
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("'messages' must be a non-empty list", param="messages")
        add_generation_prompt = bool(body.get("add_generation_prompt", True))
        tokens = model.vocabulary.chat_prompt_ids(messages, add_generation_prompt=add_generation_prompt)
    elif isinstance(body.get("prompt"), str):
        tokens = model.vocabulary.tokenize(body["prompt"], add_special=bool(body.get("add_special_tokens", True)))
    else:
        raise BadRequestError("give 'prompt' (a string) or 'messages'", param="prompt")
    return web.json_response({"count": len(tokens), "max_model_len": model.engine.n_ctx, "tokens": tokens})


async def detokenize(request: web.Request) -> web.Response:
    """vLLM-shaped /detokenize."""
    body = await read_json(request)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    engine = request.app[MODEL].engine
    if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < engine.n_vocab for t in tokens):
        raise BadRequestError("'tokens' must be a list of token ids in the vocabulary", param="tokens")
    text = b"".join(engine.vocabulary.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")
    return web.json_response({"prompt": text})


async def model_info(request: web.Request) -> web.Response:
    """SGLang's /get_model_info, extended with what the proxy's tokenizer check compares."""
    engine = request.app[MODEL].engine
    return web.json_response({
        "model_path": str(engine.options.model_path),
        "is_generation": True,
        "vocab_size": engine.n_vocab,
        "bos_token_id": engine.vocabulary.special_ids["bos"],
        "eos_token_id": engine.vocabulary.special_ids["eos"],
        "max_model_len": engine.n_ctx,
        "speculoos_extensions": ["draft_support_ids"],
    })


async def list_models(request: web.Request) -> web.Response:
    """OpenAI /v1/models: the one model served."""
    engine = request.app[MODEL].engine
    entry = {"id": request.app[MODEL_NAME], "object": "model", "created": int(time.time()),
             "owned_by": "speculoos-verifier", "max_model_len": engine.n_ctx}
    return web.json_response({"object": "list", "data": [entry]})


async def health(request: web.Request) -> web.Response:
    """Liveness, and how many sequences requests hold."""
    in_use, total = request.app[MODEL].occupancy()
    return web.json_response({"status": "ok", "sequences": {"in_use": in_use, "total": total}})


def _prompt_ids(vocabulary: LlamaVocabulary, parsed: GenerationRequest) -> list[int]:
    if parsed.kind == CHAT:
        return vocabulary.chat_prompt_ids(parsed.messages or [])
    if isinstance(parsed.prompt, list):
        return list(parsed.prompt)
    return vocabulary.tokenize(parsed.prompt or "")


async def _decode_one_by_one(
    model: VerifierModel, prompt_ids: Sequence[int], params: SamplingParams, max_tokens: int,
    rng: np.random.Generator,
) -> AsyncIterator[list[int]]:
    """Plain decoding: one token per forward pass, in a sequence held for the whole generation."""
    async with model.sequence(prompt_ids) as seq:
        context = list(prompt_ids)
        for _ in range(max_tokens):
            evaluation = await model.evaluate(seq, context, len(context) - 1)
            token = pick_token(evaluation.logits[0], params, rng)
            yield [token]
            if model.vocabulary.is_end_of_generation(token):
                return
            context.append(token)


async def _openai_generation(request: web.Request, kind: str) -> web.StreamResponse:
    parsed = parse_generation_request(await read_json(request), kind)  # type: ignore[arg-type]
    if parsed.unsupported:
        raise BadRequestError(UNSUPPORTED_HERE.format(fields=", ".join(parsed.unsupported)))
    model = request.app[MODEL]
    vocabulary = model.vocabulary
    prompt_ids = _prompt_ids(vocabulary, parsed)
    max_tokens = parsed.max_tokens_within(len(prompt_ids), model.engine.n_ctx)
    stream = TextStream(vocabulary.token_bytes, vocabulary.is_end_of_generation, stop=parsed.stop,
                        max_tokens=max_tokens)
    tokens = _decode_one_by_one(model, prompt_ids, parsed.sampling_params, max_tokens,
                                np.random.default_rng(parsed.seed))
    response, _ = await write_generation(request, parsed, tokens, stream, len(prompt_ids))
    return response


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI /v1/chat/completions with the model's own chat template."""
    return await _openai_generation(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """OpenAI /v1/completions."""
    return await _openai_generation(request, COMPLETION)


def create_verifier_app(model: VerifierModel, model_name: str, *, max_body_bytes: int = 64 << 20) -> web.Application:
    """The verifier's aiohttp application around an already loaded model."""
    app = web.Application(middlewares=[error_middleware], client_max_size=max_body_bytes)
    app[MODEL] = model
    app[MODEL_NAME] = model_name

    async def close_model(app: web.Application) -> None:
        app[MODEL].close()

    app.on_cleanup.append(close_model)
    app.router.add_post("/generate", generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    return app


def load_verifier_app(options: EngineOptions, *, model_name: str | None = None,
                      shared_decode: bool = False) -> web.Application:
    """Load the GGUF and build the app."""
    model = VerifierModel(LlamaEngine(options), shared_decode=shared_decode)
    return create_verifier_app(model, model_name or options.model_path.stem)
