"""Token batches -> text -> an OpenAI JSON body or SSE stream (chunks, usage, whole bodies), with in-band errors
once bytes are out."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.errors import SpeculoosError
from proxy.wire.errors import end_stream, sse_stream, stream_opened
from proxy.wire.request import CHAT, GenerationRequest
from proxy.wire.response import SSE_HEADERS, sse_event
from proxy.wire.shapers import ResponseShaper
from proxy.wire.textstream import Delta, TextStream


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """OpenAI usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ResponseShape:
    """Builds the chunks and the final body for one response."""

    def __init__(self, kind: str, model: str, *, include_usage: bool = False) -> None:
        self.kind = kind
        self.model = model
        self.include_usage = include_usage
        prefix = "chatcmpl" if kind == CHAT else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            body["usage"] = None  # every chunk but the last carries usage: null (OpenAI)
        return body

    def chunk(self, text: str | None, finish_reason: str | None, *, role: bool = False) -> dict[str, Any]:
        """One streaming chunk (its log-probs null until a shaper sets them)."""
        if self.kind == CHAT:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            choice = {"index": 0, "delta": delta if text is not None or role else {}, "logprobs": None,
                      "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, usage_obj: dict[str, Any]) -> dict[str, Any]:
        """The final stream_options.include_usage chunk: no choices."""
        body = self._envelope("chat.completion.chunk" if self.kind == CHAT else "text_completion", [])
        body["usage"] = usage_obj
        return body

    def full(self, text: str, finish_reason: str | None, usage_obj: dict[str, Any]) -> dict[str, Any]:
        """The non-streaming response body (its log-probs null until a shaper sets them)."""
        if self.kind == CHAT:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage_obj
        return body


@dataclass
class GenerationOutcome:
    """What a finished generation produced, for logs and stats."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None  # what ended a stream in-band, if anything did


async def _open_stream(request: web.Request, shape: ResponseShape,
                       headers: dict[str, str] | None) -> web.StreamResponse:
    """Send the SSE headers and, for chat, the first chunk with the assistant role."""
    response = web.StreamResponse(headers={**SSE_HEADERS, **(headers or {})})
    await response.prepare(request)
    stream_opened(request, response)
    if shape.kind == CHAT:
        await response.write(sse_event(shape.chunk(None, None, role=True)))
    return response


async def write_generation(
    request: web.Request,
    parsed: GenerationRequest,
    token_batches: AsyncIterator[Sequence[int]],
    stream: TextStream,
    prompt_tokens: int,
    *,
    headers: dict[str, str] | None = None,
    shapers: Sequence[ResponseShaper] = (),
) -> tuple[web.StreamResponse, GenerationOutcome]:
    """Drive `token_batches` through `stream` and answer in JSON or SSE, each chunk, body and usage shaped by
    `shapers` in order (proxy/wire/shapers.py).

    The first batch is awaited before any byte is sent, so an upstream that is down on the first
    round still gets a proper HTTP error; any later failure goes in-band as an error event.
    """
    shape = ResponseShape(parsed.kind, parsed.model, include_usage=parsed.stream and parsed.include_usage)
    try:
        return await _write(request, parsed, token_batches, stream, prompt_tokens, shape, headers, shapers)
    except Exception as exc:
        response = sse_stream(request)
        if response is None or isinstance(exc, ConnectionError):
            raise  # no byte out yet: a real HTTP error; or the client went away
        await end_stream(request, exc)
        error = exc.message if isinstance(exc, SpeculoosError) else type(exc).__name__
        return response, GenerationOutcome(stream.text, None, prompt_tokens, stream.completion_tokens, error)
    finally:
        await token_batches.aclose()  # type: ignore[attr-defined]


async def _write(request: web.Request, parsed: GenerationRequest, token_batches: AsyncIterator[Sequence[int]],
                 stream: TextStream, prompt_tokens: int, shape: ResponseShape, headers: dict[str, str] | None,
                 shapers: Sequence[ResponseShaper]) -> tuple[web.StreamResponse, GenerationOutcome]:
    """The answer: chunks as the batches come (a stream), or one body at their end."""
    response: web.StreamResponse | None = None
    async for batch in token_batches:
        taken = stream.completion_tokens
        delta = stream.push(batch)
        for shaper in shapers:  # the tokens the stream took (none past the end)
            shaper.add(batch[: stream.completion_tokens - taken])
        if parsed.stream:
            if response is None:
                response = await _open_stream(request, shape, headers)
            if delta.text or delta.finish_reason:
                await _write_chunk(response, shape, shapers, delta)
        if delta.finish_reason:
            break
    else:
        delta = stream.close()
        if parsed.stream and response is not None:
            await _write_chunk(response, shape, shapers, delta)
    usage_obj = usage(prompt_tokens, stream.completion_tokens)
    outcome = GenerationOutcome(stream.text, stream.finish_reason, prompt_tokens, stream.completion_tokens)
    if not parsed.stream:
        body = shape.full(stream.text, stream.finish_reason, usage_obj)
        for shaper in shapers:
            shaper.shape_body(body, stream.text)
        for shaper in shapers:
            shaper.shape_usage(usage_obj, body)
        return web.json_response(body, headers=headers), outcome
    if response is None:  # the generator produced nothing at all: still a well-formed stream
        response = await _open_stream(request, shape, headers)
        await _write_chunk(response, shape, shapers, stream.close())
    if parsed.include_usage:
        chunk = shape.usage_chunk(usage_obj)
        for shaper in shapers:
            shaper.shape_usage(usage_obj, chunk)
        await response.write(sse_event(chunk))
    await end_stream(request)
    return response, outcome


async def _write_chunk(response: web.StreamResponse, shape: ResponseShape, shapers: Sequence[ResponseShaper],
                       delta: Delta) -> None:
    """Send the chunk of `delta`, as the shapers leave it (one may hold it back: a tail that may begin a tool call)."""
    chunk = shape.chunk(delta.text, delta.finish_reason)
    sends = [shaper.shape_chunk(chunk, delta.text, delta.finish_reason) for shaper in shapers]  # each one sees it
    if all(sends):
        await response.write(sse_event(chunk))
