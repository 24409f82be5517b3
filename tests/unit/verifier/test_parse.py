"""`/generate` caps: at the limit a request is served, one above it is refused naming the limit."""

from __future__ import annotations

import re
from typing import Any

import pytest

from proxy.errors import BadRequestError, ContextOverflowError
from proxy.verifier.parse import (
    DEFAULT_MAX_BATCH,
    MAX_LOGPROB_ENTRIES,
    MAX_SCORED_LOGITS,
    RequestLimits,
    check_limits,
    parse_generate,
)

N_CTX = 4096
N_VOCAB = 1 << 16
MAX_ROWS = MAX_SCORED_LOGITS // N_VOCAB  # 1024


def body(n_ids: int, *, max_new: int = 1, start: int = -1, top_n: int = 0, logprobs: bool = False) -> dict[str, Any]:
    return {"input_ids": [1] * n_ids, "sampling_params": {"max_new_tokens": max_new},
            "logprob_start_len": start, "top_logprobs_num": top_n, "return_logprob": logprobs}


def batch(sequences: int, n_ids: int, *, max_new: int = 1) -> dict[str, Any]:
    return {"input_ids": [[1] * n_ids] * sequences, "sampling_params": {"max_new_tokens": max_new}}


def check(request: dict[str, Any], limits: RequestLimits | None = None) -> None:
    check_limits(parse_generate(request)[0], N_CTX, N_VOCAB, limits)


@pytest.mark.parametrize("request_body", [
    body(N_CTX - 5, max_new=5),  # the context, exactly
    body(MAX_ROWS, start=0),  # every row of logits allowed
    body(2, start=0, max_new=998, top_n=999, logprobs=True),  # (2 + 998) rows x 1000 = the entries allowed
    body(2, start=0, max_new=4000, top_n=1000),  # no log-probs asked for: no entries returned
    batch(DEFAULT_MAX_BATCH, 2),  # the sequences a batch may hold
    batch(4, N_CTX - 96, max_new=96),  # four full contexts: the tokens a request may ask for
])
def test_at_the_limits_a_request_is_served(request_body: dict[str, Any]) -> None:
    check(request_body)


@pytest.mark.parametrize(("request_body", "error", "message"), [
    (body(N_CTX - 5, max_new=6), ContextOverflowError,
     "the input (4091 tokens) plus 'max_new_tokens' (6) exceed the context of 4096 tokens"),
    (body(MAX_ROWS + 1, start=0), BadRequestError,
     f"asks for {MAX_ROWS + 1} rows of logits; this verifier scores at most {MAX_ROWS} rows"),
    (body(2, start=0, max_new=999, top_n=999, logprobs=True), BadRequestError,
     f"make 1001000 log-prob entries; this verifier returns at most {MAX_LOGPROB_ENTRIES} per request"),
    ({**body(0), "input_ids": [[1] * 600, [2] * 600], "return_logprob": True, "logprob_start_len": 0,
      "top_logprobs_num": 999}, BadRequestError, "make 1202000 log-prob entries"),  # a batch counts as one answer
    (batch(DEFAULT_MAX_BATCH + 1, 2), BadRequestError,
     f"holds {DEFAULT_MAX_BATCH + 1} sequences; this verifier takes at most {DEFAULT_MAX_BATCH} per request"),
    (batch(5, N_CTX - 96, max_new=96), BadRequestError,
     f"5 sequences of input and 'max_new_tokens' make {5 * N_CTX} tokens; this verifier takes at most {4 * N_CTX}"),
])
def test_above_the_limits_a_request_is_refused(request_body: dict[str, Any], error: type[Exception],
                                                message: str) -> None:
    with pytest.raises(error, match=re.escape(message)) as caught:
        check(request_body)
    assert caught.value.status == 400


@pytest.mark.parametrize(("request_body", "limits", "message"), [
    (batch(3, 2), RequestLimits(max_batch=2, max_tokens=N_CTX), "takes at most 2 per request (--max-batch)"),
    (body(100, max_new=1), RequestLimits(max_batch=1, max_tokens=100), "takes at most 100 per request"),
])
def test_the_caps_are_the_verifiers_options(request_body: dict[str, Any], limits: RequestLimits, message: str) -> None:
    with pytest.raises(BadRequestError, match=re.escape(message)):
        check(request_body, limits)
