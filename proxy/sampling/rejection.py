"""Speculative sampling as pure numpy: acceptance, residual, verify().

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023, arXiv:2211.17192), Algorithm 1. Glossary, for one round of k drafted tokens:

- draft tokens: d_0 .. d_{k-1}, drawn by the draft model from `draft_probs[i]`  # [k, vocab]
- target probs: the target's processed distribution at each draft position plus one more,
  `target_probs`  # [k + 1, vocab]; row k is the bonus position.
- accepted tokens: the longest prefix of draft tokens where each d_i passed u_i < min(1, t/q),
  t = target_probs[i, d_i], q = draft_probs[i, d_i].
- recovered (residual) token: at the first rejected position i, a sample from
  norm(max(0, target_probs[i] - draft_probs[i])); it replaces d_i and ends the round.
- bonus token: when all k are accepted, a sample from target_probs[k].
Each round emits accepted + 1 tokens, distributed exactly as the target would sample them.
Greedy decoding is the same algorithm on one-hot distributions, not a second code path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:  # probs: [vocab]
    """One token from a row of (possibly unnormalised) probabilities."""
    row = np.asarray(probs, dtype=np.float64)
    # A NaN or negative entry would make the cdf unordered and searchsorted pick an arbitrary token.
    if not (np.isfinite(row).all() and (row >= 0.0).all()):
        raise ValueError("cannot sample from a row with a negative or non-finite probability")
    cdf = np.cumsum(row)
    if not cdf[-1] > 0.0:
        raise ValueError("cannot sample from a row with no probability mass")
    token = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    # Defensive: should u * total ever round up to total, stay on the last token with mass.
    return token if token < row.size else int(np.flatnonzero(row)[-1])


def residual_probs(target_row: np.ndarray, draft_row: np.ndarray) -> np.ndarray:  # rows: [vocab]
    """norm(max(0, target - draft)): the distribution of the recovered token.

    Its mass is 0 only when target <= draft everywhere, i.e. target == draft; then a rejection
    has probability 0 in exact arithmetic and happens only through rounding in min(1, t/q), so
    we return the target row, which is the right distribution to emit there.
    """
    target = np.asarray(target_row, dtype=np.float64)
    excess = np.maximum(target - np.asarray(draft_row, dtype=np.float64), 0.0)
    mass = excess.sum()
    if mass <= 0.0:
        return target / target.sum()
    return excess / mass


def acceptance_probs(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """Elementwise min(1, target / draft): the chance a token drafted with these probs is kept."""
    target = np.asarray(target_probs, dtype=np.float64)
    draft = np.asarray(draft_probs, dtype=np.float64)
    # A token with draft probability 0 cannot have been drafted; reject it instead of dividing by 0.
    safe_draft = np.where(draft > 0.0, draft, 1.0)
    return np.where(draft > 0.0, np.minimum(1.0, target / safe_draft), 0.0)


@dataclass(frozen=True)
class RoundResult:
    """Outcome of one speculative round."""

    accepted: int  # number of draft tokens accepted, 0..k
    next_token: int  # recovered token (accepted < k) or bonus token (accepted == k)
    draft_tokens: tuple[int, ...]  # all k drafted tokens, accepted or not

    def __post_init__(self) -> None:
        if not 0 <= self.accepted <= len(self.draft_tokens):
            raise ValueError(f"accepted={self.accepted} outside 0..{len(self.draft_tokens)}")

    @property
    def bonus(self) -> bool:
        """True when every draft token was accepted and next_token is the bonus token."""
        return self.accepted == len(self.draft_tokens)

    @property
    def emitted(self) -> tuple[int, ...]:
        """The accepted draft tokens followed by next_token."""
        return (*self.draft_tokens[: self.accepted], self.next_token)


def verify(
    draft_tokens: np.ndarray | Sequence[int],  # [k] int
    draft_probs: np.ndarray,  # [k, vocab]
    target_probs: np.ndarray,  # [k + 1, vocab]
    rng: np.random.Generator,
) -> RoundResult:
    """Accept a prefix of the draft and emit one more token (Leviathan et al., Algorithm 1)."""
    tokens = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
    k = tokens.size
    target = np.asarray(target_probs, dtype=np.float64)
    draft = np.asarray(draft_probs, dtype=np.float64)
    if target.ndim != 2 or target.shape[0] != k + 1:
        raise ValueError(f"target_probs must be [k + 1 = {k + 1}, vocab], got {target.shape}")
    if draft.shape != (k, target.shape[1]):
        raise ValueError(f"draft_probs must be [k, vocab] = {(k, target.shape[1])}, got {draft.shape}")
    # u >= NaN is False, so a NaN target probability would accept any draft token; refuse it instead.
    if not (np.isfinite(target).all() and np.isfinite(draft).all()):
        raise ValueError("target_probs and draft_probs must be finite")
    # A negative probability would pass for a smaller acceptance and a residual with negative weights.
    if (target < 0.0).any() or (draft < 0.0).any():
        raise ValueError("target_probs and draft_probs must not be negative")
    if k and (tokens.min() < 0 or tokens.max() >= target.shape[1]):  # numpy would wrap a negative id around
        raise ValueError(f"draft_tokens must lie in 0..{target.shape[1] - 1}")
    positions = np.arange(k)
    accept = acceptance_probs(target[positions, tokens], draft[positions, tokens])
    # u < accept, where the paper has r <= ratio: so an acceptance of 0 rejects even when u == 0.0.
    rejected = np.flatnonzero(rng.random(k) >= accept)
    drafted = tuple(int(t) for t in tokens)
    if rejected.size:
        first = int(rejected[0])
        recovered = sample(residual_probs(target[first], draft[first]), rng)
        return RoundResult(accepted=first, next_token=recovered, draft_tokens=drafted)
    return RoundResult(accepted=k, next_token=sample(target[k], rng), draft_tokens=drafted)


@dataclass(frozen=True)
class KnownSupport:
    """One round's distributions known on a few ids per position, plus the target's mass outside them.

    The draft has no mass outside `ids` (it draws from its own top candidates), so on the rest of
    the vocabulary the residual norm(max(0, target − draft)) is the target itself. The whole
    outside is folded into one extra column; when the residual lands there, the emitted token is
    `outside_tokens[i]`, a token drawn from the target restricted to outside the ids. That
    composition samples the exact residual without knowing the target's full distribution.
    """

    ids: np.ndarray  # [k + 1, m] token ids per position; -1 pads unused columns
    draft_probs: np.ndarray  # [k, m] the draft's probability of each id
    target_probs: np.ndarray  # [k + 1, m] the target's processed probability of each id
    outside_mass: np.ndarray  # [k + 1] the target's mass outside the ids
    outside_tokens: np.ndarray  # [k + 1] a target token drawn from outside the ids; -1 if no mass

    @classmethod
    def from_rows(cls, ids: Sequence[np.ndarray], target_probs: Sequence[np.ndarray],
                  draft_probs: Sequence[np.ndarray], outside_mass: np.ndarray,
                  outside_tokens: np.ndarray) -> KnownSupport:
        """Pad per-position rows of different widths (k + 1 id and target rows, k draft rows) into arrays."""
        if len(target_probs) != len(ids) or len(outside_mass) != len(ids) or len(outside_tokens) != len(ids):
            raise ValueError(f"{len(ids)} id rows need as many target rows, outside masses and outside tokens")
        # A row shorter than its ids would be broadcast over them (one probability copied to every candidate).
        for position, row in enumerate(ids):
            widths = {len(target_probs[position])} | ({len(draft_probs[position])} if position < len(draft_probs)
                                                      else set())
            if widths != {len(row)}:
                raise ValueError(f"position {position}: {len(row)} ids but rows of {sorted(widths)} probabilities")
        width = max([len(row) for row in ids] + [1])
        padded_ids = np.full((len(ids), width), -1, dtype=np.int64)
        padded = {"target": np.zeros((len(ids), width)), "draft": np.zeros((len(draft_probs), width))}
        for position, row in enumerate(ids):
            padded_ids[position, : len(row)] = row
            padded["target"][position, : len(row)] = target_probs[position]
            if position < len(draft_probs):
                padded["draft"][position, : len(row)] = draft_probs[position]
        return cls(padded_ids, padded["draft"], padded["target"], np.asarray(outside_mass, dtype=np.float64),
                   np.asarray(outside_tokens, dtype=np.int64))


def verify_on_support(draft_tokens: Sequence[int], support: KnownSupport, rng: np.random.Generator) -> RoundResult:
    """verify() on the folded vocabulary (known ids + one outside column); returns real token ids."""
    k = len(draft_tokens)
    target = np.concatenate([support.target_probs, support.outside_mass[:, None]], axis=1)
    draft = np.concatenate([support.draft_probs, np.zeros((k, 1))], axis=1)
    # Each draft token's column: the first of its row's ids that names it (all rows compared at once).
    named = support.ids[:k] == np.asarray(draft_tokens, dtype=np.int64).reshape(k, 1)
    found = named.any(axis=1)
    if not found.all():
        position = int(np.flatnonzero(~found)[0])
        raise ValueError(f"draft token {draft_tokens[position]} is not in the known ids of position {position}")
    folded = verify(named.argmax(axis=1), draft, target, rng)
    row, column = folded.accepted, folded.next_token
    outside_column = support.ids.shape[1]
    token = int(support.outside_tokens[row]) if column == outside_column else int(support.ids[row, column])
    # The outside column is chosen only with positive mass, and then a token was drawn there.
    if token < 0:
        raise ValueError(f"position {row}: the residual chose the outside but no outside token was drawn")
    return RoundResult(folded.accepted, token, tuple(int(t) for t in draft_tokens))
