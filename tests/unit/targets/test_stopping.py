"""The route's stop set: the ids first assumed, then what the server's answers showed."""

from __future__ import annotations

from proxy.targets.stopping import EndEvidence, StopSet


def test_the_servers_answers_have_the_last_word_either_way() -> None:
    stop = StopSet(frozenset({0, 2}), "assumed")
    assert stop.is_end(2) and not stop.is_end(7)
    stop.seen.saw(2, False)  # generated and went on past: a base model's <|im_end|>
    stop.seen.saw(7, True)  # ended there: an id only its generation config names
    assert not stop.is_end(2) and stop.is_end(7) and stop.is_end(0)
    stop.seen.saw(7, False)  # the latest answer decides
    assert not stop.is_end(7)


def test_evidence_gathered_before_the_set_is_known_is_judged_against_it() -> None:
    seen = EndEvidence()
    seen.saw(5, True)
    seen.saw(0, True)
    stop = StopSet(frozenset({0}), "assumed", seen)
    assert stop.is_end(5) and stop.is_end(0) and not stop.is_end(6)
