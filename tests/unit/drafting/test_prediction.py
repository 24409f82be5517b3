"""The prediction draft: following the output through the prediction (copies, changes, inserted and deleted lines,
a wrong prediction), path lengths, and the drafter around the route's own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import pytest

from proxy.drafting.base import Draft, Source
from proxy.drafting.prediction import PredictionDrafter
from proxy.sampling.processors import one_hot
from tests.fakes.drafter import ScriptedDrafter
from tests.unit.drafting.plans import plan

NL = 9  # the newline token: every line ends with it


def line(n: int) -> list[int]:
    """Line n of a prediction: four tokens of its own, then the newline."""
    return [100 + 10 * n + j for j in range(4)] + [NL]


def lines(*numbers: int) -> list[int]:
    return [token for n in numbers for token in line(n)]


PREDICTION_IDS = lines(0, 1, 2, 3, 4, 5)
INSERTED = [500, 501, 502, NL]
CHANGED = [100 + 10 * 2, 777, *line(2)[2:]]  # line 2 with its second token replaced


class WideVocabulary:
    """Room for the test's token ids (none of which ends a generation)."""

    n_vocab = 2048

    def is_end_of_generation(self, token: int) -> bool:
        return False


def route_drafter(script=lambda context, k: []) -> ScriptedDrafter:
    """The route's own drafter behind the prediction: scripted, of the wide vocabulary."""
    drafter = ScriptedDrafter(script)
    drafter.vocabulary = WideVocabulary()  # type: ignore[assignment]
    return drafter


def path_after(output: Sequence[int], prediction: Sequence[int] = PREDICTION_IDS, limit: int = 32) -> tuple[int, ...]:
    """The prediction's path once the output so far was followed token by token, as rounds of one token would."""
    drafter = PredictionDrafter(route_drafter(), prediction, prompt_length=0)
    for end in range(len(output) + 1):
        found = drafter.alignment(output[:end]).path(limit)
    return found.tokens


@pytest.mark.parametrize(("output", "starts_with"), [
    ([], line(0)),  # nothing written: the prediction from its start
    (lines(0, 1), line(2)),  # a copy goes on after itself
    (lines(0, 1) + line(2)[:2], line(2)[2:] + line(3)),  # ... mid-line too
    (lines(0, 1) + INSERTED + line(2)[:1], line(2)[1:] + line(3)),  # a line inserted: the copy goes on after it
    (lines(0, 1, 3)[:-3], line(3)[2:] + line(4)),  # a line deleted: found again ahead
    (lines(0, 1) + CHANGED, line(3)),  # a token changed: found again right after it
    (lines(0, 1) + CHANGED[:2] + line(2)[2:4], [NL] + line(3)),  # ... by the next tokens already
    (lines(0, 1, 2, 3, 4, 5), ()),  # the prediction is used up
])
def test_the_path_continues_the_prediction_from_where_the_output_stands(output: list[int],
                                                                          starts_with: list[int]) -> None:
    found = path_after(output)
    assert found[:len(starts_with)] == tuple(starts_with), found


def test_while_a_line_is_inserted_the_prediction_waits() -> None:
    assert path_after(lines(0, 1) + INSERTED[:2]) == ()


def test_a_wrong_prediction_drafts_nothing_once_the_output_left_it() -> None:
    output = [900 + n for n in range(12)]
    assert path_after(output[:1], [7, 8]) == () and path_after(output) == ()


def test_a_change_that_repeats_is_drafted_as_the_output_makes_it() -> None:
    """Token 7 in every line renamed to 70, 71: once the output renamed it in line 0, the path renames it."""
    prediction = [t for n in range(4) for t in (100 + 10 * n, 101 + 10 * n, 7, 103 + 10 * n, 104 + 10 * n, NL)]
    output = [t for n in range(4) for t in (100 + 10 * n, 101 + 10 * n, 70, 71, 103 + 10 * n, 104 + 10 * n, NL)]
    assert path_after(output[:7], prediction)[:7] == tuple(output[7:14])  # the next line, renamed


