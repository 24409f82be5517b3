"""proxy.sampling.candidates: exact identity per node, seeded chi-square over a token tree, a negative control."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.sampling import candidates
from proxy.sampling.candidates import verify_candidates
from proxy.sampling.rejection import KnownSupport, sample
from tests import chi_square

VOCAB = 8
ROUNDS = 20_000
SIGNIFICANCE = 1e-3
# Candidates best first: two share the prefix (0,), one starts elsewhere, one is a single token.
PATHS = ((0, 1, 2), (0, 3), (4, 5), (6,))


@functools.cache
def target_row(prefix: tuple[int, ...]) -> np.ndarray:
    """The toy target's distribution after a prefix (deterministic, every token possible; read-only, shared)."""
    seed = 1 + sum((token + 1) * 31**i for i, token in enumerate(prefix))
    row = np.random.default_rng(seed).dirichlet(np.full(VOCAB, 0.8))
    row.flags.writeable = False
    return row


@functools.cache
def known_rows(path: tuple[int, ...], known: int) -> tuple[np.ndarray, ...]:
    """The deterministic part of a candidate's support: ids, draft one-hots, target rows, outside masses and
    the target restricted to outside the ids (what an outside token is drawn from), per position."""
    rows = len(path) + 1
    ids, target = np.full((rows, known + 1), -1), np.zeros((rows, known + 1))
    outside_mass, outside_rows = np.zeros(rows), np.zeros((rows, VOCAB))
    for depth in range(rows):
        row = target_row(path[:depth])
        chosen = list(np.argsort(row)[::-1][:known])
        if depth < len(path) and path[depth] not in chosen:
            chosen.append(path[depth])
        ids[depth, : len(chosen)] = chosen
        target[depth, : len(chosen)] = row[chosen]
        outside_rows[depth] = row
        outside_rows[depth, chosen] = 0.0
        outside_mass[depth] = outside_rows[depth].sum()
    one_hot = np.zeros((len(path), known + 1))
    for depth, token in enumerate(path):
        one_hot[depth, int(np.flatnonzero(ids[depth] == token)[0])] = 1.0
    for array in (ids, one_hot, target, outside_mass, outside_rows):
        array.flags.writeable = False
    return ids, one_hot, target, outside_mass, outside_rows


def support_with(path: Sequence[int], known: int, outside_tokens: np.ndarray) -> KnownSupport:
    """A candidate's support with these outside tokens (one per position, -1 where no mass is outside)."""
    ids, one_hot, target, outside_mass, _ = known_rows(tuple(path), known)
    return KnownSupport(ids.copy(), one_hot.copy(), target.copy(), outside_mass.copy(), outside_tokens)


def folded_support(path: Sequence[int], rng: np.random.Generator, known: int) -> KnownSupport:
    """What the target returns for one candidate: its top `known` ids plus the drafted id, the rest folded outside."""
    outside_rows = known_rows(tuple(path), known)[4]
    return support_with(path, known, np.array([sample(rest, rng) if rest.sum() > 0 else -1 for rest in outside_rows]))


def outside_draws(path: Sequence[int], known: int, rounds: int, rng: np.random.Generator) -> np.ndarray:
    """The outside tokens of `rounds` supports of one candidate, drawn at once: [rounds, len(path) + 1]."""
    outside_rows = known_rows(tuple(path), known)[4]
    draws = np.full((rounds, len(outside_rows)), -1)
    for depth, rest in enumerate(outside_rows):
        if rest.sum() > 0:
            draws[:, depth] = rng.choice(VOCAB, size=rounds, p=rest / rest.sum())
    return draws


