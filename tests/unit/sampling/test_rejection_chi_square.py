"""Tests for proxy.sampling.rejection by seeded chi-square, with negative controls: full and folded vocabularies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from proxy.sampling.rejection import KnownSupport, RoundResult, acceptance_probs, sample, verify, verify_on_support
from tests import chi_square

SIGNIFICANCE = 1e-3
CHI_SQUARE_ROUNDS = 20_000

Verifier = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], RoundResult]


# Seeded chi-square of the emitted tokens per position, with a negative control.

CHI_DRAFT = np.array(
    [
        [0.40, 0.30, 0.10, 0.10, 0.10, 0.00],
        [0.05, 0.05, 0.50, 0.20, 0.10, 0.10],
        [0.00, 0.20, 0.20, 0.20, 0.20, 0.20],
    ]
)
CHI_TARGET = np.array(
    [
        [0.10, 0.30, 0.20, 0.00, 0.20, 0.20],
        [0.30, 0.10, 0.30, 0.10, 0.10, 0.10],
        [0.25, 0.25, 0.10, 0.10, 0.00, 0.30],
        [0.10, 0.20, 0.30, 0.20, 0.10, 0.10],
    ]
)


def _verify_argmax_on_reject(
    draft_tokens: np.ndarray, draft_probs: np.ndarray, target_probs: np.ndarray, rng: np.random.Generator
) -> RoundResult:
    """The common bug: on rejection emit the target's argmax instead of sampling the residual."""
    positions = np.arange(len(draft_tokens))
    drafted_at = (positions, draft_tokens)
    accept = acceptance_probs(target_probs[drafted_at], draft_probs[drafted_at])
    drafted = tuple(int(t) for t in draft_tokens)
    for position, (u, chance) in enumerate(zip(rng.random(len(draft_tokens)), accept, strict=True)):
        if u >= chance:
            return RoundResult(position, int(np.argmax(target_probs[position])), drafted)
    return RoundResult(len(drafted), sample(target_probs[-1], rng), drafted)


def draws(rows: np.ndarray, rounds: int, rng: np.random.Generator) -> np.ndarray:
    """`rounds` independent tokens from each row, at once: [rounds, len(rows)]."""
    return np.stack([rng.choice(row.size, size=rounds, p=row / row.sum()) for row in rows], axis=1)


def _per_position_p_values(verifier: Verifier, seed: int) -> list[float]:
    """Chi-square p-value of each emitted position against that position's target row."""
    rng = np.random.default_rng(seed)
    counts = np.zeros_like(CHI_TARGET)
    # The draft's tokens are drawn apart from the verifier's random stream: every round's at once.
    for draft_tokens in draws(CHI_DRAFT, CHI_SQUARE_ROUNDS, np.random.default_rng([seed, 1])):
        emitted = verifier(draft_tokens, CHI_DRAFT, CHI_TARGET, rng).emitted
        counts[np.arange(len(emitted)), emitted] += 1
    p_values = []
    for observed, target_row in zip(counts, CHI_TARGET, strict=True):
        support = target_row > 0
        assert observed[~support].sum() == 0, "emitted a token the target gives probability 0"
        expected = target_row[support] * observed.sum()
        p_values.append(chi_square.p_value(observed[support], expected))
    return p_values


def test_emitted_tokens_follow_target_per_position() -> None:
    p_values = _per_position_p_values(verify, seed=20_230_518)
    assert min(p_values) >= SIGNIFICANCE, p_values


def test_argmax_on_reject_negative_control_fails_the_same_test() -> None:
    p_values = _per_position_p_values(_verify_argmax_on_reject, seed=20_230_518)
    assert min(p_values) < SIGNIFICANCE**2, p_values


# --- the folded vocabulary (KnownSupport): what the verifier's draft_support extension feeds ---

def _fold(draft_rows: np.ndarray, target_rows: np.ndarray) -> tuple[KnownSupport, np.ndarray]:
    """Build a KnownSupport as the verifier does: draft support ids, target probs on them; with no outside draw yet,
    and the target restricted to outside the ids at each position (what the outside tokens are drawn from)."""

    k, vocab = draft_rows.shape
    width = max(int(np.count_nonzero(row)) for row in draft_rows)
    ids = np.full((k + 1, width), -1, dtype=np.int64)
    target = np.zeros((k + 1, width))
    draft = np.zeros((k, width))
    outside_mass = np.zeros(k + 1)
    rests = np.zeros((k, vocab))
    for position in range(k):
        support = np.flatnonzero(draft_rows[position])
        ids[position, : support.size] = support
        target[position, : support.size] = target_rows[position, support]
        draft[position, : support.size] = draft_rows[position, support]
        rests[position] = target_rows[position]
        rests[position, support] = 0.0
        outside_mass[position] = rests[position].sum()
    outside_mass[k] = 1.0
    return KnownSupport(ids, draft, target, outside_mass, np.full(k + 1, -1, dtype=np.int64)), rests


OutsideDraws = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]  # (rest, rounds, rng) -> [rounds]


def _first_token_counts(outside_draws: OutsideDraws, rounds: int = 20_000) -> tuple[np.ndarray, np.ndarray]:

    rng = np.random.default_rng(20261121)
    vocab, k = 8, 2
    target_rows = np.array([[0.30, 0.25, 0.15, 0.10, 0.08, 0.06, 0.04, 0.02]] * (k + 1))
    draft_full = np.array([0.05, 0.40, 0.05, 0.30, 0.05, 0.05, 0.05, 0.05])
    draft_row = np.zeros(vocab)
    draft_row[[1, 3, 0]] = draft_full[[1, 3, 0]]  # the draft's top 3, renormalised (a truncated support)
    draft_row /= draft_row.sum()
    draft_rows = np.stack([draft_row] * k)
    folded, rests = _fold(draft_rows, target_rows)  # the same every round: only the draws change
    # The draft's tokens and the outside tokens are drawn apart from the verifier's stream: every round's at once.
    drafted = draws(draft_rows, rounds, np.random.default_rng([20261121, 1]))
    outside_rng = np.random.default_rng([20261121, 2])
    outside = np.stack([outside_draws(rest, rounds, outside_rng) if rest.sum() > 0 else np.full(rounds, -1)
                        for rest in rests] + [draws(target_rows[k:], rounds, outside_rng)[:, 0]], axis=1)
    counts = np.zeros(vocab)
    for tokens, outside_tokens in zip(drafted, outside, strict=True):
        support = replace(folded, outside_tokens=outside_tokens)
        counts[verify_on_support(list(tokens), support, rng).emitted[0]] += 1
    return counts, target_rows[0] * rounds


def test_folded_support_first_token_follows_the_target() -> None:
    counts, expected = _first_token_counts(lambda rest, rounds, rng: draws(rest[None], rounds, rng)[:, 0])
    assert chi_square.p_value(counts, expected) > 1e-3


def test_folded_support_negative_control_biased_outside_draw_fails() -> None:
    # A verifier that draws the outside token as the most likely one instead of sampling it.
    counts, expected = _first_token_counts(lambda rest, rounds, rng: np.full(rounds, int(np.argmax(rest))))
    assert chi_square.p_value(counts, expected) < 1e-6
