"""proxy/admission.py: who may force rounds, and requests the server would sample under its own defaults."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.admission import RouteSnapshot, forcing_problem, passthrough_reason
from proxy.config.speculation import SpeculationConfig
from proxy.targets.sglang import SGLangTarget
from proxy.targets.upstream import Timeouts, Upstream
from proxy.targets.vllm import VLLMTarget
from proxy.targets.vllm_probe import PrefixCache, VLLMInfo
from proxy.wire.control import RequestControl
from proxy.wire.request import CHAT, parse_generation_request

LOOPBACK, REMOTE = "http://127.0.0.1:9", "http://vllm.internal:8000"
O_K = VLLMInfo("0.32.0", "m", 4096, 20, PrefixCache(True, 128))  # rounds read the prefix cache
O_CONTEXT = VLLMInfo("0.32.0", "m", 4096, 20, PrefixCache(False, 128))  # rounds re-prefill the context
QWEN = VLLMInfo("0.32.0", "m", 4096, 20, PrefixCache(True, 128), (
    ("temperature", 0.7), ("top_p", 0.8), ("top_k", 20.0), ("min_p", 0.0), ("repetition_penalty", 1.05),
    ("presence_penalty", 0.0), ("frequency_penalty", 0.0)), "/v1/completions/render")
GREEDY_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


@pytest.fixture
async def upstreams() -> AsyncIterator[dict[str, Upstream]]:
    """A loopback and a remote upstream, never contacted."""
    made = {url: Upstream(url, Timeouts(1.0, 1.0, 1.0)) for url in (LOOPBACK, REMOTE)}
    yield made
    for upstream in made.values():
        await upstream.close()


def vllm(upstreams: dict[str, Upstream], url: str, info: VLLMInfo | None) -> VLLMTarget:
    target = VLLMTarget(upstreams[url], "m")
    target.info = info
    return target


@pytest.mark.parametrize(("allow_force", "url", "info", "refused"), [
    (None, REMOTE, O_CONTEXT, "a round costs the whole context"),  # the default guards a shared server
    (None, REMOTE, None, "a round costs the whole context"),  # not probed yet: prompt log-probs rounds
    (None, LOOPBACK, O_CONTEXT, None),  # this machine's own server
    (None, REMOTE, O_K, None),  # rounds cost K + 1 tokens
    (True, REMOTE, O_CONTEXT, None),
    (False, LOOPBACK, O_K, "speculation.allow_force is false"),
])
async def test_who_may_force_rounds(upstreams: dict, allow_force: bool | None, url: str, info: VLLMInfo | None,
                                    refused: str | None) -> None:
    problem = forcing_problem(allow_force, vllm(upstreams, url, info))
    assert (problem is None) == (refused is None) and (refused or "") in (problem or "")


async def test_sglangs_rounds_read_its_cache(upstreams: dict) -> None:
    assert forcing_problem(None, SGLangTarget(upstreams[REMOTE])) is None


def reason(target: Any, body: dict[str, Any], control: RequestControl, allow_force: bool | None = None) -> str | None:
    route = RouteSnapshot(SpeculationConfig(allow_force=allow_force), True, target, vocabulary_size=100)
    return passthrough_reason(route, parse_generation_request(body, CHAT), control)  # type: ignore[arg-type]


@pytest.mark.parametrize("control", [RequestControl(forced=True), RequestControl(forced=True, pinned_k=4)],
                         ids=["on", "k=4"])
async def test_a_forced_request_on_a_costly_route_passes_through(upstreams: dict, control: RequestControl) -> None:
    target = vllm(upstreams, REMOTE, O_CONTEXT)
    assert (reason(target, GREEDY_CHAT, control) or "").startswith("forcing refused")
    assert reason(target, GREEDY_CHAT, RequestControl()) is None  # the controller decides unforced ones
    assert reason(target, GREEDY_CHAT, control, allow_force=True) is None


@pytest.mark.parametrize(("body", "speculates"), [
    (GREEDY_CHAT, False),  # the server would apply repetition_penalty 1.05
    ({**GREEDY_CHAT, "repetition_penalty": 1.0}, True),
    ({**GREEDY_CHAT, "temperature": 0.7, "repetition_penalty": 1}, False),  # top_p 0.8 and top_k 20 would apply
    ({**GREEDY_CHAT, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1}, True),
])
async def test_requests_the_server_would_sample_otherwise_pass_through(upstreams: dict, body: dict,
                                                                      speculates: bool) -> None:
    why = reason(vllm(upstreams, LOOPBACK, QWEN), body, RequestControl())
    assert (why is None) == speculates, why
    assert speculates or (why or "").startswith("server defaults: the server's generation_config applies")
