"""The verifier's tokenizer and description endpoints, in SGLang's shapes so the `sglang` client reads them as SGLang's.

Tokenize at `/v1/tokenize` and `/tokenize` (`{tokens, count, max_model_len}`), detokenize at
`/v1/detokenize` and `/detokenize` (`{text}`), `/model_info` and its old name `/get_model_info`
(extended with the vocabulary size, special ids and the draft-support extension), `/server_info` and
`/get_server_info` (`version`, `context_length`, `enable_deterministic_inference`), `/v1/models`.
"""

from __future__ import annotations

import asyncio
import time
from importlib import metadata
from typing import Any

from aiohttp import web

from proxy.engine.vocabulary import LlamaVocabulary
from proxy.errors import BadRequestError
from proxy.verifier.model import VerifierModel
from proxy.wire.json_body import read_json
from proxy.wire.tools import request_tools, template_messages

MODEL = web.AppKey("model", VerifierModel)
MODEL_NAME = web.AppKey("model_name", str)


def version() -> str:
    """The installed speculoos version."""
    try:
        return metadata.version("speculoos")
    except metadata.PackageNotFoundError:
        return "0+unknown"  # a checkout run without installing


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


async def tokenize(request: web.Request) -> web.Response:
    """SGLang's /v1/tokenize: exactly one of a prompt (or a list of them) and a conversation (with its tools)."""
    body = await read_json(request)
    model = request.app[MODEL]
    if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
        raise BadRequestError("Exactly one of 'prompt' or 'messages' must be provided.", param="prompt")
    tokens, count = await asyncio.to_thread(_tokens, model.vocabulary, body)  # seconds for a long prompt
    return web.json_response({"tokens": tokens, "count": count, "max_model_len": model.engine.n_ctx})


def _tokens(vocabulary: LlamaVocabulary, body: dict[str, Any]) -> tuple[list[int] | list[list[int]], int | list[int]]:
    """A tokenize body's ids and their count (blocking)."""
    prompt = body.get("prompt")
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("'messages' must be a non-empty list", param="messages")
        # Omitted, the generation prompt is added, as SGLang renders a conversation for its chat endpoint.
        add_generation_prompt = body.get("add_generation_prompt") is not False
        ids = vocabulary.chat_prompt_ids(template_messages(messages), add_generation_prompt=add_generation_prompt,
                                         tools=request_tools(body))
        return ids, len(ids)
    add_special = bool(body.get("add_special_tokens", True))
    if isinstance(prompt, str):
        ids = vocabulary.tokenize(prompt, add_special=add_special)
        return ids, len(ids)
    if isinstance(prompt, list) and all(isinstance(text, str) for text in prompt):
        rows = [vocabulary.tokenize(text, add_special=add_special) for text in prompt]
        return rows, [len(row) for row in rows]
    raise BadRequestError("'prompt' must be a string or a list of strings", param="prompt")


async def detokenize(request: web.Request) -> web.Response:
    """SGLang's /v1/detokenize: token ids (or lists of them) to text; special tokens render as nothing."""
    body = await read_json(request)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    rows = tokens if isinstance(tokens, list) and tokens and isinstance(tokens[0], list) else [tokens]
    texts = await asyncio.to_thread(_texts, request.app[MODEL].vocabulary, rows)  # a call per token
    return web.json_response({"text": texts if rows is tokens else texts[0]})


def _texts(vocabulary: LlamaVocabulary, rows: list[Any]) -> list[str]:
    """Each row of ids as text (blocking)."""
    if not all(_is_ids(row) and all(0 <= t < vocabulary.n_vocab for t in row) for row in rows):
        raise BadRequestError("'tokens' must be a list of token ids in the vocabulary (or a list of such lists)",
                              param="tokens")
    return [b"".join(vocabulary.token_bytes(t) for t in row).decode("utf-8", errors="replace") for row in rows]


async def model_info(request: web.Request) -> web.Response:
    """SGLang's /model_info, extended with what the proxy's tokenizer check compares."""
    engine = request.app[MODEL].engine
    return web.json_response({
        "model_path": engine.options.model_path.name,  # the file name only: its directory tells a client about the host
        "served_model_name": request.app[MODEL_NAME],
        "is_generation": True,
        "vocab_size": engine.n_vocab,
        "bos_token_id": engine.vocabulary.special_ids["bos"],
        "eos_token_id": engine.vocabulary.special_ids["eos"],
        "eos_token_ids": sorted(engine.vocabulary.end_of_generation_ids),  # where generation stops here (llama.cpp's)
        "max_model_len": engine.n_ctx,
        "speculoos_extensions": ["draft_support_ids"],
    })


async def server_info(request: web.Request) -> web.Response:
    """SGLang's /server_info subset: the version, the context length and whether seeds reproduce."""
    model = request.app[MODEL]
    return web.json_response({"version": version(), "context_length": model.engine.n_ctx,
                              # Shared decodes make logits, and so seeded draws, depend on the load.
                              "enable_deterministic_inference": not model.shared_decode,
                              "max_running_requests": model.engine.n_seq})


async def list_models(request: web.Request) -> web.Response:
    """OpenAI /v1/models: the one model served, its context length as SGLang gives it."""
    engine = request.app[MODEL].engine
    entry = {"id": request.app[MODEL_NAME], "object": "model", "created": int(time.time()),
             "owned_by": "speculoos-verifier", "root": request.app[MODEL_NAME], "max_model_len": engine.n_ctx}
    return web.json_response({"object": "list", "data": [entry]})


def add_routes(app: web.Application) -> None:
    """Register every endpoint of this module, new paths and old aliases."""
    for path in ("/v1/tokenize", "/tokenize"):
        app.router.add_post(path, tokenize)
    for path in ("/v1/detokenize", "/detokenize"):
        app.router.add_post(path, detokenize)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    app.router.add_get("/v1/models", list_models)
