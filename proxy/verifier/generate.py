"""SGLang-native `POST /generate` for one llama.cpp model: token ids in, raw logprobs and samples out.

Shapes follow SGLang's `GenerateReqInput` and its `meta_info` (see ../shared/guides/backends.md):
`input_token_logprobs[j] = [logprob, token_id, null]` for the input token at
`logprob_start_len + j`, entry 0 carrying a null logprob (nothing is scored against it here);
`input_top_logprobs[j]` the top-N `[logprob, id, null]` lists, entry 0 null. Logprobs are raw
log-softmax of the logits, no temperature. Only rows from `logprob_start_len` on are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from proxy.engine import LlamaEngine
from proxy.errors import BadRequestError
from proxy.sampling import SamplerOrder, SamplingParams, processed_probs, sample

MAX_TOP_LOGPROBS = 1000
LLAMA_CPP_ORDER = SamplerOrder.TRUNCATE_THEN_TEMPERATURE  # this verifier samples as llama.cpp does

LogprobEntry = list  # [logprob | None, token_id, None]


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


def _int_field(obj: dict, name: str, default: int, low: int) -> int:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRequestError(f"'{name}' must be an integer >= {low}", param=name)
    return value


def _float_field(obj: dict, name: str, default: float, low: float, high: float) -> float:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequestError(f"'{name}' must be a number in [{low}, {high}]", param=name)
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
        top_p=_float_field(obj, "top_p", 1.0, 0.0, 1.0),
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
    requests = []
    for ids, params in zip(sequences, per_sequence):
        max_new, sampling_params, seed = _parse_sampling(params)
        if start >= len(ids):
            raise BadRequestError(f"'logprob_start_len' {start} must be below the input length {len(ids)}",
                                  param="logprob_start_len")
        requests.append(GenerateRequest(ids, max_new, sampling_params, return_logprob,
                                        len(ids) - 1 if start == -1 else start, top_n, seed))
    return requests, batched


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Raw logprobs per row, in float64."""  # [rows, vocab] -> [rows, vocab]
    rows = logits.astype(np.float64)
    rows -= rows.max(axis=-1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=-1, keepdims=True))
    return rows


def top_entries(logprobs: np.ndarray, n: int) -> list[LogprobEntry]:
    """The true top-n of one row, highest first, ties broken by the lower id."""  # logprobs: [vocab]
    if n <= 0:
        return []
    candidates = np.argpartition(-logprobs, n - 1)[:n] if n < logprobs.size else np.arange(logprobs.size)
    # Every id tied with the n-th value must be considered so the lowest ids win ties.
    threshold = logprobs[candidates].min()
    candidates = np.flatnonzero(logprobs >= threshold)
    order = np.lexsort((candidates, -logprobs[candidates]))[:n]
    return [[float(logprobs[i]), int(i), None] for i in candidates[order]]


def pick_token(row_logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The next token from one row of logits under the request's sampling parameters."""
    if params.greedy:
        return int(np.argmax(row_logits))
    return sample(processed_probs(row_logits, params, LLAMA_CPP_ORDER), rng)


def run_generate(engine: LlamaEngine, req: GenerateRequest, rng: np.random.Generator) -> dict[str, Any]:
    """Answer one sequence (blocking): score the input rows, then generate max_new_tokens."""
    ids = req.input_ids
    start = req.logprob_start_len
    evaluation = engine.evaluate(ids, start)
    cached = evaluation.cached_tokens
    logprobs = log_softmax(evaluation.logits)  # row r predicts token start + r + 1
    meta: dict[str, Any] = {"prompt_tokens": len(ids), "cached_tokens": cached}
    if req.return_logprob:
        actual = [[None, ids[start], None]]
        actual += [[float(logprobs[j - start - 1, ids[j]]), ids[j], None] for j in range(start + 1, len(ids))]
        meta["input_token_logprobs"] = actual
        meta["input_top_logprobs"] = [None] + [
            top_entries(logprobs[r], req.top_logprobs_num) for r in range(len(ids) - start - 1)
        ]
    output_ids, output_actual, output_top = [], [], []
    row, row_logprobs, context = evaluation.logits[-1], logprobs[-1], list(ids)
    finish: dict[str, Any] = {"type": "length", "length": req.max_new_tokens}
    for step in range(req.max_new_tokens):
        if step:
            row = engine.evaluate(context, len(context) - 1).logits[0]
            row_logprobs = log_softmax(row[None])[0]
        token = pick_token(row, req.params, rng)
        output_ids.append(token)
        output_actual.append([float(row_logprobs[token]), token, None])
        output_top.append(top_entries(row_logprobs, req.top_logprobs_num))
        context.append(token)
        if engine.is_end_of_generation(token):
            finish = {"type": "stop", "matched": token}
            break
    meta.update(completion_tokens=len(output_ids), finish_reason=finish)
    if req.return_logprob:
        meta["output_token_logprobs"] = output_actual
        meta["output_top_logprobs"] = output_top
    text = b"".join(engine.token_bytes(t) for t in output_ids).decode("utf-8", errors="replace")
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


def run_batch(engine: LlamaEngine, requests: Sequence[GenerateRequest]) -> list[dict[str, Any]]:
    """Answer every sequence of a call in order (blocking)."""
    return [run_generate(engine, req, np.random.default_rng(req.seed)) for req in requests]
