"""Changes learned from how an output copies its prompt, and lookup paths that make them again."""

from __future__ import annotations

from proxy.drafting.edits import Edit, in_prompt_words, learn_edits, replay
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
