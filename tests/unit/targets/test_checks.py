"""Upstream answers refused at the boundary (proxy/targets/checks.py through each parser): bad answer -> message."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplingParams
from proxy.targets import checks
from proxy.targets.sglang import SGLangTarget, parse_support, parse_verification
from proxy.targets.upstream import Timeouts, Upstream
from proxy.targets.vllm import VLLMTarget
from proxy.targets.vllm_answers import parse_verification as parse_vllm
from tests.fakes.toy_model import VOCAB
from tests.unit.targets.test_sglang_parse import SUPPORT_IDS, answer, changed, draft_probs, support_answer
from tests.unit.targets.test_vllm import VERIFY
from tests.unit.targets.test_vllm_parse import answer as vllm_answer
from tests.unit.targets.test_vllm_parse import broken

VLLM_VOCAB = 49152  # SmolLM2's, whose answer tests/unit/targets/data holds
OUT = 10**6  # past any vocabulary


def meta(mutate: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return changed(lambda r: mutate(r["meta_info"]))


def support(mutate: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return changed(lambda r: mutate(r["meta_info"]["draft_support"]), support_answer)


def set_at(rows: list, index: int, value: Any) -> None:
    rows[index] = value


TOP_N_FAULTS = [
    # (id, answer for drafts 5 and 9 with top 2, message)
    ("bonus id past the vocabulary", changed(lambda r: r.update(output_ids=[VOCAB])),
     f"the bonus token holds token id {VOCAB}, outside the vocabulary (0..{VOCAB - 1})"),
    ("negative bonus id", changed(lambda r: r.update(output_ids=[-3])), "token id -3, outside the vocabulary"),
    ("two bonus ids", changed(lambda r: r.update(output_ids=[2, 3])), "has 2 output ids where 1 were asked for"),
    ("top-N id past the vocabulary", meta(lambda m: m["input_top_logprobs"][1][1].__setitem__(1, OUT)),
     f"draft position 1 holds token id {OUT}, outside the vocabulary"),
    ("bonus row id past the vocabulary", meta(lambda m: m["output_top_logprobs"][0][0].__setitem__(1, OUT)),
     "the bonus position holds token id"),
    ("NaN top log-prob", meta(lambda m: m["input_top_logprobs"][2][0].__setitem__(0, math.nan)),
     "draft position 2 holds a log-prob of nan, not a finite number"),
    ("+Inf top log-prob", meta(lambda m: m["output_top_logprobs"][0][1].__setitem__(0, math.inf)),
     "the bonus position holds a log-prob of inf"),
    ("-Inf top log-prob", meta(lambda m: m["input_top_logprobs"][1][0].__setitem__(0, -math.inf)),
     "log-prob of -inf, not a finite number"),
    ("NaN draft log-prob", meta(lambda m: m["input_token_logprobs"][1].__setitem__(0, math.nan)),
     "draft position 1 holds a log-prob of nan"),
    ("a log-prob above 0", meta(lambda m: m["input_top_logprobs"][1][0].__setitem__(0, 0.5)),
     "log-prob of 0.5, above 0"),
    ("mass above 1", meta(lambda m: m["input_top_logprobs"][1][1].__setitem__(0, -0.2)),
     "draft position 1's probabilities sum to 1.72"),
    ("mass above 1 with the draft token", meta(lambda m: m["input_token_logprobs"][2].__setitem__(0, -0.1)),
     "draft position 2's probabilities sum to"),
    ("an id twice", meta(lambda m: m["input_top_logprobs"][1][1].__setitem__(1, 5)), "names a token twice"),
    ("a one-element row", meta(lambda m: m["input_top_logprobs"][2].pop()),
     "draft position 2 has 1 top log-probs where 2 were asked for"),
    ("a row too wide", meta(lambda m: m["output_top_logprobs"][0].append([-5.0, 7, None])),
     "the bonus position has 3 top log-probs where 2 were asked for"),
    ("two bonus rows", meta(lambda m: m["output_top_logprobs"].append(m["output_top_logprobs"][0])),
     "the bonus position has 2 rows where 1 were asked for"),
    ("one position too few", meta(lambda m: (m["input_token_logprobs"].pop(), m["input_top_logprobs"].pop())),
     "scored 2 input positions for 2 drafts"),
]


@pytest.mark.parametrize("response, message", [case[1:] for case in TOP_N_FAULTS], ids=[c[0] for c in TOP_N_FAULTS])
def test_bad_top_n_answers_are_refused(response: dict[str, Any], message: str) -> None:
    with pytest.raises(UpstreamUnavailableError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_verification(response, [5, 9], 11, top_n=2, vocab_size=VOCAB)


def test_a_good_top_n_answer_passes_the_checks() -> None:
    verification = parse_verification(answer(), [5, 9], 11, top_n=2, vocab_size=VOCAB)
    assert verification.bonus_token == 2


SUPPORT_FAULTS = [
    # (id, answer for drafts 5 and 9 with supports {5, 6} and {9}, message)
    ("bonus id past the vocabulary", changed(lambda r: r.update(output_ids=[OUT]), support_answer),
     f"the bonus token holds token id {OUT}"),
    ("outside token past the vocabulary", support(lambda s: set_at(s["outside_tokens"], 0, VOCAB)),
     f"draft_support position 1 holds token id {VOCAB}, outside the vocabulary"),
    ("outside token one of the draft's", support(lambda s: set_at(s["outside_tokens"], 0, 6)),
     "draft_support position 1's outside token 6 is one of the draft's ids"),
    ("outside mass but no outside token", support(lambda s: (set_at(s["outside_tokens"], 0, None))),
     "draft_support position 1 has mass outside the draft's ids but no token drawn there"),
    ("NaN target_probs", support(lambda s: set_at(s["target_probs"], 0, [math.nan, math.nan])),
     "draft_support position 1 holds a probability that is not a finite number"),
    ("Inf outside mass", support(lambda s: set_at(s["outside_mass"], 1, math.inf)),
     "draft_support position 2 holds a probability that is not a finite number"),
    ("a negative probability", support(lambda s: set_at(s["target_probs"], 0, [0.9, -0.2])),
     "holds a probability outside [0, 1]"),
    ("a probability above 1",
     support(lambda s: (set_at(s["target_probs"], 1, [1.5]), set_at(s["outside_mass"], 1, -0.5))),
     "holds a probability outside [0, 1]"),
    ("mass above 1", support(lambda s: set_at(s["outside_mass"], 0, 0.5)),
     "draft_support position 1's probabilities and outside mass sum to 1.2, not 1"),
    ("mass missing", support(lambda s: set_at(s["target_probs"], 1, [0.5])),
     "draft_support position 2's probabilities and outside mass sum to 0.5, not 1"),
    ("a one-element row for two ids", support(lambda s: set_at(s["target_probs"], 0, [0.7])),
     "draft_support position 1 holds 1 probabilities for 2 ids"),
    ("a row of rows", support(lambda s: set_at(s["target_probs"], 0, [[0.5], [0.2]])),
     "holds probabilities of shape (2, 1) for 2 ids"),
    ("two bonus ids", changed(lambda r: r.update(output_ids=[2, 2]), support_answer), "has 2 output ids"),
]


@pytest.mark.parametrize("response, message", [case[1:] for case in SUPPORT_FAULTS],
                         ids=[c[0] for c in SUPPORT_FAULTS])
def test_bad_draft_support_answers_are_refused(response: dict[str, Any], message: str) -> None:
    with pytest.raises(UpstreamUnavailableError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        parse_support(response, [5, 9], SUPPORT_IDS, draft_probs(), vocab_size=VOCAB)


def prompt_entry(index: int, mutate: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return broken(lambda r: mutate(r["choices"][0]["prompt_logprobs"][index]))


def bonus_entry(mutate: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return broken(lambda r: mutate(r["choices"][0]["logprobs"]["top_logprobs"][0]))


VLLM_FAULTS = [
    # (id, the captured answer for drafts 7042 28 4528 with top 2 after 5 context tokens, changed; message)
    ("bonus id past the vocabulary", broken(lambda r: r["choices"][0].update(token_ids=[VLLM_VOCAB])),
     f"the bonus token holds token id {VLLM_VOCAB}, outside the vocabulary (0..{VLLM_VOCAB - 1})"),
    ("two bonus ids", broken(lambda r: r["choices"][0].update(token_ids=[314, 28])), "has 2 output ids"),
    ("top-N id past the vocabulary", prompt_entry(6, lambda e: e.update({str(OUT): e.pop("30")})),
     f"draft position 2 holds token id {OUT}"),
    ("bonus row id past the vocabulary",
     bonus_entry(lambda e: e.update({f"token_id:{OUT}": e.pop(next(iter(e)))})), "the bonus position holds token id"),
    ("NaN log-prob", prompt_entry(5, lambda e: e["260"].update(logprob=math.nan)),
     "draft position 1 holds a log-prob of nan"),
    ("+Inf bonus log-prob", bonus_entry(lambda e: e.update({k: math.inf for k in e})),
     "the bonus position holds a log-prob of inf"),
    ("mass above 1", prompt_entry(5, lambda e: e["260"].update(logprob=-0.1)),
     "draft position 1's probabilities sum to"),
    ("a one-element row", prompt_entry(6, lambda e: e.pop("30")),
     "draft position 2 has 1 log-probs where the top 2 were asked for"),
    ("a row too wide", prompt_entry(5, lambda e: e.update({"9": {"logprob": -9.0}, "10": {"logprob": -9.5}})),
     "draft position 1 has 4 log-probs where the top 2 were asked for"),
    ("one position too few", broken(lambda r: r["choices"][0]["prompt_logprobs"].pop()),
     "scores 7 prompt positions for a prompt of 8"),
    ("one position too many", broken(lambda r: r["choices"][0]["prompt_logprobs"].append(None)),
     "scores 9 prompt positions for a prompt of 8"),
]


@pytest.mark.parametrize("response, message", [case[1:] for case in VLLM_FAULTS], ids=[c[0] for c in VLLM_FAULTS])
def test_bad_vllm_answers_are_refused(response: dict[str, Any], message: str) -> None:
    with pytest.raises(UpstreamUnavailableError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_vllm(response, VERIFY["context_len"], VERIFY["draft_tokens"], 2, vocab_size=VLLM_VOCAB)


def test_the_captured_vllm_answer_passes_the_checks() -> None:
    parse_vllm(vllm_answer(), VERIFY["context_len"], VERIFY["draft_tokens"], 2, vocab_size=VLLM_VOCAB)


@pytest.mark.parametrize("ids, vocab_size, message", [
    ([1, 2, 24], 24, "holds token id 24, outside the vocabulary (0..23)"),
    ([-1], 24, "holds token id -1"),
    ([-1], None, "outside the vocabulary (ids >= 0)"),
])
def test_token_ids_outside_the_vocabulary(ids: list[int], vocab_size: int | None, message: str) -> None:
    with pytest.raises(UpstreamUnavailableError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checks.token_ids(ids, vocab_size, "the answer")


# Plain decoding and tokenization answers, from a server on a loopback port.


def answering(path: str, body: dict[str, Any]) -> web.Application:
    """A server that answers `body` on `path`, whatever it is asked."""

    async def handle(request: web.Request) -> web.Response:
        return web.json_response(body)

    app = web.Application()
    app.router.add_post(path, handle)
    return app


PLAIN_FAULTS = [
    # (target kind, path, answer, message)
    ("sglang", "/generate", {"output_ids": [1, VOCAB]}, f"a plain /generate answer holds token id {VOCAB}"),
    ("sglang", "/generate", {"output_ids": [1, 2, 3, 4, 5]}, "has 5 tokens where at most 4 were asked for"),
    ("vllm", "/v1/completions", {"choices": [{"token_ids": [OUT]}]}, f"a plain completion holds token id {OUT}"),
    ("vllm", "/v1/completions", {"choices": [{"token_ids": [1] * 5}]}, "has 5 tokens where at most 4"),
    ("vllm", "/tokenize", {"tokens": [1, -5], "max_model_len": 64}, "the prompt's tokenization holds token id -5"),
]


@pytest.mark.parametrize("kind, path, body, message", PLAIN_FAULTS, ids=[f"{c[0]} {c[3][:40]}" for c in PLAIN_FAULTS])
async def test_bad_plain_answers_are_refused(kind: str, path: str, body: dict[str, Any], message: str) -> None:
    server = TestServer(answering(path, body))
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), Timeouts(1.0, 5.0, 5.0))
    target = SGLangTarget(upstream) if kind == "sglang" else VLLMTarget(upstream, "toy")
    target.vocab_size = VOCAB
    try:
        with pytest.raises(UpstreamUnavailableError, match=message):
            if path == "/tokenize":
                await target.prompt_ids({"prompt": "hi"}, "completion")
            else:
                await target.generate([1, 2], 4, SamplingParams(temperature=0.0), 1)
    finally:
        await upstream.close()
        await server.close()


def test_a_probability_row_checks_its_shape_before_its_values() -> None:
    with pytest.raises(UpstreamUnavailableError, match="holds 3 probabilities for 2 ids"):
        checks.probabilities(np.array([np.nan, 0.5, 0.5]), 0.0, width=2, what="row")