def test_long_copies_earn_long_drafts() -> None:
    prediction = list(range(1000, 1200))
    lengths = [len(path_after(prediction[:written], prediction)) for written in (0, 20, 60, 150)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert len(path_after(prediction[:150], prediction, limit=8)) == 8  # never past the round's limit


def test_a_draft_ahead_that_missed_leaves_no_trace() -> None:
    """The loop may align a longer output (a branch drafted ahead) and then a shorter, different one."""
    drafter = PredictionDrafter(route_drafter(), PREDICTION_IDS, prompt_length=0)
    fresh = PredictionDrafter(route_drafter(), PREDICTION_IDS, prompt_length=0)
    drafter.alignment(lines(0))
    drafter.alignment(lines(0) + [555, 556, 557, NL])  # the branch: a departure
    taken = lines(0) + line(1)[:2]
    fresh.alignment(lines(0))
    assert drafter.alignment(taken) == fresh.alignment(taken)


async def test_the_drafter_proposes_the_prediction_first_then_the_route_drafter() -> None:
    inner = route_drafter(lambda context, k: [42] * k)
    prompt = [1, 2, 3]
    drafter = PredictionDrafter(inner, PREDICTION_IDS, prompt_length=len(prompt))
    first = await drafter.propose(prompt, plan(8))
    assert (first.source, first.tokens) == (Source.PREDICTION, tuple(PREDICTION_IDS[:8]))
    assert first.probs.shape == (8, inner.vocabulary.n_vocab)
    assert (first.probs.dense().max(axis=1) == 1).all()  # one-hot
    asked: list[bool] = []
    trimmed = await drafter.propose(prompt, plan(8, worth=lambda probs, match, predicted=False:
                                                 asked.append(predicted) or 3))
    assert trimmed.tokens == tuple(PREDICTION_IDS[:3]) and asked == [True]  # judged as the client's prediction
    declined = await drafter.propose(prompt, plan(8, worth=lambda *_, **__: 0))
    assert declined.tokens == (42,) * 8 and declined.declined == tuple(PREDICTION_IDS[:8])  # the route's draft
    done = await drafter.propose(prompt + PREDICTION_IDS, plan(4))
    assert done.tokens == (42,) * 4 and not inner.looks_up and drafter.looks_up


class ReadingDrafter(ScriptedDrafter):
    """A route drafter with a model: reading tokens answers the model's greedy choice before each (scripted)."""

    def __init__(self, choose: Callable[[Sequence[int]], int]) -> None:
        super().__init__(lambda context, k: [42] * k)
        self.vocabulary = WideVocabulary()  # type: ignore[assignment]
        self.choose, self.reads = choose, []

    def occupancy(self) -> tuple[int, int]:
        return 0, 1  # holds a sequence per request, as a model does

    def read(self, request_id: str, context: Sequence[int], tokens: Sequence[int]) -> Awaitable[list[int]]:
        self.reads.append(list(tokens))
        choices = [self.choose([*context, *tokens[:i]]) for i in range(len(tokens))]
        future = asyncio.get_running_loop().create_future()
        future.set_result(choices)
        return future


def agreeing_except(position: int, token: int) -> Callable[[Sequence[int]], int]:
    """A model that writes the prediction (after a prompt of 3) except `token` at output position `position`."""
    return lambda context: token if len(context) - 3 == position else LONG[len(context) - 3]


LONG = list(range(1000, 1100))


async def test_the_draft_model_checks_the_path_and_writes_its_own_token_where_it_leaves_it() -> None:
    prompt = [1, 2, 3]
    agreeing = ReadingDrafter(agreeing_except(-1, 0))
    drafter = PredictionDrafter(agreeing, LONG, prompt_length=len(prompt))
    unchecked = PredictionDrafter(route_drafter(), LONG, prompt_length=len(prompt))
    first = await drafter.propose(prompt, plan(32))
    # Before the first token nothing is checked (the model would read the prompt while the client waits): the
    # path ends where its estimates do.
    assert 0 < len(first.tokens) < 32 and agreeing.reads == []
    whole = await drafter.propose(prompt + LONG[:1], plan(32))
    # Checked by the model, the path runs to the round's limit; unchecked, its estimates end it.
    assert whole.tokens == tuple(LONG[1:33]) and agreeing.reads == [LONG[1:33]]
    assert whole.checked and not first.checked
    assert len((await unchecked.propose(prompt + LONG[:1], plan(32))).tokens) < 32
    leaving = ReadingDrafter(agreeing_except(5, 777))
    cut = await PredictionDrafter(leaving, LONG, prompt_length=len(prompt)).propose(prompt + LONG[:1], plan(32))
    assert (cut.source, cut.tokens) == (Source.PREDICTION, (*LONG[1:5], 777))


async def test_no_check_where_the_round_lets_the_model_draft_nothing() -> None:
    model = ReadingDrafter(agreeing_except(2, 777))
    drafter = PredictionDrafter(model, LONG, prompt_length=3)
    found = await drafter.propose([1, 2, 3, LONG[0]], replace(plan(8), k=0))  # lookups only (the prompt being read)
    assert found.tokens == tuple(LONG[1:9]) and model.reads == []


async def test_after_an_edit_the_models_draft_leads_and_the_prediction_follows_in_the_same_round() -> None:
    prompt = [1, 2, 3]
    written = lines(0, 1) + CHANGED[:2]  # line 2's second token replaced: the output left the prediction
    goes_on = CHANGED[2:] + lines(3, 4, 5)  # ... and is back on it two tokens later

    def next_of(context: Sequence[int]) -> list[int]:
        return goes_on[len(context) - len(prompt) - len(written):]

    model = ReadingDrafter(lambda context: next_of(context)[0])
    plans: list = []
    model.script = lambda context, k: next_of(context)[:k]
    model.propose = lambda context, asked: plans.append(asked) or ReadingDrafter.propose(model, context, asked)
    drafter = PredictionDrafter(model, PREDICTION_IDS, prompt_length=len(prompt))
    found = await drafter.propose(prompt + written, replace(plan(16), k=4))
    assert (found.source, found.led, found.tokens) == (Source.PREDICTION, 4, tuple(goes_on[:16]))
    # Asked of the route's drafter during the edit: a lookup path shorter than the model's 4 tokens gives way.
    assert (plans[0].worth([1.0] * 3, 0), plans[0].worth([1.0] * 5, 0)) == (0, 5)
    assert found.probs.shape == (16, WideVocabulary.n_vocab) and (found.probs.dense().max(axis=1) == 1).all()
    assert model.reads == [goes_on[4:16]]  # the model checked the prediction's part, after its own
    model.script = lambda context, k: [500, 501, 502, 503][:k]  # an edit that does not come back to the prediction
    alone = await drafter.propose(prompt + written, replace(plan(16), k=4))
    assert (alone.source, alone.led, alone.tokens) == ("model", 0, (500, 501, 502, 503))
    declined = await drafter.propose(prompt + written, replace(plan(16, worth=lambda *_, **__: 0), k=4))
    assert declined.led == 0 and declined.source == "model"  # a path not worth verifying is not added either


async def test_a_route_lookup_path_keeps_its_own_match_beside_a_declined_prediction() -> None:
    inner = route_drafter()
    inner.propose = lambda context, asked: _lookup([600, 601], match=7)
    drafter = PredictionDrafter(inner, PREDICTION_IDS, prompt_length=3)
    found = await drafter.propose([1, 2, 3], plan(8, worth=lambda *_, **__: 0))  # the prediction's path declined
    assert (found.source, found.tokens, found.declined) == ("lookup", (600, 601), tuple(PREDICTION_IDS[:8]))
    assert found.match == 7  # the path verified is judged by the match it was found after


async def test_a_lookup_path_in_a_prediction_request_is_checked_too() -> None:
    prompt, found = [1, 2, 3], [600 + i for i in range(8)]
    written = len(prompt) + len(LONG)
    model = ReadingDrafter(lambda context: 999 if len(context) == written + 3 else found[len(context) - written])
    model.propose = lambda context, asked: _lookup(found)
    drafter = PredictionDrafter(model, LONG, prompt_length=len(prompt))
    after = await drafter.propose(prompt + LONG, plan(16))  # the prediction is used up: the route's lookup drafts
    assert (after.source, after.checked, after.tokens) == ("lookup", True, (600, 601, 602, 999))
    assert (after.probs.dense().max(axis=1) == 1).all() and after.probs.dense()[3, 999] == 1


async def _lookup(tokens: list[int], match: int = 0) -> Draft:
    return Draft(tuple(tokens), one_hot(tokens, WideVocabulary.n_vocab), "lookup", match=match)
