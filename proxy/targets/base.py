"""Target clients: one small module per verification protocol, all returning `Verification`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from proxy.sampling.rejection import KnownSupport

from proxy.sampling.processors import SamplerOrder, SamplingParams


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


class Target(Protocol):
    """What the round loop needs from a verification protocol."""

    exact_support: bool  # True: verify_support() gives exact residual draws for any sampling parameters
    order: SamplerOrder  # how the server turns logits into its sampling distribution

    async def probe(self) -> dict:
        """Learn the server's capabilities once at start-up."""
        ...

    async def verify_support(self, context: list[int], draft_tokens: Sequence[int], draft_probs: np.ndarray,
                             params: SamplingParams, seed: int,
                             client_headers: dict[str, str] | None = None) -> KnownSupport:
        """Score the drafts with exact residual draws (only when exact_support)."""
        ...

    async def verify(self, context: list[int], draft_tokens: list[int], top_n: int,
                     client_headers: dict[str, str] | None = None) -> Verification:
        """Score `draft_tokens` after `context` in one request."""
        ...

    async def generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                       client_headers: dict[str, str] | None = None) -> list[int]:
        """Plain decoding on the target (the continuation after a mid-stream switch)."""
        ...

    async def prompt_ids(self, body: dict, kind: str, client_headers: dict[str, str] | None = None) -> tuple[list[int], int]:
        """Prompt token ids from the server's own tokenizer and chat template, and its context size."""
        ...
