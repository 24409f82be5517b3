"""A generation request's way in: parsed, routed, then admitted to speculation or passed through, every reason one
passes through decided here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.admission import RouteSnapshot, passthrough_reason
from proxy.errors import BadRequestError
from proxy.server.runtime import RouteRuntime, no_route, route_of
from proxy.wire.control import RequestControl, request_control
from proxy.wire.json_body import parse_body
from proxy.wire.keys import key_headers, tenant
from proxy.wire.request import CHAT, COMPLETION, GenerationRequest, parse_generation_request
from proxy.wire.tool_stream import ToolCallStream
from proxy.wire.tools import format_problem, parses_tool_calls, prompt_text

UNPARSED = "fields the proxy does not read: the server judges them"


@dataclass(frozen=True)
class Routed:
    """A generation request and the route that serves it."""

    runtime: RouteRuntime
    raw: bytes
    body: dict[str, Any]  # as the client sent it
    parsed: GenerationRequest | None  # None: a body only the server can judge, forwarded untouched
    control: RequestControl | None
    tenant: str  # whose outputs it may draft from
    client_headers: dict[str, str] | None  # the client's key, in whichever header it came

    @property
    def stream(self) -> bool:
        """Whether the client asked for a stream."""
        return self.parsed.stream if self.parsed is not None else self.body.get("stream") is True


@dataclass(frozen=True)
class Admitted:
    """A request that speculates: its prompt as the target tokenizes it, its token budget, its tool-call reader and
    the client's key headers; it holds a draft sequence until the caller releases it."""

    parsed: GenerationRequest
    control: RequestControl
    prompt_ids: list[int]
    max_tokens: int
    tools: ToolCallStream | None
    client_headers: dict[str, str] | None


async def route_request(request: web.Request, kind: str, raw: bytes) -> Routed:
    """The request parsed and routed (a 400 or 404 if it cannot be): sampled as its server would sample it, with the
    server's defaults in the fields it left out; a body the proxy refuses goes untouched where its route would
    forward it as it is anyway."""
    client_headers, client_tenant = key_headers(request.headers) or None, tenant(request.headers)
    body = await parse_body(raw)
    model = body.get("model") if isinstance(body, dict) else None
    runtime = route_of(request, model) if isinstance(model, str) else None
    try:
        parsed = parse_generation_request(body, kind)  # type: ignore[arg-type]
    except BadRequestError:
        # Forwarded untouched where its route would forward it as it is anyway: the server judges its fields.
        if runtime is None or (runtime.speculates and runtime.route.speculation.enabled
                               and not request_control(request.headers, body).off):
            raise
        return Routed(runtime, raw, body, None, None, client_tenant, client_headers)
    control = request_control(request.headers, body)
    if runtime is None:
        raise no_route(request, parsed.model)
    if runtime.target is not None:
        parsed = runtime.target.with_defaults(parsed)
    return Routed(runtime, raw, body, parsed, control, client_tenant, client_headers)


async def admit(routed: Routed, request_id: str) -> Admitted | str:
    """What the request speculates with, or why it passes through."""
    runtime, parsed, control = routed.runtime, routed.parsed, routed.control
    if parsed is None or control is None:
        return UNPARSED
    if (reason := await _route_reason(runtime, parsed, control)) is not None:
        return reason
    drafter, target = runtime.drafter, runtime.target
    assert drafter is not None and target is not None  # a route that lacks either passes through above
    client_headers = routed.client_headers
    # Tokenized for the model verified against, and a completion's prompt as parsed (a batch of one unwrapped).
    named = {**parsed.body, "model": upstream_model(runtime, parsed)}
    if parsed.kind == COMPLETION:
        named["prompt"] = parsed.prompt
    prompt_ids, context_size = await target.prompt_ids(named, parsed.kind, client_headers)
    max_tokens = parsed.max_tokens_within(len(prompt_ids), context_size, "the upstream's")
    tools = None
    if parsed.kind == CHAT and parses_tool_calls(parsed.body):  # the answer's tool calls are read from its text
        # The prompt as the target rendered it shows the call format (the draft's vocabulary is the target's).
        if (unread := format_problem(prompt_text(drafter.vocabulary.token_bytes, prompt_ids))) is not None:
            return unread
        tools = ToolCallStream()
    # The output may outgrow the draft's context: the model's drafts then stop, and the rest is decoded plainly or
    # drafted by lookups (the loop). Only a prompt the model cannot read at all passes through.
    if not drafter.fits(len(prompt_ids) + runtime.route.speculation.k):
        return "the prompt exceeds the draft's context"
    if not drafter.reserve(request_id, prompt_ids, tenant=routed.tenant):
        return "every draft sequence is in use"
    return Admitted(parsed, control, prompt_ids, max_tokens, tools, client_headers)


async def _route_reason(runtime: RouteRuntime, parsed: GenerationRequest, control: RequestControl) -> str | None:
    """Why the route does not speculate this request, from what it knows before asking the target anything."""
    snapshot = RouteSnapshot(runtime.route.speculation, runtime.drafter is not None, runtime.target,
                             runtime.drafter.vocabulary.n_vocab if runtime.drafter is not None else None)
    if (reason := passthrough_reason(snapshot, parsed, control)) is not None:
        return reason
    if (mismatch := await runtime.tokenizer_problem()) is not None:
        return mismatch
    if control.forced or parsed.prediction:
        return None  # a prediction drafts as lookups do, at their cost: the request decides round by round
    speculate, why = runtime.controller.start_request()
    return None if speculate else f"controller: {why}"


def upstream_model(runtime: RouteRuntime, parsed: GenerationRequest) -> str:
    """The model the upstream is asked for, as passthrough forwards it: a LoRA adapter is verified as itself."""
    return runtime.route.upstream.model or parsed.model
