"""proxy/targets/sglang.py's parsers on hand-written answers: stock top-N, and our draft-support extension."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from proxy.errors import UpstreamUnavailableError
from proxy.targets.sglang import parse_support, parse_verification
from proxy.targets.sglang_parse import ending
from tests.fakes.toy_model import VOCAB

# Parsing: a top-N answer.


def answer() -> dict[str, Any]:
    """A /generate answer for drafts 5 and 9 after a context ending in 11, top 2: d_2 is outside the top 2."""
    return {"text": "c ", "output_ids": [2], "meta_info": {
        "id": "a", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 6, "weight_version": "default",
        "input_token_logprobs": [[None, 11, None], [-0.1, 5, None], [-2.0, 9, None]],
        "input_top_logprobs": [None, [[-0.1, 5, None], [-2.5, 3, None]], [[-0.5, 4, None], [-1.5, 6, None]]],
        "output_token_logprobs": [[-0.2, 2, None]], "output_top_logprobs": [[[-0.2, 2, None], [-1.9, 8, None]]],
        "output_token_logprobs_length": 1, "completion_tokens": 1, "cached_tokens": 3}}


def changed(mutate: Callable[[dict[str, Any]], Any], base: Callable[[], dict[str, Any]] = answer) -> dict[str, Any]:
    response = copy.deepcopy(base())
    mutate(response)
    return response


def with_text(response: dict[str, Any]) -> None:
    """return_text_in_logprobs: the third element carries the token's text."""
    meta = response["meta_info"]
    for entry in [*meta["input_token_logprobs"], *meta["output_token_logprobs"]]:
        entry[2] = "t"
    for top in [*meta["input_top_logprobs"][1:], *meta["output_top_logprobs"]]:
        for entry in top:
            entry[2] = "t"


def drop_null_entries(response: dict[str, Any]) -> None:
    """The alignment an older SGLang path used: no null entry unless the start is 0, one entry per draft."""
    del response["meta_info"]["input_token_logprobs"][0]
    del response["meta_info"]["input_top_logprobs"][0]


@pytest.mark.parametrize(("response", "last_context_token", "cached"), [
    (answer(), 11, 3),
    (answer(), None, 3),  # the context token unknown: the null entry alone tells
    (changed(with_text), 11, 3),
    (changed(lambda r: r["meta_info"].pop("cached_tokens")), 11, 0),
    (changed(drop_null_entries), 11, 3),  # the older alignment reads the same positions
])
def test_a_top_n_answer_parses_position_by_position(response: dict[str, Any], last_context_token: int | None,
                                                    cached: int) -> None:
    verification = parse_verification(response, [5, 9], last_context_token)
    rows = [(p.token_id, p.token_logprob, p.top_ids.tolist(), p.top_logprobs.tolist()) for p in verification.positions]
    assert rows == [(5, -0.1, [5, 3], [-0.1, -2.5]),
                    (9, -2.0, [4, 6], [-0.5, -1.5]),  # the top 2 without d_2, whose logprob is known all the same
                    (None, None, [2, 8], [-0.2, -1.9])]
    assert (verification.bonus_token, verification.cached_tokens) == (2, cached)


def no_drafts(response: dict[str, Any]) -> None:
    """A round of K = 0: only the context token's null entry (current) or nothing (older)."""
    del response["meta_info"]["input_token_logprobs"][1:]
    del response["meta_info"]["input_top_logprobs"][1:]


@pytest.mark.parametrize("response", [changed(no_drafts), changed(lambda r: (no_drafts(r), drop_null_entries(r)))],
                         ids=["null first", "older"])
def test_a_round_without_drafts_parses_to_the_bonus_position(response: dict[str, Any]) -> None:
    verification = parse_verification(response, [], 11)
    assert [p.top_ids.tolist() for p in verification.positions] == [[2, 8]]


