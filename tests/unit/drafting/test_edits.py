"""Changes learned from how an output copies its prompt, and lookup paths that make them again."""

from __future__ import annotations

import difflib
import random
from types import SimpleNamespace

import pytest

from proxy.drafting.edits import LOOKBACK, MAX_ALIGNED_OUTPUT, Edit, OutputEdits, in_prompt_words, learn_edits, replay
from proxy.drafting.lookup import SuffixDrafter
from proxy.drafting.suffix import LookupSettings
from tests.fakes.drafter import ScriptedDrafter
from tests.unit.drafting.plans import plan

OLD, NEW_1, NEW_2 = 20, 21, 22  # a one-token name renamed to a two-token one (the toy vocabulary has 24)
# A prompt that uses the name three times, each in a different line (distinct tokens around it).
PROMPT = [1, 2, 3, 4, 5, OLD, 6, 7, 8, 9, OLD, 10, 11, 12, 13, OLD, 14, 15, 0]
RENAMED = [4, 5, NEW_1, NEW_2, 6, 7, 8, 9, NEW_1, NEW_2, 10, 11, 12, 13, NEW_1, NEW_2, 14, 15]


def test_a_replacement_between_matching_stretches_is_learned() -> None:
    assert learn_edits(PROMPT, RENAMED[:6]) == [Edit((OLD,), (NEW_1, NEW_2))]


def test_an_unfinished_or_loosely_anchored_replacement_or_a_rewrite_is_not() -> None:
    assert learn_edits(PROMPT, RENAMED[:4]) == []  # still inside the change: what follows is unknown
    assert learn_edits(PROMPT, [4, 5, NEW_1, 6, 23]) == []  # one matching token after it
    rewrite = [4, 5, *range(100, 120), 6, 7]
    assert learn_edits(PROMPT, rewrite) == []
    assert learn_edits(PROMPT, PROMPT[3:12]) == []  # an exact copy changes nothing


def test_the_latest_change_of_the_same_text_wins() -> None:
    output = [4, 5, 16, 6, 7, 8, 9, 17, 10, 11]
    assert learn_edits(PROMPT, output) == [Edit((OLD,), (17,))]


def test_the_tail_is_read_in_the_prompts_words() -> None:
    edits = [Edit((OLD,), (NEW_1, NEW_2))]
    assert in_prompt_words([6, 7, 8, 9, NEW_1, NEW_2, 10], edits) == ([6, 7, 8, 9, OLD, 10], ())
    assert in_prompt_words([6, 7, 8, 9, NEW_1], edits) == ([6, 7, 8, 9, OLD], (NEW_2,))  # halfway
    assert in_prompt_words([6, 7, 8], edits) == ([6, 7, 8], ())


def test_replay_makes_the_changes_and_says_where_each_token_came_from() -> None:
    tokens, origins = replay([10, 11, 12, 13, OLD, 14], [Edit((OLD,), (NEW_1, NEW_2))])
    assert tokens == [10, 11, 12, 13, NEW_1, NEW_2, 14] and origins == [0, 1, 2, 3, 4, 4, 5]


async def propose(output: list[int]) -> tuple[int, ...]:
    drafter = SuffixDrafter(ScriptedDrafter(lambda context, k: []), LookupSettings(factor=8.0))
    drafter.reserve("r", PROMPT)
    return (await drafter.propose(PROMPT + output, plan(k=16))).tokens


async def test_a_path_through_the_prompt_makes_the_outputs_change_again() -> None:
    expected = (*RENAMED[6:], 0)
    assert await propose(RENAMED[:6]) == expected
    assert await propose(RENAMED[:9]) == expected[3:]  # the tail stops inside a change: its rest comes first


async def test_without_a_change_the_path_copies_the_prompt() -> None:
    copy = PROMPT[3:9]  # the same six tokens, unchanged
    assert (await propose(copy))[:10] == tuple(PROMPT[9:])


# -- long prompts and outputs: the alignment is bounded, the changes are still learned ---------------

