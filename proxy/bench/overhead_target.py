"""`bench overhead`'s target: a stock SGLang in its shapes, with a chosen acceptance, asleep for a GPU's step time.

The shapes are those of the project's fake SGLang for tests (current release: a null entry first at any
logprob_start_len; tokenize at /v1/tokenize; the context length as /v1/models' max_model_len). It
tokenizes with the draft's own vocabulary, so the proxy's tokenizer check passes, and takes no chat
messages (the bench sends completions; chat prompts then pass through, as on an SGLang that cannot
render them). A verification's top entry at each draft position is the draft token with probability
`acceptance`, else another token of the context; the bonus and plain tokens continue the context as a
copy would. Everything but the choice of tokens is rendered once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

TOP_PROBABILITY = 0.8  # the top entry's probability at every position
TAIL_FIRST, TAIL_RATIO = 0.08, 0.6  # the other entries': geometric, the whole row summing just under 1
ABSENT_LOGPROB = math.log(1e-4)  # a scored draft token outside the top entries
COPY_ANCHOR = 2  # tokens of the context's tail a copy continues from (the last two)
SERVED_NAME = "overhead-fake"
VERSION = "0.5.23"  # the release whose shapes it answers in


def row_logprobs(top_n: int) -> list[float]:
    """The log-probs of a top-N row, best first (the same at every position)."""
    probs = [TOP_PROBABILITY] + [TAIL_FIRST * TAIL_RATIO ** j for j in range(top_n - 1)]
    return [math.log(p) for p in probs]


@dataclass
class FakeState:
    """The fake's settings and its one random stream (the bench is seeded)."""

    acceptance: float
    vocab_size: int
    rng: np.random.Generator
    tokenize: Callable[[str, bool], list[int]]
    context_length: int
    step_seconds: float = 0.0  # a step's wall time, asleep (no CPU): a verification costs one, a plain token one


def _other(pool: Sequence[int], avoid: int, rng: np.random.Generator, vocab_size: int) -> int:
    """A token of the context other than `avoid` (any other id when the context holds none)."""
    for _ in range(4):
        token = int(pool[int(rng.integers(len(pool)))])
        if token != avoid:
            return token
    return (avoid + 1 + int(rng.integers(vocab_size - 1))) % vocab_size


def _row(top: int, second: int | None, top_n: int, logprobs: list[float], rng: np.random.Generator,
         vocab_size: int) -> list[list[Any]]:
    """A top-N row: `top` first, `second` next when given, then distinct ids drawn from the vocabulary."""
    chosen = [top] if second is None else [top, second]
    taken = set(chosen)
    while len(chosen) < top_n:
        for token in rng.integers(vocab_size, size=top_n).tolist():
            if token not in taken and len(chosen) < top_n:
                taken.add(token)
                chosen.append(token)
    return [[logprobs[i], token, None] for i, token in enumerate(chosen)]


def copy_next(ids: Sequence[int], n: int, rng: np.random.Generator, vocab_size: int) -> list[int]:
    """The n tokens that follow the latest earlier occurrence of the context's tail (a copy), else context tokens."""
    if len(ids) > COPY_ANCHOR:
        last, before = ids[-1], ids[-2]
        for end in range(len(ids) - 2, 0, -1):  # ids[end - 1:end + 1] is an earlier occurrence of the tail
            if ids[end] == last and ids[end - 1] == before:
                follow = list(ids[end + 1:end + 1 + n])
                if len(follow) == n:
                    return follow
    return [_other(ids, -1, rng, vocab_size) for _ in range(n)]


