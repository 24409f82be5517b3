"""proxy/admission.py: who may force rounds, and requests the server would sample under its own defaults."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from proxy.admission import RouteSnapshot, forcing_problem, passthrough_reason
from proxy.config.speculation import SpeculationConfig
from proxy.sampling.processors import SamplingParams
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
PROCESSED = replace(QWEN, processed_logprobs=True)  # started with --logprobs-mode processed_logprobs
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
    """Why the request passes through, judged as the handler judges it: with the server's defaults filled in."""
    route = RouteSnapshot(SpeculationConfig(allow_force=allow_force), True, target, vocabulary_size=100)
    return passthrough_reason(route, target.with_defaults(parse_generation_request(body, CHAT)), control)


@pytest.mark.parametrize("control", [RequestControl(forced=True), RequestControl(forced=True, pinned_k=4)],
                         ids=["on", "k=4"])
async def test_a_forced_request_on_a_costly_route_passes_through(upstreams: dict, control: RequestControl) -> None:
    target = vllm(upstreams, REMOTE, O_CONTEXT)
    assert (reason(target, GREEDY_CHAT, control) or "").startswith("forcing refused")
    assert reason(target, GREEDY_CHAT, RequestControl()) is None  # the controller decides unforced ones
    assert reason(target, GREEDY_CHAT, control, allow_force=True) is None


PENALISED = "cannot be exact: the server applies repetition_penalty after the raw log-probs it answers"


@pytest.mark.parametrize(("info", "body", "passes"), [
    (QWEN, GREEDY_CHAT, None),  # repetition_penalty 1.05 at temperature 0: vLLM's own choice after each prefix
    (QWEN, {**GREEDY_CHAT, "repetition_penalty": 1.3}, None),  # named, likewise
    (QWEN, {**GREEDY_CHAT, "repetition_penalty": 1.0}, None),
    (QWEN, {**GREEDY_CHAT, "temperature": 0.7, "repetition_penalty": 1}, None),  # top_p 0.8, top_k 20 followed
    (QWEN, {**GREEDY_CHAT, "temperature": None}, f"{PENALISED}: rounds follow it at temperature 0 only"),
    (QWEN, {**GREEDY_CHAT, "temperature": 0.7}, f"{PENALISED}: rounds follow it at temperature 0 only"),
    (PROCESSED, {**GREEDY_CHAT, "temperature": None}, None),  # vLLM answers the distribution it samples from
    (PROCESSED, {**GREEDY_CHAT, "temperature": None, "top_k": 50},
     "cannot be exact: a penalised distribution is known whole from the top 20 only with top_k in 1..20"),
    (PROCESSED, {**GREEDY_CHAT, "temperature": 0.7, "repetition_penalty": 1, "logprobs": True},
     "the server answers processed log-probs"),
    (QWEN, {**GREEDY_CHAT, "logprobs": True}, "log-probs under a repetition penalty"),
    (replace(QWEN, prefix_cache=PrefixCache(False, 128)), GREEDY_CHAT,
     f"{PENALISED}: rounds follow it over the prefix cache only"),
    (replace(QWEN, sampling_defaults=(*(QWEN.sampling_defaults or ()), ("presence_penalty", 0.5))), GREEDY_CHAT,
     "server: the server's generation_config applies presence_penalty 0.5 to a request that leaves it out"),
])
async def test_requests_speculate_as_the_server_would_sample_them(upstreams: dict, info: VLLMInfo, body: dict,
                                                                  passes: str | None) -> None:
    why = reason(vllm(upstreams, LOOPBACK, info), body, RequestControl())
    assert (why is None) == (passes is None) and (why or "").startswith(passes or ""), why


async def test_a_request_takes_the_servers_defaults_for_the_fields_it_omits(upstreams: dict) -> None:
    target = vllm(upstreams, LOOPBACK, QWEN)
    omitted = target.with_defaults(parse_generation_request({**GREEDY_CHAT, "temperature": None}, CHAT))
    assert omitted.sampling_params == SamplingParams(0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
    named = target.with_defaults(parse_generation_request({**GREEDY_CHAT, "top_k": 5, "repetition_penalty": 1}, CHAT))
    assert named.sampling_params == SamplingParams(0.0, top_k=5, top_p=0.8, repetition_penalty=1.0)
    assert vllm(upstreams, LOOPBACK, O_K).with_defaults(omitted) == omitted  # no defaults read: as it is
