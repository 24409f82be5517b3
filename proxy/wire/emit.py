"""Token batches -> text -> an OpenAI JSON body or SSE stream, with in-band errors once bytes are out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.errors import SpeculoosError
from proxy.wire.request import CHAT, GenerationRequest
from proxy.wire.response import SSE_DONE, SSE_HEADERS, ResponseShape, sse_event, usage
from proxy.wire.textstream import TextStream


@dataclass
class GenerationOutcome:
    """What a finished generation produced, for logs and stats."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


async def _open_stream(request: web.Request, shape: ResponseShape, headers: dict[str, str] | None) -> web.StreamResponse:
    """Send the SSE headers and, for chat, the first chunk with the assistant role."""
    response = web.StreamResponse(headers={**SSE_HEADERS, **(headers or {})})
    await response.prepare(request)
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
) -> tuple[web.StreamResponse, GenerationOutcome]:
    """Drive `token_batches` through `stream` and answer in JSON or SSE.

    The first batch is awaited before any byte is sent, so an upstream that is down on the first
    round still gets a proper HTTP error; later failures go in-band as an error event. `extension`,
    if given, is a callable returning a JSON object added as `speculoos` to the usage chunk or body.
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
    except SpeculoosError as exc:
        if response is None:
            raise
        await response.write(sse_event(exc.to_body()))
        await response.write(SSE_DONE)
        return response, GenerationOutcome(stream.text, None, prompt_tokens, stream.completion_tokens)
    finally:
        await token_batches.aclose()  # type: ignore[attr-defined]
    usage_obj = usage(prompt_tokens, stream.completion_tokens)
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
    await response.write(SSE_DONE)
    return response, outcome
