"""`POST /generate` bodies (SGLang's `GenerateReqInput`, token ids only) -> validated requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequestError, ContextOverflowError
from proxy.sampling.processors import SamplingParams

MAX_TOP_LOGPROBS = 1000
# Logits one sequence may score (rows x vocabulary): 256 MiB as float32, a few times that while their
# log-softmax is taken. logprob_start_len 0 on a 4k prompt over a 150k vocabulary would be about 15 GB.
MAX_SCORED_LOGITS = 1 << 26
# [logprob, id, null] entries one answer may return: each is a few hundred bytes as Python objects.
MAX_LOGPROB_ENTRIES = 1_000_000
# One /generate holds one sequence lease for its whole batch: without caps, thousands of sequences of thousands
# of tokens would keep it (and the engine) for hours. The proxy sends one sequence a request.
DEFAULT_MAX_BATCH = 16
CONTEXTS_PER_REQUEST = 4  # the default cap on a request's tokens: four full contexts


@dataclass(frozen=True)
class GenerateRequest:
    """One sequence of a /generate call."""

    input_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    seed: int | None
    draft_support_ids: list[list[int]] | None = None


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for: sequences in a /generate batch, and their input plus new tokens together."""

    max_batch: int
    max_tokens: int

    @classmethod
    def for_context(cls, n_ctx: int) -> RequestLimits:
        """The defaults for a model served with an `n_ctx`-token context."""
        return cls(DEFAULT_MAX_BATCH, CONTEXTS_PER_REQUEST * n_ctx)


def _int_field(obj: dict, name: str, default: int, low: int) -> int:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRequestError(f"'{name}' must be an integer >= {low}", param=name)
    return value


