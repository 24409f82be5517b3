"""A fake stock SGLang server backed by a toy model, in SGLang's own shapes; it records every request.

`/generate` lives in sglang_generate.py, with `Release`: the shapes that differ between SGLang releases.
The rest, read from SGLang's sources (python/sglang/srt/entrypoints/; release 0.5.23 and older commits):
- `POST /v1/tokenize` and its hidden alias `/tokenize` (openai/protocol.py `TokenizeRequest`,
  serving_tokenize.py; JSON content type required): exactly one of `prompt` (a string or a list of
  strings) and `messages`; other fields are allowed. Messages are rendered as for a chat completion,
  generation prompt included (a final assistant message becomes a user one, or with
  `continue_final_message` is appended after the generation prompt: serving_chat.py
  `_handle_last_assistant_message`). 0.5.23 also takes `add_generation_prompt` (messages rendered as
  given, no final-message handling; continuing then needs it true); older releases ignore it, and the
  oldest take `prompt` only. Answers `{tokens, count, max_model_len}`, where `max_model_len` is the
  tokenizer's `model_max_length`; a 1e30 placeholder is answered as the context length by 0.5.23 and
  fails serialisation (500) before.
- `GET /v1/models`: one card, the context length as `max_model_len`; `GET /model_info` (0.5.23; the
  deprecated `/get_model_info` everywhere): paths and flags, no vocabulary size or EOS; `GET /server_info`
  (deprecated `/get_server_info`): the resolved server args (server_args.py: `sampling_defaults`,
  `preferred_sampling_params`, `reasoning_parser`, `tool_call_parser`, the LoRA ones), `version`.
- `POST /v1/chat/completions` (non-streaming only): the conversation rendered as above; `max_tokens` 0
  means unset; `return_prompt_token_ids` (0.5.23) adds `prompt_token_ids` to the choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from tests.fakes.sglang_generate import (
    CACHE,
    DEFAULT_MAX_NEW_TOKENS,
    MODEL,
    RELEASE,
    SEEN,
    SGLANG_ORDER,
    RefusedError,
    Release,
    answer,
    generate,
)
from tests.fakes.toy_model import ToyModel, ToyVocabulary

__all__ = ["CONTEXT_SIZE", "MIDDLE", "OLDEST", "SEEN", "SGLANG_ORDER", "Release", "fake_sglang_app", "toy_chat_ids"]

CONTEXT_SIZE = 4096
SERVED_NAME = "toy"
ROLE_IDS = {"system": 21, "user": 22, "assistant": 23}  # the toy chat template's role markers
LIMITS = web.AppKey("limits", dict)  # context_size, tokenizer_max_length, launch_context_length
SERVER_ARGS = web.AppKey("server_args", dict)  # the server arguments /server_info adds
# As the README starts SGLang for the proxy (--sampling-defaults openai); the others at SGLang's defaults.
STARTED_ARGS = {"sampling_defaults": "openai", "preferred_sampling_params": None, "reasoning_parser": None,
                "tool_call_parser": None, "enable_lora": None, "lora_paths": None}
ORJSON_INT_LIMIT = 2**64  # the largest int orjson writes, plus one
# Releases before 0.5.23: conversations without add_generation_prompt, only the deprecated info paths,
# no prompt ids from the chat endpoint; the oldest tokenize takes prompts only and pads only a start of 0.
MIDDLE = Release(version="0.5.4", generation_prompt_flag=False, clamps_placeholder=False,
                 model_info_paths=("/get_model_info",), server_info_paths=("/get_server_info",),
                 prompt_token_ids=False)
OLDEST = Release(version="0.4.9", null_first_always=False, tokenize_paths=("/tokenize",), tokenize_messages=False,
                 generation_prompt_flag=False, clamps_placeholder=False, model_info_paths=("/get_model_info",),
                 server_info_paths=("/get_server_info",), prompt_token_ids=False)


def toy_chat_ids(messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """The toy chat template: a role marker then the content per message, then the assistant's marker."""
    vocabulary, ids = ToyVocabulary(), []
    for message in messages:
        ids += [ROLE_IDS[message["role"]], *vocabulary.tokenize(message.get("content") or "")]
    return ids + [ROLE_IDS["assistant"]] if add_generation_prompt else ids


def render(messages: list[dict[str, Any]], continue_final: bool, add_generation_prompt: bool | None) -> list[int]:
    """A conversation's ids as SGLang's chat serving renders it through the (toy) template."""
    if add_generation_prompt is not None:  # 0.5.23's flag: rendered as given
        if continue_final and not add_generation_prompt:
            raise RefusedError("continue_final_message needs add_generation_prompt to open the assistant turn.")
        if not continue_final:
            return toy_chat_ids(messages, add_generation_prompt)
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant" and isinstance(last.get("content"), str):
        if continue_final:
            return toy_chat_ids(messages[:-1], True) + ToyVocabulary().tokenize(last["content"])
        messages = [*messages[:-1], {"role": "user", "content": last["content"]}]
    return toy_chat_ids(messages, True)


def _refused(message: str, status: int = 400) -> web.Response:
    """SGLang's error for an OpenAI-side request it cannot validate (http_server.py)."""
    return web.json_response({"object": "error", "message": message, "type": "Bad Request", "param": None,
                              "code": status}, status=status)


async def _json_body(request: web.Request) -> Any:
    body = await request.json() if request.can_read_body and request.content_type == "application/json" else None
    request.app[SEEN].append((f"{request.method} {request.path}", body))
    return body


