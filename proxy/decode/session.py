"""One request's fixed inputs to the round loop: its plan, its policy and its random streams."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from proxy.decode.decision import Decision, Policy
from proxy.decode.events import Subscriber
from proxy.drafting.base import Drafter, DraftPlan
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.targets.base import ScorePlan

SEED_BOUND = 2**63  # seeds handed to servers fit a signed 64-bit integer


@dataclass(frozen=True)
class RequestRandom:
    """Independent random streams derived from one seed, so reordering work cannot change a seeded request's draws."""

    drafts: np.random.SeedSequence  # a stream of its own for every draft (see draft_stream)
    target: np.random.Generator  # seeds for draws the server makes
    accept: np.random.Generator  # acceptance tests and residual samples

    @classmethod
    def from_seed(cls, seed: int | None) -> RequestRandom:
        """Streams spawned from the request's seed (fresh entropy without one)."""
        # SeedSequence takes non-negative entropy; a negative client seed maps to a distinct one.
        entropy = None if seed is None else seed % 2**64
        drafts, target, accept = np.random.SeedSequence(entropy).spawn(3)
        return cls(drafts, np.random.default_rng(target), np.random.default_rng(accept))

    def draft_stream(self) -> np.random.Generator:
        """The next draft's own stream: a draft-ahead stopped halfway cannot shift the draws of later drafts."""
        return np.random.default_rng(self.drafts.spawn(1)[0])


@dataclass(frozen=True, kw_only=True)
class Session:
    """What the round loop needs to know about one request."""

    request_id: str
    route: str
    prompt_ids: Sequence[int]
    max_tokens: int
    params: SamplingParams
    order: SamplerOrder  # the target's sampler order; the draft samples the same way
    top_n: int  # candidates per position: the target's top-N, and the draft's support size
    policy: Policy
    random: RequestRandom
    publish: Subscriber
    client_headers: dict[str, str] | None = None
    max_tv: float = 0.0  # bounded sampling: a round whose error bound exceeds this ends speculation
    lookup_k: int = 0  # the longest lookup draft (0: the round's K)
    pipeline: bool = False  # draft the next round ahead while a round is verified
    warm_up: bool = False  # decode plainly while the draft model reads the prompt, instead of waiting for it
    model: str | None = None  # the model named upstream (as forwarded): verified against as itself
    ends: Callable[[int], bool] | None = None  # where the target ends a generation (None: where the draft's vocabulary
    # does, for drafts and targets of one toy vocabulary)

    def is_end(self, drafter: Drafter) -> Callable[[int], bool]:
        """The target's ends of generation: the stop set learned from the upstream."""
        return self.ends or drafter.vocabulary.is_end_of_generation

    def draft_plan(self, k: int, cap: int, decision: Decision) -> DraftPlan:
        """A round's request to the drafter: k model tokens, lookup paths up to lookup_k (both within cap), trimmed
        by the policy for the round's decision."""
        return DraftPlan(k, self.params, self.order, self.top_n, self.random.draft_stream(), self.request_id,
                         min(self.lookup_k or k, cap), partial(self.policy.lookup_length, decision=decision))

    def at_prompt(self, context: Sequence[int]) -> bool:
        """Whether context is the prompt alone: what is evaluated next pays the prompt's prefill."""
        return len(context) == len(self.prompt_ids)

    def target_seed(self) -> int:
        """A seed for the next draw the server makes."""
        return int(self.random.target.integers(SEED_BOUND))

    def score_plan(self) -> ScorePlan:
        """A round's request to the target."""
        return ScorePlan(self.params, self.top_n, self.target_seed(), self.client_headers, self.model)
