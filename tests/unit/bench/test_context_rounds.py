"""`speculoos bench context-rounds`: its prompts and its table (the measurement itself runs against a live proxy)."""

from __future__ import annotations

import pytest

from proxy.bench.client import BenchError
from proxy.bench.context_rounds import ContextRounds, SpeculatedAnswer, markdown, prompt


def test_prompts_grow_with_their_lines_and_share_no_prefix_across_requests() -> None:
    assert len(prompt(200, 0)) > 4 * len(prompt(50, 0))
    assert prompt(50, 0).splitlines()[0] != prompt(50, 1).splitlines()[0]
    assert prompt(50, 0).splitlines()[1:] == prompt(50, 1).splitlines()[1:]


def test_the_table_compares_each_size_with_the_smallest() -> None:
    rows = [ContextRounds(300, (310, 330), 20, 780.0, 0.9, 4.1), ContextRounds(1800, (1790, 1810), 18, 1170.0,
                                                                                None, None)]
    table = markdown(rows, 4)
    assert "| 310–330 | 20 | 780 | 1.00× | 0.90 | 4.10 |" in table
    assert "| 1790–1810 | 18 | 1170 | 1.50× | – | – |" in table


def test_an_answer_is_read_for_its_rounds_and_a_malformed_one_is_one_bench_error() -> None:
    answer = {"usage": {"prompt_tokens": 300, "completion_tokens": 64},
              "speculoos": {"rounds": 12, "verify_ms": 6000.0, "drafted": 48, "accepted": 40, "plain_tokens": 4}}
    read = SpeculatedAnswer.read(answer, 300)
    assert (read.prompt_tokens, read.rounds, read.verify_ms, read.round_tokens) == (300, 12, 6000.0, 60)
    for broken in ({**answer, "usage": None}, {**answer, "speculoos": {**answer["speculoos"], "verify_ms": "x"}},
                   {"speculoos": answer["speculoos"]}, {**answer, "speculoos": {"rounds": 0}}, []):
        with pytest.raises(BenchError, match="at 300 tokens"):
            SpeculatedAnswer.read(broken, 300)
