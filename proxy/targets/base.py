"""The Target protocol: score a round's drafts, decode plainly, tokenize; one client module per protocol.

Every client answers `score()` with the sampler's `KnownSupport`: protocol knowledge (top-N
folding, the verifier's draft-support extension) stays inside the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from proxy.drafting.base import Draft
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.sampling.rejection import KnownSupport
from proxy.targets.stopping import EndEvidence
from proxy.wire.request import GenerationRequest


@dataclass(frozen=True)
class PositionLogprobs:
    """The target's raw logprobs at one position: the token that stands there, and the top-N."""

    token_id: int | None  # the draft token scored here; None at the bonus position
    token_logprob: float | None
    top_ids: np.ndarray  # [n] int64, best first
    top_logprobs: np.ndarray  # [n] float64

    @property
    def argmax(self) -> int:
        """The target's greedy choice at this position."""
        return int(self.top_ids[0])


@dataclass(frozen=True)
class Verification:
    """One round's answer: positions predicting d_1..d_K, then the bonus position."""

    positions: tuple[PositionLogprobs, ...]  # K + 1
    bonus_token: int  # what the target itself generated after d_K
    cached_tokens: int
    ends: tuple[tuple[int, bool], ...] = ()  # (an id the server generated, whether it ended there), where it says


@dataclass(frozen=True)
class ScorePlan:
    """What one verification call needs besides the context and the draft."""

    params: SamplingParams
    top_n: int  # top log-probs to ask a stock server for
    seed: int  # for draws the server makes (the verifier's residual tokens), from the request's target stream
    client_headers: dict[str, str] | None = None
    model: str | None = None  # the model to verify against, as forwarded (a LoRA adapter's name); None: the server's
    logprobs: bool = False  # the answer must carry the raw log-probs per position (Scores.positions): a client asks


@dataclass(frozen=True)
class Scores:
    """One round's verification, folded for the sampler."""

    support: KnownSupport
    tv_bound: float = 0.0  # bounded sampling: the largest per-position total-variation bound (0 when exact)
    positions: tuple[PositionLogprobs, ...] | None = None  # the raw log-probs per position, where the answer has them


class Target(Protocol):
    """What the round loop and the handlers need from a verification protocol."""

    order: SamplerOrder  # how the server turns logits into its sampling distribution
    vocab_size: int | None  # the vocabulary the route speculates in; answered ids outside it are refused
    ends_seen: EndEvidence  # the ids its answers ended on or went on past: the route's stop set follows them
    sampling_fields: frozenset[str]  # sampling fields besides temperature and truncation its exactness_problem judges

    async def probe(self) -> object:
        """Learn the server's capabilities once at start-up."""
        ...

    def exactness_problem(self, params: SamplingParams, top_n: int) -> str | None:
        """Why a round cannot follow the target's distribution exactly for these parameters (None: it can)."""
        ...

    def prompt_fields(self, kind: str) -> frozenset[str]:
        """Prompt-shaping request fields the server's tokenize renders as its generation endpoint does."""
        ...

    def prompt_problem(self, request: GenerationRequest) -> str | None:
        """Why the server cannot give this request's prompt ids or context length (None: it can)."""
        ...

    def round_cost(self) -> str | None:
        """Why a round costs the server its whole context (None: about K + 1 tokens, from its prefix cache)."""
        ...

    def with_defaults(self, request: GenerationRequest) -> GenerationRequest:
        """The request as the server samples it: the server's own defaults in the sampling fields it omits."""
        ...

    def answer_problem(self, request: GenerationRequest) -> str | None:
        """Why the server would answer this request otherwise than rounds reproduce: defaults the proxy cannot follow,
        the shape it gives answers, the adapter a model names (None: it would not)."""
        ...

    async def score(self, context: list[int], draft: Draft, plan: ScorePlan) -> Scores:
        """Score the draft after context in one request."""
        ...

    async def generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                       client_headers: dict[str, str] | None = None, model: str | None = None) -> list[int]:
        """Plain decoding on the target (the continuation after a mid-stream switch), with `model` as in ScorePlan."""
        ...

    def logprobs_problem(self, params: SamplingParams, n: int, top_n: int) -> str | None:
        """Why a request's log-probs (its top `n`) cannot be answered from top-`top_n` rounds (None: they can)."""
        ...

    async def generate_logprobs(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                                top_n: int, client_headers: dict[str, str] | None = None,
                                model: str | None = None) -> tuple[list[int], tuple[PositionLogprobs, ...]]:
        """generate(), with the raw log-prob of each token and the top `top_n` where it was sampled."""
        ...

    async def prompt_ids(self, body: dict, kind: str,
                         client_headers: dict[str, str] | None = None) -> tuple[list[int], int]:
        """Prompt token ids from the server's own tokenizer and chat template, and its context size."""
        ...
