"""Token batches -> text -> an OpenAI JSON body or SSE stream, with in-band errors once bytes are out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.errors import SpeculoosError
from proxy.wire.errors import end_stream, stream_opened
from proxy.wire.request import CHAT, GenerationRequest
from proxy.wire.response import SSE_HEADERS, ResponseShape, sse_event, usage
from proxy.wire.textstream import TextStream


@dataclass
class GenerationOutcome:
    """What a finished generation produced, for logs and stats."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None  # what ended a stream in-band, if anything did


async def _open_stream(request: web.Request, shape: ResponseShape, headers: dict[str, str] | None) -> web.StreamResponse:
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
    extension: Any = None,
    usage_details: Callable[[], dict[str, int]] | None = None,
) -> tuple[web.StreamResponse, GenerationOutcome]:
    """Drive `token_batches` through `stream` and answer in JSON or SSE.

    The first batch is awaited before any byte is sent, so an upstream that is down on the first
    round still gets a proper HTTP error; any later failure goes in-band as an error event. `extension`,
    if given, is a callable returning a JSON object added as `speculoos` to the usage chunk or body;
    `usage_details`, a callable returning the usage's `completion_tokens_details`.
    """
    shape = ResponseShape(parsed.kind, parsed.model, include_usage=parsed.stream and parsed.include_usage)
    response: web.StreamResponse | None = None
    try:
        async for batch in token_batches:
            delta = stream.push(batch)
            if parsed.stream:
                if response is None:
                    response = await _open_stream(request, shape, headers)
                if delta.text or delta.finish_reason:
                    await response.write(sse_event(shape.chunk(delta.text, delta.finish_reason)))
            if delta.finish_reason:
                break
        else:
            delta = stream.close()
            if parsed.stream and response is not None:
                await response.write(sse_event(shape.chunk(delta.text, delta.finish_reason)))
    except Exception as exc:
        if response is None or isinstance(exc, ConnectionError):
            raise  # no byte out yet: a real HTTP error; or the client went away
        await end_stream(request, exc)
        error = exc.message if isinstance(exc, SpeculoosError) else type(exc).__name__
        return response, GenerationOutcome(stream.text, None, prompt_tokens, stream.completion_tokens, error)
    finally:
        await token_batches.aclose()  # type: ignore[attr-defined]
    usage_obj = usage(prompt_tokens, stream.completion_tokens, usage_details() if usage_details else None)
    outcome = GenerationOutcome(stream.text, stream.finish_reason, prompt_tokens, stream.completion_tokens)
    if not parsed.stream:
        body = shape.full(stream.text, stream.finish_reason, usage_obj)
        if extension is not None:
            body["speculoos"] = extension()
        return web.json_response(body, headers=headers), outcome
    if response is None:  # the generator produced nothing at all: still a well-formed stream
        response = await _open_stream(request, shape, headers)
        await response.write(sse_event(shape.chunk("", stream.close().finish_reason)))
    if parsed.include_usage:
        chunk = shape.usage_chunk(usage_obj)
        if extension is not None:
            chunk["speculoos"] = extension()
        await response.write(sse_event(chunk))
    await end_stream(request)
    return response, outcome