FILE_OLD, FILE_NEW = 7, (8, 9)  # a name in a long file, renamed; the file's other tokens are 100..999


def long_file(length: int) -> list[int]:
    """A file of distinct-looking lines that uses the name about every 50 tokens."""
    rng = random.Random(length)
    return [FILE_OLD if at % 50 == 25 else rng.randrange(100, 1000) for at in range(length)]


def renamed(file: list[int]) -> list[int]:
    return [new for token in file for new in (FILE_NEW if token == FILE_OLD else (token,))]


def prompt_around(file: list[int], filler: int, where: str) -> list[int]:
    """The file with `filler` other tokens (instructions, other files) before it, after it, or both."""
    rng = random.Random(filler)
    other = [rng.randrange(1000, 50_000) for _ in range(filler)]
    at = {"first": 0, "in the middle": filler // 2, "last": filler}[where]
    return [*other[:at], *file, *other[at:]]


@pytest.fixture
def aligned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The output tokens of every alignment made; -1 where the prompt was indexed."""
    sizes: list[int] = []

    class Recorded(difflib.SequenceMatcher):
        def set_seq1(self, a) -> None:  # noqa: ANN001 -- difflib's own signature
            sizes.append(len(a))
            super().set_seq1(a)

        def set_seq2(self, b) -> None:  # noqa: ANN001
            sizes.append(-1)
            super().set_seq2(b)

    monkeypatch.setattr(difflib, "SequenceMatcher", Recorded)
    return sizes


@pytest.mark.parametrize("where", ["first", "in the middle", "last"])
@pytest.mark.parametrize(("file_length", "written"), [(1_000, 400), (6_000, 3_000), (12_000, 9_000)])
def test_a_change_is_learned_in_a_long_prompt_from_the_outputs_latest_tokens(aligned: list, where: str,
                                                                            file_length: int, written: int) -> None:
    file = long_file(file_length)
    output = renamed(file)[:written]
    for filler in (20_000, 40_000):
        assert learn_edits(prompt_around(file, filler, where), output) == [Edit((FILE_OLD,), FILE_NEW)]
    assert max(aligned) == min(written, MAX_ALIGNED_OUTPUT)


@pytest.mark.parametrize("step", [1, 7, 40])
def test_each_round_aligns_only_what_the_output_added(aligned: list, step: int) -> None:
    file = long_file(3_000)
    output = renamed(file)[:1_000]
    edits = OutputEdits(prompt_around(file, 10_000, "in the middle"))
    for written in range(step, len(output) + 1, step):
        learned = edits.learn(output[:written])
    assert learned == [Edit((FILE_OLD,), FILE_NEW)]
    assert aligned.count(-1) == 1  # the prompt indexed once
    assert max(size for size in aligned if size >= 0) <= step + LOOKBACK


def test_a_guess_that_was_not_kept_teaches_nothing() -> None:
    edits = OutputEdits(PROMPT)
    assert edits.learn(RENAMED[:4]) == []
    guessed = [*RENAMED[:4], 6, 7, 8, 9, 23, 10, 11]  # a draft-ahead's continuation: OLD became 23
    assert edits.learn(guessed) == [Edit((OLD,), (23,))]
    assert edits.learn(RENAMED[:9]) == [Edit((OLD,), (NEW_1, NEW_2))]  # what the target wrote instead
    assert edits.learn(PROMPT[3:9]) == []  # another output altogether: learned afresh


async def test_a_path_through_a_long_prompt_makes_the_outputs_change_again() -> None:
    file = long_file(2_000)
    prompt = prompt_around(file, 30_000, "in the middle")
    tokenizer = ScriptedDrafter(lambda context, k: [])
    tokenizer.vocabulary = SimpleNamespace(n_vocab=50_000)
    drafter = SuffixDrafter(tokenizer, LookupSettings(factor=8.0))
    drafter.reserve("r", prompt)
    output = renamed(file)[:1_010]  # the copy stands a few tokens before the next use of the name
    expected = renamed(file)[1_010:1_026]
    assert (await drafter.propose(prompt + output, plan(k=16))).tokens == tuple(expected)
