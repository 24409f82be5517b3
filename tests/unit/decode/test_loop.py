"""The round loop with a scripted drafter and the real target clients against fake servers of a toy model.

Each test runs against SGLang and vLLM (tests/fakes/), unless it is about one protocol's requests.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.control.policy import PinnedPolicy
from proxy.decode.decision import Decision, Measure, Speculate
from proxy.decode.events import PlainEvent, SwitchEvent
from proxy.decode.loop import FIRST_CHUNK, PLAIN_CHUNK
from proxy.drafting.base import Draft
from proxy.errors import UpstreamError
from proxy.sampling.processors import SamplingParams, one_hot
from tests.fakes.drafter import ScriptedDrafter
from tests.fakes.toy_model import END, ToyModel, ToyVocabulary
from tests.unit.decode.harness import PROMPT, Served, SwitchAfter, follow, rounds, run


async def test_all_accepted_rounds_emit_k_plus_one(served: Served) -> None:
    batches, events = await run(served, follow(served.model), 15, k=4)
    assert [len(b) for b in batches] == [5, 5, 5]
    assert sum(batches, []) == served.model.greedy(PROMPT, 15)
    assert [(len(e.drafted), e.accepted, e.index) for e in rounds(events)] == [(4, 4, 0), (4, 4, 1), (4, 4, 2)]


@pytest.mark.parametrize("wrong_at", [0, 2])
async def test_a_rejected_draft_is_replaced_by_the_targets_token(served: Served, wrong_at: int) -> None:
    batches, events = await run(served, follow(served.model, wrong_at), 12, k=4)
    assert sum(batches, []) == served.model.greedy(PROMPT, 12)
    assert all(e.accepted == wrong_at for e in rounds(events)[:-1])
    assert all(len(b) == wrong_at + 1 for b in batches[:-1])


@pytest.mark.parametrize("end_after", [len(PROMPT) + 6])
async def test_generation_stops_at_the_end_token(served: Served) -> None:
    batches, events = await run(served, follow(served.model), 40, k=4)
    output = sum(batches, [])
    assert output[-1] == END and END not in output[:-1] and len(output) == 7
    assert len(rounds(events)) == 2  # 5 tokens, then the end within the second round


@pytest.mark.parametrize(("max_tokens", "k", "lengths", "drafted"), [
    (5, 4, [5], [4]),  # all four and the bonus fit exactly
    (3, 4, [3], [2]),  # the last round drafts max_tokens - 1
    (7, 4, [5, 2], [4, 1]),
    (1, 4, [1], [1]),  # one token still goes through the sampler
])
async def test_max_tokens_inside_a_round(served: Served, max_tokens: int, k: int, lengths: list[int],
                                         drafted: list[int]) -> None:
    batches, events = await run(served, follow(served.model), max_tokens, k=k)
    assert [len(b) for b in batches] == lengths
    assert [len(e.drafted) for e in rounds(events)] == drafted
    assert sum(batches, []) == served.model.greedy(PROMPT, max_tokens)


async def test_emitted_tokens_are_cut_at_max_tokens_even_after_a_full_round(served: Served) -> None:
    drafter = ScriptedDrafter(lambda context, k: served.model.greedy(context, 8))  # ignores k: proposes up to k
    batches, _ = await run(served, drafter, 6, k=8)
    assert sum(batches, []) == served.model.greedy(PROMPT, 6)


async def test_switch_to_plain_decoding_continues_the_same_text(served: Served) -> None:
    policy = SwitchAfter(k=3, rounds=2)
    batches, events = await run(served, follow(served.model, wrong_at=1), 30, policy=policy)
    assert sum(batches, []) == served.model.greedy(PROMPT, 30)
    kinds = [type(e).__name__ for e in events]
    assert kinds[:3] == ["RoundEvent", "RoundEvent", "SwitchEvent"] and set(kinds[3:]) == {"PlainEvent"}
    assert [e.reason for e in events if isinstance(e, SwitchEvent)] == ["scripted switch"]
    plain = [e for e in events if isinstance(e, PlainEvent)]
    assert sum(len(e.tokens) for e in plain) == 30 - 4  # two rounds emitted 2 tokens each
    plain_calls = served.bodies(scoring=False)
    assert [served.protocol.new_tokens(b) for b in plain_calls] == [PLAIN_CHUNK, PLAIN_CHUNK, PLAIN_CHUNK, 2]


async def test_an_empty_draft_decodes_a_plain_chunk_instead_of_verifying_nothing(served: Served) -> None:
    batches, events = await run(served, ScriptedDrafter(lambda context, k: []), 10)
    assert sum(batches, []) == served.model.greedy(PROMPT, 10)
    assert rounds(events) == [] and served.bodies(scoring=True) == []
    plain = [e for e in events if isinstance(e, PlainEvent)]
    assert all(e.lookup_missed for e in plain) and [len(e.tokens) for e in plain] == [FIRST_CHUNK, 4, 4, 1]


async def test_drafting_resumes_after_a_plain_chunk(served: Served) -> None:
    calls = []

    def every_other(context, k):
        calls.append(len(context))
        return [] if len(calls) % 2 else served.model.greedy(context, k)

    batches, events = await run(served, ScriptedDrafter(every_other), 20, k=3)
    assert sum(batches, []) == served.model.greedy(PROMPT, 20)
    kinds = [type(e).__name__ for e in events]
    assert "RoundEvent" in kinds and "PlainEvent" in kinds and "SwitchEvent" not in kinds


async def test_each_round_asks_the_target_about_the_context_and_the_draft(served: Served) -> None:
    await run(served, follow(served.model, wrong_at=2), 6, k=4)
    first, second = served.bodies(scoring=True)[:2]
    ids = served.protocol.input_ids
    assert ids(first)[: len(PROMPT) + 2] == PROMPT + served.model.greedy(PROMPT, 2)
    assert len(ids(first)) == len(PROMPT) + 4
    assert first.items() >= served.protocol.verification_fields.items()
    assert ids(second)[: len(PROMPT) + 3] == PROMPT + served.model.greedy(PROMPT, 3)


@pytest.mark.parametrize("protocol", ["sglang"])
async def test_sglang_rounds_start_the_logprobs_at_the_last_context_token(served: Served) -> None:
    await run(served, follow(served.model, wrong_at=2), 6, k=4)
    first, second = served.bodies(scoring=True)[:2]
    assert (first["logprob_start_len"], second["logprob_start_len"]) == (len(PROMPT) - 1, len(PROMPT) + 3 - 1)


async def test_a_seeded_request_at_temperature_one_reproduces(served: Served) -> None:
    params = SamplingParams(temperature=1.0, top_k=5)
    drafter = follow(served.model, wrong_at=1)
    first, _ = await run(served, drafter, 20, params=params, seed=42)
    again, _ = await run(served, drafter, 20, params=params, seed=42)
    other, _ = await run(served, drafter, 20, params=params, seed=43)
    assert sum(first, []) == sum(again, []) != sum(other, [])


class TwoPaths(ScriptedDrafter):
    """Proposes a wrong path first and the target's greedy continuation as its alternative (a lookup branch)."""

    def __init__(self, model: ToyModel) -> None:
        super().__init__(lambda context, k: [])
        self.model = model

    async def propose(self, context, plan):
        right = tuple(self.model.greedy(context, plan.k))
        wrong = ((right[0] + 1) % self.vocabulary.n_vocab, *right[1:])
        return Draft(wrong, one_hot(wrong, self.vocabulary.n_vocab), "lookup", (right,))


