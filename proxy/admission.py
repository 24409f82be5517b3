"""Whether a request may be served speculatively: a pure function of the request and the route.

What it cannot decide alone comes after it, in the handler: the tokenizer check (which may need
the upstream) and the route controller's speculate-or-pass decision.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from proxy.config.schema import SpeculationConfig
from proxy.errors import BadRequestError
from proxy.targets.base import Target
from proxy.targets.topn import bound_problem
from proxy.wire.control import RequestControl
from proxy.wire.logprobs import LOGPROB_FIELDS
from proxy.wire.request import GenerationRequest


@dataclass(frozen=True)
class RouteSnapshot:
    """What admission needs to know about a route."""

    speculation: SpeculationConfig
    has_drafter: bool
    target: Target | None  # None: the protocol cannot verify
    vocabulary_size: int | None = None  # the draft's, which the tokenizer check found equal to the target's


def passthrough_reason(route: RouteSnapshot, request: GenerationRequest, control: RequestControl) -> str | None:
    """Why this request must pass through untouched, or None if it may speculate; a 400 for prompt ids outside the
    vocabulary."""
    if not route.has_drafter or route.target is None:
        return "route has no draft model" if not route.has_drafter else "upstream protocol cannot verify"
    if not route.speculation.enabled:
        return "speculation disabled for this route"
    if control.off:
        return "client opted out"
    if control.forced and (refused := forcing_problem(route.speculation.allow_force, route.target)) is not None:
        return refused
    _check_prompt_ids(request, route.vocabulary_size)
    honoured_upstream = route.target.prompt_fields(request.kind) | route.target.sampling_fields
    answered = LOGPROB_FIELDS if request.logprobs is not None else frozenset()  # from the verification answers
    if upstream_only := [name for name in request.unsupported if name not in honoured_upstream | answered]:
        return "parameters only the upstream can honour: " + ", ".join(upstream_only)
    if (prompt := route.target.prompt_problem(request)) is not None:
        return f"cannot tokenize: {prompt}"
    if (server := route.target.answer_problem(request)) is not None:
        return f"server: {server}"
    params, spec = request.sampling_params, route.speculation
    problem = route.target.exactness_problem(params, spec.top_logprobs)
    if problem is not None and spec.sampling == "exact":
        return f"cannot be exact: {problem}"
    if problem is not None and (bounded := bound_problem(params)) is not None:
        return f"cannot be bounded: {bounded}"
    if request.logprobs is not None:
        return route.target.logprobs_problem(params, request.logprobs, spec.top_logprobs)
    return None


def forcing_problem(allow_force: bool | None, target: Target) -> str | None:
    """Why a client may not force rounds on this route (None: it may). Unset, forcing is allowed where a round costs
    the server O(K) tokens or the upstream is this machine: elsewhere one client would make the server re-prefill
    its whole context every round, for everyone."""
    if allow_force is not None:
        return None if allow_force else "forcing refused: speculation.allow_force is false"
    if (cost := target.round_cost()) is None or _loopback(target):
        return None
    return (f"forcing refused: a round costs the whole context here ({cost}); set speculation.allow_force: true "
            "to allow it")


def _loopback(target: Target) -> bool:
    """Whether the target's upstream is on this machine."""
    upstream = getattr(target, "upstream", None)  # a target built around an upstream client (every real one)
    host = upstream.base_url.host if upstream is not None else None
    if host is None:
        return False
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: not known to be this machine
        return False


def _check_prompt_ids(request: GenerationRequest, vocabulary_size: int | None) -> None:
    """A 400 for token ids no model of this vocabulary has (llama.cpp would fail on them)."""
    if vocabulary_size is None or not isinstance(request.prompt, list):
        return
    if outside := [token for token in request.prompt if not 0 <= token < vocabulary_size]:
        raise BadRequestError(f"prompt token id {outside[0]} is outside the vocabulary of {vocabulary_size} tokens",
                              param="prompt")