async def tokenize(request: web.Request) -> web.Response:
    """SGLang's /v1/tokenize: a prompt (or a list of them), or one conversation through the chat template."""
    release, body = request.app[RELEASE], await _json_body(request)
    if body is None:
        return _refused("Unsupported Media Type: Only 'application/json' is allowed")
    prompt, messages = body.get("prompt"), body.get("messages") if release.tokenize_messages else None
    if not release.tokenize_messages and prompt is None:
        return _refused("1 validation error for TokenizeRequest\nprompt\n  Field required")
    if (prompt is None) == (messages is None):
        return _refused("Exactly one of 'prompt' or 'messages' must be provided.")
    vocabulary = ToyVocabulary()
    tokens: list[int] | list[list[int]]
    if messages is not None:
        flag = body.get("add_generation_prompt") if release.generation_prompt_flag else None
        try:
            tokens = render(messages, bool(body.get("continue_final_message")), flag)
        except RefusedError as exc:
            return _refused(str(exc))
        count: int | list[int] = len(tokens)
    elif isinstance(prompt, str):
        tokens = vocabulary.tokenize(prompt)
        count = len(tokens)
    else:
        tokens = [vocabulary.tokenize(text) for text in prompt]
        count = [len(row) for row in tokens]
    limits = request.app[LIMITS]
    max_model_len = limits["tokenizer_max_length"]
    if max_model_len >= ORJSON_INT_LIMIT:
        if not release.clamps_placeholder:
            return web.Response(status=500, text="Internal Server Error")  # the response fails to serialise
        max_model_len = limits["context_size"]
    return web.json_response({"tokens": tokens, "count": count, "max_model_len": max_model_len})


async def chat_completions(request: web.Request) -> web.Response:
    """SGLang's /v1/chat/completions, non-streaming: the rendered conversation, decoded by /generate's rules."""
    release, body = request.app[RELEASE], await _json_body(request)
    try:
        ids = render(body["messages"], bool(body.get("continue_final_message")), None)
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_NEW_TOKENS
        sampling = {key: body.get(key) for key in ("temperature", "top_p", "top_k", "min_p")}
        result = answer(request.app, {"input_ids": ids, "sampling_params": {**sampling, "max_new_tokens": limit,
                                                                            "sampling_seed": body.get("seed")}})
    except RefusedError as exc:
        return _refused(str(exc))
    meta = result["meta_info"]
    choice = {"index": 0, "message": {"role": "assistant", "content": result["text"], "reasoning_content": None,
                                      "tool_calls": None},
              "logprobs": None, "finish_reason": meta["finish_reason"]["type"],
              "matched_stop": meta["finish_reason"].get("matched")}
    if release.prompt_token_ids and body.get("return_prompt_token_ids"):
        choice["prompt_token_ids"] = ids
    usage = {"prompt_tokens": len(ids), "completion_tokens": len(result["output_ids"]),
             "total_tokens": len(ids) + len(result["output_ids"]), "prompt_tokens_details": None}
    return web.json_response({"id": meta["id"], "object": "chat.completion", "created": 0, "model": body.get("model"),
                              "choices": [choice], "usage": usage})


async def model_info(request: web.Request) -> web.Response:
    """SGLang's /model_info (and /get_model_info): paths and flags, no vocabulary size."""
    await _json_body(request)
    return web.json_response({"model_path": SERVED_NAME, "tokenizer_path": SERVED_NAME, "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": "default"})


async def server_info(request: web.Request) -> web.Response:
    """SGLang's /server_info (and /get_server_info): resolved server args, scheduler info and the version."""
    await _json_body(request)
    limits, release = request.app[LIMITS], request.app[RELEASE]
    return web.json_response({"model_path": SERVED_NAME, "context_length": limits["launch_context_length"],
                              "enable_deterministic_inference": release.deterministic,
                              "max_req_input_len": limits["context_size"] - 1, "internal_states": [{}],
                              "version": release.version, **request.app[SERVER_ARGS]})


async def models(request: web.Request) -> web.Response:
    """SGLang's /v1/models: one card, the context length as max_model_len."""
    await _json_body(request)
    length = request.app[LIMITS]["context_size"] if request.app[RELEASE].models_card_length else None
    card = {"id": SERVED_NAME, "object": "model", "created": 0, "owned_by": "sglang", "root": SERVED_NAME,
            "parent": None, "max_model_len": length}
    return web.json_response({"object": "list", "data": [card]})


def fake_sglang_app(model: ToyModel, *, release: Release = Release(), context_size: int = CONTEXT_SIZE,
                    tokenizer_max_length: int | None = None, launch_context_length: int | None = None,
                    **server_args: Any) -> web.Application:
    """The fake server around one toy model; the tokenizer's model_max_length defaults to the context size;
    `server_args` change the arguments /server_info shows."""
    app = web.Application()
    app[SEEN], app[MODEL], app[CACHE], app[RELEASE] = [], model, [], release
    app[SERVER_ARGS] = {**STARTED_ARGS, **server_args}
    app[LIMITS] = {"context_size": context_size, "launch_context_length": launch_context_length,
                   "tokenizer_max_length": context_size if tokenizer_max_length is None else tokenizer_max_length}
    app.router.add_post("/generate", generate)
    for path in release.tokenize_paths:
        app.router.add_post(path, tokenize)
    for path in release.model_info_paths:
        app.router.add_get(path, model_info)
    for path in release.server_info_paths:
        app.router.add_get(path, server_info)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app
