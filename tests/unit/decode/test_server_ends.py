"""The target ends the answer: where the server's answers end on an id the draft does not end at, or go on past one
it does, the proxy's generation ends (or goes on) with the server's, in rounds and in plain chunks.

A vLLM round over the prefix cache shows how the server ends after each of its positions; one over prompt
log-probs, or SGLang's, only after its bonus token, so there only plain chunks are sure to show it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from proxy.control.policy import PinnedPolicy
from proxy.decode.events import Publisher
from proxy.decode.loop import speculative_tokens
from proxy.decode.session import RequestRandom, Session
from proxy.targets.base import Target
from proxy.targets.sglang import SGLangTarget
from proxy.targets.stopping import EndEvidence, StopSet
from proxy.targets.upstream import Upstream
from proxy.targets.vllm import VLLMTarget
from tests.fakes import sglang_generate, vllm
from tests.fakes.sglang import fake_sglang_app
from tests.fakes.toy_model import END, ToyModel
from tests.fakes.vllm_scale_out import scale_out_vllm_app
from tests.unit.decode.harness import GREEDY, PROMPT, TOP_N, SwitchAfter, follow
from tests.unit.targets.serving import serving

MAX_TOKENS = 40
# A fake server, its key of the ids it ends at, and the client.
SERVERS: dict[str, tuple[Callable[[ToyModel], Any], Any, Callable[[Upstream], Target]]] = {
    "vllm prefix cache": (scale_out_vllm_app, vllm.ENDS, VLLMTarget),
    "vllm prompt log-probs": (vllm.toy_vllm_app, vllm.ENDS, VLLMTarget),
    "sglang": (fake_sglang_app, sglang_generate.ENDS, SGLangTarget),
}


def continuation(model: ToyModel, n: int) -> list[int]:
    """The model's greedy tokens after PROMPT, past any end."""
    context = list(PROMPT)
    for _ in range(n):
        context.append(int(np.argmax(model.logits(context))))
    return context[len(PROMPT):]


@asynccontextmanager
async def ending_at(model: ToyModel, ends: frozenset[int], name: str) -> AsyncIterator[Target]:
    app, key, client = SERVERS[name]
    served = app(model)
    served[key] = ends
    async with serving(served, client) as target:
        await target.probe()
        yield target


async def generate(model: ToyModel, target: Target, policy: PinnedPolicy, *, learn: bool = True) -> list[int]:
    """A greedy generation whose drafts follow the model; ends as the draft's vocabulary says (the toy's end token),
    and, with `learn`, as the server's answers show."""
    stop = StopSet(frozenset({END}), "the draft's", target.ends_seen if learn else EndEvidence())
    session = Session(request_id="req", route="route", prompt_ids=PROMPT, max_tokens=MAX_TOKENS, params=GREEDY,
                      order=target.order, top_n=TOP_N, policy=policy, random=RequestRandom.from_seed(1),
                      publish=Publisher([policy.observe]), ends=stop.is_end)
    return sum([batch async for batch in speculative_tokens(session, follow(model), target)], [])


POLICIES = {"rounds": lambda: PinnedPolicy(4), "plain chunks": lambda: SwitchAfter(4, rounds=0)}
CASES = [("vllm prefix cache", "rounds"), ("vllm prefix cache", "plain chunks"),
         ("vllm prompt log-probs", "plain chunks"), ("sglang", "plain chunks")]


@pytest.mark.parametrize(("server", "steps"), CASES)
async def test_an_id_only_the_server_ends_at_ends_the_answer(server: str, steps: str) -> None:
    model = ToyModel(seed=1)
    expected = continuation(model, MAX_TOKENS)
    server_end = expected[6]  # first generated inside the second round, a draft position
    assert server_end != END and expected.index(server_end) == 6
    expected = expected[:7]
    async with ending_at(model, frozenset({END, server_end}), server) as target:
        assert await generate(model, target, POLICIES[steps]()) == expected
        assert len(await generate(model, target, POLICIES[steps](), learn=False)) > len(expected)  # the control


@pytest.mark.parametrize(("server", "steps"), CASES)
async def test_an_end_the_server_goes_on_past_does_not_end_the_answer(server: str, steps: str) -> None:
    model = ToyModel(end_after=len(PROMPT) + 12)  # the toy's end token from the 13th token on
    expected = continuation(model, MAX_TOKENS)
    assert expected.index(END) == 12
    async with ending_at(model, frozenset(), server) as target:  # a base model: not its end
        assert await generate(model, target, POLICIES[steps]()) == expected
        assert await generate(model, target, POLICIES[steps](), learn=False) == expected[:13]  # the control
