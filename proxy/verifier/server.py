"""The verifier: an aiohttp server around one llama.cpp model.

It answers SGLang's `/generate` (token ids in, per-position raw logprobs out) so the proxy can
verify drafts against a GGUF target, SGLang's tokenizer and description endpoints (info.py), and
plain OpenAI generation so the proxy can pass requests through to it. One model, several
KV-cached sequences: each request in flight keeps its own prefix.

It defends itself: browsers of other sites, a missing key and bodies that are not JSON are refused
(access.py); served with handler cancellation (`run_verifier`), a request whose client leaves
stops between two engine steps and frees its sequence; a bounded queue waits for sequences (503
with Retry-After beyond it); `/generate` refuses up front what exceeds the context, the memory
caps or the batch and token caps of `parse.check_limits`; tokenizing runs off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

import numpy as np
from aiohttp import web

from proxy.engine.llama import EngineOptions, LlamaEngine
from proxy.engine.vocabulary import LlamaVocabulary
from proxy.errors import BadRequestError
from proxy.sampling.processors import SamplingParams
from proxy.verifier import info
from proxy.verifier.access import API_KEY, LISTENER, access_guard
from proxy.verifier.generate import pick_token, run_generate
from proxy.verifier.info import MODEL, MODEL_NAME
from proxy.verifier.model import VerifierModel
from proxy.verifier.parse import RequestLimits, check_limits, parse_generate
from proxy.verifier.plain import PlainSteps
from proxy.wire.browsers import Bound
from proxy.wire.emit import write_generation
from proxy.wire.errors import error_middleware
from proxy.wire.fields import RESPONSE_EXTRAS
from proxy.wire.json_body import read_json
from proxy.wire.request import CHAT, COMPLETION, GenerationRequest, parse_generation_request
from proxy.wire.textstream import TextStream
from proxy.wire.tool_stream import ToolCallStream
from proxy.wire.tools import parses_tool_calls, request_tools, template_messages

UNSUPPORTED_HERE = "the speculoos verifier does not support {fields}; send them to a full server"
TEMPLATED_HERE = frozenset({"tools"})  # rendered by the chat template; calls read from the output (wire/tools.py)
LIMITS = web.AppKey("limits", RequestLimits)
LOOPBACK = Bound("127.0.0.1")  # the default bind (cli.py)


async def generate(request: web.Request) -> web.Response:
    """SGLang-native /generate."""
    requests, batched = parse_generate(await read_json(request))
    model = request.app[MODEL]
    check_limits(requests, model.engine.n_ctx, model.engine.n_vocab, request.app[LIMITS])
    async with model.sequence(requests[0].input_ids) as seq:  # a batch's sequences take turns in one
        answers = [await run_generate(model, seq, req, np.random.default_rng(req.seed))
                   for req in requests]
    return web.json_response(answers if batched else answers[0])


async def health(request: web.Request) -> web.Response:
    """Liveness, how many sequences requests hold, and how many requests wait for one."""
    model = request.app[MODEL]
    in_use, total = model.occupancy()
    return web.json_response({"status": "ok", "sequences": {"in_use": in_use, "total": total,
                                                            "waiting": model.waiting}})


def _prompt_ids(vocabulary: LlamaVocabulary, parsed: GenerationRequest) -> list[int]:
    """The prompt's ids (blocking: seconds for a long prompt, so called off the event loop)."""
    if parsed.kind == CHAT:
        return vocabulary.chat_prompt_ids(template_messages(parsed.messages or []), tools=request_tools(parsed.body))
    if isinstance(parsed.prompt, list):
        return list(parsed.prompt)
    return vocabulary.tokenize(parsed.prompt or "")


