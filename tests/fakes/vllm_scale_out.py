"""A fake vLLM started with `--enable-scale-out` and its prefix cache on: the toy vLLM of vllm.py, and besides it
what the proxy reads from such a server, in the shapes captured from a real one (tests/unit/targets/data/):
- `POST /v1/completions` with several token-id prompts: one choice per prompt, `index` its place
  (entrypoints/openai/completion/serving.py); each generates as one prompt would.
- `POST /v1/completions/render`: a list of one `GenerateRequest`, the prompt's ids and the SamplingParams the
  server would use, its generation_config defaults (`sampling_defaults`) filling the fields the request omits
  (entrypoints/scale_out/render/serving.py); msgspec leaves out fields at vLLM's own defaults.
- `GET /metrics`: the `vllm:cache_config_info` line, with `enable_prefix_caching` and `block_size`.
- `POST /v1/chat/completions` (non-streaming): the toy's answer to the conversation, whose `usage` has
  `completion_tokens_details` (reasoning tokens) only on a server started with a reasoning parser
  (entrypoints/openai/chat_completion/serving.py).
The toy generation applies the repetition penalty as vllm.py does; presence and frequency penalties it ignores.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes import vllm
from tests.fakes.sglang import toy_chat_ids
from tests.fakes.toy_model import ToyModel, ToyVocabulary

DEFAULTS = web.AppKey("defaults", dict)  # the server's generation_config sampling defaults
PREFIX_CACHE = web.AppKey("prefix_cache", tuple)  # (enabled, block size)
REASONING = web.AppKey("reasoning_parser", bool)  # started with --reasoning-parser
VLLM_DEFAULTS = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
                 "top_p": 1.0, "top_k": 0, "min_p": 0.0}
OMITTED_AT_DEFAULT = ("top_p", "top_k", "min_p")  # fields the captured render leaves out at vLLM's defaults


def _with_defaults(app: web.Application, body: dict[str, Any]) -> dict[str, Any]:
    """The body with the server's defaults in the sampling fields it omits."""
    return {**body, **{name: value for name, value in app[DEFAULTS].items() if body.get(name) is None}}


async def completions(request: web.Request) -> web.Response:
    """/v1/completions: one prompt as the toy vLLM answers it, or one choice per prompt of a list of them."""
    body = await request.json()
    request.app[vllm.SEEN].append(("POST /v1/completions", body))
    prompts = body.get("prompt")
    batch = isinstance(prompts, list) and bool(prompts) and all(isinstance(p, list) for p in prompts)
    try:
        answers = [vllm.completion(request.app, _with_defaults(request.app, {**body, "prompt": prompt}))
                   for prompt in (prompts if batch else [prompts])]
    except vllm.RefusedError as exc:
        return exc.response()
    choices = [{**answer["choices"][0], "index": index} for index, answer in enumerate(answers)]
    usage = {key: sum(answer["usage"][key] for answer in answers)
             for key in ("prompt_tokens", "total_tokens", "completion_tokens")}
    return web.json_response({**answers[0], "choices": choices, "usage": {**answers[0]["usage"], **usage}})


async def render(request: web.Request) -> web.Response:
    """/v1/completions/render: the prompt's ids and the sampling parameters the server would use."""
    body = await request.json()
    request.app[vllm.SEEN].append(("POST /v1/completions/render", body))
    named = _with_defaults(request.app, {name: body.get(name) for name in VLLM_DEFAULTS})
    params = {**VLLM_DEFAULTS, **{name: value for name, value in named.items() if value is not None}}
    params = {name: value for name, value in params.items()
              if not (name in OMITTED_AT_DEFAULT and value == VLLM_DEFAULTS[name])}
    ids = body["prompt"] if isinstance(body["prompt"], list) else ToyVocabulary().tokenize(body["prompt"])
    sampling = {**params, "stop": [], "stop_token_ids": [], "max_tokens": body.get("max_tokens", 16),
                "output_kind": 2, "skip_clone": True, "bad_words": [], "skip_reading_prefix_cache": False}
    return web.json_response([{"request_id": "cmpl-fake", "token_ids": ids, "sampling_params": sampling,
                               "model": body.get("model"), "output_mode": "tokens", "stream": False}])


async def chat_completions(request: web.Request) -> web.Response:
    """/v1/chat/completions: the toy's answer to the rendered conversation, reasoning counted where parsed."""
    body = await request.json()
    request.app[vllm.SEEN].append(("POST /v1/chat/completions", body))
    ids = toy_chat_ids(body["messages"], True)
    answer = vllm.completion(request.app, _with_defaults(request.app, {**body, "prompt": ids}))
    choice = answer["choices"][0]
    usage = {**answer["usage"],
             "completion_tokens_details": {"reasoning_tokens": 0} if request.app[REASONING] else None}
    message = {"role": "assistant", "content": choice["text"], "reasoning": None}
    return web.json_response({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                              "model": answer["model"], "usage": usage,
                              "choices": [{"index": 0, "message": message, "finish_reason": choice["finish_reason"],
                                           "stop_reason": choice["stop_reason"]}]})


async def metrics(request: web.Request) -> web.Response:
    """/metrics: the cache configuration line."""
    enabled, block = request.app[PREFIX_CACHE]
    line = (f'vllm:cache_config_info{{block_size="{block}",cache_dtype="auto",enable_prefix_caching="{enabled}",'
            'engine="0"} 1.0')
    return web.Response(text=f"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n{line}\n")


def scale_out_vllm_app(model: ToyModel, *, sampling_defaults: dict[str, float] | None = None,
                       prefix_caching: bool = True, block_size: int = 128,
                       reasoning_parser: bool = False, processed_logprobs: bool = False) -> web.Application:
    """A toy vLLM with the scale-out endpoints, its generation_config's `sampling_defaults`, its prefix cache,
    whether it has a reasoning parser and whether it answers processed log-probs."""
    app = web.Application()
    app[vllm.SEEN], app[vllm.ADAPTERS], app[vllm.MODEL] = [], (), model
    app[DEFAULTS], app[PREFIX_CACHE] = dict(sampling_defaults or {}), (prefix_caching, block_size)
    app[REASONING], app[vllm.PROCESSED] = reasoning_parser, processed_logprobs
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions/render", render)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", vllm.tokenize)
    app.router.add_get("/v1/models", vllm.models)
    app.router.add_get("/version", vllm.version)
    return app