async def test_several_candidates_are_verified_in_one_round_and_the_right_one_is_followed(served: Served) -> None:
    batches, events = await run(served, TwoPaths(served.model), 12, k=3)
    assert sum(batches, []) == served.model.greedy(PROMPT, 12)
    assert all(e.candidates == 2 and e.accepted == 3 and e.source == "lookup" for e in rounds(events))
    assert len(served.bodies(scoring=True)) == 2 * len(rounds(events))  # both paths scored every round


async def test_a_lookup_drafter_keeps_looking_when_the_policy_turns_the_model_off(served: Served) -> None:
    calls = []

    def lookup_then_nothing(context, k):
        calls.append(k)
        return served.model.greedy(context, 3) if len(calls) % 2 else []

    drafter = ScriptedDrafter(lookup_then_nothing)
    drafter.looks_up = True
    batches, events = await run(served, drafter, 16, policy=SwitchAfter(k=3, rounds=0), lookup_k=8)
    assert sum(batches, []) == served.model.greedy(PROMPT, 16)
    assert {type(e).__name__ for e in events} == {"RoundEvent", "PlainEvent"}  # no switch: lookups go on
    assert {k for _, k in drafter.calls} == {0}  # the model's K stayed 0


class MeasureOnce(PinnedPolicy):
    """Drafts k, except one plain chunk (to measure the plain rate) after the first round."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.k, self.decided = k, 0

    def decide(self) -> Decision:
        self.decided += 1
        return Measure("measuring") if self.decided == 2 else Speculate(self.k, "scripted")


async def test_a_plain_chunk_to_measure_the_plain_rate_does_not_end_speculation(served: Served) -> None:
    batches, events = await run(served, follow(served.model), 20, policy=MeasureOnce(k=3))
    assert sum(batches, []) == served.model.greedy(PROMPT, 20)
    kinds = [type(e).__name__ for e in events]
    assert kinds[:3] == ["RoundEvent", "PlainEvent", "RoundEvent"] and "SwitchEvent" not in kinds
    assert len(events[1].tokens) == PLAIN_CHUNK and not events[1].lookup_missed


class StalledPaths:
    """The served target, except that a verification of a path beginning with a token of `failing` fails at once and
    every other one never answers; those left running and those cancelled are counted."""

    def __init__(self, served: Served, failing: frozenset[int] = frozenset()) -> None:
        self._served, self._failing = served, failing
        self.order = served.target.order
        self.running = self.cancelled = 0

    async def score(self, context, draft, plan):
        if draft.tokens[0] in self._failing:
            raise UpstreamError("the upstream failed this path")
        self.running += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    def __getattr__(self, name):
        return getattr(self._served.target, name)


async def settled() -> None:
    """Let every task that was woken or cancelled take its next step."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("protocol", ["sglang"])
