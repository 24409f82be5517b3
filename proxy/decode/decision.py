"""What a request's policy decides once per round, what the round loop does for each decision, and the interface a
policy offers the loop.

The policy decides from its measurements, without side effects; the loop acts on the decision as `action_for`
says (`proxy.decode.loop`) and hands the same value to whatever else in the round depends on it (the
draft-ahead's K, the lookup trimming). `proxy.control` implements `Policy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from proxy.decode.events import Event


@dataclass(frozen=True)
class Speculate:
    """A round: the model drafts up to k tokens (k > 0) and the target verifies them."""

    k: int
    reason: str


@dataclass(frozen=True)
class _Reasoned:
    """A decision that carries only why it was made."""

    reason: str


class Measure(_Reasoned):
    """One plain chunk with the draft idle, to measure what plain decoding gets; then decide again."""


class Read(_Reasoned):
    """A plain chunk that the draft model reads, before any round: what it would have drafted decides later."""


class Plain(_Reasoned):
    """The model drafts nothing: the target decodes plainly (a lookup drafter still proposes its paths)."""


class Finish(_Reasoned):
    """The loop's own: speculation ended for good (the error budget is spent, or a model draft neither drafts nor
    reads), plain chunks to the end."""


Decision = Speculate | Measure | Read | Plain


class Action(Enum):
    """What the loop does next."""

    PLAIN = "a plain chunk, the draft model idle"
    PLAIN_READ = "a plain chunk the draft model reads"
    ROUND = "a round: draft, verify, accept (a plain chunk where nothing was drafted)"


def action_for(decision: Decision | Finish, *, looks_up: bool, reading_prompt: bool) -> Action:
    """The loop's action for a decision: a lookup drafter proposes its paths in every round the policy does not
    stop, a model drafter reads along instead of drafting where the policy says so or while it reads the prompt."""
    match decision:
        case Finish() | Measure():  # a chunk that measures would be slowed (and mismeasured) by the reading
            return Action.PLAIN
        case Plain() | Read() if not looks_up:
            return Action.PLAIN_READ
        case Speculate() if reading_prompt and not looks_up:  # the target goes on meanwhile
            return Action.PLAIN_READ
        case _:
            return Action.ROUND


def model_k(decision: Decision) -> int:
    """How many tokens the model drafts under the decision (0 unless it speculates)."""
    return decision.k if isinstance(decision, Speculate) else 0


class Policy(Protocol):
    """Per request: a decision each round, learning from its events."""

    def decide(self) -> Decision:
        """This round's decision, from the measurements so far; it settles the request in the mode it chose
        (asking twice gives the same answer)."""
        ...

    def observe(self, event: Event) -> None:
        """This request's own events."""
        ...

    def lookup_length(self, probs: Sequence[float], match: int, decision: Decision, *, predicted: bool = False) -> int:
        """How many tokens of a lookup path are worth verifying (0: none), given each one's estimated probability,
        how many context tokens the path matched, the round's decision, and whether the client predicted it."""
        ...

    def plain_chunk(self) -> int:
        """Tokens to decode plainly when a lookup found nothing, before looking again."""
        ...

    def model_may_pay(self) -> bool:
        """Whether the model draft could still pay on this request (False: it stops reading along for good)."""
        ...
