"""SGLang-native `POST /generate` for one llama.cpp model: token ids in, raw logprobs and samples out.

Shapes follow SGLang's `GenerateReqInput` and its `meta_info`:
`input_token_logprobs[j] = [logprob, token_id, null]` for the input token at
`logprob_start_len + j`, entry 0 carrying a null logprob (nothing is scored against it here);
`input_top_logprobs[j]` the top-N `[logprob, id, null]` lists, entry 0 null. Logprobs are raw
log-softmax of the logits, no temperature. Only rows from `logprob_start_len` on are computed.

Speculoos extension, `draft_support_ids` (one list of ids per draft token, the drafts being the
last K input ids): for each draft position the answer's `meta_info.draft_support` gives the
target's processed probabilities (under `sampling_params`, llama.cpp's sampler order) of those
ids, its mass outside them, and one token drawn from the target restricted to outside them.
With the generated token as the bonus sample, that is all an exact rejection sampler needs
(see `proxy.sampling.KnownSupport`), in the same single round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from proxy.engine.llama import LlamaEngine
from proxy.errors import BadRequestError
from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs
from proxy.sampling.rejection import sample

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
    draft_support_ids: list[list[int]] | None = None


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
    if req.draft_support_ids is not None:
        meta["draft_support"] = _draft_support(engine, req, evaluation.logits, rng)
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


def _draft_support(engine: LlamaEngine, req: GenerateRequest, logits: np.ndarray,
                   rng: np.random.Generator) -> dict[str, list]:
    """The target's processed probabilities on each draft support, its mass outside, and an outside draw."""
    support = req.draft_support_ids or []
    k = len(support)
    if k == 0:  # a round without drafts: only the bonus sample is needed
        return {"target_probs": [], "outside_mass": [], "outside_tokens": []}
    first = len(req.input_ids) - k - 1 - req.logprob_start_len  # the row predicting the first draft
    probs = processed_probs(logits[first : first + k], req.params, LLAMA_CPP_ORDER)  # [k, vocab]
    target_probs, outside_mass, outside_tokens = [], [], []
    for row, ids in zip(probs, support):
        if max(ids) >= engine.n_vocab or min(ids) < 0:
            raise BadRequestError("'draft_support_ids' holds an id outside the vocabulary", param="draft_support_ids")
        target_probs.append([float(row[i]) for i in ids])
        outside = row.copy()
        outside[ids] = 0.0
        mass = float(outside.sum())
        outside_mass.append(mass)
        outside_tokens.append(sample(outside, rng) if mass > 0.0 else None)
    return {"target_probs": target_probs, "outside_mass": outside_mass, "outside_tokens": outside_tokens}


def run_batch(engine: LlamaEngine, requests: Sequence[GenerateRequest]) -> list[dict[str, Any]]:
    """Answer every sequence of a call in order (blocking)."""
    return [run_generate(engine, req, np.random.default_rng(req.seed)) for req in requests]