@pytest.mark.parametrize("failing", ["the draft", "the other path"])
async def test_a_failing_path_cancels_the_verification_of_the_other(served: Served, failing: str) -> None:
    right = served.model.greedy(PROMPT, 1)[0]
    wrong = (right + 1) % ToyVocabulary().n_vocab  # TwoPaths' draft; `right` begins its other path
    target = StalledPaths(served, frozenset({wrong if failing == "the draft" else right}))
    with pytest.raises(UpstreamError):
        await asyncio.wait_for(run(served, TwoPaths(served.model), 12, k=3, target=target), 5)
    await settled()
    assert (target.running, target.cancelled) == (0, 1)  # no verification goes on for nobody


@pytest.mark.parametrize("protocol", ["sglang"])
async def test_a_client_gone_cancels_the_verification_of_every_path(served: Served) -> None:
    target = StalledPaths(served)
    generation = asyncio.ensure_future(run(served, TwoPaths(served.model), 12, k=3, target=target))
    while target.running < 2:
        await asyncio.sleep(0)
    generation.cancel()  # what the server does to a handler whose client hung up
    with pytest.raises(asyncio.CancelledError):
        await generation
    await settled()
    assert (target.running, target.cancelled) == (0, 2)


class AheadRefused(ScriptedDrafter):
    """Drafts the target's greedy continuation; a draft-ahead fails as it starts, before anything is awaited."""

    def __init__(self, model: ToyModel) -> None:
        super().__init__(follow(model).script)

    def propose(self, context, plan):  # not async: the failure comes from the call itself
        if plan.k == 1 and len(context) > len(PROMPT):  # the draft-ahead's guess of the target's next token
            raise RuntimeError("no draft-ahead")
        return super().propose(context, plan)


@pytest.mark.parametrize("protocol", ["sglang"])
async def test_a_round_that_fails_after_its_verification_started_cancels_it(served: Served) -> None:
    target = StalledPaths(served)
    with pytest.raises(RuntimeError, match="no draft-ahead"):
        await asyncio.wait_for(run(served, AheadRefused(served.model), 20, k=4, pipeline=True, target=target), 5)
    await settled()
    assert target.running == 0
