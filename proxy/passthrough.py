"""Forward a request to the upstream untouched, streaming the answer back byte for byte."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from proxy.errors import UpstreamError
from proxy.openai_wire import SSE_DONE, sse_event
from proxy.upstream import Upstream, iter_body

# Hop-by-hop headers (RFC 9110 §7.6.1) and those aiohttp sets itself are not forwarded.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers minus the hop-by-hop ones."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


async def forward(request: web.Request, upstream: Upstream, *, body: bytes | None = None,
                  extra_headers: dict[str, str] | None = None) -> web.StreamResponse:
    """Send the request on as it came (or with `body` instead) and stream the answer back."""
    headers = forwardable(request.headers)
    headers.update(upstream.auth_headers(headers))
    data = body if body is not None else await request.read()
    answer = await upstream.open(request.method, request.rel_url.raw_path_qs, headers=headers, data=data)
    async with answer:
        response_headers = forwardable(answer.headers)
        response_headers.update(extra_headers or {})
        response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=response_headers)
        if "Content-Length" in answer.headers:
            response.content_length = int(answer.headers["Content-Length"])
        await response.prepare(request)
        try:
            async for chunk in iter_body(answer):
                await response.write(chunk)
        except UpstreamError as exc:
            # Bytes already reached the client: report in-band where the format allows it.
            if answer.content_type == "text/event-stream":
                await response.write(sse_event(exc.to_body()))
                await response.write(SSE_DONE)
            else:
                raise ConnectionResetError("upstream failed mid-body") from exc
        await response.write_eof()
    return response
