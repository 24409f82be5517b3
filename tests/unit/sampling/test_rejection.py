"""Tests for proxy.sampling.rejection: the exact identity, one-hot tables, bad inputs, sample() and seeds."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from proxy.sampling.processors import SamplerOrder, SamplingParams, one_hot, processed_probs
from proxy.sampling.rejection import KnownSupport, RoundResult, acceptance_probs, residual_probs, sample, verify
from tests.unit.sampling.test_processors import ALL_ORDERS, LLAMA, QWEN_VOCAB

IDENTITY_TOLERANCE = 1e-12
RNG = np.random.default_rng(0)  # for calls that fail before drawing


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
        # NaN compares false: u >= NaN would accept the draft token without the guard.
        (lambda: verify([1], np.full((1, 3), 1 / 3), np.array([[0.2, np.nan, 0.8], [1.0, 0.0, 0.0]]), RNG),
         "must be finite"),
        (lambda: verify([1], np.array([[0.0, np.nan, 0.0]]), np.full((2, 3), 1 / 3), RNG), "must be finite"),
        (lambda: verify([1], np.full((1, 3), 1 / 3), np.array([[0.5, np.inf, 0.5], [1.0, 0.0, 0.0]]), RNG),
         "must be finite"),
        (lambda: verify([1], np.full((1, 3), 1 / 3), np.array([[0.5, -0.5, 1.0], [1.0, 0.0, 0.0]]), RNG),
         "must not be negative"),
        (lambda: verify([-1], np.full((1, 3), 1 / 3), np.full((2, 3), 1 / 3), RNG), r"draft_tokens must lie in 0\.\.2"),
        (lambda: verify([3], np.full((1, 3), 1 / 3), np.full((2, 3), 1 / 3), RNG), r"draft_tokens must lie in 0\.\.2"),
        (lambda: sample(np.array([0.5, np.nan, 0.5]), RNG), "non-finite"),
        (lambda: sample(np.array([0.5, -0.1, 0.6]), RNG), "negative"),
        # A one-element row would be broadcast over every id of its position.
        (lambda: KnownSupport.from_rows([np.array([4, 5]), np.array([])], [np.array([0.9]), np.array([])],
                                        [np.array([0.5, 0.5])], np.zeros(2), np.full(2, -1)),
         r"position 0: 2 ids but rows of \[1, 2\] probabilities"),
        (lambda: KnownSupport.from_rows([np.array([4, 5]), np.array([])], [np.array([0.5, 0.5]), np.array([])],
                                        [np.array([1.0])], np.zeros(2), np.full(2, -1)),
         r"position 0: 2 ids but rows of \[1, 2\] probabilities"),
        (lambda: KnownSupport.from_rows([np.array([4]), np.array([])], [np.array([1.0])], [np.array([1.0])],
                                        np.zeros(2), np.full(2, -1)), "2 id rows need as many target rows"),
        (lambda: KnownSupport.from_rows([np.array([4]), np.array([])], [np.array([1.0]), np.array([])],
                                        [np.array([1.0])], np.zeros(1), np.full(2, -1)), "outside masses"),
    ],
)
def test_bad_inputs_raise(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# (c) sample() and verify(): reproducible per seed, and never a token without mass.


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
