"""Suffix lookup: matches, frequencies, recency, adaptive length, branches, the bounded history, and the drafters."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.drafting import lookup as lookup_module
from proxy.drafting.lookup import HybridDrafter, SuffixDrafter
from proxy.drafting.suffix import LookupSettings, OutputHistory, ScopedHistory, continuations, match_lengths
from tests.fakes.drafter import ScriptedDrafter
from tests.unit.drafting.plans import plan

WIDE = LookupSettings(max_tokens=32, min_prob=0.1, factor=8.0)


def best(corpus: list[int], query: list[int] | None = None, settings: LookupSettings = WIDE) -> tuple[int, ...]:
    found = continuations(np.array(corpus), np.array(corpus if query is None else query), settings)
    return found[0].tokens if found else ()


def test_match_lengths_count_how_far_each_occurrence_matches_the_tail() -> None:
    corpus = np.array([7, 1, 2, 3, 9, 2, 3, 8, 1, 2, 3])
    ends, lengths = match_lengths(corpus, corpus, 64)
    assert dict(zip(ends.tolist(), lengths.tolist(), strict=True)) == {3: 3, 6: 2}  # the tail itself is excluded


@pytest.mark.parametrize(("corpus", "expected"), [
    ([1, 2, 3, 4, 5, 1, 2], (3, 4, 5, 1, 2)),  # the continuation of the match, as long as 8 × the match allows
    ([1, 2, 3], ()),  # nothing repeats
    ([5, 1, 2, 9, 1, 2, 7, 0, 1, 2], (7, 0, 1, 2)),  # a tie in frequency: the most recent occurrence wins
    ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], (9, 2, 3, 8, 1, 2, 3)),  # the longest match wins over a later shorter one
])
def test_best_path(corpus: list[int], expected: tuple[int, ...]) -> None:
    assert best(corpus) == expected


def test_the_most_frequent_continuation_wins_over_the_latest() -> None:
    corpus = [1, 2, 5, 0, 1, 2, 5, 0, 1, 2, 6, 0, 1, 2]
    found = continuations(np.array(corpus), np.array(corpus), LookupSettings(max_tokens=1, factor=8.0))
    assert found[0].tokens == (5,) and found[0].probs == pytest.approx((2 / 3,))


def test_length_follows_the_match_length() -> None:
    text = list(range(10, 40))
    corpus = text + [99, 98] + text[:3]  # the tail matches 3 tokens
    for factor, length in [(1.0, 3), (2.0, 6), (8.0, 24)]:
        assert len(best(corpus, settings=LookupSettings(max_tokens=32, factor=factor))) == length
    assert len(best(text + [99] + text[:20], settings=LookupSettings(max_tokens=32))) == 20  # 20 matched
    assert len(best(corpus, settings=LookupSettings(max_tokens=4, factor=8.0))) == 4


def test_a_shorter_match_whose_path_is_surer_still_wins() -> None:
    # After (7, 8, 9) twice: 1 2 3 then 4 or 5 (3.5 expected); after (8, 9) six times: 1 2 3 then 4 five times in six.
    corpus = [7, 8, 9, 1, 2, 3, 4, -1, 7, 8, 9, 1, 2, 3, 5, -1] + [0, 8, 9, 1, 2, 3, 4, -1] * 4
    (path,) = continuations(np.array(corpus), np.array([7, 8, 9]), LookupSettings(max_tokens=4, factor=8.0))
    assert (path.tokens, path.match_length) == ((1, 2, 3, 4), 2)
    assert path.score == pytest.approx(3 + 5 / 6)


def test_a_path_stops_where_its_probability_falls_below_min_prob() -> None:
    # After (1, 2): 3 every time; after (1, 2, 3): 4, 5, 6 or 7, each with probability 1/4.
    corpus = [1, 2, 3, 4, 10, 1, 2, 3, 5, 11, 1, 2, 3, 6, 12, 1, 2, 3, 7, 13, 1, 2]
    assert best(corpus, settings=LookupSettings(min_prob=0.3, factor=8.0)) == (3,)
    assert best(corpus, settings=LookupSettings(min_prob=0.2, factor=8.0)) == (3, 7, 13, 1, 2)  # the latest of 4


def test_candidates_branch_off_the_best_path() -> None:
    corpus = [7, 1, 2, 3, 4, 0, 7, 1, 2, 3, 5, 9, 8, 7, 1, 2]
    found = continuations(np.array(corpus), np.array(corpus), LookupSettings(factor=8.0, candidates=3))
    assert [c.tokens[:3] for c in found] == [(3, 5, 9), (3, 4, 0)]
    assert found[1].probs[:2] == pytest.approx((1.0, 0.5))


def test_history_is_bounded_and_drops_the_least_recently_used() -> None:
    history = OutputHistory(max_tokens=10)
    history.add([1, 2, 3, 4])
    history.add([5, 6, 7, 8])
    history.corpus()
    history.touch(0)  # the first output was used: the second goes first
    history.add([9, 9, 9])
    assert history.tokens <= 10
    corpus = history.corpus().tolist()
    assert 1 in corpus and 5 not in corpus and corpus.count(-1) == 2
    history.add([42])  # too short to teach anything
    assert 42 not in history.corpus().tolist()


def test_using_an_output_keeps_the_corpus_built() -> None:
    history = OutputHistory(max_tokens=100)
    history.add([1, 2, 3, 4])
    history.add([5, 6, 7, 8])
    corpus = history.corpus()
    history.touch(0)  # which output goes first changes; the corpus (and its order) does not
    assert history.corpus() is corpus and corpus.tolist() == [1, 2, 3, 4, -1, 5, 6, 7, 8, -1]


def test_matches_never_cross_from_one_output_into_the_next() -> None:
    history = OutputHistory(max_tokens=100)
    history.add([1, 2])
    history.add([3, 4])
    assert continuations(history.corpus(), np.array([1, 2]), WIDE) == []


async def test_the_route_history_serves_later_requests_unless_kept_apart() -> None:
    model = ScriptedDrafter(lambda context, k: [])
    for history_tokens, expected in [(1000, (4, 5, 6, 7)), (0, ())]:
        drafter = SuffixDrafter(model, LookupSettings(factor=8.0), history_tokens=history_tokens)
        drafter.reserve("first", [1])
        await drafter.propose([1, 2, 3, 4, 5, 6, 7], plan(request_id="first"))
        drafter.release("first")
        drafter.reserve("second", [8])
        assert (await drafter.propose([8, 2, 3], plan(request_id="second"))).tokens == expected


@pytest.mark.parametrize(("per_tenant", "writer", "reader", "expected"), [
    (True, "key-a", "key-a", (4, 5, 6, 7)),  # a client drafts from its own earlier outputs
    (True, "key-a", "key-b", ()),  # ... never from another client's
    (True, "key-a", "", ()),  # ... nor does a request without a key
    (True, "", "", (4, 5, 6, 7)),  # requests without a key share one scope
    (False, "key-a", "key-b", (4, 5, 6, 7)),  # share_history: route shares across clients on purpose
])
async def test_the_history_is_scoped_per_tenant_unless_shared_across_the_route(
        per_tenant: bool, writer: str, reader: str, expected: tuple[int, ...]) -> None:
    drafter = SuffixDrafter(ScriptedDrafter(lambda context, k: []), LookupSettings(factor=8.0), history_tokens=1000,
                            per_tenant=per_tenant)
    drafter.reserve("first", [1], tenant=writer)
    await drafter.propose([1, 2, 3, 4, 5, 6, 7], plan(request_id="first"))
    drafter.release("first")
    drafter.reserve("second", [8], tenant=reader)
    assert (await drafter.propose([8, 2, 3], plan(request_id="second"))).tokens == expected
    drafter.release("second")


async def test_the_history_is_not_searched_when_the_request_itself_has_a_sure_path_as_long_as_allowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    drafter = SuffixDrafter(ScriptedDrafter(lambda context, k: []), LookupSettings(factor=8.0), history_tokens=1000)
    drafter.reserve("first", [1])
    await drafter.propose([1, 2, 3, 4, 5, 6, 7], plan(request_id="first"))
    drafter.release("first")
    searched = []
    real = lookup_module.continuations
    monkeypatch.setattr(lookup_module, "continuations", lambda corpus, *rest: searched.append(corpus.size) or
                        real(corpus, *rest))
    context = [8, 2, 3, 4, 5, 8, 2, 3]  # the request copies 4, 5 after 8, 2, 3; the history holds 4, 5, 6, 7
    drafter.reserve("second", [8])
    assert (await drafter.propose(context, plan(request_id="second", k=2))).tokens == (4, 5)
    assert searched == [len(context)]  # two sure tokens, the most a path may have: the history could not do better
    searched.clear()
    assert (await drafter.propose(context, plan(request_id="second", k=8))).tokens == (4, 5, 8, 2, 3)
    assert len(searched) == 2  # with room for more, the history is read too


def test_scopes_share_one_bound_and_the_least_recently_used_scope_gives_way() -> None:
    history = ScopedHistory(max_tokens=10)
    history.add("a", [1, 2, 3, 4])
    history.add("a", [5, 6, 7])
    history.add("b", [8, 9, 10, 11])
    assert history.tokens == 7 + 4 - 4  # a's oldest output went to make room for b's
    assert history.get("a").corpus().tolist() == [5, 6, 7, -1]
    history.add("b", [12] * 10)  # alone within the bound: every other scope gives way, and b's older output
    assert history.get("a") is None and history.tokens == 10
    assert history.get("b").corpus().tolist() == [12] * 10 + [-1]


async def test_the_policy_trims_lookup_paths_and_a_hybrid_falls_back_to_its_model() -> None:
    model = ScriptedDrafter(lambda context, k: [11] * k)
    context = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    suffix = SuffixDrafter(model, LookupSettings(factor=8.0))
    matches = []
    trimmed = await suffix.propose(context, plan(worth=lambda probs, match: matches.append(match) or 2))
    assert (trimmed.tokens, trimmed.beyond) == ((4, 5), 6)  # the token after the cut, to check against the target's
    assert matches == [3] and trimmed.match == 3  # the path was found after the context's tail 1, 2, 3
    assert (await suffix.propose(context, plan())).beyond is None  # nothing was cut
    declined = await suffix.propose(context, plan(worth=lambda probs, match: 0))
    assert (declined.tokens, declined.declined[:3], declined.match) == ((), (4, 5, 6), 3)
    hybrid = HybridDrafter(model, LookupSettings(factor=8.0))
    found = await hybrid.propose(context, plan(k=3))
    assert found.tokens[:3] == (4, 5, 6) and found.source == "lookup"
    fallback = await hybrid.propose(context, plan(k=3, worth=lambda probs, match: 0))
    assert fallback.tokens == (11, 11, 11) and fallback.source == "model"
    assert (fallback.declined[:3], fallback.match) == ((4, 5, 6), 3)  # the declined path, to learn from