def _float_field(obj: dict, name: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = obj.get(name)
    if value is None:
        return default  # null means the default, as in SGLang
    low_ok = isinstance(value, (int, float)) and (value > low if open_low else value >= low)
    if isinstance(value, bool) or not low_ok or not value <= high:
        raise BadRequestError(f"'{name}' must be a number in {'(' if open_low else '['}{low:g}, {high:g}]", param=name)
    return float(value)


def _parse_sampling(obj: Any) -> tuple[int, SamplingParams, int | None]:
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise BadRequestError("'sampling_params' must be an object", param="sampling_params")
    top_k = obj.get("top_k", -1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise BadRequestError("'top_k' must be an integer >= -1", param="top_k")
    params = SamplingParams(
        temperature=_float_field(obj, "temperature", 1.0, 0.0, 100.0),
        top_k=max(top_k, 0),
        top_p=_float_field(obj, "top_p", 1.0, 0.0, 1.0, open_low=True),  # SGLang refuses 0 too
        min_p=_float_field(obj, "min_p", 0.0, 0.0, 1.0),
    )
    seed = obj.get("sampling_seed", obj.get("seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequestError("'sampling_seed' must be an integer", param="sampling_seed")
    return _int_field(obj, "max_new_tokens", 128, 0), params, seed


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def parse_generate(body: Any) -> tuple[list[GenerateRequest], bool]:
    """Validate a /generate body; returns the sequences and whether the input was a batch."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if "text" in body and "input_ids" not in body:
        raise BadRequestError("this verifier takes 'input_ids' only (token ids, not text)", param="text")
    input_ids = body.get("input_ids")
    batched = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
    sequences = input_ids if batched else [input_ids]
    if not all(_is_ids(s) for s in sequences):
        raise BadRequestError("'input_ids' must be a non-empty list of token ids (or a list of such lists)",
                              param="input_ids")
    sampling = body.get("sampling_params")
    per_sequence = sampling if isinstance(sampling, list) else [sampling] * len(sequences)
    if len(per_sequence) != len(sequences):
        raise BadRequestError("'sampling_params' list must match the batch size", param="sampling_params")
    return_logprob = bool(body.get("return_logprob", False))
    top_n = _int_field(body, "top_logprobs_num", 0, 0)
    if top_n > MAX_TOP_LOGPROBS:
        raise BadRequestError(f"'top_logprobs_num' must be at most {MAX_TOP_LOGPROBS}", param="top_logprobs_num")
    start = body.get("logprob_start_len", -1)
    if isinstance(start, bool) or not isinstance(start, int) or start < -1:
        raise BadRequestError("'logprob_start_len' must be an integer >= -1", param="logprob_start_len")
    support = _parse_support(body.get("draft_support_ids"), batched)
    requests = []
    for ids, params in zip(sequences, per_sequence):
        max_new, sampling_params, seed = _parse_sampling(params)
        if start >= len(ids):
            raise BadRequestError(f"'logprob_start_len' {start} must be below the input length {len(ids)}",
                                  param="logprob_start_len")
        first_row = len(ids) - 1 if start == -1 else start
        if support is not None and (len(support) >= len(ids) or first_row > len(ids) - len(support) - 1):
            raise BadRequestError("'draft_support_ids' needs one list per draft token, all scored "
                                  "(logprob_start_len <= len(input_ids) - K - 1)", param="draft_support_ids")
        requests.append(GenerateRequest(ids, max_new, sampling_params, return_logprob, first_row, top_n, seed,
                                        support))
    return requests, batched


def _parse_support(value: Any, batched: bool) -> list[list[int]] | None:
    if value is None:
        return None
    if batched:
        raise BadRequestError("'draft_support_ids' takes a single sequence", param="draft_support_ids")
    if not isinstance(value, list) or not all(_is_ids(ids) for ids in value):
        raise BadRequestError("'draft_support_ids' must be a list of non-empty id lists", param="draft_support_ids")
    return value


def check_limits(requests: Sequence[GenerateRequest], n_ctx: int, n_vocab: int,
                 limits: RequestLimits | None = None) -> None:
    """Refuse, before any work, what does not fit the context or would exceed this verifier's caps (`limits`:
    RequestLimits.for_context by default)."""
    limits = limits or RequestLimits.for_context(n_ctx)
    if len(requests) > limits.max_batch:
        raise BadRequestError(f"'input_ids' holds {len(requests)} sequences; this verifier takes at most "
                              f"{limits.max_batch} per request (--max-batch)", param="input_ids")
    tokens = sum(len(req.input_ids) + req.max_new_tokens for req in requests)
    if tokens > limits.max_tokens:
        raise BadRequestError(f"{len(requests)} sequences of input and 'max_new_tokens' make {tokens} tokens; this "
                              f"verifier takes at most {limits.max_tokens} per request (--max-request-tokens)",
                              param="max_new_tokens")
    entries = 0
    for req in requests:
        if len(req.input_ids) + req.max_new_tokens > n_ctx:
            raise ContextOverflowError(f"the input ({len(req.input_ids)} tokens) plus 'max_new_tokens' "
                                       f"({req.max_new_tokens}) exceed the context of {n_ctx} tokens",
                                       param="max_new_tokens")
        rows = len(req.input_ids) - req.logprob_start_len  # logit rows scored: [rows, vocab]
        max_rows = max(1, MAX_SCORED_LOGITS // n_vocab)
        if rows > max_rows:
            raise BadRequestError(f"'logprob_start_len' {req.logprob_start_len} asks for {rows} rows of logits; "
                                  f"this verifier scores at most {max_rows} rows per sequence "
                                  f"({MAX_SCORED_LOGITS} logits over a {n_vocab}-token vocabulary)",
                                  param="logprob_start_len")
        if req.return_logprob:  # each returned row: its token's entry and the top-N
            entries += (rows + req.max_new_tokens) * (req.top_logprobs_num + 1)
    if entries > MAX_LOGPROB_ENTRIES:
        raise BadRequestError(f"the returned rows x ('top_logprobs_num' + 1) make {entries} log-prob entries; "
                              f"this verifier returns at most {MAX_LOGPROB_ENTRIES} per request",
                              param="top_logprobs_num")