def verification_answer(ids: Sequence[int], start: int, top_n: int, state: FakeState) -> dict[str, Any]:
    """/generate's answer scoring ids[start + 1:] as drafts (top-N rows when top_n > 0) and one bonus token."""
    logprobs = row_logprobs(max(top_n, 1))
    actual: list[list[Any]] = [[None, ids[start], None]]
    tops: list[Any] = [None]
    for draft in ids[start + 1:]:
        if state.rng.random() < state.acceptance:
            actual.append([logprobs[0], draft, None])
            tops.append(_row(draft, None, top_n, logprobs, state.rng, state.vocab_size) if top_n else None)
        else:
            other = _other(ids, draft, state.rng, state.vocab_size)
            actual.append([logprobs[1] if top_n > 1 else ABSENT_LOGPROB, draft, None])
            tops.append(_row(other, draft if top_n > 1 else None, top_n, logprobs, state.rng, state.vocab_size)
                        if top_n else None)
    bonus = copy_next(ids, 1, state.rng, state.vocab_size)[0]
    meta: dict[str, Any] = {"id": "fake", "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": start,
                            "finish_reason": {"type": "length", "length": 1}, "input_token_logprobs": actual,
                            "output_token_logprobs": [[logprobs[0], bonus, None]]}
    if top_n:
        meta["input_top_logprobs"] = tops
        meta["output_top_logprobs"] = [_row(bonus, None, top_n, logprobs, state.rng, state.vocab_size)]
    return {"text": "", "output_ids": [bonus], "meta_info": meta}


def plain_answer(ids: Sequence[int], n: int, state: FakeState) -> dict[str, Any]:
    """/generate's answer to plain decoding: n tokens continuing the context as a copy."""
    output = copy_next(ids, n, state.rng, state.vocab_size) if n else []
    meta = {"id": "fake", "prompt_tokens": len(ids), "completion_tokens": n, "cached_tokens": len(ids) - 1,
            "finish_reason": {"type": "length", "length": n}}
    return {"text": "", "output_ids": output, "meta_info": meta}


STATE = web.AppKey("state", FakeState)


async def _generate(request: web.Request) -> web.Response:
    body, state = await request.json(), request.app[STATE]
    ids = body["input_ids"]
    if body.get("return_logprob"):
        start = body.get("logprob_start_len")
        start = len(ids) - 1 if start in (None, -1) else int(start)
        await asyncio.sleep(state.step_seconds)
        return web.json_response(verification_answer(ids, start, int(body.get("top_logprobs_num") or 0), state))
    n = int(body["sampling_params"].get("max_new_tokens", 128))
    await asyncio.sleep(state.step_seconds * n)
    return web.json_response(plain_answer(ids, n, state))


async def _tokenize(request: web.Request) -> web.Response:
    body, state = await request.json(), request.app[STATE]
    if not isinstance(body.get("prompt"), str):
        return web.json_response({"object": "error", "message": "this fake tokenizes one prompt string",
                                  "type": "Bad Request", "param": None, "code": 400}, status=400)
    tokens = state.tokenize(body["prompt"], bool(body.get("add_special_tokens", True)))
    return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": state.context_length})


async def _model_info(_: web.Request) -> web.Response:
    return web.json_response({"model_path": SERVED_NAME, "tokenizer_path": SERVED_NAME, "is_generation": True})


async def _server_info(request: web.Request) -> web.Response:
    return web.json_response({"model_path": SERVED_NAME, "context_length": request.app[STATE].context_length,
                              "enable_deterministic_inference": False, "version": VERSION})


async def _models(request: web.Request) -> web.Response:
    card = {"id": SERVED_NAME, "object": "model", "created": 0, "owned_by": "sglang",
            "max_model_len": request.app[STATE].context_length}
    return web.json_response({"object": "list", "data": [card]})


def fake_target_app(state: FakeState) -> web.Application:
    """The fake's routes: /generate, tokenize, and the info paths the proxy probes."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app.router.add_post("/generate", _generate)
    app.router.add_post("/v1/tokenize", _tokenize)
    app.router.add_get("/model_info", _model_info)
    app.router.add_get("/server_info", _server_info)
    app.router.add_get("/v1/models", _models)
    return app