def node_outcome(mass: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """The oracle: the exact distribution of a node's outcome: P(child i accepted) for each column, then P(residual)."""
    remaining = np.asarray(mass, dtype=np.float64).copy()
    outcome, reach = np.zeros(len(columns) + 1), 1.0
    for i, column in enumerate(columns):
        total = remaining.sum()
        chance = remaining[column] / total if total > 0 else 0.0
        outcome[i] = reach * chance
        reach *= 1.0 - chance
        remaining[column] = 0.0
    outcome[-1] = reach
    return outcome


@pytest.mark.parametrize("seed", range(20))
def test_a_node_emits_exactly_the_target_distribution(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mass = rng.dirichlet(np.full(VOCAB, 0.5))
    columns = list(rng.permutation(VOCAB)[: rng.integers(1, VOCAB + 1)])
    outcome = node_outcome(mass, columns)
    remaining = mass.copy()
    remaining[columns] = 0.0
    emitted = outcome[-1] * (remaining / remaining.sum() if remaining.sum() > 0 else remaining)
    for i, column in enumerate(columns):
        emitted[column] += outcome[i]
    np.testing.assert_allclose(emitted, mass, rtol=0, atol=1e-12)
    assert outcome.sum() == pytest.approx(1.0, abs=1e-12)


def _counts(known: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First-token counts, second-token counts after 0, and how often each candidate was followed."""
    rng = np.random.default_rng(seed)
    # The target's outside draws are independent of the acceptance draws: take them all at once.
    outside = [outside_draws(path, known, ROUNDS, np.random.default_rng([seed, i])) for i, path in enumerate(PATHS)]
    first, after_zero, followed = np.zeros(VOCAB), np.zeros(VOCAB), np.zeros(len(PATHS))
    for round_index in range(ROUNDS):
        supports = [support_with(path, known, outside[i][round_index]) for i, path in enumerate(PATHS)]
        result = verify_candidates(PATHS, supports, rng)
        first[result.emitted[0]] += 1
        if result.emitted[0] == 0 and result.accepted:
            after_zero[result.emitted[1]] += 1
        if result.accepted:
            followed[result.candidate] += 1
    return first, after_zero, followed


@pytest.mark.parametrize("known", [VOCAB, 3])
def test_emitted_tokens_follow_the_target_through_the_tree(known: int) -> None:
    first, after_zero, followed = _counts(known, seed=20_261_123)
    assert chi_square.p_value(first, target_row(())) > SIGNIFICANCE
    assert chi_square.p_value(after_zero, target_row((0,))) > SIGNIFICANCE
    assert followed[0] > 0
    # Root token 4 is in the first candidate's known ids only when they cover the vocabulary.
    assert (followed[2] > 0) == (known == VOCAB)


def test_negative_control_forgetting_to_zero_a_rejected_child_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def try_without_zeroing(mass, columns, rng):
        remaining = np.asarray(mass, dtype=np.float64).copy()
        for i, column in enumerate(columns):
            if rng.random() < remaining[column] / remaining.sum():
                return i, remaining
        return None, remaining  # the bug: rejected children keep their mass for the residual

    monkeypatch.setattr(candidates, "try_children", try_without_zeroing)
    first, _, _ = _counts(VOCAB, seed=20_261_123)
    assert chi_square.p_value(first, target_row(())) < SIGNIFICANCE**2


def test_a_leaf_emits_a_bonus_token_and_a_single_candidate_matches_one_hot_rejection() -> None:
    rng = np.random.default_rng(7)
    path = (3,)
    support = folded_support(path, rng, VOCAB)
    support.target_probs[0] = 0.0
    support.target_probs[0, int(np.flatnonzero(support.ids[0] == 3)[0])] = 1.0  # the target is sure of 3
    result = verify_candidates([path], [support], rng)
    assert result.emitted[0] == 3 and result.accepted == 1 and len(result.emitted) == 2


def test_a_child_outside_the_known_ids_is_not_tried() -> None:
    rng = np.random.default_rng(3)
    supports = [folded_support(path, rng, 1) for path in PATHS]
    # The first candidate's root row knows only its top id and 0; a sibling root token it does not know
    # is skipped, so the emitted root token is never a skipped sibling unless the outside draw chose it.
    unknown = [p[0] for p in PATHS if p[0] not in supports[0].ids[0]]
    for _ in range(200):
        result = verify_candidates(PATHS, supports, rng)
        if result.emitted[0] in unknown:
            assert result.accepted == 0 and result.emitted[0] == supports[0].outside_tokens[0]


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        verify_candidates([(1,)], [], np.random.default_rng(0))
