"""Token batches -> text -> an OpenAI JSON body or SSE stream, with in-band errors once bytes are out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.errors import SpeculoosError
from proxy.wire.errors import end_stream, stream_opened
from proxy.wire.logprobs import LogprobsWriter
from proxy.wire.request import CHAT, GenerationRequest
from proxy.wire.response import SSE_HEADERS, ResponseShape, sse_event, usage
from proxy.wire.textstream import Delta, TextStream
from proxy.wire.tool_stream import ToolCallStream
from proxy.wire.tools import rewrite_body


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
    extension: Any = None,
    usage_details: Callable[[], dict[str, int]] | None = None,
    logprobs: LogprobsWriter | None = None,
    tools: ToolCallStream | None = None,
) -> tuple[web.StreamResponse, GenerationOutcome]:
    """Drive `token_batches` through `stream` and answer in JSON or SSE.

    The first batch is awaited before any byte is sent, so an upstream that is down on the first
    round still gets a proper HTTP error; any later failure goes in-band as an error event. `extension`,
    if given, is a callable returning a JSON object added as `speculoos` to the usage chunk or body;
    `usage_details`, a callable returning the usage's `completion_tokens_details`; `logprobs`, the writer of the
    emitted tokens' log-probs when the client asked for them (each chunk carries those of its tokens); `tools`,
    the reader of a chat answer's tool calls when the request's output is parsed for them (tools.py).
    """
    shape = ResponseShape(parsed.kind, parsed.model, include_usage=parsed.stream and parsed.include_usage)
    response: web.StreamResponse | None = None
    try:
        async for batch in token_batches:
            taken = stream.completion_tokens
            delta = stream.push(batch)
            if logprobs is not None:  # the tokens the stream took (none past the end)
                logprobs.add(batch[: stream.completion_tokens - taken])
            if parsed.stream:
                if response is None:
                    response = await _open_stream(request, shape, headers)
                if delta.text or delta.finish_reason:
                    await _write_chunk(response, shape.chunk(delta.text, delta.finish_reason,
                                                             logprobs=_take(logprobs)), tools, delta)
            if delta.finish_reason:
                break
        else:
            delta = stream.close()
            if parsed.stream and response is not None:
                await _write_chunk(response, shape.chunk(delta.text, delta.finish_reason, logprobs=_take(logprobs)),
                                   tools, delta)
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
        body = shape.full(stream.text, stream.finish_reason, usage_obj, logprobs=_take(logprobs))
        if tools is not None:  # the text read as content and tool calls
            rewrite_body(body, stream.text)
        if extension is not None:
            body["speculoos"] = extension()
        return web.json_response(body, headers=headers), outcome
    if response is None:  # the generator produced nothing at all: still a well-formed stream
        response = await _open_stream(request, shape, headers)
        await response.write(sse_event(shape.chunk("", stream.close().finish_reason, logprobs=_take(logprobs))))
    if parsed.include_usage:
        chunk = shape.usage_chunk(usage_obj)
        if extension is not None:
            chunk["speculoos"] = extension()
        await response.write(sse_event(chunk))
    await end_stream(request)
    return response, outcome


def _take(logprobs: LogprobsWriter | None) -> dict[str, Any] | None:
    """The log-probs of the tokens since the last chunk, if the client asked for them."""
    return logprobs.take() if logprobs is not None else None


async def _write_chunk(response: web.StreamResponse, chunk: dict[str, Any], tools: ToolCallStream | None,
                       delta: Delta) -> None:
    """Send a chunk; with `tools`, its text read as content and tool calls (held back while it may begin a call)."""
    if tools is None or tools.rewrite_chunk(chunk, delta.text, delta.finish_reason):
        await response.write(sse_event(chunk))
