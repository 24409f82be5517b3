"""Whether a generation request speculates, and with what: every reason one passes through, decided in one place."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.admission import RouteSnapshot, passthrough_reason
from proxy.drafting.base import Drafter
from proxy.server import guard
from proxy.server.runtime import RouteRuntime
from proxy.wire.control import RequestControl
from proxy.wire.keys import key_headers
from proxy.wire.request import CHAT, COMPLETION, GenerationRequest
from proxy.wire.tool_stream import ToolCallStream
from proxy.wire.tools import format_problem, parses_tool_calls, prompt_text


@dataclass(frozen=True)
class Admitted:
    """A request that speculates: its prompt as the target tokenizes it, its token budget, its tool-call reader and
    the client's key headers; it holds a draft sequence until the caller releases it."""

    prompt_ids: list[int]
    max_tokens: int
    tools: ToolCallStream | None
    client_headers: dict[str, str] | None


async def admit(request: web.Request, runtime: RouteRuntime, parsed: GenerationRequest, control: RequestControl,
                request_id: str) -> Admitted | str:
    """What the request speculates with, or why it passes through."""
    if (reason := await _route_reason(runtime, parsed, control)) is not None:
        return reason
    drafter, target = runtime.drafter, runtime.target
    assert drafter is not None and target is not None  # a route that lacks either passes through above
    client_headers = key_headers(request.headers) or None  # the client's key, in whichever header it came
    # Tokenized for the model verified against, and a completion's prompt as parsed (a batch of one unwrapped).
    named = {**parsed.body, "model": upstream_model(runtime, parsed)}
    if parsed.kind == COMPLETION:
        named["prompt"] = parsed.prompt
    prompt_ids, context_size = await target.prompt_ids(named, parsed.kind, client_headers)
    max_tokens = parsed.max_tokens_within(len(prompt_ids), context_size, "the upstream's")
    tools = _tool_calls(parsed, drafter, prompt_ids)
    if isinstance(tools, str):  # tools in the prompt, but no call format the proxy reads
        return tools
    # The output may outgrow the draft's context: the model's drafts then stop, and the rest is decoded plainly or
    # drafted by lookups (the loop). Only a prompt the model cannot read at all passes through.
    if not drafter.fits(len(prompt_ids) + runtime.route.speculation.k):
        return "the prompt exceeds the draft's context"
    if not drafter.reserve(request_id, prompt_ids, tenant=guard.tenant(request.headers)):
        return "every draft sequence is in use"
    return Admitted(prompt_ids, max_tokens, tools, client_headers)


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


def _tool_calls(parsed: GenerationRequest, drafter: Drafter, prompt_ids: list[int]) -> ToolCallStream | str | None:
    """The reader of the answer's tool calls when its output is parsed for them, or why the prompt the target
    rendered has no format it reads (the draft's vocabulary is the target's: the tokenizer check)."""
    if parsed.kind != CHAT or not parses_tool_calls(parsed.body):
        return None
    return format_problem(prompt_text(drafter.vocabulary.token_bytes, prompt_ids)) or ToolCallStream()


def upstream_model(runtime: RouteRuntime, parsed: GenerationRequest) -> str:
    """The model the upstream is asked for, as passthrough forwards it: a LoRA adapter is verified as itself."""
    return runtime.route.upstream.model or parsed.model
