"""proxy/targets/vllm.py's parsers on the verification answer captured from a real vLLM (data/), and variations."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import UpstreamUnavailableError
from proxy.targets.vllm_answers import ending, parse_verification
from proxy.targets.vllm_probe import parse_max_logprobs
from tests.unit.targets.test_vllm import ENDPOINTS, VERIFY


def answer() -> dict[str, Any]:
    """A fresh copy of the captured verification answer (5 context tokens, drafts 7042 28 4528, top_n 2)."""
    return copy.deepcopy(VERIFY["response"])


def parse(response: dict[str, Any], draft_tokens: list[int] | None = None, top_n: int = 2):
    return parse_verification(response, VERIFY["context_len"], draft_tokens or VERIFY["draft_tokens"], top_n)


def test_the_captured_answer_parses_position_by_position() -> None:
    verification = parse(answer())
    rows = [(p.token_id, p.top_ids.tolist()) for p in verification.positions]
    # d_1 " Paris" is the argmax; d_2 "," is second to "."; d_3 " London" (rank 47) is an extra
    # entry vLLM adds, not part of the top 2; the bonus position has no draft token.
    assert rows == [(7042, [7042, 260]), (28, [30, 28]), (4528, [284, 527]), (None, [314, 28])]
    assert [p.argmax for p in verification.positions] == [7042, 30, 284, 314]
    assert verification.positions[2].token_logprob == pytest.approx(-7.476838111877441)
    assert verification.positions[0].top_logprobs.tolist() == pytest.approx([-0.2580755352973938, -2.740730047225952])
    assert verification.bonus_token == 314
    assert verification.cached_tokens == 0


def with_entry(response: dict[str, Any], index: int, entry: dict[str, dict[str, Any]]) -> dict[str, Any]:
    response["choices"][0]["prompt_logprobs"][index] = entry
    return response


def lp(logprob: float, rank: int) -> dict[str, Any]:
    return {"logprob": logprob, "rank": rank, "decoded_token": "x"}


@pytest.mark.parametrize(("entry", "top_ids", "top_logprobs", "token_logprob"), [
    # the draft token inside the top 2: no extra entry, nothing dropped
    ({"7042": lp(-0.5, 1), "9": lp(-1.0, 2)}, [7042, 9], [-0.5, -1.0], -0.5),
    # ties go to the lower id, whatever order the dict has
    ({"7042": lp(-0.7, 1), "9": lp(-0.7, 1)}, [9, 7042], [-0.7, -0.7], -0.7),
    # the draft token tied with the second but not chosen by top-k: the third entry is the extra one
    ({"7042": lp(-2.0, 2), "5": lp(-0.5, 1), "6": lp(-2.0, 2)}, [5, 6], [-0.5, -2.0], -2.0),
    # vLLM's -9999.0 is -inf
    ({"7042": lp(-9999.0, 49152), "5": lp(0.0, 1), "6": lp(-9999.0, 2)}, [5, 6], [0.0, -np.inf], -np.inf),
])
def test_top_list_rules(entry: dict, top_ids: list[int], top_logprobs: list[float], token_logprob: float) -> None:
    first = parse(with_entry(answer(), 5, entry)).positions[0]
    assert first.top_ids.tolist() == top_ids
    assert first.top_logprobs.tolist() == top_logprobs
    assert first.token_logprob == token_logprob
    assert first.top_ids.dtype == np.int64


def test_bonus_drops_the_sampled_token_when_it_is_an_extra() -> None:
    response = answer()
    response["choices"][0]["token_ids"] = [77]
    response["choices"][0]["logprobs"]["top_logprobs"] = [{"token_id:77": -3.0, "token_id:1": -0.9, "token_id:2": -1.0}]
    bonus = parse(response).positions[-1]
    assert (bonus.token_id, bonus.token_logprob, bonus.top_ids.tolist()) == (None, None, [1, 2])


def broken(mutate) -> dict[str, Any]:
    response = answer()
    mutate(response)
    return response


@pytest.mark.parametrize(("response", "message"), [
    ({}, "malformed verification answer (KeyError)"),
    ({"choices": []}, "malformed verification answer (IndexError)"),
    (broken(lambda r: r["choices"][0].update(prompt_logprobs=None)), "malformed verification answer (TypeError)"),
    (broken(lambda r: r["choices"][0]["prompt_logprobs"].pop()), "scores 7 prompt positions for a prompt of 8"),
    (broken(lambda r: r["choices"][0]["prompt_logprobs"][6].pop("28")), "did not score the draft token"),
    (broken(lambda r: r["choices"][0]["prompt_logprobs"][5].update({"7042": {"rank": 1}})), "(KeyError)"),
    (broken(lambda r: r["choices"][0]["logprobs"].update(top_logprobs=[{" and": -1.0}])), "(ValueError)"),
    (broken(lambda r: r["choices"][0]["logprobs"].update(top_logprobs=[{}])), "0 log-probs where the top 2"),
    (broken(lambda r: r["choices"][0].pop("token_ids")), "(KeyError)"),
    (broken(lambda r: r["choices"][0].update(logprobs=None)), "(TypeError)"),
    (broken(lambda r: r.update(usage="?")), "(AttributeError)"),
])
def test_malformed_answers_are_upstream_errors(response: Any, message: str) -> None:
    with pytest.raises(UpstreamUnavailableError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(response)


@pytest.mark.parametrize(("message", "cap"), [
    (ENDPOINTS["POST /v1/completions over the cap"]["body"]["error"]["message"], 20),
    ("upstream: Requested prompt logprobs of 1000000000, which is greater than max allowed: 49152 (x)", 49152),
    ("upstream: something else entirely", None),
])
def test_max_logprobs_from_the_error(message: str, cap: int | None) -> None:
    assert parse_max_logprobs(message) == cap


@given(st.data(), st.integers(1, 20))
def test_any_entry_gives_the_top_n_best_first(data: st.DataObject, top_n: int) -> None:
    ids = data.draw(st.lists(st.integers(0, 49151), min_size=top_n + 1, max_size=top_n + 1, unique=True))
    # A distribution's: top_n + 1 of these never hold more than all the mass.
    logprobs = data.draw(st.lists(st.floats(-30, -math.log(top_n + 1)), min_size=top_n + 1, max_size=top_n + 1))
    ranked = sorted(zip(ids, logprobs, strict=True), key=lambda pair: (-pair[1], pair[0]))
    top, rest = ranked[:top_n], ranked[top_n:]
    draft = data.draw(st.sampled_from([pair[0] for pair in ranked]))
    shown = top + [pair for pair in rest if pair[0] == draft]  # vLLM: the top-N plus the standing token
    response = answer()  # one draft, and a bonus position as wide as top_n
    choice = response["choices"][0]
    choice["prompt_logprobs"] = [*choice["prompt_logprobs"][:5],
                                 {str(i): lp(v, 0) for i, v in data.draw(st.permutations(shown))}]
    choice["token_ids"] = [top[0][0]]
    choice["logprobs"]["top_logprobs"] = [{f"token_id:{i}": v for i, v in top}]
    first = parse(response, [draft], top_n).positions[0]
    assert first.top_ids.tolist() == [i for i, _ in top]
    assert first.token_logprob == dict(ranked)[draft]


@pytest.mark.parametrize(("choice", "shown"), [
    ({"finish_reason": "stop", "stop_reason": None}, (5, True)),  # the tokenizer's EOS
    ({"finish_reason": "stop", "stop_reason": 5}, (5, True)),  # a generation_config eos_token_id
    ({"finish_reason": "length", "stop_reason": None}, (5, False)),  # it would have gone on
    ({"finish_reason": "stop", "stop_reason": "###"}, None),  # a stop string: says nothing of the id
    ({"finish_reason": "stop", "stop_reason": 9}, None),  # another id: not this one's doing
    ({"finish_reason": "abort"}, None),
])
def test_how_an_answer_ended_on_its_last_id(choice: dict, shown: tuple[int, bool] | None) -> None:
    assert ending(choice, 5) == shown