async def _decode_one_by_one(
    model: VerifierModel, prompt_ids: Sequence[int], params: SamplingParams, max_tokens: int,
    rng: np.random.Generator,
) -> AsyncIterator[list[int]]:
    """Plain decoding: one token per forward pass, in a sequence held for the whole generation."""
    steps = PlainSteps(list(prompt_ids), lambda row: pick_token(row, params, rng),
                       model.vocabulary.is_end_of_generation, max_tokens)
    async with model.sequence(prompt_ids) as seq, aclosing(model.decode_plain(seq, steps)) as tokens:
        async for token in tokens:  # closed before the sequence is given back: no step of it starts after
            yield [token]


async def _openai_generation(request: web.Request, kind: str) -> web.StreamResponse:
    parsed = parse_generation_request(await read_json(request), kind)  # type: ignore[arg-type]
    if refused := [name for name in parsed.unsupported  # extras: ignored here
                   if name not in RESPONSE_EXTRAS and name not in TEMPLATED_HERE]:
        raise BadRequestError(UNSUPPORTED_HERE.format(fields=", ".join(refused)))
    model = request.app[MODEL]
    vocabulary = model.vocabulary
    prompt_ids = await asyncio.to_thread(_prompt_ids, vocabulary, parsed)
    max_tokens = parsed.max_tokens_within(len(prompt_ids), model.engine.n_ctx)
    stream = TextStream(vocabulary.token_bytes, vocabulary.is_end_of_generation, stop=parsed.stop,
                        max_tokens=max_tokens)
    tokens = _decode_one_by_one(model, prompt_ids, parsed.sampling_params, max_tokens,
                                np.random.default_rng(parsed.seed))
    tools = ToolCallStream() if parsed.kind == CHAT and parses_tool_calls(parsed.body) else None
    response, _ = await write_generation(request, parsed, tokens, stream, len(prompt_ids),
                                         shapers=[tools] if tools is not None else ())
    return response


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI /v1/chat/completions with the model's own chat template."""
    return await _openai_generation(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """OpenAI /v1/completions."""
    return await _openai_generation(request, COMPLETION)


def create_verifier_app(model: VerifierModel, model_name: str, *, max_body_bytes: int = 64 << 20,
                        listener: Bound = LOOPBACK, api_key: str | None = None,
                        limits: RequestLimits | None = None) -> web.Application:
    """The verifier's aiohttp application around an already loaded model, its browser rules judging Host headers by
    `listener` (the address bound), asking for `api_key` when given, capping requests by `limits` (default: for its
    context)."""
    # The guard inside the error middleware: its refusals are rendered like every other error.
    app = web.Application(middlewares=[error_middleware, access_guard], client_max_size=max_body_bytes)
    app[MODEL] = model
    app[MODEL_NAME] = model_name
    app[LISTENER] = listener
    app[LIMITS] = limits or RequestLimits.for_context(model.engine.n_ctx)
    if api_key is not None:
        app[API_KEY] = api_key

    async def close_model(app: web.Application) -> None:
        app[MODEL].close()

    app.on_cleanup.append(close_model)
    app.router.add_post("/generate", generate)
    info.add_routes(app)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    return app


def load_verifier_app(options: EngineOptions, *, model_name: str | None = None, shared_decode: bool = False,
                      max_waiting: int | None = None, listener: Bound = LOOPBACK, api_key: str | None = None,
                      limits: RequestLimits | None = None) -> web.Application:
    """Load the GGUF and build the app (the rest: see create_verifier_app)."""
    model = VerifierModel(LlamaEngine(options), shared_decode=shared_decode, max_waiting=max_waiting)
    return create_verifier_app(model, model_name or options.model_path.stem, listener=listener, api_key=api_key,
                               limits=limits)


def run_verifier(app: web.Application, host: str, port: int) -> None:
    """Serve until interrupted; a handler whose client disconnects is cancelled, freeing its sequence."""
    # aiohttp leaves handler cancellation off by default: a non-streamed generation would otherwise
    # decode to its end, holding its sequence, for a client that is gone.
    web.run_app(app, host=host, port=port, print=None, access_log=None, handler_cancellation=True)
