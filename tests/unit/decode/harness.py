"""What the round loop's tests share: fake servers of a toy model behind the real target clients, and drafters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from proxy.control.policy import PinnedPolicy
from proxy.decode.decision import Decision, Plain, Speculate
from proxy.decode.events import Event, Publisher, RoundEvent
from proxy.decode.loop import speculative_tokens
from proxy.decode.session import RequestRandom, Session
from proxy.drafting.base import Drafter
from proxy.sampling.processors import SamplingParams
from proxy.targets.base import Target
from proxy.targets.sglang import SGLangTarget
from proxy.targets.upstream import Upstream
from proxy.targets.vllm import VLLMTarget
from tests import chi_square
from tests.fakes import sglang, vllm
from tests.fakes.drafter import ScriptedDrafter
from tests.fakes.toy_model import ToyModel

PROMPT = [3, 5, 7, 11]
GREEDY = SamplingParams(temperature=0.0)
TOP_N = 5  # each session's top-N


@dataclass(frozen=True)
class Protocol:
    """One target protocol: its fake server, its client, and where its requests carry what these tests check."""

    app: Callable[[ToyModel], Any]
    seen: Any  # the fake's AppKey of ("METHOD /path", body) records
    client: Callable[[Upstream], Target]
    path: str  # the generation endpoint
    scores: Callable[[dict], bool]  # a verification request, not plain decoding
    input_ids: Callable[[dict], list[int]]
    new_tokens: Callable[[dict], int]  # how many tokens a plain-decoding request asks for
    verification_fields: dict[str, Any]  # what every verification request sends


PROTOCOLS = {
    "sglang": Protocol(
        sglang.fake_sglang_app, sglang.SEEN, SGLangTarget, "POST /generate",
        scores=lambda body: bool(body.get("return_logprob")),
        input_ids=lambda body: body["input_ids"],
        new_tokens=lambda body: body["sampling_params"]["max_new_tokens"],
        verification_fields={"top_logprobs_num": TOP_N, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}),
    "vllm": Protocol(
        vllm.toy_vllm_app, vllm.SEEN, VLLMTarget, "POST /v1/completions",
        scores=lambda body: "prompt_logprobs" in body,
        input_ids=lambda body: body["prompt"],
        new_tokens=lambda body: body["max_tokens"],
        verification_fields={"prompt_logprobs": TOP_N, "logprobs": TOP_N, "max_tokens": 1, "temperature": 0.0}),
}


@dataclass
class Served:
    """A fake server, the target client talking to it, and the toy model behind it."""

    protocol: Protocol
    target: Target
    model: ToyModel
    seen: list  # ("METHOD /path", body) per request

    def bodies(self, *, scoring: bool) -> list[dict]:
        """The generation requests: verification rounds, or plain decoding."""
        return [body for path, body in self.seen
                if path == self.protocol.path and self.protocol.scores(body) == scoring]


class SwitchAfter(PinnedPolicy):
    """A policy that drafts k for `rounds` rounds, then switches to plain decoding."""

    def __init__(self, k: int, rounds: int) -> None:
        super().__init__(k)
        self.k, self.rounds, self.seen = k, rounds, 0

    def decide(self) -> Decision:
        return Speculate(self.k, "scripted") if self.seen < self.rounds else Plain("scripted switch")

    def observe(self, event: Event) -> None:
        self.seen += isinstance(event, RoundEvent)


async def run(served: Served, drafter: Drafter, max_tokens: int, *, k: int = 4, policy=None,
              params: SamplingParams = GREEDY, seed: int | None = 1, lookup_k: int = 0,
              pipeline: bool = False, warm_up: bool = False,
              target: Target | None = None) -> tuple[list[list[int]], list[Event]]:
    events: list[Event] = []
    policy = policy or PinnedPolicy(k)
    session = Session(request_id="req", route="route", prompt_ids=PROMPT, max_tokens=max_tokens, params=params,
                      order=served.target.order, top_n=TOP_N, policy=policy, random=RequestRandom.from_seed(seed),
                      publish=Publisher([policy.observe, events.append]), lookup_k=lookup_k, pipeline=pipeline,
                      warm_up=warm_up)
    batches = [batch async for batch in speculative_tokens(session, drafter, target or served.target)]
    return batches, events


def follow(model: ToyModel, wrong_at: int | None = None) -> ScriptedDrafter:
    """A drafter that proposes the target's greedy continuation, wrong from position `wrong_at` of each round."""

    def script(context: Sequence[int], k: int) -> list[int]:
        tokens = model.greedy(context, k)
        if wrong_at is not None and wrong_at < len(tokens):
            tokens[wrong_at] = (tokens[wrong_at] + 1) % model.vocab or 1  # any other token, never the end token
        return tokens

    return ScriptedDrafter(script)


def rounds(events: list[Event]) -> list[RoundEvent]:
    return [e for e in events if isinstance(e, RoundEvent)]


class EmittedTokens:
    """Tokens some rounds emitted, against the target's distribution at each: a chi-square over seeded requests."""

    def __init__(self, served: Served, params: SamplingParams) -> None:
        self.served, self.params = served, params
        self.expected = np.zeros(served.model.vocab)
        self.observed = np.zeros(served.model.vocab)

    def add(self, batches: list[list[int]], events: list[Event], counted: Callable[[RoundEvent], bool]) -> None:
        """Count the tokens of one request's rounds that `counted` picks."""
        text = PROMPT + sum(batches, [])
        for event in rounds(events):
            if counted(event):
                for offset, token in enumerate(event.emitted):
                    self.expected += self.served.model.probs(text[: event.context + offset], self.params,
                                                             self.served.target.order)
                    self.observed[token] += 1

    def pvalue(self) -> tuple[float, int]:
        """The chi-square p-value (tokens expected fewer than 5 times pooled in one bin), and the tokens counted."""
        bins = self.expected >= 5
        counts, means = list(self.observed[bins]), list(self.expected[bins])
        if self.expected[~bins].sum() > 0:
            counts.append(self.observed[~bins].sum())
            means.append(self.expected[~bins].sum())
        return chi_square.p_value(counts, means), int(self.observed.sum())