@pytest.mark.parametrize(("response", "message"), [
    ({}, "malformed verification answer (KeyError)"),
    ({"meta_info": None, "output_ids": [2]}, "(TypeError)"),
    (changed(lambda r: r["meta_info"].pop("input_token_logprobs")), "(KeyError)"),  # return_logprob not honoured
    (changed(lambda r: r["meta_info"].pop("output_top_logprobs")), "(KeyError)"),  # top_logprobs_num not honoured
    (changed(lambda r: r["meta_info"]["input_token_logprobs"].pop()), "scored 2 input positions for 2 drafts"),
    (changed(lambda r: r["meta_info"]["input_token_logprobs"][0].__setitem__(1, 12)), "3 input positions"),
    (changed(lambda r: r["meta_info"]["input_token_logprobs"][0].__setitem__(0, -0.5)), "3 input positions"),
    (changed(lambda r: r["meta_info"]["input_top_logprobs"].pop()), "(ValueError)"),  # zip(strict): lengths differ
    (changed(lambda r: r["meta_info"]["input_token_logprobs"][2].__setitem__(1, 10)), "scored a different token"),
    (changed(lambda r: r["meta_info"]["input_token_logprobs"][1].__setitem__(0, "high")), "(ValueError)"),
    (changed(lambda r: r["meta_info"]["input_top_logprobs"].__setitem__(2, None)), "no top logprobs"),
    (changed(lambda r: r["meta_info"]["input_top_logprobs"].__setitem__(1, [])), "no top logprobs"),
    (changed(lambda r: r["meta_info"]["input_top_logprobs"][1].__setitem__(0, 7)), "(TypeError)"),
    (changed(lambda r: r.update(output_ids=[])), "has 0 output ids where 1 were asked for"),
    (changed(lambda r: r["meta_info"].update(cached_tokens="many")), "(ValueError)"),
])
def test_malformed_top_n_answers_are_upstream_errors(response: Any, message: str) -> None:
    with pytest.raises(UpstreamUnavailableError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_verification(response, [5, 9], 11)


# Parsing: our verifier's draft-support extension.


SUPPORT_IDS = [[5, 6], [9]]


def draft_probs() -> np.ndarray:  # [2, VOCAB]
    probs = np.zeros((2, VOCAB))
    probs[0, 5], probs[0, 6], probs[1, 9] = 0.7, 0.3, 1.0
    return probs


def support_answer() -> dict[str, Any]:
    """Our verifier's answer for drafts 5 and 9 with supports {5, 6} and {9}: no target mass is outside at 2."""
    return {"text": "c ", "output_ids": [2], "meta_info": {
        "id": "s", "prompt_tokens": 6, "completion_tokens": 1, "cached_tokens": 3,
        "draft_support": {"target_probs": [[0.5, 0.2], [1.0]], "outside_mass": [0.3, 0.0],
                          "outside_tokens": [11, None]}}}


def test_a_draft_support_answer_parses_into_the_known_support() -> None:
    support = parse_support(support_answer(), [5, 9], SUPPORT_IDS, draft_probs())
    assert support.ids.tolist() == [[5, 6], [9, -1], [-1, -1]]  # the bonus row knows no ids: all of it is "outside"
    assert support.target_probs.tolist() == [[0.5, 0.2], [1.0, 0.0], [0.0, 0.0]]
    assert support.draft_probs.tolist() == [[0.7, 0.3], [1.0, 0.0]]
    assert support.outside_mass.tolist() == [0.3, 0.0, 1.0]
    assert support.outside_tokens.tolist() == [11, -1, 2]  # no draw where nothing is outside; the bonus is the output


def extension(mutate: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return changed(lambda r: mutate(r["meta_info"]["draft_support"]), support_answer)


@pytest.mark.parametrize(("response", "message"), [
    (changed(lambda r: r["meta_info"].pop("draft_support"), support_answer), "(KeyError)"),  # a stock SGLang
    (changed(lambda r: r["meta_info"].update(draft_support=None), support_answer), "(TypeError)"),
    (changed(lambda r: r.pop("output_ids"), support_answer), "(KeyError)"),
    (extension(lambda s: s["target_probs"].pop()), "(ValueError)"),
    (extension(lambda s: s["outside_mass"].pop()), "(ValueError)"),
    (extension(lambda s: s["outside_tokens"].append(3)), "(ValueError)"),
    (extension(lambda s: s["outside_tokens"].__setitem__(0, "x")), "(ValueError)"),
])
def test_malformed_draft_support_answers_are_upstream_errors(response: Any, message: str) -> None:
    with pytest.raises(UpstreamUnavailableError, match=r"malformed draft_support answer " + message.replace(
            "(", r"\(").replace(")", r"\)")):
        parse_support(response, [5, 9], SUPPORT_IDS, draft_probs())


@pytest.mark.parametrize(("meta", "shown"), [
    ({"finish_reason": {"type": "stop", "matched": 5}}, (5, True)),  # FINISH_MATCHED_TOKEN
    ({"finish_reason": {"type": "length", "length": 8}}, (5, False)),
    ({"finish_reason": {"type": "stop", "matched": "###"}}, None),  # FINISH_MATCHED_STR
    ({"finish_reason": {"type": "abort", "message": "x"}}, None),
    ({"finish_reason": None}, None),
    ("not a dict", None),
])
def test_how_an_answer_ended_on_its_last_id(meta: Any, shown: tuple[int, bool] | None) -> None:
    assert ending(meta, 5) == shown
