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

from typing import TYPE_CHECKING, Any

import numpy as np

from proxy.errors import BadRequestError
from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs
from proxy.sampling.rejection import sample
from proxy.verifier.parse import GenerateRequest
from proxy.verifier.plain import PlainSteps

if TYPE_CHECKING:
    from proxy.verifier.model import VerifierModel

LLAMA_CPP_ORDER = SamplerOrder.TRUNCATE_THEN_TEMPERATURE  # this verifier samples as llama.cpp does

LogprobEntry = list  # [logprob | None, token_id, None]


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


async def run_generate(model: VerifierModel, seq: int, req: GenerateRequest,
                       rng: np.random.Generator) -> dict[str, Any]:
    """Answer one sequence in llama.cpp sequence `seq`: score the input rows, then generate max_new_tokens."""
    ids = req.input_ids
    start = req.logprob_start_len
    vocabulary = model.vocabulary
    evaluation = await model.evaluate(seq, ids, start)
    meta: dict[str, Any] = {"prompt_tokens": len(ids), "cached_tokens": evaluation.cached_tokens}
    logprobs = log_softmax(evaluation.logits) if req.return_logprob else None  # row r predicts token start + r + 1
    if logprobs is not None:
        actual = [[None, ids[start], None]]
        actual += [[float(logprobs[j - start - 1, ids[j]]), ids[j], None] for j in range(start + 1, len(ids))]
        meta["input_token_logprobs"] = actual
        meta["input_top_logprobs"] = [None] + [
            top_entries(logprobs[r], req.top_logprobs_num) for r in range(len(ids) - start - 1)
        ]
    if req.draft_support_ids is not None:
        meta["draft_support"] = _draft_support(vocabulary.n_vocab, req, evaluation.logits, rng)
    output_actual: list[LogprobEntry] = []
    output_top: list[list[LogprobEntry]] = []

    def choose(row: np.ndarray) -> int:  # row: [vocab]
        token = pick_token(row, req.params, rng)
        if logprobs is not None:  # a full-vocabulary pass per token, which plain decoding does without
            row_logprobs = log_softmax(row[None])[0] if output_actual else logprobs[-1]
            output_actual.append([float(row_logprobs[token]), token, None])
            output_top.append(top_entries(row_logprobs, req.top_logprobs_num))
        return token

    steps = PlainSteps(list(ids), choose, vocabulary.is_end_of_generation, req.max_new_tokens,
                       first_row=evaluation.logits[-1])
    output_ids = [token async for token in model.decode_plain(seq, steps)]
    finish: dict[str, Any] = {"type": "length", "length": req.max_new_tokens}
    if output_ids and vocabulary.is_end_of_generation(output_ids[-1]):
        finish = {"type": "stop", "matched": output_ids[-1]}
    meta.update(completion_tokens=len(output_ids), finish_reason=finish)
    if logprobs is not None:
        meta["output_token_logprobs"] = output_actual
        meta["output_top_logprobs"] = output_top
    text = b"".join(vocabulary.token_bytes(t) for t in output_ids).decode("utf-8", errors="replace")
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


def _draft_support(n_vocab: int, req: GenerateRequest, logits: np.ndarray,
                   rng: np.random.Generator) -> dict[str, list]:
    """The target's processed probabilities on each draft support, its mass outside, and an outside draw."""
    support = req.draft_support_ids or []
    k = len(support)
    if k == 0:  # a round without drafts: only the bonus sample is needed
        return {"target_probs": [], "outside_mass": [], "outside_tokens": []}
    if any(max(ids) >= n_vocab or min(ids) < 0 for ids in support):
        raise BadRequestError("'draft_support_ids' holds an id outside the vocabulary", param="draft_support_ids")
    first = len(req.input_ids) - k - 1 - req.logprob_start_len  # the row predicting the first draft
    if req.params.greedy:
        return greedy_support(logits[first : first + k], support)
    return support_answer(processed_probs(logits[first : first + k], req.params, LLAMA_CPP_ORDER), support, rng)


def support_answer(probs: np.ndarray, support: list[list[int]], rng: np.random.Generator) -> dict[str, list]:
    """From the processed rows (which it overwrites): each support's probabilities, the mass outside, a draw there."""
    target_probs, outside_mass, outside_tokens = [], [], []
    for row, ids in zip(probs, support):  # probs: [k, vocab]
        target_probs.append([float(row[i]) for i in ids])
        row[ids] = 0.0  # the row is ours: what remains is the mass outside the support
        mass = float(row.sum())
        outside_mass.append(mass)
        outside_tokens.append(sample(row, rng) if mass > 0.0 else None)
    return {"target_probs": target_probs, "outside_mass": outside_mass, "outside_tokens": outside_tokens}


def greedy_support(logits: np.ndarray, support: list[list[int]]) -> dict[str, list]:
    """support_answer at temperature 0, where each row's distribution is one-hot at its argmax: the same answer
    without building [k, vocab] float64 rows, which cost a long round tens of milliseconds."""
    tops = np.argmax(logits, axis=-1)  # [k]; the lowest id on ties, as processed_probs picks
    if not np.all(logits[np.arange(len(tops)), tops] > -np.inf):
        raise ValueError("every row of logits needs at least one finite value")
    target_probs, outside_mass, outside_tokens = [], [], []
    for top, ids in zip(tops.tolist(), support):
        target_probs.append([1.0 if i == top else 0.0 for i in ids])
        inside = top in ids
        outside_mass.append(0.0 if inside else 1.0)
        outside_tokens.append(None if inside else top)
    return {"target_probs": target_probs, "outside_mass": outside_mass, "outside_tokens": outside_tokens}
