"""Tests for proxy.sampling.rejection: exact identity, one-hot tables, chi-square, sample(), KnownSupport."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from proxy.sampling.processors import SamplerOrder, SamplingParams, one_hot, processed_probs
from proxy.sampling.rejection import (
    KnownSupport,
    RoundResult,
    acceptance_probs,
    residual_probs,
    sample,
    verify,
    verify_on_support,
)
from tests.unit.sampling.test_processors import ALL_ORDERS, LLAMA, QWEN_VOCAB

IDENTITY_TOLERANCE = 1e-12
SIGNIFICANCE = 1e-3
CHI_SQUARE_ROUNDS = 20_000
RNG = np.random.default_rng(0)  # for calls that fail before drawing

Verifier = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], RoundResult]


# (a) The exact identity: one step's output distribution equals the target, no sampling.


def _pair(kind: str, vocab: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A (target_row, draft_row) pair of the named kind."""
    target, draft = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    half = max(vocab // 2, 1)
    if kind == "draft_mass_where_target_has_none":
        target[:half] = 0.0
    elif kind == "target_mass_where_draft_has_none":
        draft[:half] = 0.0
    elif kind == "disjoint_supports":
        target[:half], draft[half:] = 0.0, 0.0
    elif kind == "identical":
        draft = target.copy()
    elif kind == "one_hot_target":
        target = one_hot([vocab - 1], vocab)[0]
    return target / target.sum(), draft / draft.sum()


def _emitted_distribution(target_row: np.ndarray, draft_row: np.ndarray) -> np.ndarray:
    """P(emit x) = draft(x)·accept(x) + (1 - Σ draft·accept)·residual(x)."""
    accepted_mass = draft_row * acceptance_probs(target_row, draft_row)
    return accepted_mass + (1.0 - accepted_mass.sum()) * residual_probs(target_row, draft_row)


@pytest.mark.parametrize("vocab", [2, 3, 8, 101, 5_000, QWEN_VOCAB])
@pytest.mark.parametrize(
    "kind",
    [
        "dense",
        "draft_mass_where_target_has_none",
        "target_mass_where_draft_has_none",
        "disjoint_supports",
        "identical",
        "one_hot_target",
    ],
)
def test_one_step_output_distribution_equals_target(vocab: int, kind: str) -> None:
    rng = np.random.default_rng([vocab, len(kind)])
    for _ in range(3):
        target_row, draft_row = _pair(kind, vocab, rng)
        emitted = _emitted_distribution(target_row, draft_row)
        assert np.max(np.abs(emitted - target_row)) <= IDENTITY_TOLERANCE


def test_residual_with_zero_mass_falls_back_to_target() -> None:
    row = np.array([0.25, 0.75, 0.0])
    assert np.array_equal(residual_probs(row, row), row)


# (b) Named one-hot cases with exact expected results.

VOCAB = 5


def _rows(spec: list[int | list[float]]) -> np.ndarray:
    """Each entry is a token (one-hot row) or an explicit probability row."""
    return np.array([one_hot([e], VOCAB)[0] if isinstance(e, int) else e for e in spec])


@pytest.mark.parametrize(
    "name, draft_tokens, draft_rows, target_rows, expected",
    [
        ("early_mismatch", [1, 2, 3], [1, 2, 3], [1, 4, 3, 0], RoundResult(1, 4, (1, 2, 3))),
        ("first_token_wrong", [2, 2], [2, 2], [0, 2, 2], RoundResult(0, 0, (2, 2))),
        ("all_accepted_bonus", [1, 2, 3], [1, 2, 3], [1, 2, 3, 4], RoundResult(3, 4, (1, 2, 3))),
        ("no_draft_tokens", [], [], [3], RoundResult(0, 3, ())),
        (
            "zero_draft_mass_on_target_favourite",
            [1],
            [[0.0, 0.5, 0.5, 0.0, 0.0]],
            [0, 4],
            RoundResult(0, 0, (1,)),
        ),
        (
            "identical_distributions",
            [2, 0],
            [[0.1, 0.2, 0.3, 0.4, 0.0], [0.6, 0.0, 0.0, 0.0, 0.4]],
            [[0.1, 0.2, 0.3, 0.4, 0.0], [0.6, 0.0, 0.0, 0.0, 0.4], 1],
            RoundResult(2, 1, (2, 0)),
        ),
        (
            "disjoint_supports",
            [1, 2],
            [[0.0, 0.5, 0.5, 0.0, 0.0], 2],
            [3, 3, 3],
            RoundResult(0, 3, (1, 2)),
        ),
    ],
)
def test_verify_one_hot_table(
    name: str,
    draft_tokens: list[int],
    draft_rows: list[int | list[float]],
    target_rows: list[int | list[float]],
    expected: RoundResult,
) -> None:
    draft_probs = _rows(draft_rows).reshape(len(draft_tokens), VOCAB)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        assert verify(np.array(draft_tokens), draft_probs, _rows(target_rows), rng) == expected, name


@pytest.mark.parametrize("order", ALL_ORDERS)
@pytest.mark.parametrize(
    "draft_tokens, target_logits, expected",
    [
        (
            [1, 1, 2],
            [[0, 5, 1, 0, 0], [0, 9, 9, 0, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 1]],
            RoundResult(2, 0, (1, 1, 2)),
        ),
        ([4, 0], [[0, 0, 0, 0, 1], [0, 2, 0, 0, 0], [7, 7, 7, 7, 7]], RoundResult(1, 1, (4, 0))),
        ([3], [[1, 1, 1, 2, 0], [0, 0, 0, 0, 0]], RoundResult(1, 0, (3,))),
    ],
)
def test_greedy_is_verify_on_one_hot_distributions(
    order: SamplerOrder, draft_tokens: list[int], target_logits: list[list[float]], expected: RoundResult
) -> None:
    greedy = SamplingParams(temperature=0.0, top_k=2, top_p=0.5, min_p=0.1)
    target_probs = processed_probs(np.array(target_logits, dtype=float), greedy, order)
    draft_probs = one_hot(draft_tokens, VOCAB)
    assert verify(draft_tokens, draft_probs, target_probs, np.random.default_rng(0)) == expected


def test_round_result_emitted_and_bonus() -> None:
    assert RoundResult(1, 9, (4, 5, 6)).emitted == (4, 9)
    assert RoundResult(3, 9, (4, 5, 6)).emitted == (4, 5, 6, 9)
    assert RoundResult(3, 9, (4, 5, 6)).bonus and not RoundResult(2, 9, (4, 5, 6)).bonus


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: RoundResult(4, 0, (1, 2, 3)), "accepted=4 outside 0..3"),
        (lambda: verify([1], np.full((1, 3), 1 / 3), np.full((1, 3), 1 / 3), RNG), "target_probs"),
        (lambda: verify([1], np.full((1, 4), 1 / 4), np.full((2, 3), 1 / 3), RNG), "draft_probs"),
        (lambda: one_hot([5], 5), r"token ids must be in \[0, 5\)"),
        (lambda: sample(np.zeros(3), RNG), "no probability mass"),
        (lambda: processed_probs(np.full(3, -np.inf), SamplingParams(), LLAMA), "finite"),
    ],
)
def test_bad_inputs_raise(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# (c) Seeded chi-square of the emitted tokens per position, with a negative control.

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


def _per_position_p_values(verifier: Verifier, seed: int) -> list[float]:
    """Chi-square p-value of each emitted position against that position's target row."""
    rng = np.random.default_rng(seed)
    counts = np.zeros_like(CHI_TARGET)
    for _ in range(CHI_SQUARE_ROUNDS):
        draft_tokens = np.array([sample(row, rng) for row in CHI_DRAFT])
        emitted = verifier(draft_tokens, CHI_DRAFT, CHI_TARGET, rng).emitted
        counts[np.arange(len(emitted)), emitted] += 1
    p_values = []
    for observed, target_row in zip(counts, CHI_TARGET, strict=True):
        support = target_row > 0
        assert observed[~support].sum() == 0, "emitted a token the target gives probability 0"
        expected = target_row[support] * observed.sum()
        p_values.append(float(stats.chisquare(observed[support], expected).pvalue))
    return p_values


def test_emitted_tokens_follow_target_per_position() -> None:
    p_values = _per_position_p_values(verify, seed=20_230_518)
    assert min(p_values) >= SIGNIFICANCE, p_values


def test_argmax_on_reject_negative_control_fails_the_same_test() -> None:
    p_values = _per_position_p_values(_verify_argmax_on_reject, seed=20_230_518)
    assert min(p_values) < SIGNIFICANCE**2, p_values


# (d) sample() and verify(): reproducible per seed, and never a token without mass.


def _draws(probs: np.ndarray, seed: int, count: int = 200) -> list[int]:
    rng = np.random.default_rng(seed)
    return [sample(probs, rng) for _ in range(count)]


def test_sample_is_reproducible_per_seed() -> None:
    probs = np.random.default_rng(1).dirichlet(np.ones(50))
    assert _draws(probs, 42) == _draws(probs, 42)
    assert _draws(probs, 42) != _draws(probs, 43)


def test_verify_is_reproducible_per_seed() -> None:
    rng = np.random.default_rng(3)
    draft_probs, target_probs = rng.dirichlet(np.ones(9), 4), rng.dirichlet(np.ones(9), 5)
    tokens = np.array([0, 3, 5, 8])
    results = [verify(tokens, draft_probs, target_probs, np.random.default_rng(11)) for _ in range(2)]
    assert results[0] == results[1]


class _HighestUniform:
    """Stands in for a Generator whose next uniform is the largest double below 1."""

    def random(self) -> float:
        return float(np.nextafter(1.0, 0.0))


@pytest.mark.parametrize(
    "probs, expected",
    [([0.3, 0.7, 0.0, 0.0], 1), ([2.0, 0.0, 6.0], 2), ([0.0, 0.0, 1.0], 2)],
)
def test_sample_top_of_range_lands_on_a_token_with_mass(probs: list[float], expected: int) -> None:
    assert sample(np.array(probs), _HighestUniform()) == expected  # type: ignore[arg-type]


def test_sample_never_picks_zero_probability() -> None:
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    rng = np.random.default_rng(5)
    assert {sample(probs, rng) for _ in range(2_000)} == {1, 3}


# --- the folded vocabulary (KnownSupport): what the verifier's draft_support extension feeds ---

def _fold(target_row: np.ndarray, draft_rows: np.ndarray, target_rows: np.ndarray, draft_tokens: list[int],
          rng: np.random.Generator, outside_sampler: object) -> KnownSupport:
    """Build a KnownSupport as the verifier does: draft support ids, target probs on them, an outside draw."""

    k, vocab = draft_rows.shape
    width = max(int(np.count_nonzero(row)) for row in draft_rows)
    ids = np.full((k + 1, width), -1, dtype=np.int64)
    target = np.zeros((k + 1, width))
    draft = np.zeros((k, width))
    outside_mass = np.zeros(k + 1)
    outside_tokens = np.full(k + 1, -1, dtype=np.int64)
    for position in range(k):
        support = np.flatnonzero(draft_rows[position])
        ids[position, : support.size] = support
        target[position, : support.size] = target_rows[position, support]
        draft[position, : support.size] = draft_rows[position, support]
        rest = target_rows[position].copy()
        rest[support] = 0.0
        outside_mass[position] = rest.sum()
        outside_tokens[position] = outside_sampler(rest, rng) if rest.sum() > 0 else -1
    outside_mass[k] = 1.0
    outside_tokens[k] = sample(target_rows[k], rng)
    return KnownSupport(ids, draft, target, outside_mass, outside_tokens)


def _first_token_counts(outside_sampler, rounds: int = 20_000) -> tuple[np.ndarray, np.ndarray]:

    rng = np.random.default_rng(20261121)
    vocab, k = 8, 2
    target_rows = np.array([[0.30, 0.25, 0.15, 0.10, 0.08, 0.06, 0.04, 0.02]] * (k + 1))
    draft_full = np.array([0.05, 0.40, 0.05, 0.30, 0.05, 0.05, 0.05, 0.05])
    draft_row = np.zeros(vocab)
    draft_row[[1, 3, 0]] = draft_full[[1, 3, 0]]  # the draft's top 3, renormalised (a truncated support)
    draft_row /= draft_row.sum()
    draft_rows = np.stack([draft_row] * k)
    counts = np.zeros(vocab)
    for _ in range(rounds):
        tokens = [sample(draft_rows[i], rng) for i in range(k)]
        support = _fold(target_rows[0], draft_rows, target_rows, tokens, rng, outside_sampler)
        counts[verify_on_support(tokens, support, rng).emitted[0]] += 1
    return counts, target_rows[0] * rounds


def test_folded_support_first_token_follows_the_target() -> None:
    counts, expected = _first_token_counts(lambda rest, rng: sample(rest, rng))
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_folded_support_negative_control_biased_outside_draw_fails() -> None:
    # A verifier that draws the outside token as the most likely one instead of sampling it.
    counts, expected = _first_token_counts(lambda rest, rng: int(np.argmax(rest)))
    assert stats.chisquare(counts, expected).pvalue < 1e-6
